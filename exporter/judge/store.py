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

The store also remembers the node's last known driver and models, so that an exporter that has
just started reports the driver its runs had rather than "unknown" (an exporter restart is never a
driver change).
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from fleetcanary.core.environment import UNKNOWN
from fleetcanary.core.record import RunRecord
from fleetcanary.judge import figures as figmod
from fleetcanary.judge.stats import DAY, Series, Stats

log = logging.getLogger("fleetcanary.judge")

FILENAME = "figures.jsonl"
RETAIN_DAYS = 15
MAX_SERIES = 4096  # a bound on what a misconfigured probe (thousands of label values) can make the node keep


def _known(value: Any) -> str:
    v = str(value or "")
    return "" if v in ("", UNKNOWN) else v


class FigureStore:
    def __init__(self, state_dir: str | None, retain_days: float = RETAIN_DAYS) -> None:
        self.path = Path(state_dir) / "judge" / FILENAME if state_dir else None
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
            try:
                self._load()
            except OSError as exc:
                self.write_errors += 1
                log.error("judge: cannot read %s: %s; starting from nothing", self.path, exc.strerror or exc)

    # --- runs in ------------------------------------------------------------------------------------
    def observe(self, rec: RunRecord) -> bool:
        """Keep the judged figures of a successful run and recompute their statistics. True if any."""
        if rec.outcome != "success" or rec.probe not in figmod.BY_PROBE:
            return False
        values = figmod.extract(rec.probe, rec.samples)
        if not values:
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
            fig = figmod.BY_KEY.get(figure)
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
            s = self.series[key] = Series(fig)
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
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(line, separators=(",", ":")) + "\n")
        except OSError as exc:
            self.write_errors += 1
            log.error("judge: cannot write %s: %s", self.path, exc.strerror or exc)

    def _lines(self):
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                for raw in f:
                    try:
                        line = json.loads(raw)
                        float(line["t"])
                        if not isinstance(line["v"], dict):
                            raise TypeError
                    except (ValueError, KeyError, TypeError):
                        self.bad_lines += 1
                        continue
                    yield line
        except FileNotFoundError:
            return

    def _rewrite(self, now: float) -> None:
        """Keep the lines of the retention window, in time order, atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keep = sorted((ln for ln in self._lines() if float(ln["t"]) > now - self.retain), key=lambda ln: ln["t"])
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(ln, separators=(",", ":")) + "\n" for ln in keep)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.compacted_day = int(now // DAY)

    def _load(self) -> None:
        lines = sorted(self._lines(), key=lambda ln: ln["t"])
        if not lines:
            return
        newest = float(lines[-1]["t"])
        for line in lines:
            if float(line["t"]) > newest - self.retain:
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
