"""Experimental changes to the exporter's judge, applied by run.py --judge-variant before any node is judged:
the measurement of a proposed change, without editing the exporter. The variant is part of the fleet's cache key."""
from __future__ import annotations


def _confirm_median3() -> None:
    """The confirmed figure (change's numerator) as the better of the median of 5 and the median of the newest 3
    runs (the judge: the best of the newest 3), so one good run among bad ones is no recovery. The published
    `newest` (the fast path's) stays the best of 3."""
    import dataclasses
    import statistics

    from fleetcanary.judge import stats

    orig = stats.Series.stats

    def patched(self):
        st = orig(self)
        if st is None or st.median is None or len(self.tail) < stats.NEWEST_RUNS or not self.fig.history:
            return st
        confirmed = self.fig.better(st.median, statistics.median(list(self.tail)[-stats.NEWEST_RUNS:]))
        kw = {}
        if st.baseline is not None:
            kw["change"] = confirmed / st.baseline
        if st.previous_baseline is not None:
            kw["previous_change"] = confirmed / st.previous_baseline
        return dataclasses.replace(st, **kw)

    stats.Series.stats = patched


VARIANTS = {"confirm-median3": _confirm_median3}
