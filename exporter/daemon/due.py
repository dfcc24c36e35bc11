"""Which invasive GPU probes are due for a run out of schedule: pure functions over plain data.

The daemon asks when a pod lets go of GPUs (daemon/service.py, run_opportunistic) and the claim asks which
probes a tenant has kept off the node (daemon/claim.py); both take the answer cheapest first, by the GPU
seconds a run is expected to cost, so the exclusive "gpu" class runs the short ones before a long one.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """An enabled invasive GPU probe as the rules see it."""

    name: str
    interval: float                 # its configured interval, seconds
    cost: float                     # the GPU seconds one run is expected to take: the order
    per_gpu: bool = True            # coverage per GPU (False: measured per node)
    last_success: float | None = None  # unix time of its newest successful run
    skipped_for_tenant: bool = False   # its newest run skipped because a tenant holds the GPUs


def cheapest_first(candidates: Iterable[Candidate], pred: Callable[[Candidate], bool]) -> list[str]:
    """The names of the candidates for which ``pred`` holds, cheapest first (ties by name)."""
    return [c.name for c in sorted((c for c in candidates if pred(c)), key=lambda c: (c.cost, c.name))]


def is_due(c: Candidate, now: float, last_measured: Mapping[tuple[str, str], float],
           freed: Iterable[str] = ()) -> bool:
    """Due: its newest run skipped for a tenant, no success within its interval, or (``freed``: GPU indices a
    pod just let go of) a freed GPU it has not measured within its interval (its runs measured the others
    while a tenant held that one). ``last_measured``: (gpu, probe) -> unix time (daemon/coverage.py)."""
    stale = c.last_success is None or now - c.last_success >= c.interval
    unmeasured = c.per_gpu and any(now - last_measured.get((g, c.name), 0.0) >= c.interval for g in freed)
    return c.skipped_for_tenant or stale or unmeasured


def due(candidates: Iterable[Candidate], now: float, last_measured: Mapping[tuple[str, str], float],
        freed: Iterable[str] | None = None) -> list[str]:
    """The names of the due candidates (``is_due``), cheapest first."""
    freed = tuple(freed or ())
    return cheapest_first(candidates, lambda c: is_due(c, now, last_measured, freed))


def held(c: Candidate, now: float, last_measured: Mapping[tuple[str, str], float], since: float, wait: float,
         asked: Callable[[str], bool] = lambda name: False) -> bool:
    """Kept off the node by a tenant (what a claim answers, daemon/claim.py): its newest run skipped for a
    tenant, and for ``wait`` seconds no success, no GPU measured and no start of this exporter (``since``);
    or at once when ``asked(name)``: a requested run (POST /confirm) waits on it."""
    if not c.skipped_for_tenant:
        return False
    if asked(c.name):
        return True
    measured = [ts for (_, p), ts in last_measured.items() if p == c.name]
    return now - max([since, c.last_success or 0.0, *measured]) >= wait
