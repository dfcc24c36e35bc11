"""The fabric schedule: a circle-method round robin every member computes alone."""
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcanary.probes.fabric import schedule


def names(n):
    return [f"node-{i:03d}" for i in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 13, 16])
def test_every_pair_meets_exactly_once_per_tournament(n):
    members = names(n)
    met = []
    for r in range(schedule.rounds(n)):
        rnd = schedule.pairs(members, r)
        seen = [x for p in rnd for x in p if x is not None]
        assert sorted(seen) == members, f"round {r}: each member appears once"
        met += [p for p in rnd if p[1] is not None]
    assert sorted(met) == sorted(itertools.combinations(members, 2))


@pytest.mark.parametrize("n", [3, 5, 7])
def test_odd_fleets_give_each_member_one_bye_per_tournament(n):
    members = names(n)
    byes = [p[0] for r in range(schedule.rounds(n)) for p in schedule.pairs(members, r) if p[1] is None]
    assert sorted(byes) == members


def test_the_schedule_is_symmetric_and_hosted_by_the_lower_name():
    members = names(6)
    t0 = 1_700_000_000.0
    for k in range(10):
        t = t0 + k * 300
        for me in members:
            m = schedule.meeting(members, me, t, 300)
            other = schedule.meeting(members, m.partner, t, 300)
            assert other.partner == me and other.slot == m.slot and other.round == m.round
            assert m.host == min(me, m.partner) == other.host
            assert m.i_host != other.i_host


def test_the_slot_comes_from_the_wall_clock_and_the_order_of_the_list_does_not_matter():
    a = schedule.meeting(["c", "a", "b", "d"], "a", 3000.0, 300)
    b = schedule.meeting(["d", "b", "a", "c", "a"], "a", 3299.9, 300)
    assert a == b and a.slot == 10 and a.round == 10 % 3
    assert schedule.meeting(["a", "b", "c", "d"], "a", 3300.0, 300).slot == 11


def test_consecutive_slots_cover_every_partner():
    members = names(8)
    partners = {schedule.meeting(members, "node-003", 1e9 + s * 60, 60).partner for s in range(7)}
    assert partners == set(members) - {"node-003"}


def test_a_member_joining_or_leaving_changes_the_schedule_for_everyone_the_same_way():
    before, after = names(4), names(5)
    for t in (0.0, 300.0, 600.0, 900.0):
        views = {me: schedule.meeting(after, me, t, 300) for me in after}
        for me, m in views.items():
            if m.partner is not None:
                assert views[m.partner].partner == me
        # the schedule of the old member list is still consistent on its own
        old = {me: schedule.meeting(before, me, t, 300) for me in before}
        assert all(old[m.partner].partner == me for me, m in old.items())
    assert [schedule.pairs(before, r) for r in range(3)] != [schedule.pairs(after, r) for r in range(3)]


def test_one_member_or_a_stranger():
    assert schedule.meeting(["solo"], "solo", 10.0, 300).partner is None
    with pytest.raises(KeyError):
        schedule.meeting(["a", "b"], "c", 10.0, 300)


@settings(max_examples=60, deadline=None)
@given(st.sets(st.text(alphabet="abcdefgh-0123456789", min_size=1, max_size=6), min_size=2, max_size=20),
       st.integers(min_value=0, max_value=10**7))
def test_any_member_set_meets_all_pairs_within_one_tournament(members, start):
    members = sorted(members)
    n = len(members)
    met = set()
    for s in range(start, start + schedule.rounds(n)):
        for me in members:
            m = schedule.meeting(members, me, s * 10.0, 10)
            if m.partner is not None:
                assert schedule.meeting(members, m.partner, s * 10.0, 10).partner == me
                met.add((m.host, max(me, m.partner)))
    assert len(met) == n * (n - 1) // 2
