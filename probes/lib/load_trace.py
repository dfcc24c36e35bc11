"""A load trace: NVML readings every ``period`` seconds from a thread inside the worker while
a burn runs, and the accounting of it (time per throttle reason, clocks, power, temperature).

The accounting is a pure function over timestamped samples, so it is tested exactly on
recorded sequences; the sampler only adds timestamps. A sample's reading holds from its
timestamp to the next one (the last one until the burn's end), as DCGM's field watches
and nvidia-smi's throttle counters account time.
"""
from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fleetcanary.probes.lib import nvml

# Reasons that mean a fault under load. The software power cap is not among them: a full-load
# burn reaches it on a healthy GPU too, so it is accounted (seconds) but compared through peers.
SLOWDOWN_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


@dataclass
class Sample:
    t: float                       # seconds since the burn started
    sm_mhz: float | None = None
    mem_mhz: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    mask: int | None = None

    def to_list(self) -> list:
        return [round(self.t, 4), self.sm_mhz, self.mem_mhz, self.power_w, self.temp_c, self.mask]


def reasons(mask: int | None) -> list[str]:
    if mask is None:
        return []
    return [name for bit, name in nvml.THROTTLE_REASONS.items() if mask & bit]


def account(samples: list[Sample], end: float, tail_from: float) -> dict[str, Any]:
    """Seconds in each throttle reason (every reason of the fixed set, zeros included), the seconds
    with any slowdown reason (SLOWDOWN_REASONS), and clocks/power (median over the tail: t >= tail_from) and the
    hottest temperature. ``end``: the burn's length in seconds."""
    per = dict.fromkeys(nvml.THROTTLE_REASONS.values(), 0.0)
    slowdown = 0.0
    covered = 0.0
    for i, s in enumerate(samples):
        nxt = samples[i + 1].t if i + 1 < len(samples) else end
        dt = max(0.0, min(nxt, end) - max(s.t, 0.0))
        if s.mask is None or dt == 0.0:
            continue
        covered += dt
        names = reasons(s.mask)
        for name in names:
            per[name] += dt
        if any(n in SLOWDOWN_REASONS for n in names):
            slowdown += dt
    tail = [s for s in samples if s.t >= tail_from] or samples[-1:]

    def med(attr):
        vals = [getattr(s, attr) for s in tail if getattr(s, attr) is not None]
        return statistics.median(vals) if vals else None

    temps = [s.temp_c for s in samples if s.temp_c is not None]
    return {"throttle_seconds": per, "slowdown_seconds": slowdown, "covered_seconds": covered,
            "slowdown_ratio": slowdown / covered if covered else None,
            "sm_mhz_tail": med("sm_mhz"), "mem_mhz_tail": med("mem_mhz"), "power_w_tail": med("power_w"),
            "temp_c_max": max(temps) if temps else None, "samples": len(samples)}


@dataclass
class Sampler:
    """Reads every GPU every ``period`` seconds until stopped; also notices a foreign compute
    process (a job started during the burn) so the burn can stop early."""

    session: Any
    handles: list
    period: float = 0.1
    check_processes_every: int = 10
    traces: dict[int, list[Sample]] = field(default_factory=dict)
    intruder: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._t0 = 0.0
        self.errors: list[str] = []

    def start(self, t0: float) -> None:
        self._t0 = t0
        self._thread.start()

    def stop(self) -> dict[int, list[Sample]]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.traces

    def _loop(self) -> None:
        me = os.getpid()
        tick = 0
        next_t = time.monotonic()
        while not self._stop.is_set():
            for g in self.handles:
                try:
                    r = self.session.sample(g)
                except Exception as exc:  # noqa: BLE001 - a failed read must not end the burn's trace
                    self.errors.append(str(exc).splitlines()[0])
                    continue
                self.traces.setdefault(g.index, []).append(
                    Sample(time.monotonic() - self._t0, r["sm_mhz"], r["mem_mhz"], r["power_w"], r["temp_c"],
                           r["mask"]))
                if tick % self.check_processes_every == 0:
                    others = [p for p in self.session.compute_processes(g) if p != me]
                    if others:
                        self.intruder[g.index] = others
            tick += 1
            next_t += self.period
            self._stop.wait(max(0.0, next_t - time.monotonic()))
