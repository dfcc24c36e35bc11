"""Two real daemons on loopback with the fabric probe: the slot-aligned schedule starts both
sides together, they meet, and each publishes the pair's figures and its partner; the
secret appears in neither /metrics, /results nor the logs.

The slot is sized from what this machine measures (tests/support/realtime.py), and the wait for the
first meeting ends on the daemons' own records: a meeting, or ATTEMPTS slots in which both ran and
did not meet. The daemons start at any moment of a slot, so the first slot may find one alone."""
import pytest

from fleetcanary.probes import PROBES
from tests.support.daemon import Daemon
from tests.support.helpers import free_port, metric_value, wait_for
from tests.support.realtime import Meetings, SlotPlan

SECRET = "daemon-pair-secret-5c0ffee5c0ffee"
NAMES = ["node-a", "node-b"]
SWEEP_SECONDS = 3.0         # 2 sizes x 2 collectives and 5 ping-pongs of 1 MiB on loopback, the process group
ATTEMPTS = 3
HANG_SLOTS = 20             # only a hang reaches it: the records end a failing wait first


def config(me, ports, plan: SlotPlan):
    off = {n: {"enabled": False} for n in PROBES if n != "fabric"}
    return {"node_name": me, "kubernetes": {"mode": "off"}, "worker_kill_grace_seconds": plan.kill_grace,
            "probes": {**off, "fabric": {"enabled": True, "interval_seconds": plan.slot,
                                         "timeout_seconds": plan.timeout, "params": {
                "members": [{"name": "node-a", "address": f"127.0.0.1:{ports[0]}"},
                            {"name": "node-b", "address": f"127.0.0.1:{ports[1]}"}],
                "backend": "gloo", "slot_seconds": plan.slot, "meet_offset_seconds": plan.meet_offset,
                "rendezvous_wait_seconds": plan.wait, "sizes_bytes": [8, 4096], "sendrecv_bytes": 1 << 20,
                "iterations": 3}}}}


@pytest.mark.long
def test_two_daemons_meet_on_the_slot_grid(tmp_path):
    ports = (free_port(), free_port())
    plan = SlotPlan.measure(workers=len(NAMES), sweep_seconds=SWEEP_SECONDS)
    daemons = {}
    try:
        for me in ("node-a", "node-b"):
            daemons[me] = Daemon(tmp_path / me, config(me, ports, plan), env={"FLEETCANARY_FABRIC_SECRET": SECRET})
        meetings = Meetings(daemons, NAMES, plan)
        met = wait_for(lambda: meetings.all_pairs_met([tuple(NAMES)], ATTEMPTS), timeout=HANG_SLOTS * plan.slot,
                       interval=0.5, what=f"the pair's first meeting (slots of {plan})")
        assert all(meetings.partner_in("node-a", s) == "node-b" for s in met[frozenset(NAMES)])

        def published(me):   # the success is in the history; /metrics follows from the same record
            code, _, body = daemons[me].get("/metrics")
            text = body.decode()
            return code == 200 and (metric_value(text, "fleetcanary_probe_runs_total", probe="fabric",
                                                 outcome="success") or 0) >= 1 and text
        texts = {me: wait_for(lambda me=me: published(me), timeout=60, interval=0.2, what=f"{me}'s published pair")
                 for me in ("node-a", "node-b")}
        assert metric_value(texts["node-a"], "fleetcanary_fabric_last_partner_info", partner="node-b") == 1
        assert metric_value(texts["node-b"], "fleetcanary_fabric_last_partner_info", partner="node-a") == 1
        for me in ("node-a", "node-b"):
            assert metric_value(texts[me], "fleetcanary_fabric_sendrecv_bandwidth_bytes_per_second",
                                backend="gloo") > 0
            assert metric_value(texts[me], "fleetcanary_fabric_pair_slot_timestamp_seconds") % plan.slot == 0
            _, _, results = daemons[me].get("/results")
            assert SECRET not in texts[me] and SECRET not in results.decode()
    finally:
        for d in daemons.values():
            d.stop()
    for me in ("node-a", "node-b"):
        assert SECRET not in daemons[me].log()
