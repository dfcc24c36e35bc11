"""Tests whose parts must run in real time (daemons meeting on a wall-clock slot grid) without
a verdict that depends on the machine's speed or load.

``SlotPlan.measure``: the fabric probe's slot, meeting window and deadline sized from what this
machine measures now (the wall time of the workers' imports and torch imports, started together as
the daemons start them, under the current load), instead of constants tuned on one machine. A fast
machine gets short slots (a fast test); a loaded one gets the room it needs.

The other half is how such tests wait: ``helpers.wait_for`` with a predicate that raises
``StopWaiting`` on *evidence* read from what the daemons recorded (so many attempts made and
failed), so that its timeout only bounds a hang and can be generous.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from .helpers import StopWaiting

WORKER_IMPORTS = "import fleetcanary.runner.worker, fleetcanary.probes.fabric.probe"
TORCH_IMPORTS = "import torch, torch.distributed"


def wall_together(code: str, workers: int) -> float:
    """The longest wall time of ``workers`` copies of ``python -I -c code`` started together, as the daemons
    start their workers at a slot's start: what the fleet's workers will meet, beside whatever else the
    machine runs at the moment. (Where the files are not in the page cache yet, the first reads count too: a
    longer slot, never a shorter one.)"""
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-I", "-c", code], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(workers)]
    worst = 0.0
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise RuntimeError(f"python -I -c {code!r} exited {p.returncode}")
        worst = max(worst, time.monotonic() - t0)
    return worst


@dataclass(frozen=True)
class SlotPlan:
    """The fabric probe's timing for a test fleet; every length in whole seconds."""

    slot: int                 # slot_seconds and the probe's interval_seconds
    meet_offset: int          # meet_offset_seconds
    wait: int                 # rendezvous_wait_seconds
    timeout: int              # the probe's timeout_seconds (its deadline), < slot
    kill_grace: int           # worker_kill_grace_seconds
    measured: dict = field(default_factory=dict, compare=False)   # what the plan was derived from

    @classmethod
    def measure(cls, workers: int, sweep_seconds: float, safety: float = 1.5, kill_grace: int = 2) -> SlotPlan:
        """``workers`` start together at every slot start: their imports and torch imports are measured that
        way (``wall_together``), under the load of the moment, and scaled by ``safety``. The meeting window holds
        the workers' start; the deadline adds their torch import and the sweep (``sweep_seconds``: its transfers
        at the test's link rate, the process group, the result); the slot adds the kill grace.

        (It was one process alone, its worst of two, times a contention factor from the 1-minute load average,
        and a safety of 2. At the start of `make test` the load average still showed the idle minute before
        while six test workers started at once: a torch import alone took 9.3 s, the factor said 1.5 more, and
        the slot came out at 59 s for runs that took 5-7.6 s. Measured together at that moment, four imports
        took 12 s; with a safety of 1.5 the deadline is still 4 times what the runs took.)"""
        start, torch = wall_together(WORKER_IMPORTS, workers), wall_together(TORCH_IMPORTS, workers)
        meet_offset = max(2, math.ceil(safety * start))
        wait = max(4, meet_offset)
        timeout = meet_offset + wait + math.ceil(safety * torch + sweep_seconds)
        slot = timeout + kill_grace + 2
        return cls(slot, meet_offset, wait, timeout, kill_grace,
                   {"worker_imports_s": round(start, 2), "torch_import_s": round(torch, 2),
                    "load1": round(os.getloadavg()[0], 1)})

    def window_end(self, slot_index: int) -> int:
        """Unix time at which the meeting window of slot ``slot_index`` closes."""
        return slot_index * self.slot + self.meet_offset + self.wait


class Meetings:
    """The fabric runs a set of daemons recorded (their results.jsonl), read by slot: who met whom, and
    which scheduled meetings both sides attempted. ``daemons`` maps member name to anything with
    ``history()`` (tests.support.daemon.Daemon); it is read live, so a restarted daemon may replace its
    entry (same state_dir, so the same history)."""

    def __init__(self, daemons: dict, names: list[str], plan: SlotPlan) -> None:
        from fleetcanary.probes.fabric import schedule

        self._schedule = schedule
        self.daemons, self.names, self.plan = daemons, sorted(names), plan
        self.created = time.time()

    def slot_of(self, rec: dict) -> int:
        """The slot a run belonged to: the daemon starts the fabric probe on the slot grid."""
        return round(rec["started_at"] / self.plan.slot)

    def partner_in(self, name: str, slot: int) -> str | None:
        return self._schedule.meeting(self.names, name, slot * self.plan.slot, self.plan.slot).partner

    def runs(self, name: str, slot: int | None = None) -> list[dict]:
        out = [r for r in self.daemons[name].history() if r.get("probe") == "fabric"]
        return out if slot is None else [r for r in out if self.slot_of(r) == slot]

    def met(self) -> dict[frozenset, set[int]]:
        """Pairs that met: both sides recorded a success in the same slot, each naming the other."""
        seen: dict[tuple[str, int], str] = {}
        for name in self.names:
            for r in self.runs(name):
                if r["outcome"] == "success":
                    seen[(name, r["result"]["extra"]["slot"])] = r["result"]["extra"]["partner"]
        out: dict[frozenset, set[int]] = {}
        for (name, slot), partner in seen.items():
            if seen.get((partner, slot)) == name:
                out.setdefault(frozenset((name, partner)), set()).add(slot)
        return out

    def tried(self, a: str, b: str) -> list[int]:
        """Slots in which the schedule paired a and b and both recorded a run (whatever its outcome)."""
        slots_a = {self.slot_of(r) for r in self.runs(a)}
        slots_b = {self.slot_of(r) for r in self.runs(b)}
        return sorted(s for s in slots_a & slots_b if self.partner_in(a, s) == b)

    def describe(self, a: str, b: str, slots: list[int]) -> str:
        parts = []
        for s in slots:
            for n in (a, b):
                for r in self.runs(n, s):
                    parts.append(f"slot {s} {n}: {r['outcome']} {r['reason']} {r['detail'][:160]!r} "
                                 f"(ran {r['wall_seconds']:.1f}s)")
        return "; ".join(parts)

    def stalled(self, slots: int = 3) -> str | None:
        """Why waiting on runs is pointless: no daemon recorded a fabric run for ``slots`` slots."""
        ends = [r["started_at"] + r["wall_seconds"] for n in self.names if n in self.daemons for r in self.runs(n)]
        last = max(ends, default=self.created)
        if time.time() - last > slots * self.plan.slot + self.plan.timeout:
            return f"no daemon recorded a fabric run for {time.time() - last:.0f}s ({slots} slots of {self.plan.slot}s)"
        return None

    def all_pairs_met(self, pairs: list[tuple[str, str]], attempts: int):
        """A wait_for predicate: the met pairs once every one of ``pairs`` met; StopWaiting once one of them
        was scheduled in ``attempts`` slots in which both sides ran, and never met (the evidence that it
        will not), or once the daemons stopped running the probe."""
        met = self.met()
        if all(frozenset(p) in met for p in pairs):
            return met
        for a, b in pairs:
            if frozenset((a, b)) in met:
                continue
            tried = self.tried(a, b)
            if len(tried) >= attempts:
                raise StopWaiting(f"{a} and {b} did not meet in the {len(tried)} slots the schedule gave them and both "
                                  f"ran: {self.describe(a, b, tried)}")
        why = self.stalled()
        if why:
            raise StopWaiting(why)
        return None

    def met_again(self, pairs: list[tuple[str, str]], since: float, times: int) -> bool:
        """Every one of ``pairs`` met ``times`` more times in slots that started after ``since`` (unix time)."""
        met = self.met()
        first = math.ceil(since / self.plan.slot)
        return all(len([s for s in met.get(frozenset(p), ()) if s >= first]) >= times for p in pairs)
