"""Bounded canary load (probes/lib/fanout.py): each inference endpoint is probed by k nodes of the fleet, chosen
by rendezvous hashing, so requests per endpoint stay the same at any fleet size. 50 simulated members each run
the real canary against 5 reference servers over HTTP; the servers count what they receive."""
from __future__ import annotations

from collections import Counter

import pytest

from fleetcanary.offline.simulate_llm import SimSettings
from fleetcanary.probes.base import ProbeError, ProbeSkipped
from fleetcanary.probes.inference import Config, Inference, Target, assigned
from fleetcanary.probes.lib import fanout
from tests.support.gpu import ctx
from tests.support.llm import sim_server

MEMBERS = [f"gpu-node-{i:03d}" for i in range(50)]
ENDPOINTS = [f"llm-{i}" for i in range(5)]


def targets(urls: dict[str, str] | None = None) -> tuple[Target, ...]:
    return tuple(Target(name=e, base_url=(urls or {}).get(e, "http://127.0.0.1:9/v1"), model="sim-model",
                        prefix_words=64, stream_max_tokens=8, golden=()) for e in ENDPOINTS)


def test_fifty_members_probe_each_endpoint_from_exactly_three_nodes(tmp_path):
    servers = [sim_server(SimSettings(ttft_ms=1, itl_ms=1, max_tokens_default=8)) for _ in ENDPOINTS]
    for srv, _ in servers:
        srv.__enter__()
    try:
        urls = {e: f"{srv.url}/v1" for e, (srv, _) in zip(ENDPOINTS, servers, strict=True)}
        cfg = Config(targets=targets(urls), members_from="static", members=tuple(MEMBERS))
        runs: Counter[str] = Counter()       # canary runs per endpoint, over one interval of the whole fleet
        sent: Counter[str] = Counter()       # requests the canaries say they sent
        skipped = []
        for m in MEMBERS:
            try:
                r = Inference().run(cfg, node_ctx(tmp_path, m))
            except ProbeSkipped as e:
                skipped.append(e.reason)
                continue
            runs.update(r.extra["targets"].keys())
            for s in r.samples:
                if s.metric == "fleetcanary_inference_requests_total":
                    sent[dict(s.labels)["target"]] += int(s.value)
        received = {e: sim.stats()["requests"] for e, (_, sim) in zip(ENDPOINTS, servers, strict=True)}
    finally:
        for srv, _ in servers:
            srv.__exit__(None, None, None)
    assert runs == dict.fromkeys(ENDPOINTS, 3), runs
    assert received == dict(sent) and len(set(received.values())) == 1, (received, sent)   # 3 runs' worth each
    assert set(skipped) == {"not_assigned"}
    assert len(skipped) == 50 - len({m for m in MEMBERS for e in ENDPOINTS if m in fanout.choose(e, MEMBERS, 3)})


def node_ctx(tmp_path, node):
    c = ctx(tmp_path)
    c.node_name = node
    return c


def test_requests_per_endpoint_do_not_grow_with_the_fleet():
    """The same 5 endpoints over 50 and 500 members: 3 probers each, at any size."""
    for n in (50, 500):
        members = [f"gpu-node-{i:03d}" for i in range(n)]
        cfg = Config(targets=targets(), members_from="static", members=tuple(members))
        probers = Counter(t.name for m in members for t in assigned(cfg, m))
        assert probers == dict.fromkeys(ENDPOINTS, 3), (n, probers)
        load = Counter(m for m in members for _ in assigned(cfg, m))
        assert max(load.values()) <= 3      # no node carries many endpoints


def test_a_member_leaving_moves_only_the_endpoints_it_probed():
    many = [f"ep-{i}" for i in range(200)]
    before = {e: fanout.choose(e, MEMBERS, 3) for e in many}
    gone = MEMBERS[17]
    after = {e: fanout.choose(e, [m for m in MEMBERS if m != gone], 3) for e in many}
    moved = [e for e in many if before[e] != after[e]]
    assert moved and all(gone in before[e] for e in moved)
    for e in moved:                         # the other two probers stay
        assert set(before[e]) - {gone} <= set(after[e])


def test_k_zero_probes_everything_and_self_outside_kubernetes(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert [t.name for t in assigned(Config(targets=targets(), members_from="auto"), "any")] == ENDPOINTS
    cfg = Config(targets=targets(), members_from="static", members=tuple(MEMBERS), probers_per_target=0)
    assert len(assigned(cfg, MEMBERS[0])) == 5


def test_members_that_cannot_be_read_keep_every_node_off(monkeypatch):
    with pytest.raises(ProbeError) as e:
        assigned(Config(targets=targets(), members_from="static"), "gpu-node-000")
    assert e.value.reason == "members_unavailable"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ProbeError) as e:
        assigned(Config(targets=targets(), members_from="kubernetes"), "gpu-node-000")
    assert e.value.reason == "members_unavailable" and "KUBERNETES_SERVICE_HOST" in e.value.detail
