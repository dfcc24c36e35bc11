"""The freshness rules (fleetcanary.judge.freshness), in their one place: how long a run's figures are
exported, when a judged series turns held, then stale; and the daemon's store and the judge's exposition
agree on them."""
from __future__ import annotations

import math
import time

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from fleetcanary.core.record import RunRecord
from fleetcanary.daemon.state import ResultStore
from fleetcanary.judge import freshness
from fleetcanary.judge.exposition import families
from fleetcanary.judge.freshness import FRESH_INTERVALS, HOLD_SECONDS, Freshness, expired, fresh_for, hold_for
from fleetcanary.judge.store import FigureStore
from fleetcanary.probes import PROBES

seconds = st.floats(min_value=0.0, max_value=10 * 86400.0, allow_nan=False)
intervals = st.one_of(st.none(), st.floats(min_value=1.0, max_value=10 * 86400.0, allow_nan=False))
timeouts = st.one_of(st.none(), seconds)
ORDER = {"baselined": 0, "held": 1, "stale": 2}


def test_a_run_is_fresh_for_one_and_a_half_intervals_plus_its_timeout():
    assert FRESH_INTERVALS == 1.5 and HOLD_SECONDS == 86400.0
    assert fresh_for(600.0, 120.0) == 1020.0
    assert fresh_for(600.0, None) == 900.0
    assert fresh_for(None, 120.0) == math.inf and fresh_for(0.0, 120.0) == math.inf  # no interval: for ever
    assert not expired(1020.0, 600.0, 120.0) and expired(1020.5, 600.0, 120.0)
    assert not expired(1e12, None, 120.0)


def test_a_judged_series_is_held_for_a_day_or_its_freshness_when_longer():
    assert hold_for(900.0, 300.0) == HOLD_SECONDS
    assert hold_for(None, None) == HOLD_SECONDS
    assert hold_for(2 * 86400.0, 600.0) == 3 * 86400.0 + 600.0  # a two-day probe: never held before it is late


def test_a_series_shows_its_own_state_then_held_then_stale():
    fresh, hold = fresh_for(900.0, 300.0), hold_for(900.0, 300.0)
    assert freshness.series_state("smoothed", fresh, hold, fresh) == "smoothed"   # at the bound: still fresh
    assert freshness.series_state("smoothed", fresh + 1, hold, fresh) == "held"
    assert freshness.series_state("smoothed", hold, hold, fresh) == "held"
    assert freshness.series_state("smoothed", hold + 1, hold, fresh) == "stale"
    assert freshness.series_state("warming", 10 * fresh, hold) == "warming"        # no freshness given: never held


def test_the_hold_ends_once_between_two_renders():
    assert freshness.hold_ended(last=0.0, hold=100.0, since=50.0, now=101.0)
    assert not freshness.hold_ended(last=0.0, hold=100.0, since=50.0, now=100.0)   # not over yet
    assert not freshness.hold_ended(last=0.0, hold=100.0, since=101.0, now=200.0)  # already rendered without it


@given(intervals, timeouts, seconds)
def test_figures_expire_exactly_when_their_series_stops_being_fresh(interval, timeout, age):
    fresh, hold = fresh_for(interval, timeout), hold_for(interval, timeout)
    state = freshness.series_state("baselined", age, hold, fresh)
    if interval:
        assert fresh <= hold  # a fresh run is never stale
        assert expired(age, interval, timeout) == (state != "baselined")
    else:  # no interval known: the figures stay, the series is never held, and stale after the day
        assert not expired(age, interval, timeout)
        assert state == ("stale" if age > hold else "baselined")


@given(intervals, timeouts, seconds, seconds)
def test_a_series_only_ages(interval, timeout, a, b):
    fresh, hold = fresh_for(interval, timeout), hold_for(interval, timeout)
    young, old = sorted((a, b))
    assert ORDER[freshness.series_state("baselined", young, hold, fresh)] <= \
        ORDER[freshness.series_state("baselined", old, hold, fresh)]


def test_a_probe_without_a_configured_interval_keeps_its_figures_and_is_held_a_day():
    f = Freshness({"gpu_bandwidth": 900.0}, {"gpu_bandwidth": 300.0})
    assert f.fresh("gpu_bandwidth") == 1650.0 and f.hold("gpu_bandwidth") == HOLD_SECONDS
    assert f.fresh("storage") == math.inf and f.hold("storage") == HOLD_SECONDS
    assert f.expired("gpu_bandwidth", 1651.0) and not f.expired("storage", 1e9)


def test_the_store_drops_figures_when_the_judge_turns_the_series_held(tmp_path):
    """The daemon's store and the judge's exposition read the same bound: the probe's gauges leave the
    exposition at the moment its judged series turn from their own state to held."""
    samples = [{"metric": "fleetcanary_host_memory_bandwidth_bytes_per_second", "labels": {"op": "copy"},
                "value": 5e10}]
    store = ResultStore(PROBES, ["host_memory_bandwidth"], judge=FigureStore(str(tmp_path)))
    store.set_enabled(["host_memory_bandwidth"], {"host_memory_bandwidth": 600.0}, {"host_memory_bandwidth": 60.0})
    finished = time.time() - 60
    store.apply(RunRecord("host_memory_bandwidth", "success", samples=samples, started_at=finished - 10,
                          wall_seconds=10, environment={"cpu_model": "EPYC"}))
    bound = store.judge_fresh("host_memory_bandwidth")
    assert bound == 960.0 and store.judge_hold("host_memory_bandwidth") == HOLD_SECONDS

    def seen(now: float) -> tuple[bool, set[str]]:
        store.expire(now=now)
        fams = {f.name: f for f in text_string_to_metric_families(store.exposition.decode())}
        gauge = "fleetcanary_host_memory_bandwidth_bytes_per_second" in fams and \
            bool(fams["fleetcanary_host_memory_bandwidth_bytes_per_second"].samples)
        states = {s.labels["state"] for f in families(store.judge, {"pool": ""}, now, store.judge_hold,
                                                      store.judge_fresh)
                  if f.name == "fleetcanary_judge_series" for s in f.samples}
        return gauge, states

    assert seen(finished + bound - 1) == (True, {"warming"})
    assert seen(finished + bound + 1) == (False, {"held"})
    assert seen(finished + HOLD_SECONDS + 1) == (False, {"stale"})
