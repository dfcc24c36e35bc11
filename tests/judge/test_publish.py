"""What the judge leaves out of its exposition (fleetcanary.judge.publish): the newest runs where no rule could
act on them, a drift far from its alert, and a judged figure's gauge once its median stands in for it."""
from __future__ import annotations

import time

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


def test_the_judges_median_stands_in_for_a_judged_figures_gauge_once_it_has_one():
    """The daemon's exposition: each run's gauge of a judged figure until the judge has the series' median, then
    the median alone (one series, not two); the P2P matrix of gpu_p2p's `pairs` stays (it says which link)."""
    import random

    from prometheus_client.parser import text_string_to_metric_families

    from fleetcanary.daemon.collector import render
    from fleetcanary.daemon.state import ResultStore
    from fleetcanary.judge.store import FigureStore
    from fleetcanary.probes import PROBES
    from tests.judge.test_store import record

    rng = random.Random(4)
    store = ResultStore(PROBES, ["host_memory_bandwidth", "gpu_p2p"], judge=FigureStore(None))
    store.set_enabled(["host_memory_bandwidth", "gpu_p2p"], {"host_memory_bandwidth": 600, "gpu_p2p": 600},
                      {"host_memory_bandwidth": 60, "gpu_p2p": 60})

    def exposed() -> dict[str, int]:
        out: dict[str, int] = {}
        for fam in text_string_to_metric_families(render(store).decode()):
            for s in fam.samples:
                out[s.name] = out.get(s.name, 0) + 1
        return out

    host, p2p = "fleetcanary_host_memory_bandwidth_bytes_per_second", "fleetcanary_gpu_p2p_bandwidth_bytes_per_second"
    now = time.time()
    for k in range(7):
        for probe in ("host_memory_bandwidth", "gpu_p2p"):
            store.apply(record(probe, now - (7 - k) * 600, rng))
        seen = exposed()
        if k < 6:  # warming: each run's gauge, no median yet
            assert seen[host] == 3 and "fleetcanary_judge_median" not in seen, (k, seen.get(host))
    assert seen.get(host, 0) == 0 and seen[p2p] == 56
    assert seen["fleetcanary_judge_median"] == 3 + 8  # host: 3 ops; P2P: each source GPU's slowest link



def test_the_default_p2p_gauge_each_source_gpus_slowest_link_gives_way_to_its_median_a_matrix_cell_does_not():
    """gpu_p2p without `pairs` publishes each source GPU's slowest link with dst_gpu empty: the judged figure
    itself, so its median stands in for it; a matrix cell (dst_gpu set) and the daily burn's ratio stay."""
    from fleetcanary.judge import figures as figmod

    p2p = "fleetcanary_gpu_p2p_bandwidth_bytes_per_second"
    assert figmod.stood_in_key(p2p, {"src_gpu": "3", "dst_gpu": ""}) == ("gpu_p2p_bandwidth", "slowest_link", "3")
    assert figmod.stood_in_key(p2p, {"src_gpu": "3"}) == ("gpu_p2p_bandwidth", "slowest_link", "3")
    assert figmod.stood_in_key(p2p, {"src_gpu": "3", "dst_gpu": "5"}) is None
    assert figmod.stood_in_key("fleetcanary_gpu_sustained_throughput_ratio", {"gpu": "0"}) is None
    assert figmod.stood_in_key("fleetcanary_gpu_matmul_flops_per_second", {"gpu": "0", "dtype": "bf16"}) == (
        "gpu_matmul_throughput", "bf16", "0")
    assert figmod.stood_in_key("fleetcanary_gpus_visible", {}) is None
