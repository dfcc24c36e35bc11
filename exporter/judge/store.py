"""The node's figure store: every judged figure of every successful run, kept RETAIN_DAYS in the
state directory, so the statistics survive exporter restarts (the DaemonSet keeps the state
directory on the host) and a reimaged node starts again from nothing.

One JSON line per run: ``{"t": finish time, "p": probe, "d": driver, "m": model, "c": cpu model,
"v": {figure: {"series|gpu": value}}}``, values to 6 significant digits, and ``"u": {index: UUID}``
when a GPU's UUID is first seen or changed (a replaced GPU's series start again). At the default schedule an
8-GPU node writes about 4,700 figures a day, ~0.2 MB; 15 days are ~3 MB. Lines older than the
retention are dropped when the file is rewritten (at start and once a day, to a temporary file
renamed over the old one). A line that does not parse (a torn write at a power cut) is skipped and
counted; a write that fails is counted and the figures stay in memory.

Time: the wall clock can step by any amount (a bad RTC at boot before NTP, a VM restored with a skewed
clock), so no wall-clock reading alone may delete history. The store keeps its own clock, anchored on the
monotonic clock at start (``Anchored``). A run stamped more than FUTURE_SKEW_SECONDS past it is refused and
counted (``set_aside["future_run"]``); a compaction's cutoff comes from the appended run's time, which is
then never in the future, and never moves more than MAX_DROP_SECONDS past the previous cutoff at once, so
even a wrong anchor costs at most a day of the oldest data per compaction. On load, lines stamped in the
future are set aside (kept in the file, not applied, not used for retention) and counted. A wall clock
that stays ahead of the anchor for REANCHOR_SECONDS is taken as the truth (NTP corrected a clock that was
behind at start) and the store re-anchors on it.

Every line is read through core/statefile (no link followed, never raises) and checked field by field; a
line of the wrong shape is set aside and counted (``fleetcanary_state_errors_total``).

The store also remembers the node's last known driver and models, so that an exporter that has
just started reports the driver its runs had rather than "unknown" (an exporter restart is never a
driver change).
"""
from __future__ import annotations

import json
import logging
import math
import os
import stat
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from fleetcanary.core import statefile
from fleetcanary.core.environment import UNKNOWN
from fleetcanary.core.record import RunRecord
from fleetcanary.judge import figures as figmod
from fleetcanary.judge.publish import Policy
from fleetcanary.judge.stats import DAY, Series, Stats

log = logging.getLogger("fleetcanary.judge")

FILENAME = "figures.jsonl"
RETAIN_DAYS = 15
MAX_SERIES = 4096  # a bound on what a misconfigured probe (thousands of label values) can make the node keep
FILE_LABEL = "judge/figures.jsonl"  # its name in fleetcanary_state_errors_total
FUTURE_SKEW_SECONDS = 600.0   # a run finished this far past the anchored clock is from a stepped clock
MAX_DROP_SECONDS = DAY        # the most a compaction moves its cutoff past the previous one
REANCHOR_SECONDS = 3600.0     # a wall clock ahead of the anchor this long is the truth (re-anchored)
SET_ASIDE_REASONS = ("future_run", "future_line")


class SystemClock:
    """The clock the store reads (the daemon passes its scheduler Clock: the same two methods)."""

    def now(self):
        from datetime import datetime, timezone
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()


class Anchored:
    """Wall time carried forward on the monotonic clock from one reading of the wall clock: a later step
    of the wall clock does not move it."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.reanchor()

    def reanchor(self) -> None:
        self._wall0, self._mono0 = self.clock.now().timestamp(), self.clock.monotonic()

    def now(self) -> float:
        return self._wall0 + (self.clock.monotonic() - self._mono0)

    def wall(self) -> float:
        return self.clock.now().timestamp()


def _known(value: Any) -> str:
    v = str(value or "")
    return "" if v in ("", UNKNOWN) else v


class FigureStore:
    def __init__(self, state_dir: str | None, retain_days: float = RETAIN_DAYS, clock=None,
                 figures: dict[str, figmod.Figure] | None = None, publish: Policy | None = None) -> None:
        """clock: now() (a datetime) and monotonic(), e.g. the daemon's scheduler Clock; tests pass a fake.
        figures: the judged figures by key with the deployer's floors (figmod.configured); default: as declared.
        publish: which statistics the exposition leaves out (judge/publish.py), from the rule settings; default:
        theirs."""
        self.figures = figures if figures is not None else figmod.BY_KEY
        self.publish = publish if publish is not None else Policy.from_settings(None)
        self.path = Path(state_dir) / "judge" / FILENAME if state_dir else None
        self.clock = Anchored(clock or SystemClock())
        self.set_aside: Counter[str] = Counter()  # reason -> runs refused or lines not used
        self._floor: float | None = None          # the previous compaction's cutoff (or the file's oldest line)
        self._ahead_since: float | None = None    # monotonic time the wall clock first ran ahead of the anchor
        self.retain = retain_days * DAY
        self._lock = threading.Lock()
        self.series: dict[figmod.SeriesKey, Series] = {}
        self.models: dict[figmod.SeriesKey, str] = {}
        self.facts: dict[str, str] = {}       # driver_version, gpu_model, cpu_model: the last known
        self.uuids: dict[str, str] = {}       # GPU index -> UUID: a replaced GPU starts its series again
        self.bad_lines = 0
        self.write_errors = 0
        self.compacted_day = -1
        self.stats: dict[figmod.SeriesKey, Stats] = {}
        if self.path is not None:
            try:  # judge/ itself: never a link to elsewhere, never another user's (created 0700)
                _tighten(self.path.parent)
                statefile.check_dir(self.path.parent)
            except statefile.StateDirError as exc:
                kind = "symlink" if self.path.parent.is_symlink() else "unreadable"
                statefile.drop(FILE_LABEL, kind, self.path.parent, str(exc), "the figures are kept in memory only")
                self.write_errors += 1
                self.path = None
        if self.path is not None:
            self._load()

    # --- runs in ------------------------------------------------------------------------------------
    def observe(self, rec: RunRecord) -> bool:
        """Keep the judged figures of a successful run and recompute their statistics. True if any."""
        if rec.outcome != "success" or rec.probe not in figmod.BY_PROBE:
            return False
        values = figmod.extract(rec.probe, rec.samples)
        if not values:
            return False
        if not self._in_time(rec):
            return False
        env = rec.environment or {}
        line = {"t": round(rec.finished_at, 3), "p": rec.probe,
                "d": _known(env.get("driver_version")) or self.facts.get("driver_version", ""),
                "m": _known(env.get("gpu_model")) or self.facts.get("gpu_model", ""),
                "c": _known(env.get("cpu_model")) or self.facts.get("cpu_model", ""),
                "v": {}}
        for (figure, series, gpu), v in values.items():
            line["v"].setdefault(figure, {})[f"{series}|{gpu}"] = float(f"{v:.6g}")
        uuids = {str(g.get("index")): str(g.get("uuid")) for g in env.get("gpus") or []
                 if isinstance(g, dict) and _known(g.get("uuid"))}
        with self._lock:
            changed = {i: u for i, u in uuids.items() if self.uuids.get(i) != u}
            if changed:  # written when a GPU's UUID is new or changed, not on every line
                line["u"] = changed
            self._apply(line)
            self._append(line)
        return True

    def _in_time(self, rec: RunRecord) -> bool:
        """False for a run stamped in the future of the anchored clock (counted, logged once a step)."""
        t = rec.finished_at
        limit = self.clock.now() + FUTURE_SKEW_SECONDS
        if isinstance(t, (int, float)) and math.isfinite(t) and t <= limit:
            self._ahead_since = None
            return True
        if isinstance(t, (int, float)) and math.isfinite(t) and self.clock.wall() > limit:
            mono = self.clock.clock.monotonic()
            if self._ahead_since is None:
                self._ahead_since = mono
            elif mono - self._ahead_since >= REANCHOR_SECONDS:
                log.warning("judge: the wall clock has been %.0f s ahead of the store's clock for %.0f s; taking "
                            "it as the truth", self.clock.wall() - self.clock.now(), mono - self._ahead_since)
                self.clock.reanchor()
                self._ahead_since = None
                self._reload()  # lines set aside at start as future may be the real history
                return True
        with self._lock:
            first = self.set_aside["future_run"] == 0
            self.set_aside["future_run"] += 1
        (log.warning if first else log.debug)(
            "judge: run of %s finished at %r, past the store's clock (%.0f) by more than %.0f s (a stepped wall "
            "clock); not kept", rec.probe, t, self.clock.now(), FUTURE_SKEW_SECONDS)
        return False

    def _reload(self) -> None:
        with self._lock:
            self.series, self.models, self.stats, self.uuids = {}, {}, {}, {}
            self._floor = None
            self.compacted_day = -1
            if self.path is not None:
                self._load()

    def _apply(self, line: dict[str, Any], compute: bool = True) -> None:
        t = float(line["t"])
        for name, field in (("d", "driver_version"), ("m", "gpu_model"), ("c", "cpu_model")):
            if line.get(name):
                self.facts[field] = str(line[name])
        for index, uuid in (line.get("u") or {}).items() if isinstance(line.get("u"), dict) else ():
            if self.uuids.get(index, uuid) != uuid:
                # Another GPU in this slot (a replacement): its series start again from nothing; the old
                # GPU's runs are neither its baseline nor its median.
                for key in [k for k in self.series if k[2] == index and figmod.BY_KEY[k[0]].gpu]:
                    del self.series[key]
                    self.stats.pop(key, None)
            self.uuids[index] = str(uuid)
        for figure, values in line["v"].items():
            fig = self.figures.get(figure)
            if fig is None or not isinstance(values, dict):
                continue
            for skey, value in values.items():
                self._add(fig, (figure, *skey.rsplit("|", 1)), t, value, line, compute)

    def _add(self, fig: figmod.Figure, key: tuple, t: float, value: Any, line: dict[str, Any],
             compute: bool = True) -> None:
        try:
            value = float(value)
        except (TypeError, ValueError):
            self.bad_lines += 1
            return
        s = self.series.get(key)
        if s is None:
            if len(key) != 3 or len(self.series) >= MAX_SERIES:
                return
            s = self.series[key] = Series(fig, drift_floor=self.publish.drift_floor)
        # Only GPU figures are per driver: a GPU driver upgrade does not restart a host memory baseline.
        s.add(t, value, str(line.get("d", "")) if fig.model_field == "gpu_model" else "")
        field = {"gpu_model": "m", "cpu_model": "c"}.get(fig.model_field)
        self.models[key] = str(line.get(field, "")) if field else ""
        if compute:
            self._compute(key)

    def _compute(self, key: tuple) -> None:
        st = self.series[key].stats()
        if st is not None:
            self.stats[key] = st

    # --- the file -----------------------------------------------------------------------------------
    def _append(self, line: dict[str, Any]) -> None:
        if self.path is None:
            return
        day = int(line["t"] // DAY)
        try:
            if day != self.compacted_day:
                self._rewrite(line["t"])
            data = (json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n").encode()
            n = statefile.append(self.path, data, FILE_LABEL)
            if n != len(data):
                raise OSError(28, f"wrote {n} of {len(data)} bytes")
        except (OSError, ValueError) as exc:
            self.write_errors += 1
            log.error("judge: cannot write %s: %s", self.path, getattr(exc, "strerror", None) or exc)

    def _lines(self, why: list[str] | None = None, bad: Counter[str] | None = None):
        """The file's lines of the right shape, "t" a float; the rest counted and logged (and, by kind, in
        ``bad`` when given)."""
        raw = statefile.read_bytes(self.path, FILE_LABEL, "its figures are not used", why=why)
        if raw is None:
            return
        wrong = 0
        for _, value in statefile.lines(raw, FILE_LABEL, self.path, "those lines are skipped", bad=bad):
            line = _checked(value)
            if line is None:
                wrong += 1
                continue
            yield line
        if wrong:
            statefile.drop(FILE_LABEL, "wrong_shape", self.path, f"{wrong} lines of the wrong shape" if wrong > 1
                           else "a line of the wrong shape", "those lines are skipped", n=wrong)
            if bad is not None:
                bad["wrong_shape"] += wrong

    def _rewrite(self, now: float) -> None:
        """Keep the lines of the retention window, in time order, atomically. The cutoff moves at most
        MAX_DROP_SECONDS past the previous one; lines in the future of the store's clock are kept."""
        why: list[str] = []
        lines = list(self._lines(why))
        if "unreadable" in why:
            return  # the file is there but cannot be read now (EIO, EACCES): never replace it with nothing
        cutoff = now - self.retain
        if self._floor is not None:
            cutoff = min(cutoff, self._floor + MAX_DROP_SECONDS)
        keep = sorted((ln for ln in lines if ln["t"] > cutoff), key=lambda ln: ln["t"])
        statefile.write_atomic(self.path, "".join(json.dumps(ln, separators=(",", ":")) + "\n" for ln in keep))
        self._floor = cutoff if self._floor is None else max(self._floor, cutoff)
        self.compacted_day = int(now // DAY)

    def _load(self) -> None:
        bad: Counter[str] = Counter()
        lines = sorted(self._lines(bad=bad), key=lambda ln: ln["t"])
        self.bad_lines += sum(bad.values())
        future = self.clock.now() + FUTURE_SKEW_SECONDS
        ahead = [ln for ln in lines if ln["t"] > future]
        if ahead:
            lines = [ln for ln in lines if ln["t"] <= future]
            self.set_aside["future_line"] += len(ahead)
            statefile.ERRORS.count(FILE_LABEL, "future", len(ahead))
            log.warning("judge: %d lines of %s are stamped in the future (the newest %.0f, the store's clock %.0f); "
                        "kept in the file, not used", len(ahead), self.path, ahead[-1]["t"], self.clock.now())
        if not lines:
            return
        newest = lines[-1]["t"]
        self._floor = max(lines[0]["t"], newest - self.retain)
        for line in lines:
            if line["t"] > newest - self.retain:
                self._apply(line, compute=False)  # the statistics once, at the end
        for key in self.series:
            self._compute(key)
        log.info("judge: %d runs of %d series loaded from %s", len(lines), len(self.series), self.path)

    # --- reads ----------------------------------------------------------------------------------
    def snapshot(self) -> list[tuple[figmod.SeriesKey, Stats, str]]:
        with self._lock:
            return [(k, st, self.models.get(k, "")) for k, st in self.stats.items()]

    def size_bytes(self) -> int:
        try:
            return self.path.stat().st_size if self.path is not None else 0
        except OSError:
            return 0


def _tighten(directory: Path) -> None:
    """An older version made judge/ with the process's umask (0775 under umask 002): our own directory, so
    take the group's and others' write bits instead of refusing it."""
    try:
        st = os.lstat(directory)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o022:
        try:
            os.chmod(directory, stat.S_IMODE(st.st_mode) & ~0o022, follow_symlinks=False)
        except (OSError, NotImplementedError):
            pass  # check_dir says why it is refused


def _checked(value: Any) -> dict[str, Any] | None:
    """The line with "t" a finite float, "v" an object of objects of finite numbers (other values left out),
    the facts strings and "u" an object of strings; None when its shape is wrong."""
    if not isinstance(value, dict):
        return None
    t = statefile.number(value.get("t"))
    v = value.get("v")
    if t is None or not isinstance(v, dict):
        return None
    if any(k in value and not isinstance(value[k], str) for k in ("p", "d", "m", "c")):
        return None
    u = value.get("u")
    if u is not None and not (isinstance(u, dict) and all(isinstance(x, str) for x in u.values())):
        return None
    figures = {}
    for figure, series in v.items():
        if isinstance(series, dict):
            kept = {k: statefile.number(x) for k, x in series.items()}
            figures[figure] = {k: x for k, x in kept.items() if x is not None}
    return {**value, "t": t, "v": figures}
