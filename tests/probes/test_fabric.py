"""The fabric probe on loopback: two "nodes" as two real isolated workers, real gloo over
TCP, a static member list with distinct ports."""
import json
import socket
import threading
import time

import pytest

from fleetcanary.probes.fabric import Fabric
from fleetcanary.probes.fabric.spec import BUSBW, PARTNER, SENDRECV, Config
from tests.support.helpers import free_port, run_job, wait_for

SECRET = "loopback-fleet-secret-7f3a9c21d4e8"
ENV = {"FLEETCANARY_FABRIC_SECRET": SECRET}


def slot_plan(now: float) -> tuple[float, float]:
    """A slot length that puts now within 10 s of a slot start (so both workers, started
    together, pick the same slot) and a meeting offset of now: slot boundaries are far."""
    for s in range(120, 2000):
        if now % s < 10:
            return float(s), now % s
    raise AssertionError("no slot length found")


def params(ports, me, wait=40.0, plan=None, **extra):
    slot, offset = plan or slot_plan(time.time())
    return {"members": [{"name": "node-a", "address": f"127.0.0.1:{ports[0]}"},
                        {"name": "node-b", "address": f"127.0.0.1:{ports[1]}"}],
            "member_name": me, "backend": "gloo", "slot_seconds": slot, "meet_offset_seconds": offset,
            "rendezvous_wait_seconds": wait, "sizes_bytes": [8, 4096], "sendrecv_bytes": 1 << 20,
            "iterations": 3, "warmup_iterations": 1, "sendrecv_iterations": 3, "collective_timeout_seconds": 20,
            "handshake_timeout_seconds": 2, **extra}


def run_pair(tmp_path, ports, env_a=None, env_b=None, timeout=120.0, start_b=None, **extra):
    out = {}
    plan = slot_plan(time.time())   # one plan for both sides, however late the second starts

    def one(me, env):
        out[me] = run_job(Fabric, params(ports, me, plan=plan, **extra), tmp_path / me, timeout,
                          env={**ENV, **(env or {})})
    ta = threading.Thread(target=one, args=("node-a", env_a))
    ta.start()
    if start_b:
        start_b()
    tb = threading.Thread(target=one, args=("node-b", env_b))
    tb.start()
    ta.join(timeout + 30)
    tb.join(timeout + 30)
    return out["node-a"], out["node-b"]


def samples(rec, metric):
    return {tuple(sorted(s["labels"].items())): s["value"] for s in rec.samples if s["metric"] == metric}


def test_a_pair_meets_measures_and_checks_every_element(tmp_path):
    ports = (free_port(), free_port())
    a, b = run_pair(tmp_path, ports)
    assert (a.outcome, b.outcome) == ("success", "success"), (a.detail, b.detail, a.output_tail[-2000:])
    assert a.result["extra"]["partner"] == "node-b" and b.result["extra"]["partner"] == "node-a"
    assert a.result["extra"]["role"] == "host" and b.result["extra"]["role"] == "guest"
    assert a.result["extra"]["slot"] == b.result["extra"]["slot"]
    # both sides publish the same pair's figures (both ranks' timings are exchanged)
    assert samples(a, BUSBW) == samples(b, BUSBW)
    assert set(samples(a, BUSBW)) == {(("backend", "gloo"), ("collective", c), ("size_bytes", str(s)))
                                      for c in ("all_reduce", "all_gather") for s in (8, 4096)}
    assert all(v > 0 for v in samples(a, SENDRECV).values())
    assert samples(a, PARTNER) == {(("partner", "node-b"),): 1.0}
    for rec in (a, b):
        text = json.dumps(rec.result) + json.dumps(rec.samples) + rec.output_tail + rec.detail
        assert SECRET not in text


def test_wrong_data_fails_both_sides_with_wrong_result(tmp_path):
    ports = (free_port(), free_port())
    a, b = run_pair(tmp_path, ports, env_b={"FLEETCANARY_FABRIC_FAULT": "corrupt"})
    assert (a.outcome, a.reason) == ("failure", "wrong_result"), a.detail
    assert (b.outcome, b.reason) == ("failure", "wrong_result"), b.detail
    assert "1 wrong elements" in a.detail


@pytest.mark.parametrize("me", ["node-a", "node-b"])
def test_an_absent_partner_is_a_peer_unavailable_skip_not_a_failure(tmp_path, me):
    ports = (free_port(), free_port())
    rec = run_job(Fabric, params(ports, me, wait=2.0), tmp_path, 60.0, env=ENV)
    assert (rec.outcome, rec.reason) == ("skipped", "peer_unavailable"), rec.detail
    assert rec.wall_seconds < 60.0
    assert SECRET not in rec.detail + rec.output_tail


@pytest.mark.long
def test_a_partner_that_stops_mid_sweep_ends_as_a_timeout_within_the_deadline(tmp_path):
    ports = (free_port(), free_port())
    a, b = run_pair(tmp_path, ports, env_b={"FLEETCANARY_FABRIC_FAULT": "hang"}, timeout=40.0, wait=15.0,
                    collective_timeout_seconds=5)
    assert (a.outcome, a.reason) == ("timeout", "collective_timeout"), (a.detail, a.output_tail[-1500:])
    assert b.outcome == "timeout"          # the hung side is killed at its deadline
    assert a.wall_seconds < 40.0


def test_strays_on_the_rendezvous_port_do_not_break_the_pair(tmp_path):
    ports = (free_port(), free_port())
    strays = []

    def strays_first():
        def connect():
            try:
                return socket.create_connection(("127.0.0.1", ports[0]), timeout=1)
            except OSError:
                return None
        first = wait_for(connect, timeout=60, interval=0.05, what="the host's rendezvous port")
        garbage = socket.create_connection(("127.0.0.1", ports[0]))
        garbage.sendall(b"garbage\n")
        strays.extend([first, garbage])          # first says nothing and stays open

    a, b = run_pair(tmp_path, ports, start_b=strays_first)
    assert (a.outcome, b.outcome) == ("success", "success"), (a.detail, b.detail)
    rejected = a.result["extra"]["rendezvous_rejected"]
    # the garbage is refused at once; the silent one is dropped after handshake_timeout if the
    # partner's worker is slower than that to start, and never holds the pair up either way
    assert rejected.get("bad_handshake") == 1 and rejected.get("silent", 0) <= 1, rejected
    assert samples(a, "fleetcanary_fabric_rendezvous_rejected_total") == {
        (("reason", r),): float(c) for r, c in rejected.items()}
    for s in strays:
        s.close()


def test_a_node_outside_the_member_list_and_bad_settings_are_clear(tmp_path):
    ports = (free_port(), free_port())
    rec = run_job(Fabric, params(ports, "node-z"), tmp_path, 30.0, env=ENV)
    assert (rec.outcome, rec.reason) == ("skipped", "not_configured") and "node-z" in rec.detail
    rec = run_job(Fabric, params(ports, "node-a"), tmp_path, 30.0, env={})
    assert (rec.outcome, rec.reason) == ("skipped", "not_configured") and "secret" in rec.detail
    with pytest.raises(ValueError, match="shorter than slot_seconds"):
        Config(slot_seconds=10, meet_offset_seconds=5, rendezvous_wait_seconds=8)
    with pytest.raises(ValueError, match="unique"):
        Config(members=[{"name": "a", "address": "x"}, {"name": "a", "address": "y"}])
    bad = params(ports, "node-a")
    bad["members"][1]["address"] = "127.0.0.1:99999"
    rec = run_job(Fabric, bad, tmp_path, 30.0, env=ENV)
    assert (rec.outcome, rec.reason) == ("failure", "members_unavailable") and "99999" in rec.detail


@pytest.mark.parametrize("fixture, reason", [("h100_8gpu_busy", "gpu_busy"),
                                             ("h100_8gpu_healthy", "dependency_missing")])
def test_a_gpu_node_gates_before_the_rendezvous(tmp_path, monkeypatch, fixture, reason):
    """NVML (faked from recorded facts) says GPUs: a busy node skips before it ever listens, so
    its partner sees it absent; GPUs this torch cannot use (the CPU wheel here) skip dependency_missing."""
    from fleetcanary.probes.base import ProbeSkipped
    from tests.support.gpu import ctx, fake

    fake(monkeypatch, fixture)
    monkeypatch.setenv("FLEETCANARY_FABRIC_SECRET", SECRET)
    ports = (free_port(), free_port())
    cfg = Config(**{**params(ports, "node-a", wait=30.0), "backend": "auto"})
    with pytest.raises(ProbeSkipped) as ei:
        Fabric().run(cfg, ctx(tmp_path))
    # no partner runs: had the node met first, it would have skipped peer_unavailable instead
    assert ei.value.reason == reason, ei.value.detail
