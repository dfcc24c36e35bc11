"""Which invasive probes are due out of schedule (fleetcanary.daemon.due): pure functions of the probes' newest
runs, their coverage and the clock."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleetcanary.daemon.due import Candidate, cheapest_first, due, held, is_due

NOW = 1_750_000_000.0
GPUS = [str(g) for g in range(8)]


def cand(name="gpu_bandwidth", interval=900.0, cost=10.0, **kw) -> Candidate:
    return Candidate(name, interval, cost, **kw)


def test_a_probe_that_never_succeeded_is_due():
    assert due([cand()], NOW, {}) == ["gpu_bandwidth"]


def test_a_probe_that_succeeded_within_its_interval_is_not_due_until_the_interval_has_passed():
    c = cand(last_success=NOW - 899.0)
    assert due([c], NOW, {}) == []
    assert due([c], NOW + 1.0, {}) == ["gpu_bandwidth"]  # at the interval: due


def test_a_probe_skipped_for_a_tenant_is_due_even_right_after_a_success():
    assert due([cand(last_success=NOW - 1.0, skipped_for_tenant=True)], NOW, {}) == ["gpu_bandwidth"]


def test_a_freed_gpu_the_probe_has_not_measured_within_its_interval_makes_it_due():
    c = cand(last_success=NOW - 60.0)
    measured = {(g, "gpu_bandwidth"): NOW - 60.0 for g in GPUS if g != "3"}
    assert due([c], NOW, measured) == []
    assert due([c], NOW, measured, freed={"1"}) == []                        # measured a minute ago
    assert due([c], NOW, measured, freed={"1", "3"}) == ["gpu_bandwidth"]    # GPU 3 never was
    assert due([cand(last_success=NOW - 60.0, per_gpu=False)], NOW, measured, freed={"3"}) == []  # per node


def test_due_probes_come_cheapest_first_and_ties_by_name():
    cands = [cand("gpu_sustained", cost=600.0), cand("gpu_p2p", cost=5.0), cand("gpu_compute", cost=5.0),
             cand("gpu_bandwidth", cost=20.0, last_success=NOW)]
    assert due(cands, NOW, {}) == ["gpu_compute", "gpu_p2p", "gpu_sustained"]


def test_a_claim_waits_for_the_tenant_to_have_held_the_probe_off_for_the_whole_wait():
    c = cand(last_success=NOW - 5000.0, skipped_for_tenant=True)
    assert held(c, NOW, {}, since=NOW - 4000.0, wait=3600.0)
    assert not held(c, NOW, {}, since=NOW - 100.0, wait=3600.0)                           # just started
    assert not held(c, NOW, {("2", "gpu_bandwidth"): NOW - 10.0}, since=0.0, wait=3600.0)  # a GPU measured
    assert not held(cand(last_success=0.0), NOW, {}, since=0.0, wait=3600.0)               # not skipped for a tenant
    assert held(c, NOW, {}, since=NOW, wait=3600.0, asked=lambda name: name == "gpu_bandwidth")  # asked: at once


# --- properties -----------------------------------------------------------------------------------------
times = st.floats(min_value=NOW - 7 * 86400, max_value=NOW, allow_nan=False)
candidates = st.lists(st.builds(
    Candidate, name=st.sampled_from(["gpu_bandwidth", "gpu_compute", "gpu_p2p", "gpu_sustained", "train_step"]),
    interval=st.floats(min_value=1.0, max_value=86400.0), cost=st.floats(min_value=0.0, max_value=3600.0),
    per_gpu=st.booleans(), last_success=st.one_of(st.none(), times), skipped_for_tenant=st.booleans()),
    max_size=5, unique_by=lambda c: c.name)
coverage = st.dictionaries(st.tuples(st.sampled_from(GPUS), st.sampled_from(
    ["gpu_bandwidth", "gpu_compute", "gpu_p2p", "gpu_sustained", "train_step"])), times, max_size=20)
freed_gpus = st.sets(st.sampled_from(GPUS), max_size=4)


@given(candidates, coverage, freed_gpus, st.integers(min_value=0, max_value=86400).map(float))
def test_due_is_the_candidates_that_are_due_in_cost_order(cands, measured, freed, later):
    got = due(cands, NOW, measured, freed)
    assert sorted(got) == sorted(c.name for c in cands if is_due(c, NOW, measured, freed))
    costs = {c.name: c.cost for c in cands}
    assert [costs[n] for n in got] == sorted(costs[n] for n in got)
    # never-run and tenant-skipped probes are always due
    assert {c.name for c in cands if c.last_success is None or c.skipped_for_tenant} <= set(got)
    # time only makes more probes due, and so does freeing more GPUs
    assert set(got) <= set(due(cands, NOW + later, measured, freed))
    assert set(due(cands, NOW, measured)) <= set(got)
    assert set(got) <= set(due(cands, NOW, measured, freed | {"7"}))


@given(candidates, coverage, times, st.integers(min_value=0, max_value=86400).map(float))
def test_a_held_probe_was_skipped_for_a_tenant_and_stays_held_as_time_goes_on(cands, measured, since, wait):
    got = cheapest_first(cands, lambda c: held(c, NOW, measured, since, wait))
    assert all(c.skipped_for_tenant for c in cands if c.name in got)
    later = cheapest_first(cands, lambda c: held(c, NOW + wait, measured, since, wait))
    assert set(got) <= set(later)
    # after the wait, every probe skipped for a tenant is held (nothing of it is newer than now)
    assert set(later) == {c.name for c in cands if c.skipped_for_tenant}
