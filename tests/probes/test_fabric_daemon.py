"""Two real daemons on loopback with the fabric probe: the slot-aligned schedule starts both
sides together, they meet, and each publishes the pair's figures and its partner; the
secret appears in neither /metrics, /results nor the logs."""
from fleetcanary.probes import PROBES
from tests.support.daemon import Daemon
from tests.support.helpers import free_port, metric_value, wait_for

SECRET = "daemon-pair-secret-5c0ffee5c0ffee"


def config(me, ports):
    off = {n: {"enabled": False} for n in PROBES if n != "fabric"}
    return {"node_name": me, "kubernetes": {"mode": "off"},
            "probes": {**off, "fabric": {"enabled": True, "interval_seconds": 30, "timeout_seconds": 28, "params": {
                "members": [{"name": "node-a", "address": f"127.0.0.1:{ports[0]}"},
                            {"name": "node-b", "address": f"127.0.0.1:{ports[1]}"}],
                "backend": "gloo", "slot_seconds": 30, "meet_offset_seconds": 10, "rendezvous_wait_seconds": 8,
                "sizes_bytes": [8, 4096], "sendrecv_bytes": 1 << 20, "iterations": 3}}}}


def test_two_daemons_meet_on_the_slot_grid(tmp_path):
    ports = (free_port(), free_port())
    daemons = {}
    try:
        for me in ("node-a", "node-b"):
            daemons[me] = Daemon(tmp_path / me, config(me, ports), env={"FLEETCANARY_FABRIC_SECRET": SECRET})

        def met(me):
            code, _, body = daemons[me].get("/metrics")
            text = body.decode()
            return code == 200 and (metric_value(text, "fleetcanary_probe_runs_total", probe="fabric",
                                                 outcome="success") or 0) >= 1 and text
        texts = {me: wait_for(lambda me=me: met(me), timeout=150, interval=1, what=f"{me}'s first pair")
                 for me in ("node-a", "node-b")}
        assert metric_value(texts["node-a"], "fleetcanary_fabric_last_partner_info", partner="node-b") == 1
        assert metric_value(texts["node-b"], "fleetcanary_fabric_last_partner_info", partner="node-a") == 1
        for me in ("node-a", "node-b"):
            assert metric_value(texts[me], "fleetcanary_fabric_sendrecv_bandwidth_bytes_per_second",
                                backend="gloo") > 0
            assert metric_value(texts[me], "fleetcanary_fabric_pair_slot_timestamp_seconds") % 30 == 0
            _, _, results = daemons[me].get("/results")
            assert SECRET not in texts[me] and SECRET not in results.decode()
    finally:
        for d in daemons.values():
            d.stop()
    for me in ("node-a", "node-b"):
        assert SECRET not in daemons[me].log()
