"""The controller's decisions, in-process on a fake clock against the Kubernetes API stand-in (real HTTPS, real
kubernetes client, every written object validated against the Kubernetes schema)."""
from __future__ import annotations

import json

from fleetcanary.remediate.ownership import ANNOTATION
from tests.support.helpers import metric_value

from .conftest import FakeClock, alert, controller, node_writes, payload, quarantined, resolved


def metrics(c) -> str:
    from prometheus_client import generate_latest

    return generate_latest(c.metrics.registry).decode()


def test_dry_run_is_the_default_and_writes_nothing_but_events(api, tmp_path):
    from fleetcanary.remediate import config

    assert config.Settings().dry_run is True
    clock = FakeClock()
    audit = tmp_path / "audit.jsonl"
    c = controller(api, clock, dry_run=True, audit_log=str(audit))
    assert c.handle(payload(alert("gpu-1"))) == "accepted"
    assert api.node_patches == [] and api.lease_writes == [] and api.invalid == []
    (ev,) = api.events
    assert ev["reason"] == "WouldQuarantine" and ev["involvedObject"] == {"apiVersion": "v1", "kind": "Node",
                                                                           "name": "gpu-1", "uid": "uid-gpu-1"}
    assert "taint fleetcanary.io/quarantine:NoSchedule" in ev["message"] and "cordon" in ev["message"]
    assert "peers' median 3.1 TB/s" in ev["message"], "the Event carries the evidence"
    assert metric_value(metrics(c), "fleetcanary_remediate_refusals_total", reason="dry_run") == 1
    (line,) = audit.read_text().splitlines()
    assert json.loads(line)["decision"] == "dry_run" and json.loads(line)["node"] == "gpu-1"


def test_a_quarantine_holds_and_is_released_only_after_resolve_quiet_period_and_hold(api):
    clock = FakeClock()
    c = controller(api, clock)
    a = alert("gpu-1")
    c.handle(payload(a))
    n = api.nodes["gpu-1"]
    assert n["metadata"]["labels"]["fleetcanary.io/health"] == "failed"
    assert {"key": "fleetcanary.io/quarantine", "value": "true", "effect": "NoSchedule"} in n["spec"]["taints"]
    assert n["spec"]["unschedulable"] is True
    record = json.loads(n["metadata"]["annotations"][ANNOTATION])
    assert record["set"] == {"labels": {"fleetcanary.io/health": "failed"}, "taint": "NoSchedule", "cordon": True}
    assert [e["reason"] for e in api.events] == ["Quarantined"]
    assert "GPU 3 of gpu-1 fell off the bus" in api.events[0]["message"]
    assert not [x for x in api.nodes if x != "gpu-1" and quarantined(api, x)], "healthy nodes untouched"

    c.handle(payload(resolved(a)))      # resolved at once: the hold (600 s) and quiet period (300 s) still run
    clock.advance(400)
    c.tick()
    assert quarantined(api, "gpu-1")
    clock.advance(201)                  # quiet period passed (601 s since resolve), hold passed (601 s)
    c.tick()
    n = api.nodes["gpu-1"]
    assert not quarantined(api, "gpu-1")
    assert "fleetcanary.io/health" not in n["metadata"]["labels"]
    assert n["spec"].get("taints") == [] and n["spec"]["unschedulable"] is False
    assert [e["reason"] for e in api.events] == ["Quarantined", "Released"]
    text = metrics(c)
    assert metric_value(text, "fleetcanary_remediate_actions_total", action="quarantine") == 1
    assert metric_value(text, "fleetcanary_remediate_actions_total", action="release") == 1
    assert api.invalid == []


def test_a_flapping_alert_does_not_flap_the_node(api):
    clock = FakeClock()
    c = controller(api, clock)
    a = alert("gpu-2")
    c.handle(payload(a))
    for _ in range(5):                  # resolves and fires again inside the quiet period, five times
        clock.advance(100)
        c.handle(payload(resolved(a)))
        clock.advance(100)
        c.tick()
        c.handle(payload(a))
    assert quarantined(api, "gpu-2")
    assert len(node_writes(api)) == 1, "one quarantine, no release in between"
    c.handle(payload(resolved(a)))
    clock.advance(299)
    c.tick()
    assert quarantined(api, "gpu-2"), "the quiet period restarts at the last resolve"
    clock.advance(2)
    c.tick()
    assert not quarantined(api, "gpu-2") and len(node_writes(api)) == 2


def test_the_breaker_stops_at_its_threshold_and_says_so(api, caplog):
    clock = FakeClock()
    c = controller(api, clock)          # at most 3 nodes and half a pool: pool train-a (8 nodes) allows 3
    for i in range(1, 7):
        c.handle(payload(alert(f"gpu-{i}")))
    assert [x for x in sorted(api.nodes) if quarantined(api, x)] == ["gpu-1", "gpu-2", "gpu-3"]
    text = metrics(c)
    assert metric_value(text, "fleetcanary_remediate_refusals_total", reason="breaker") == 3
    assert metric_value(text, "fleetcanary_remediate_breaker_trips_total", pool="train-a") == 1
    assert metric_value(text, "fleetcanary_remediate_breaker_open", pool="train-a") == 1
    assert "circuit breaker open for pool train-a" in caplog.text
    # another pool has its own breaker: infer-b (2 nodes, half of it) still takes one
    c.handle(payload(alert("gpu-9")))
    c.handle(payload(alert("gpu-10")))
    assert quarantined(api, "gpu-9") and not quarantined(api, "gpu-10")
    # the window passes: the pool may take one more (the three still held started outside it)
    clock.advance(3601)
    c.handle(payload(alert("gpu-4")))
    assert quarantined(api, "gpu-4")
    assert metric_value(metrics(c), "fleetcanary_remediate_breaker_open", pool="train-a") == 0


def test_the_opt_out_label_is_respected(api):
    api.nodes["gpu-3"]["metadata"]["labels"]["fleetcanary.io/remediation"] = "disabled"
    c = controller(api, FakeClock())
    c.handle(payload(alert("gpu-3")))
    assert api.node_patches == [] and not quarantined(api, "gpu-3")
    assert metric_value(metrics(c), "fleetcanary_remediate_refusals_total", reason="opt_out") == 1
    assert [e["reason"] for e in api.events] == ["QuarantineRefused"]


def test_what_it_did_not_set_is_never_undone(api):
    n = api.nodes["gpu-4"]
    n["spec"] = {"unschedulable": True,   # cordoned by a person, tainted by another tool with the same key
                 "taints": [{"key": "fleetcanary.io/quarantine", "value": "manual", "effect": "NoSchedule"}]}
    n["metadata"]["labels"]["fleetcanary.io/health"] = "failed"
    clock = FakeClock()
    c = controller(api, clock, release={"quiet_seconds": 0})
    a = alert("gpu-4")
    c.handle(payload(a))
    record = json.loads(api.nodes["gpu-4"]["metadata"]["annotations"][ANNOTATION])
    assert record["set"] == {"labels": {}, "taint": None, "cordon": False}
    clock.advance(601)
    c.handle(payload(resolved(a)))
    n = api.nodes["gpu-4"]
    assert not quarantined(api, "gpu-4")
    assert n["spec"]["unschedulable"] is True and n["metadata"]["labels"]["fleetcanary.io/health"] == "failed"
    assert n["spec"]["taints"] == [{"key": "fleetcanary.io/quarantine", "value": "manual", "effect": "NoSchedule"}]
    # a record it cannot read is someone else's: hands off, counted
    api.nodes["gpu-5"]["metadata"]["annotations"] = {ANNOTATION: "set by a person"}
    c.handle(payload(alert("gpu-5")))
    assert api.nodes["gpu-5"]["metadata"]["annotations"] == {ANNOTATION: "set by a person"}
    assert metric_value(metrics(c), "fleetcanary_remediate_refusals_total", reason="not_owner") == 1


def test_a_resolved_alert_it_never_acted_on_changes_nothing(api):
    c = controller(api, FakeClock(), release={"quiet_seconds": 0})
    c.handle(payload(resolved(alert("gpu-6"))))
    c.handle(payload(alert("gpu-6", name="FleetCanaryNoRuleForThis", severity="info")))
    assert api.node_patches == [] and api.events == []
    assert metric_value(metrics(c), "fleetcanary_remediate_alerts_total", outcome="no_rule") == 1


def test_two_replicas_one_acts_and_a_lost_lease_hands_over_without_a_double_action(api):
    clock = FakeClock()
    lease = {"enabled": True, "duration_seconds": 15, "retry_seconds": 2}
    a = controller(api, clock, identity="replica-a", lease=lease, release={"quiet_seconds": 0})
    b = controller(api, clock, identity="replica-b", lease=lease, release={"quiet_seconds": 0})
    a.tick()
    b.tick()
    assert a.leading() and not b.leading()
    fault = alert("gpu-7")
    assert b.handle(payload(fault)) == "standby"
    assert a.handle(payload(fault)) == "accepted"
    assert len(node_writes(api)) == 1
    # replica-a stops renewing (a partition, a hung process); within the lease duration nobody else takes it
    clock.advance(10)
    b.tick()
    assert not b.leading()
    clock.advance(6)
    assert not a.leading(), "a leader that could not renew stops acting before anyone else may start"
    b.tick()
    assert b.leading()
    assert api.leases[("fleetcanary", "fleetcanary-remediate")]["spec"]["holderIdentity"] == "replica-b"
    assert api.leases[("fleetcanary", "fleetcanary-remediate")]["spec"]["leaseTransitions"] == 1
    # Alertmanager repeats the notification to both: the new leader reads the node and does nothing twice
    assert b.handle(payload(fault)) == "accepted" and a.handle(payload(fault)) == "standby"
    assert len(node_writes(api)) == 1
    # replica-a comes back: it sees replica-b's lease and stays standby
    a.tick()
    assert not a.leading()
    clock.advance(601)
    b.tick()                            # it renews every retry period; a tick after the jump keeps it leading
    assert b.handle(payload(resolved(fault))) == "accepted"
    assert not quarantined(api, "gpu-7") and len(node_writes(api)) == 2, "released once, by the new leader"
    assert api.invalid == []
