"""The circuit breaker: per pool, at most ``max_nodes`` nodes and at most ``max_pool_ratio`` of the pool's nodes
(never less than one) quarantined by the controller with a start inside the window. A fault that hits many
nodes at once (a bad driver roll-out, a fabric outage, a broken rule) is not the nodes' fault: beyond the
limit nothing more is touched, a metric and a log line say so, and a person decides.

Counted from the nodes themselves (their records, ownership.py), so a new leader sees what the last one did;
in dry-run, where nothing is recorded on nodes, from the would-be quarantines this process saw."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .config import Breaker


@dataclass(frozen=True)
class Verdict:
    pool: str
    quarantined: int     # nodes of the pool quarantined within the window
    limit: int
    pool_size: int

    @property
    def open(self) -> bool:
        return self.quarantined >= self.limit


def limit(cfg: Breaker, pool_size: int) -> int:
    return min(cfg.max_nodes, max(1, math.floor(cfg.max_pool_ratio * pool_size)))


def judge(cfg: Breaker, pool: str, pool_size: int, starts: list[float], now: float) -> Verdict:
    """``starts``: when each node of the pool now held was quarantined (wall clock)."""
    recent = sum(1 for t in starts if now - cfg.window_seconds <= t)
    return Verdict(pool, recent, limit(cfg, pool_size), pool_size)
