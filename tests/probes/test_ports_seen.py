"""The node's memory of its RDMA ports (probes/lib/ports_seen): properties over any memory, clock and ports."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleetcanary.probes.lib import ports_seen as ps

PORTS = st.sampled_from([f"mlx5_{i}/1" for i in range(12)])
TIMES = st.floats(min_value=0, max_value=4e9, allow_nan=False)


@given(st.dictionaries(PORTS, TIMES), st.lists(PORTS), TIMES)
def test_the_memory_holds_only_the_last_day_never_the_future_and_every_port_up_now(seen, up, now):
    out, changed = ps.update(seen, up, now)
    assert all(now - ps.WINDOW <= t <= now for t in out.values())
    assert all(ps.recently_up(out, k, now) for k in up)
    assert len(out) <= ps.MAX_PORTS
    assert changed or out == seen


@given(st.dictionaries(PORTS, TIMES), TIMES, st.floats(min_value=1, max_value=1e9))
def test_a_clock_stepped_back_remembers_a_port_one_day_of_the_new_clock_not_longer(seen, now, back):
    """Times in the clock's future count as now: a port up before the step stays remembered one window."""
    stepped = max(0.0, now - back)
    out, _ = ps.update({**seen, "mlx5_0/1": now}, [], stepped)
    assert ps.recently_up(out, "mlx5_0/1", stepped)
    later, _ = ps.update(out, [], stepped + ps.WINDOW + 1)
    assert not ps.recently_up(later, "mlx5_0/1", stepped + ps.WINDOW + 1)


def test_ports_up_are_rewritten_every_refresh_not_every_run():
    seen, changed = ps.update({}, ["mlx5_0/1"], 1000.0)
    assert changed and seen == {"mlx5_0/1": 1000.0}
    assert ps.update(seen, ["mlx5_0/1"], 1000.0 + ps.REFRESH) == (seen, False)
    assert ps.update(seen, ["mlx5_0/1"], 1001.0 + ps.REFRESH) == ({"mlx5_0/1": 1001.0 + ps.REFRESH}, True)


def test_the_memory_is_bounded_keeping_the_newest():
    seen = {f"d{i}/1": float(i) for i in range(ps.MAX_PORTS + 10)}
    out, changed = ps.update(seen, [], float(ps.MAX_PORTS + 10))
    assert changed and len(out) == ps.MAX_PORTS and "d0/1" not in out and f"d{ps.MAX_PORTS + 9}/1" in out
