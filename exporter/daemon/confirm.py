"""Confirmation runs: one extra run soon after a run whose figure jumped.

The alerts' fast path (alerts/build.py, fast_alert) fires on a large drop only when the
best of a series' newest three runs is low (fleetcanary_judge_newest): the run that showed it,
a confirmation run ``confirm_delay_seconds`` later, and the next scheduled run. Two runs
cannot tell a fault from two junk runs in a row (a job that started during the probe, a noisy
neighbour): on the 195-node detection fleet with 0.5%
junk runs, pairs of agreeing junk runs were the fast path's only false alerts. A third run
makes that chance the cube of the junk rate instead of its square, and because the
confirmation comes minutes after the first run, not an interval, the fast path still fires
within about one probe interval of the first degraded run.

A run asks for a confirmation when one of its probe's ``confirm_metrics`` (the gauges a fast
path judges) moved by ``confirm_change`` or more, either way, from the median of that
series' previous ``HISTORY`` figures. A confirmation run never asks for another, so a fault
costs one extra run, and a series needs HISTORY figures before it can ask (a new exporter's
first runs never do). Nagios users know the pattern as a soft state and its retry interval.
"""
from __future__ import annotations

import statistics
import threading
from collections import defaultdict, deque

from fleetcanary.core.record import RunRecord

HISTORY = 3                 # previous figures of a series whose median a new figure is compared with
SERIES_LIMIT = 4096         # series remembered per probe (a probe with more only checks the first ones)


class Confirmer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, dict[tuple, deque[float]]] = defaultdict(dict)

    def jumped(self, out: RunRecord, metrics: tuple[str, ...], change: float) -> str:
        """Record the figures of a successful run and say which series jumped ("" if none).
        ``out.trigger == "confirmation"`` records without asking for another run."""
        if out.outcome != "success" or not metrics:
            return ""
        found = ""
        with self._lock:
            seen = self._seen[out.probe]
            for s in out.samples:
                name = s.get("metric")
                if name not in metrics:
                    continue
                try:
                    value = float(s["value"])
                except (KeyError, TypeError, ValueError):
                    continue
                if value != value or value in (float("inf"), float("-inf")):
                    continue
                key = (name, tuple(sorted((str(k), str(v)) for k, v in (s.get("labels") or {}).items())))
                past = seen.get(key)
                if past is None:
                    if len(seen) >= SERIES_LIMIT:
                        continue
                    past = seen[key] = deque(maxlen=HISTORY)
                if change > 0 and out.trigger != "confirmation" and not found and len(past) == HISTORY:
                    ref = statistics.median(past)
                    if ref > 0 and abs(value / ref - 1.0) >= change:
                        labels = ",".join(f"{k}={v}" for k, v in key[1])
                        found = (f"{name}{{{labels}}} {value / ref - 1.0:+.0%} "
                                 f"against the median of its last {HISTORY} runs")
                past.append(value)
        return found
