"""The claim inbox's gate: what a claim pod left is checked before anything of it is published.

The inbox is a host directory the claim pod can write (daemon/claim.py), so a file in it is outside input:
it may be torn, planted, replayed from another node, stamped in the future, or built to blow up the budget or
the series count. `check` turns the bytes of one file into an accepted RunRecord or one reason from REASONS
(a fixed set: they are label values of fleetcanary_claim_records_rejected_total), and never raises:

- size (MAX_BYTES) and nesting (MAX_DEPTH) are bounded before and while parsing (core/statefile.parse_json);
- the node is this node (the spec the exporter wrote named it: runner/claim.py keeps the job's node_name);
- the probe is an invasive probe of this exporter that a claim asked for (`Expect.asked`: when it asked);
- the time window is sane: started no earlier than the ask (less SKEW_SECONDS), no later than the claim can
  have lived (pending + run deadline), finished no later than now + SKEW_SECONDS, a duration within the
  claim pod's deadline;
- GPU seconds are finite, non-negative, on GPUs this node has, each at most the run's duration and all
  together at most the duration x the node's GPU count (a record cannot drive the budget to -inf);
- samples are bounded (MAX_SAMPLES, MAX_SERIES distinct label sets), and every GPU label names a GPU of this
  node, so a record cannot publish thousands of series.

`quarantine` moves a rejected entry aside (a directory or a link named *.json too: moved, never followed) into
inbox/quarantine, which keeps at most MAX_QUARANTINE entries (the oldest go), so the inbox always drains and
what was refused can still be looked at.
"""
from __future__ import annotations

import itertools
import logging
import math
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from fleetcanary.core import statefile
from fleetcanary.core.record import RunRecord

log = logging.getLogger("fleetcanary.claim")

MAX_BYTES = 4 << 20          # a record with its samples is a few KiB (the largest, a few hundred)
MAX_DEPTH = statefile.MAX_DEPTH  # a record nests about 6 levels (result.figures[].parameters...)
MAX_SAMPLES = 2048
MAX_SERIES = 512             # distinct (metric, labels) of one record
MAX_GPUS = 64                # when the node's GPU count is not known
SKEW_SECONDS = 600.0         # clocks of the claim pod and the exporter are the node's; allow for a step
DURATION_SLACK_SECONDS = 1.0
QUARANTINE = "quarantine"
MAX_QUARANTINE = 64
GPU_LABELS = ("gpu", "src_gpu", "dst_gpu", "peer_gpu")

REASONS = ("not_a_file", "too_large", "unreadable", "not_json", "too_deep", "malformed", "unknown_probe",
           "not_asked", "wrong_node", "bad_time", "bad_gpu_seconds", "too_many_series", "error")


REJECTED = statefile.Tally(lambda reason: reason in REASONS)  # reason -> records refused


@dataclass
class Expect:
    """What this exporter knows a record of its claim must match."""
    node: str
    invasive: frozenset[str]                          # the invasive probes of this exporter
    asked: dict[str, float]                           # probe -> unix time a claim asked for it
    gpus: frozenset[str] = frozenset()                # the node's GPU indices (labels); empty: unknown
    gpu_count: int = 0                                # 0: unknown (MAX_GPUS)
    lifetime_seconds: float = 5400.0                  # pending_seconds + max_run_seconds of the claim
    max_run_seconds: float = 1800.0

    @property
    def n_gpus(self) -> int:
        return max(self.gpu_count, len(self.gpus)) or MAX_GPUS


class Reject(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check(raw: bytes, expect: Expect, now: float) -> tuple[RunRecord | None, str, str]:
    """(record, "", "") or (None, reason, one-line detail). Never raises."""
    try:
        return _check(raw, expect, now), "", ""
    except Reject as r:
        return None, r.reason, r.detail[:200]
    except Exception as exc:  # noqa: BLE001 - whatever a hostile record does, it is a rejection
        return None, "malformed", f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def _check(raw: bytes, expect: Expect, now: float) -> RunRecord:
    if not isinstance(raw, (bytes, bytearray)):
        raise Reject("malformed", "not bytes")
    if len(raw) > MAX_BYTES:
        raise Reject("too_large", f"{len(raw)} bytes > {MAX_BYTES}")
    obj, kind, detail = statefile.parse_json(bytes(raw), MAX_DEPTH)
    if kind is not None:
        raise Reject("too_deep" if kind == "too_deep" else "not_json", detail)
    if not isinstance(obj, dict):
        raise Reject("malformed", "not a JSON object")
    try:
        rec = RunRecord.from_json(obj)
    except ValueError as exc:  # RecordError
        raise Reject("malformed", str(exc).splitlines()[0] if str(exc) else "not a run record") from None
    if rec.probe not in expect.invasive:
        raise Reject("unknown_probe", f"probe {rec.probe[:60]!r} is not an invasive probe of this exporter")
    if rec.node != expect.node:
        raise Reject("wrong_node", f"a record of node {rec.node[:63]!r}, not of {expect.node!r}")
    asked = expect.asked.get(rec.probe)
    if asked is None:
        raise Reject("not_asked", f"no claim asked for probe {rec.probe!r}")
    _check_time(rec, asked, expect, now)
    _check_gpu_seconds(rec, obj, expect)
    _check_series(rec, expect)
    rec.trigger = "claim"
    return rec


def _check_time(rec: RunRecord, asked: float, expect: Expect, now: float) -> None:
    start, wall = rec.started_at, rec.wall_seconds
    if not (math.isfinite(start) and math.isfinite(wall)):
        raise Reject("bad_time", "a time that is not a number")
    if not 0 <= wall <= expect.max_run_seconds + DURATION_SLACK_SECONDS:
        raise Reject("bad_time", f"a duration of {wall:.0f} s, outside 0..{expect.max_run_seconds:.0f} s")
    if start < asked - SKEW_SECONDS:
        raise Reject("bad_time", f"started {asked - start:.0f} s before the claim asked for it")
    if start > asked + expect.lifetime_seconds + SKEW_SECONDS:
        raise Reject("bad_time", f"started {start - asked:.0f} s after the claim asked, longer than a claim lives")
    if start + wall > now + SKEW_SECONDS:
        raise Reject("bad_time", f"finished {start + wall - now:.0f} s in the future")


def _check_gpu_seconds(rec: RunRecord, obj: dict, expect: Expect) -> None:
    result = obj.get("result")
    raw = result.get("gpu_seconds") if isinstance(result, dict) else None
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise Reject("bad_gpu_seconds", f"gpu_seconds is a JSON {type(raw).__name__}, not an object")
    if len(raw) > expect.n_gpus:
        raise Reject("bad_gpu_seconds", f"gpu_seconds names {len(raw)} GPUs; the node has {expect.n_gpus}")
    cap = rec.wall_seconds + DURATION_SLACK_SECONDS
    total = 0.0
    for gpu, secs in raw.items():
        if expect.gpus and gpu not in expect.gpus:
            raise Reject("bad_gpu_seconds", f"gpu_seconds names GPU {gpu[:16]!r}, not one of this node's")
        if not _finite(secs) or not 0 <= secs <= cap:
            raise Reject("bad_gpu_seconds", f"{str(secs)[:30]} GPU seconds on GPU {gpu[:16]!r} in a run of "
                         f"{rec.wall_seconds:.0f} s")
        total += secs
    if total > cap * expect.n_gpus:
        raise Reject("bad_gpu_seconds", f"{total:.0f} GPU seconds in a run of {rec.wall_seconds:.0f} s on "
                     f"{expect.n_gpus} GPUs")


def _check_series(rec: RunRecord, expect: Expect) -> None:
    if len(rec.samples) > MAX_SAMPLES:
        raise Reject("too_many_series", f"{len(rec.samples)} samples > {MAX_SAMPLES}")
    keys = set()
    for s in rec.samples:
        if not isinstance(s, dict) or not isinstance(s.get("labels", {}), dict):
            raise Reject("malformed", "a sample is not an object with labels")
        labels = s.get("labels") or {}
        for name in GPU_LABELS:
            if name in labels and expect.gpus and str(labels[name]) not in expect.gpus:
                raise Reject("too_many_series", f"a sample's {name} label {str(labels[name])[:16]!r} is not a GPU "
                             "of this node")
        keys.add((str(s.get("metric"))[:200], tuple(sorted((str(k)[:64], str(v)[:64]) for k, v in labels.items()))))
    if len(keys) > MAX_SERIES:
        raise Reject("too_many_series", f"{len(keys)} distinct series > {MAX_SERIES}")
    gpu_values = {str((s.get("labels") or {}).get(n)) for s in rec.samples for n in GPU_LABELS
                  if n in (s.get("labels") or {})}
    if len(gpu_values) > expect.n_gpus:
        raise Reject("too_many_series", f"samples name {len(gpu_values)} GPUs; the node has {expect.n_gpus}")
    env_gpus = rec.environment.get("gpus")
    if env_gpus is not None and (not isinstance(env_gpus, list) or len(env_gpus) > expect.n_gpus):
        raise Reject("too_many_series", "the environment's GPU list is not a list of this node's GPUs")


_READ_REASONS = {"symlink": "not_a_file", "not_a_file": "not_a_file", "too_large": "too_large"}


def read(path: Path, expect: Expect, now: float) -> tuple[RunRecord | None, str, str]:
    """One inbox entry: (record, "", "") or (None, reason, detail). Never follows a link, never raises."""
    raw, kind, detail = statefile.read_raw(path, MAX_BYTES)
    if raw is None:
        return None, _READ_REASONS.get(kind, "unreadable"), detail or "gone"
    rec, reason, detail = check(raw, expect, now)
    if rec is not None:
        rec.source = str(path)
    return rec, reason, detail


def remove(path: Path) -> None:
    """Remove an entry, a directory with all in it, never following a link."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def _quarantine_dir(inbox: Path) -> Path | None:
    q = inbox / QUARANTINE
    try:
        st = os.lstat(q)
        if not stat.S_ISDIR(st.st_mode):   # a planted link or file: never moved into
            remove(q)
            raise FileNotFoundError
        return q
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        q.mkdir(mode=0o700)
        return q
    except OSError:
        return None


_seq = itertools.count(1)   # next() is atomic under the GIL: names stay distinct across threads


def quarantine(inbox: Path, path: Path, reason: str) -> str:
    """Move ``path`` aside into inbox/quarantine (or remove it when it cannot be moved); the oldest entries
    go beyond MAX_QUARANTINE. Where it went, for the log line. Never raises."""
    try:
        q = _quarantine_dir(inbox)
        if q is not None:
            n = next(_seq)
            base = f"{time.time_ns():020d}-{n:06d}-{reason}-{path.name}"[:200]
            target = q / base
            k = 0
            while os.path.lexists(target):      # never over another entry
                k += 1
                target = q / f"{base}.{k}"
            try:
                os.rename(path, target)         # a link is moved as a link; a directory as a whole
                _trim(q)
                return f"moved to {QUARANTINE}/{target.name}"
            except OSError:
                pass
        remove(path)
        return "removed"
    except Exception:  # noqa: BLE001 - the inbox drains whatever this entry is
        remove(path)
        return "removed"


def _trim(q: Path) -> None:
    try:
        names = sorted(os.listdir(q))
    except OSError:
        return
    for name in names[:max(0, len(names) - MAX_QUARANTINE)]:
        remove(q / name)
