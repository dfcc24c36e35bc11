"""End to end with real parts: a real Alertmanager (Debian's 0.25) sends its webhooks to real `fleetcanary
remediate` processes, which act on the Kubernetes API stand-in. Waits poll for a state with a deadline; no
assertion depends on how fast anything is."""
from __future__ import annotations

import json

import pytest

from fleetcanary.remediate.ownership import ANNOTATION
from tests.support.alertmanager import Alertmanager
from tests.support.helpers import wait_for

from .conftest import POOL, RULES, alert, node_writes, quarantined
from .process import Remediate, alertmanager_config, send

DEADLINE = 120.0


@pytest.fixture
def started(tmp_path):
    things = []

    def start(thing):
        things.append(thing)
        return thing

    yield start
    for t in reversed(things):
        t.stop()


def test_dry_run_sends_events_and_writes_nothing_else(api, tmp_path, started):
    r = started(Remediate(tmp_path / "r", api, {"pool_label": POOL, "rules": RULES}, "replica-a"))
    wait_for(lambda: r.metric("fleetcanary_remediate_leader") == 1, timeout=DEADLINE, what="leading")
    am = started(Alertmanager(tmp_path / "am", alertmanager_config(r.url)))
    send(am, alert("gpu-1"))
    # the Event is posted before the audit line is written: wait for both (under load the test read the
    # audit file between the two)
    wait_for(lambda: api.events and r.audit.exists() and r.audit.read_text().strip(), timeout=DEADLINE,
             what="the would-be quarantine's Event and audit line")
    assert [e["reason"] for e in api.events] == ["WouldQuarantine"]
    assert api.node_patches == [] and api.invalid == []
    assert r.metric("fleetcanary_remediate_dry_run") == 1
    assert r.metric("fleetcanary_remediate_refusals_total", reason="dry_run") == 1
    assert json.loads(r.audit.read_text().splitlines()[0])["decision"] == "dry_run"


def test_a_quarantine_and_its_release(api, tmp_path, started):
    cfg = {"dry_run": False, "pool_label": POOL, "release": {"quiet_seconds": 0},
           "rules": [{**RULES[0], "min_hold_seconds": 0}]}
    r = started(Remediate(tmp_path / "r", api, cfg, "replica-a"))
    wait_for(lambda: r.metric("fleetcanary_remediate_leader") == 1, timeout=DEADLINE, what="leading")
    am = started(Alertmanager(tmp_path / "am", alertmanager_config(r.url)))
    fault = alert("gpu-2")
    send(am, fault)
    wait_for(lambda: quarantined(api, "gpu-2"), timeout=DEADLINE, what="gpu-2 quarantined")
    n = api.nodes["gpu-2"]
    assert n["spec"]["unschedulable"] is True and n["metadata"]["labels"]["fleetcanary.io/health"] == "failed"
    assert [x for x in api.nodes if quarantined(api, x)] == ["gpu-2"], "healthy nodes untouched"
    send(am, fault, resolved=True)
    wait_for(lambda: not quarantined(api, "gpu-2"), timeout=DEADLINE, what="gpu-2 released")
    n = api.nodes["gpu-2"]
    assert n["spec"]["unschedulable"] is False and "fleetcanary.io/health" not in n["metadata"]["labels"]
    # the Event follows the patch: wait for it, then nothing more may be there
    wait_for(lambda: len(api.events) == 2, timeout=DEADLINE, what="the release's Event")
    assert [e["reason"] for e in api.events] == ["Quarantined", "Released"] and api.invalid == []
    wait_for(lambda: r.audit.read_text().count("\n") == 3, timeout=DEADLINE, what="three audit lines")
    decisions = [json.loads(x)["decision"] for x in r.audit.read_text().splitlines()]
    assert decisions == ["quarantine", "resolved", "release"]


def test_two_replicas_one_acts_and_a_killed_leader_hands_over_without_a_double_action(api, tmp_path, started):
    cfg = {"dry_run": False, "pool_label": POOL, "release": {"quiet_seconds": 0},
           "lease": {"duration_seconds": 4, "retry_seconds": 1}, "rules": [{**RULES[0], "min_hold_seconds": 0}]}
    a = started(Remediate(tmp_path / "a", api, cfg, "replica-a"))
    b = started(Remediate(tmp_path / "b", api, cfg, "replica-b"))
    am = started(Alertmanager(tmp_path / "am", alertmanager_config(a.url, b.url)))
    wait_for(lambda: (a.metric("fleetcanary_remediate_leader") or 0) + (b.metric("fleetcanary_remediate_leader")
                                                                         or 0) == 1, timeout=DEADLINE,
             what="one leader")
    leader, standby = (a, b) if a.metric("fleetcanary_remediate_leader") == 1 else (b, a)
    fault = alert("gpu-3")
    send(am, fault)
    wait_for(lambda: quarantined(api, "gpu-3"), timeout=DEADLINE, what="gpu-3 quarantined")
    wait_for(lambda: standby.metric("fleetcanary_remediate_webhooks_total", outcome="standby"), timeout=DEADLINE,
             what="the standby answered the same notification")
    assert len(node_writes(api)) == 1
    leader.stop(kill=True)
    wait_for(lambda: standby.metric("fleetcanary_remediate_leader") == 1, timeout=DEADLINE,
             what="the standby takes the lease")
    holder = api.leases[("fleetcanary", "fleetcanary-remediate")]["spec"]["holderIdentity"]
    assert holder == ("replica-b" if standby is b else "replica-a")
    send(am, fault, resolved=True)
    wait_for(lambda: not quarantined(api, "gpu-3"), timeout=DEADLINE, what="gpu-3 released by the new leader")
    assert len(node_writes(api)) == 2, "one quarantine, one release: nothing done twice"
    assert api.invalid == []


def test_bad_requests_get_one_line_and_a_count_never_a_traceback(api, tmp_path, started):
    r = started(Remediate(tmp_path / "r", api, {"max_body_bytes": 4096}, "replica-a"))
    assert r.post(b"{not json")[0] == 400
    assert r.post(json.dumps({"version": "3", "status": "firing", "alerts": []}).encode())[0] == 400
    assert r.post(json.dumps({"version": "4", "status": "firing", "alerts": [{"status": "odd"}]}).encode())[0] == 400
    assert r.post(b"x" * 5000)[0] == 413
    assert r.metric("fleetcanary_remediate_webhooks_total", outcome="bad_request") == 3
    assert r.metric("fleetcanary_remediate_webhooks_total", outcome="too_large") == 1
    log = r.log.read_text()
    assert log.count("webhook from 127.0.0.1 refused") == 4 and "Traceback" not in log
    assert api.node_patches == [] and api.events == []


def test_a_bad_config_is_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text("dry_run: false\nrules:\n  - name: x\n    actions: {taint: {effect: NoExecute}}\n")
    r = subprocess.run([sys.executable, "-m", "fleetcanary", "remediate", "--config", str(bad), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [f"fleetcanary remediate: config error: {bad}: rules.0.actions.taint.effect: "
                                     "Input should be 'NoSchedule' or 'PreferNoSchedule'"]
    good = tmp_path / "good.yaml"
    good.write_text(f"rules: {json.dumps(RULES)}\n")
    r = subprocess.run([sys.executable, "-m", "fleetcanary", "remediate", "--config", str(good), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "2 rules, dry run" in r.stdout
    assert ANNOTATION  # the record's name is part of the contract the docs describe
