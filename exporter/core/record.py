"""The run record: one probe run, in one shape, from the worker to every reader.

The worker fills what it knows (outcome, samples, the probe's result, environment, the
time inside ``probe.run``); the runner adds what only it sees (start time, wall time, exit
status, the output tail) and the node. The daemon publishes it, the history file stores it
one JSON line per run, /results serves the latest of each probe, and compare/report load
it back with ``from_json``. Every field has one name and one meaning everywhere.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from fleetcanary.probes.base import SKIP_REASONS

SCHEMA = 2
# What happened to a run. A fixed vocabulary: each becomes a label value.
OUTCOMES = ("success", "failure", "timeout", "crash", "skipped")
# Why a run crashed, as the runner classifies it (skip reasons: SKIP_REASONS; failure
# reasons: each probe's own plus "other"); spawn_failed: no worker could be started (out of descriptors,
# processes or memory); internal: the daemon itself failed around the run.
CRASH_REASONS = ("exception", "killed_by_signal", "oom_killed", "exit_nonzero", "bad_result", "result_too_large",
                 "spawn_failed", "internal")
BROKEN = ("failure", "timeout", "crash")

__all__ = ["BROKEN", "CRASH_REASONS", "OUTCOMES", "SCHEMA", "SKIP_REASONS", "RecordError", "RunRecord"]


class RecordError(ValueError):
    """JSON that is not a run record; the message is one line."""


def _finite(v: Any) -> Any:
    """JSON-safe: NaN and infinities become None, so the record stays standard JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


@dataclass
class RunRecord:
    probe: str
    outcome: str                        # one of OUTCOMES
    reason: str = ""                    # skip, failure or crash reason; "deadline" for a deadline kill
    detail: str = ""                    # one human line: what broke or why it skipped
    node: str = ""                      # node_name from the config
    started_at: float = 0.0             # unix time the worker was started
    wall_seconds: float = 0.0           # worker start to end, as the runner saw it (the deadline applies to this)
    probe_seconds: float | None = None  # time inside probe.run, as the worker measured it
    # figures, parameters, touched, gpu_seconds, config, extra
    result: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)  # the environment record the run ran in
    samples: list[dict[str, Any]] = field(default_factory=list)  # metric samples (worker to daemon only)
    exit_status: int | None = None      # the worker's exit status
    output_tail: str = ""               # the end of the worker's stdout and stderr
    trigger: str = "schedule"           # "schedule", "confirmation" (the daemon re-ran it: daemon/confirm.py),
                                        # "requested" (POST /confirm: daemon/requests.py), "claim", "opportunistic"
    source: str = field(default="", compare=False)  # the file it was loaded from (never serialized)

    # --- reading ------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return self.outcome == "success"

    @property
    def broken(self) -> bool:
        return self.outcome in BROKEN

    @property
    def figures(self) -> list[dict[str, Any]]:
        return list(self.result.get("figures") or [])

    @property
    def gpu_seconds(self) -> dict[str, float]:
        out = {}
        for gpu, secs in (self.result.get("gpu_seconds") or {}).items():
            try:
                out[str(gpu)] = max(float(secs), 0.0)
            except (TypeError, ValueError):
                continue
        return out

    @property
    def finished_at(self) -> float:
        return self.started_at + self.wall_seconds

    # --- JSON -----------------------------------------------------------------
    def to_json(self, with_samples: bool = False) -> dict[str, Any]:
        """The record as a JSON object. Samples travel from the worker to the daemon only;
        the history, /results and `once --json` hold the figures instead."""
        d = {"schema": SCHEMA, **asdict(self)}
        d.pop("source")
        if not with_samples:
            d.pop("samples")
        return _finite(d)

    @classmethod
    def from_json(cls, obj: Any, source: str = "") -> RunRecord:
        """A record from its JSON object. Schema 1 (history files of fleetcanary 0.1) is read
        too: its ``record`` is ``result`` and its ``duration_seconds`` is ``wall_seconds``."""
        if not isinstance(obj, dict):
            raise RecordError("not a JSON object")
        if not isinstance(obj.get("probe"), str) or not obj["probe"]:
            raise RecordError("missing probe")
        if obj.get("outcome") not in OUTCOMES:
            raise RecordError(f"outcome {obj.get('outcome')!r} is not one of {', '.join(OUTCOMES)}")
        if obj.get("schema") == 1 or ("schema" not in obj and "record" in obj):
            obj = {**obj, "result": obj.get("record"), "wall_seconds": obj.get("duration_seconds")}
        known = {f.name for f in fields(cls)} - {"source"}
        kw = {k: v for k, v in obj.items() if k in known and v is not None}
        try:
            for name in ("reason", "detail", "node", "output_tail"):
                kw[name] = str(kw.get(name, ""))
            kw["trigger"] = str(kw.get("trigger", "schedule"))
            for name in ("started_at", "wall_seconds"):
                kw[name] = float(kw.get(name, 0.0))
            if "probe_seconds" in kw:
                kw["probe_seconds"] = float(kw["probe_seconds"])
            if "exit_status" in kw:
                kw["exit_status"] = int(kw["exit_status"])
        except (TypeError, ValueError) as exc:
            raise RecordError(f"a field has the wrong type ({exc})") from None
        for name, kind in (("result", dict), ("environment", dict), ("samples", list)):
            if not isinstance(kw.get(name, kind()), kind):
                raise RecordError(f"{name} is not a JSON {'object' if kind is dict else 'array'}")
        return cls(**kw, source=source)
