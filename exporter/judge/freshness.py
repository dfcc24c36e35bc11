"""How long a run counts: the freshness rules of the node's figures and of the judge's series, in one place.

A probe's newest run is *fresh* for FRESH_INTERVALS of its interval plus its timeout after it finished: the
next run is due after one interval (+ up to 10% jitter by default) and may take up to its timeout, or wait
behind another exclusive GPU probe; half an interval more absorbs that. While fresh, the probe's figures are
exported (daemon/state.py drops them after) and a judged series shows its own state (warming, smoothed,
baselined). After that the series is *held*: its statistics stay published, for HOLD_SECONDS after its newest
run (a tenant may keep the GPU for hours), then it is *stale* and nothing of it is published.
"""
from __future__ import annotations

FRESH_INTERVALS = 1.5
HOLD_SECONDS = 86400.0  # statistics stay published this long after the series' newest run


def fresh_for(interval: float | None, timeout: float | None) -> float:
    """Seconds a probe's newest run counts as fresh; without a known interval, for ever."""
    return FRESH_INTERVALS * interval + (timeout or 0.0) if interval else float("inf")


def hold_for(interval: float | None, timeout: float | None) -> float:
    """Seconds a judged series' statistics stay published after the probe's newest run: a day, and never
    less than the run's freshness."""
    return max(HOLD_SECONDS, FRESH_INTERVALS * (interval or 0.0) + (timeout or 0.0))


def expired(age: float, interval: float | None, timeout: float | None) -> bool:
    """A run's figures, ``age`` seconds after it finished, are past their freshness (no longer exported)."""
    return age > fresh_for(interval, timeout)


def series_state(state: str, age: float, hold: float, fresh: float = float("inf")) -> str:
    """What a judged series shows ``age`` seconds after its newest run: its own ``state`` while the run is
    fresh, "held" once it is not, "stale" once the hold is over."""
    if age > hold:
        return "stale"
    if age > fresh:
        return "held"
    return state


def hold_ended(last: float, hold: float, since: float, now: float) -> bool:
    """A series whose newest run finished at ``last`` passed its hold after ``since`` and by ``now``."""
    return since <= last + hold < now


class Freshness:
    """The bounds of each probe from its configured interval and timeout (seconds; a probe not listed has
    none: fresh for ever, held for HOLD_SECONDS)."""

    def __init__(self, intervals: dict[str, float] | None = None, timeouts: dict[str, float] | None = None) -> None:
        self.intervals = dict(intervals or {})
        self.timeouts = dict(timeouts or {})

    def fresh(self, probe: str) -> float:
        return fresh_for(self.intervals.get(probe), self.timeouts.get(probe))

    def hold(self, probe: str) -> float:
        return hold_for(self.intervals.get(probe), self.timeouts.get(probe))

    def expired(self, probe: str, age: float) -> bool:
        return expired(age, self.intervals.get(probe), self.timeouts.get(probe))
