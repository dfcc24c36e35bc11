"""Coverage: when each GPU was last measured by each invasive probe, so an unmeasured fleet is never silent
(fleetcanary_gpu_last_measured_timestamp_seconds). Kept across restarts in the state directory
(daemon/state_files.py, coverage.json: [[gpu, probe, unix time], ...]). No lock of its own: the store
(daemon/state.py) holds its lock around it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fleetcanary.core import statefile
from fleetcanary.core.record import RunRecord
from fleetcanary.probes.base import Probe

COVERAGE_SKEW_SECONDS = 600.0  # a kept coverage time further past the wall clock than this is from a stepped clock


def measured(cls: type[Probe] | None, out: RunRecord) -> list[tuple[str, str]]:
    """The (gpu, probe) pairs a successful run of an invasive probe measured: the GPUs it spent GPU time on
    (its gate's free GPUs), or ("", probe) for a probe measured per node (Probe.coverage)."""
    if cls is None or cls.exclusive != "gpu":
        return []
    if cls.coverage == "node":
        return [("", out.probe)]
    return [(g[:16], out.probe) for g in out.gpu_seconds if g.isdigit()]


class Coverage:
    def __init__(self) -> None:
        # (gpu, probe) -> unix time a successful run of the invasive probe last measured the GPU
        # (gpu "" for a probe measured per node)
        self.last_measured: dict[tuple[str, str], float] = {}

    def observe(self, cls: type[Probe] | None, out: RunRecord) -> list[tuple[str, str]]:
        """A finished run: the (gpu, probe) pairs it measured (none unless it succeeded), stamped."""
        if not out.ok:
            return []
        covered = measured(cls, out)
        for key in covered:
            self.last_measured[key] = max(self.last_measured.get(key, 0.0), out.finished_at)
        return covered

    def restore(self, entries: list, probes: dict[str, type[Probe]], now: float,
                drop: Callable[[str, str], None] | None = None) -> int:
        """Coverage kept in the state directory ([[gpu, probe, unix time], ...]). An entry of the wrong shape
        (not [str, str, finite time > 0]) or stamped past ``now`` by more than COVERAGE_SKEW_SECONDS (a stepped
        clock) is refused and passed to ``drop(kind, detail)`` ("wrong_shape", "future"); one of a probe that
        is not in ``probes`` is let go. The number restored."""
        kept = 0
        for e in entries:
            shaped = isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and isinstance(e[1], str)
            ts = statefile.number(e[2]) if shaped else None
            if ts is None or ts <= 0:
                if drop:
                    drop("wrong_shape", f"entry {str(e)[:80]}")
                continue
            if ts > now + COVERAGE_SKEW_SECONDS:
                if drop:
                    drop("future", f"entry at {ts:.0f}, {ts - now:.0f} s past this clock")
                continue
            gpu, probe = e[0][:16], e[1]
            if probe in probes:
                self.last_measured[(gpu, probe)] = max(self.last_measured.get((gpu, probe), 0.0), float(ts))
                kept += 1
        return kept

    def dump(self) -> list:
        return [[g, p, ts] for (g, p), ts in sorted(self.last_measured.items())]

    def rows(self, enabled: list[str], probes: dict[str, type[Probe]],
             environment: dict[str, Any]) -> list[tuple[str, str, float]]:
        """(gpu, probe, unix time of its last fresh run or 0) for each enabled invasive probe and each GPU the
        node has (the environment's GPUs, and any measured before); a probe measured per node has gpu "" (on a
        node with GPUs). A node without GPUs has none."""
        gpus = {str(g["index"]) for g in environment.get("gpus") or []
                if isinstance(g, dict) and "index" in g}
        gpus |= {g for g, _ in self.last_measured if g}
        out = []
        for name in enabled:
            cls = probes.get(name)
            if cls is None or cls.exclusive != "gpu":
                continue
            if cls.coverage == "gpu":
                keys = sorted(gpus, key=lambda x: (len(x), x))
            else:  # per node: on a node with GPUs (a GPU-less node's skips are not a coverage gap)
                keys = [""] if gpus or ("", name) in self.last_measured else []
            for g in keys:
                out.append((g, name, self.last_measured.get((g, name), 0.0)))
        return out
