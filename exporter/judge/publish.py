"""Which of a judged series' statistics the node publishes, beyond its median and its change: the newest runs'
best where the fleet's rules can act on it, the drift where it is near its alert (issue 42: 4 gauges for every
series were 444 of a node's 922 series, and most of them said "as usual").

Every series with a median publishes it, and every series with a baseline its change: the peers' medians, MADs
and node counts are taken over every node, so these two can never be left out where they say nothing new.

- newest (the best of the newest 3 runs): the fast path fires on it and the change path asks it to confirm a
  drop. Published where either could read it: while the series has no baseline (the fast path's level against
  the peers is all it has), where it is no better than the median (the newest runs are the worse side), and
  where the change, against either baseline, is past half the figure's change floor. Left out, the newest runs
  are better than the median and the change is near 1, where they could not confirm a drop (the node's change
  over its newest runs is then within half the floor of 1; the change path needs it a floor under the peers'
  median change, about 1) and the fast path, which fires on the newest runs being far worse than the peers'
  level, is not asked; a node whose level is far off while its change is near 1 (slow since its first day)
  publishes its newest runs whenever they are no better than its median, and the level path warns on its
  median all along.
- drift (the last day over the best day): published while its gap is past a quarter of the drift floor, and
  for the rules' hold gap after it last was, so the drift alert's hold (`last_over_time` over that gap) reads a
  value under half the floor before the series goes, never a stale one that keeps a resolved drift firing. A
  store just started (a restart: the drift a moment ago is not known) publishes every drift for that gap.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleetcanary.judge import figures as figmod

if TYPE_CHECKING:
    from fleetcanary.core.rulesettings import RuleSettings
    from fleetcanary.judge.stats import Stats

DRIFT_SHARE = 0.25   # drift is published while its gap is past this share of the drift floor
NEWEST_SHARE = 0.5   # the newest runs are published while the change's gap is past this share of the floor


def gap(fig: figmod.Figure, ratio: float) -> float:
    """How far worse a ratio (a change, a drift) is than 1: 1 - r, or r - 1 for a lower-is-better figure."""
    return 1.0 - ratio if fig.higher_is_better else ratio - 1.0


def show_newest(fig: figmod.Figure, st: Stats) -> bool:
    """The newest runs' best is published (module docstring)."""
    if st.newest is None:
        return False
    if st.change is None and st.previous_change is None:
        return True
    if st.median is None or fig.worse(st.newest, st.median) == st.newest:
        return True
    return any(c is not None and gap(fig, c) > NEWEST_SHARE * fig.floor for c in (st.change, st.previous_change))


@dataclass
class Policy:
    """The rule settings the judge's publishing follows (the exporter's `alerts` section): the drift floor, and
    how long the drift alert's hold reads back over a gap (0 without a hold)."""

    drift_floor: float
    hold_gap: float
    _drift_seen: dict[figmod.SeriesKey, float] = field(default_factory=dict, repr=False)
    _started: float | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: RuleSettings | None) -> Policy:
        from fleetcanary.core.rulesettings import RuleSettings, seconds

        s = settings if settings is not None else RuleSettings()
        return cls(drift_floor=s.drift_floor, hold_gap=float(seconds(s.hold_gap)) if s.hold else 0.0)

    def show_drift(self, key: figmod.SeriesKey, fig: figmod.Figure, drift: float | None, now: float) -> bool:
        """The drift of series `key` is published at `now` (module docstring); remembers when it was near."""
        if drift is None:
            return False
        if self._started is None:
            self._started = now
        if gap(fig, drift) > DRIFT_SHARE * self.drift_floor:
            self._drift_seen[key] = now
            return True
        return now - self._drift_seen.get(key, self._started) <= self.hold_gap
