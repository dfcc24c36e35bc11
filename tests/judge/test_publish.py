"""What the judge leaves out of its exposition (fleetcanary.judge.publish): the newest runs where no rule could
act on them, a drift far from its alert, and a judged figure's gauge once its median stands in for it."""
from __future__ import annotations

import pytest

from fleetcanary.core.rulesettings import RuleSettings
from fleetcanary.judge import figures as figmod
from fleetcanary.judge.publish import Policy, show_newest
from fleetcanary.judge.stats import Stats

BW = figmod.BY_KEY["gpu_memory_bandwidth"]            # higher is better, change floor 2.5%
FIRST_BYTE = figmod.BY_KEY["storage_first_byte"]      # lower is better, floor 10%
KEY = ("gpu_memory_bandwidth", "d2d", "0")


def stats(median=100.0, newest=101.0, change=1.0, previous=None, drift=None) -> Stats:
    return Stats(driver="570", runs=20, last=0.0, median=median, newest=newest, change=change,
                 previous_change=previous, drift=drift)


@pytest.mark.parametrize(("fig", "st", "shown", "why"), [
    (BW, stats(newest=101.0, change=1.0), False, "better than the median, change at 1"),
    (BW, stats(newest=101.0, change=0.99), False, "a 1% drop: within half of the 2.5% floor"),
    (BW, stats(newest=101.0, change=0.985), True, "a 1.5% drop: past half the floor"),
    (BW, stats(newest=99.0, change=1.0), True, "no better than the median"),
    (BW, stats(newest=100.0, change=1.0), True, "equal to the median"),
    (BW, stats(newest=101.0, change=None), True, "no baseline: the fast path has only the level"),
    (BW, stats(newest=101.0, change=None, previous=0.9), True, "a new driver's drop against the previous one"),
    (BW, stats(newest=101.0, change=1.0, previous=0.999), False, "both baselines near 1"),
    (BW, stats(newest=None), False, "no newest runs"),
    (FIRST_BYTE, stats(newest=99.0, change=1.0), False, "lower is better: the newest faster than the median"),
    (FIRST_BYTE, stats(newest=101.0, change=1.0), True, "lower is better: the newest slower"),
    (FIRST_BYTE, stats(newest=99.0, change=1.06), True, "lower is better: 6% slower, past half of 10%"),
])
def test_the_newest_runs_are_published_where_a_rule_could_act_on_them(fig, st, shown, why):
    assert show_newest(fig, st) is shown, why


def test_a_drift_is_published_near_its_alert_and_for_the_hold_gap_after():
    p = Policy.from_settings(RuleSettings(drift_floor=0.04, hold_gap="6h"))
    assert (p.drift_floor, p.hold_gap) == (0.04, 6 * 3600.0)
    t0 = 1_000_000.0
    # a store just started publishes every drift for the hold gap: the last one Prometheus has may be near
    assert p.show_drift(KEY, BW, 1.0, t0) and p.show_drift(KEY, BW, 1.0, t0 + 6 * 3600)
    assert not p.show_drift(KEY, BW, 1.0, t0 + 6 * 3600 + 1)
    assert not p.show_drift(KEY, BW, 0.991, t0 + 7 * 3600)       # 0.9%: under a quarter of 4%
    assert p.show_drift(KEY, BW, 0.989, t0 + 8 * 3600)           # 1.1%: past it
    assert p.show_drift(KEY, BW, 1.0, t0 + 14 * 3600)            # back at 1, within 6 h of the last near one
    assert not p.show_drift(KEY, BW, 1.0, t0 + 14 * 3600 + 1)
    assert not p.show_drift(KEY, BW, None, t0 + 9 * 3600)
    assert p.show_drift(KEY, BW, 1.02, t0 + 15 * 3600) is False  # better than the best day: not a drift
    assert Policy.from_settings(RuleSettings(hold=False)).hold_gap == 0.0


def test_the_drift_window_is_kept_per_series():
    p = Policy.from_settings(None)
    other = ("gpu_memory_bandwidth", "d2d", "1")
    t0 = 0.0
    assert p.show_drift(KEY, BW, 1.0, t0)
    assert p.show_drift(KEY, BW, 0.95, t0 + 7 * 3600)
    assert not p.show_drift(other, BW, 1.0, t0 + 7 * 3600)
    assert p.show_drift(KEY, BW, 1.0, t0 + 8 * 3600)
