"""Scheduled runs through Kubernetes (fleetcanary.daemon.claim, fleetcanary.runner.claim): the daemon asks the API
stand-in for a claim pod once tenants have kept an invasive probe off the node, `fleetcanary claim` runs the pod's
jobs for real and leaves its records in the inbox, the daemon publishes them as fresh runs and deletes the pod;
preemption ends in one clean skipped record; a claim never placed is withdrawn; junk in the inbox is moved
aside (tests/reliability/test_claim_inbox.py: hostile records)."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fleetcanary.core.record import RunRecord
from tests.support.gpu import FIXTURES
from tests.support.helpers import free_port, metric_value, wait_for
from tests.support.kube_api import KubeAPI, node

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-a"
SMALL = {"device": "cpu", "d2d_bytes": 1 << 20, "host_bytes": 1 << 20, "repeats": 1, "warmup": 0}
NVML = FIXTURES / "h100_8gpu_healthy.json"


@pytest.fixture
def api(tmp_path):
    a = KubeAPI(tmp_path)
    a.nodes[NODE] = node(NODE, {}, 8)
    yield a
    a.close()


def daemon(tmp_path, api, now: list[float], **claim):
    from fleetcanary.core import config as configmod
    from fleetcanary.daemon.claim import Claimer
    from fleetcanary.daemon.kube import Kube
    from fleetcanary.daemon.service import Daemon

    cfg = {"node_name": NODE, "state_dir": str(tmp_path / "state"),
           "server": {"listen_address": f"127.0.0.1:{free_port()}"}, "gpu": {"xid_watch": "off"},
           "kubernetes": {"mode": "off", "api_timeout_seconds": 2.0,
                          "claim": {"enabled": True, "image": "registry.example/fleetcanary:test",
                                    "after_seconds": 3600, "pending_seconds": 600, "spread_ratio": 0,
                                    **claim}},
           "probes": {"gpu_bandwidth": {"params": SMALL, "timeout_seconds": 120}}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    settings = configmod.load(p, env={})
    d = Daemon(settings, config_path=str(p))
    d.kube = Kube.in_cluster(settings.kubernetes, NODE, on_change=d._kube_changed, token_file=str(api.token_file),
                             ca_file=str(api.ca_file), environ=api.environ)
    assert d.kube.sync()
    d.claimer = Claimer(d, d.kube.api, "fleetcanary", {"apiVersion": "v1", "kind": "Pod", "name": "fleetcanary-x",
                                                       "uid": "u-1"}, clock=lambda: now[0])
    if not claim:
        d.claimer.inbox.mkdir(parents=True, exist_ok=True)
    api.clock = lambda: now[0]  # the pods' creationTimestamp on the claimer's clock
    return d


def held(d, at: float) -> None:
    d.store.apply(RunRecord("gpu_bandwidth", "skipped", "gpu_allocated", "GPUs held by team1/trainer-0",
                            started_at=at, wall_seconds=0.5))


def held_for_an_hour(tmp_path, api):
    """A daemon whose gpu_bandwidth a tenant has kept off the node for just over after_seconds."""
    t0 = time.time()
    now = [t0]
    d = daemon(tmp_path, api, now)
    now[0] = t0 + 3700
    held(d, t0)
    return d, now


def claim(inbox: Path, spec: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "FLEETCANARY_FAKE_NVML": str(NVML)}
    return subprocess.Popen([sys.executable, "-m", "fleetcanary", "claim", "--inbox", str(inbox), "--spec", spec],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_a_node_kept_busy_gets_a_claim_pod_whose_runs_are_published(tmp_path, api, monkeypatch):
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(NVML))
    # held since an hour ago, so that the claim is asked at the real time: the claim pod's records carry the
    # node's clock, and the inbox refuses a record that started before its claim was asked for
    t0 = time.time() - 3700
    now = [t0]
    d = daemon(tmp_path, api, now)
    try:
        held(d, t0)
        now[0] = t0 + 600
        assert d.claimer.tick() == "none"            # held for 10 minutes: not yet
        now[0] = t0 + 3700
        assert d.claimer.tick() == "created"
        assert d.claimer.tick() == "waiting"         # Pending: one claim at a time
        (pod,) = api.created
        spec = pod["spec"]
        assert pod["metadata"]["name"] == "fleetcanary-claim-gpu-a"
        (ref,) = pod["metadata"]["ownerReferences"]
        # owned (collected with the exporter pod) but not controlled: no controller adopts or deletes it
        assert ref["uid"] == "u-1" and ref["kind"] == "Pod"
        assert ref["controller"] is False and ref["blockOwnerDeletion"] is False
        assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "fleetcanary-claim"
        assert pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"
        assert spec["priorityClassName"] == "fleetcanary-claim" and spec["restartPolicy"] == "Never"
        assert spec["automountServiceAccountToken"] is False and spec["serviceAccountName"] == "fleetcanary-claim"
        assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": [NODE]}]
        (c,) = spec["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"  # the node's capacity from the API
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert spec["volumes"][0]["hostPath"]["path"] == "/var/lib/fleetcanary-inbox"
        args = c["args"]
        assert args[:3] == ["claim", "--inbox", "/inbox"] and args[3] == "--spec"
        assert [j["job"]["name"] for j in json.loads(args[4])["jobs"]] == ["gpu_bandwidth"]
        # the scheduler places it: its process runs the jobs and leaves the records in the inbox
        proc = claim(d.claimer.inbox, args[4])
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        api.pod("fleetcanary", "fleetcanary-claim-gpu-a")["status"]["phase"] = "Succeeded"
        assert d.claimer.tick() == "deleted"
        text = d.store.exposition.decode()
    finally:
        d.server.stop()
    assert api.deleted == ["fleetcanary-claim-gpu-a"]
    last = d.store.state["gpu_bandwidth"].last
    assert (last.outcome, last.trigger) == ("success", "claim"), (last.outcome, last.reason, last.detail)
    assert d.store.last_measured[("0", "gpu_bandwidth")] == last.finished_at  # coverage: GPU 0 measured
    assert metric_value(text, "fleetcanary_probe_runs_total", probe="gpu_bandwidth", outcome="success") == 1.0
    assert not list(d.claimer.inbox.iterdir())       # every record taken, nothing left behind
    assert d.budget.left(window=3600, probe="gpu_bandwidth", interval=900)["0"] < 18.0  # charged to the budget


def test_preemption_mid_run_leaves_one_clean_skipped_record(tmp_path):
    from fleetcanary.runner import job as jobmod
    from tests.support.fault_probes import FAULT_PROBES

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    pid_file = tmp_path / "hang.pid"
    context = {"node_name": NODE, "state_dir": str(tmp_path), "gpu": {}, "kube": {}}
    jobs = [{"job": jobmod.build("hang", FAULT_PROBES["hang"], {"pid_file": str(pid_file)}, context),
             "timeout_seconds": 300},
            {"job": jobmod.build("ok", FAULT_PROBES["ok"], {}, context), "timeout_seconds": 60}]
    proc = claim(inbox, json.dumps({"jobs": jobs, "kill_grace_seconds": 1.0}))
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=60, what="the hang worker")
        worker = int(pid_file.read_text().split()[0])
        proc.send_signal(signal.SIGTERM)             # the kubelet preempts the pod
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    files = sorted(inbox.iterdir())
    assert len(files) == 1 and files[0].suffix == ".json", files  # the run in flight only; no partial file
    rec = RunRecord.from_json(json.loads(files[0].read_text()))
    assert (rec.probe, rec.outcome, rec.reason, rec.trigger) == ("hang", "skipped", "preempted", "claim")
    assert not rec.samples
    wait_for(lambda: not Path(f"/proc/{worker}").exists() or
             Path(f"/proc/{worker}/stat").read_text().split(")")[-1].split()[0] == "Z",
             timeout=30, what="the preempted worker gone")


def test_a_claim_the_scheduler_never_places_is_withdrawn_and_not_asked_again_at_once(tmp_path, api):
    d, now = held_for_an_hour(tmp_path, api)
    try:
        assert d.claimer.tick() == "created"
        now[0] += 601                                 # pending_seconds passed, still Pending
        assert d.claimer.tick() == "withdrawn"
        assert d.claimer.tick() == "none"             # asked 10 minutes ago: not again before after_seconds
        now[0] += 3600
        assert d.claimer.tick() == "created"
    finally:
        d.server.stop()
    assert api.deleted == ["fleetcanary-claim-gpu-a"] and len(api.created) == 2


def test_junk_in_the_inbox_is_dropped_with_one_line_each(tmp_path, api, caplog):
    now = [time.time()]
    d = daemon(tmp_path, api, now)
    d.server.stop()
    inbox = d.claimer.inbox
    (inbox / "1-junk.json").write_text("{not json")
    (inbox / "2-host.json").write_text(json.dumps(RunRecord("host_memory_bandwidth", "success").to_json()))
    (inbox / "3-partial.json.tmp").write_text("{")   # a claim killed while writing: left until its deadline
    with caplog.at_level(logging.ERROR, logger="fleetcanary.claim"):
        assert d.claimer.ingest() == 0
    assert sorted(p.name for p in inbox.iterdir()) == ["3-partial.json.tmp", "quarantine"]
    assert len(list((inbox / "quarantine").iterdir())) == 2      # moved aside, not lost
    lines = [r.getMessage() for r in caplog.records if r.name == "fleetcanary.claim"]
    assert len(lines) == 2 and "1-junk.json" in lines[0] and "not an invasive probe" in lines[1]
    assert d.store.state["host_memory_bandwidth"].last is None


def test_an_api_that_refuses_the_claim_is_counted_and_survived(tmp_path, api):
    d, _ = held_for_an_hour(tmp_path, api)
    try:
        api.fail["create_pod"] = 403
        assert d.claimer.tick() == "error"
        text = d.store.exposition.decode()
    finally:
        d.server.stop()
    assert metric_value(text, "fleetcanary_kubernetes_api_errors_total", operation="create_pod",
                        reason="forbidden") == 1.0


def test_the_claim_pod_validates_against_the_kubernetes_schema(tmp_path, api):
    from fleetcanary.daemon.claim import claim_pod
    from tests.support.kubernetes_schemas import kubernetes_validate
    from tests.test_deploy import K8S_VERSION

    now = [time.time()]
    d = daemon(tmp_path, api, now)
    d.server.stop()
    body = claim_pod(d.claimer.cfg, NODE, "fleetcanary", d.claimer.spec(["gpu_bandwidth"]), 8,
                     {"apiVersion": "v1", "kind": "Pod", "name": "fleetcanary-x", "uid": "u-1"})
    kubernetes_validate.validate(body, K8S_VERSION, strict=True)
    assert body["spec"]["securityContext"]["runAsNonRoot"] is True


def test_an_inbox_that_cannot_be_made_turns_claims_off_without_stopping_the_daemon(tmp_path, api, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    d = daemon(tmp_path, api, [time.time()], inbox=str(blocker / "inbox"))  # under a file: mkdir fails
    d.server.stop()
    with caplog.at_level(logging.ERROR, logger="fleetcanary.claim"):
        d.claimer.start()
    assert d.claimer._thread is None
    assert any("no claims are made" in r.getMessage() for r in caplog.records)


def test_a_fleet_held_since_a_rollout_spreads_its_claims(tmp_path, api):
    """A node asks at its own phase within after_seconds x (1 + spread_ratio), not before; over 500 nodes held
    since the same moment, at the defaults (6 h, 0.25), at most a few ask in any 30-second tick (the API server
    is a shared target)."""
    from fleetcanary.core.config import ClaimConfig
    from fleetcanary.daemon import phase

    t0 = time.time()
    now = [t0]
    d = daemon(tmp_path, api, now, spread_ratio=0.25)
    d.server.stop()
    held(d, t0)
    ask = t0 + 3600 * (1 + 0.25 * d.claimer.phase)
    now[0] = ask - 1
    assert d.claimer.due() == []
    now[0] = ask + 1
    assert d.claimer.due() == ["gpu_bandwidth"]
    cfg = ClaimConfig()
    asks = [cfg.after_seconds * (1 + cfg.spread_ratio * phase.fraction(phase.seed(str(tmp_path / f"n{i}"),
                                                                                    f"node-{i}"), "claim"))
            for i in range(500)]
    per_tick: dict[int, int] = {}
    for t in asks:
        per_tick[int(t // 30)] = per_tick.get(int(t // 30), 0) + 1
    assert min(asks) >= cfg.after_seconds and max(asks) <= cfg.after_seconds * (1 + cfg.spread_ratio)
    assert max(per_tick.values()) <= 10, max(per_tick.values())  # all 500 in one tick without the spread


def _testing(api) -> tuple[str | None, str | None]:
    meta = api.nodes[NODE]["metadata"]
    return (meta.get("labels") or {}).get("fleetcanary.io/testing"), \
        (meta.get("annotations") or {}).get("fleetcanary.io/testing-set-by")


def test_the_testing_label_is_on_the_node_while_the_claim_pod_runs_and_only_then(tmp_path, api):
    t0 = time.time()
    now = [t0]
    d = daemon(tmp_path, api, now, testing_label=True)
    d.claimer.inbox.mkdir(parents=True, exist_ok=True)
    try:
        now[0] = t0 + 3700
        held(d, t0)
        assert d.claimer.tick() == "created"
        assert _testing(api) == (None, None)             # Pending: the GPUs are not held yet
        api.pod("fleetcanary", "fleetcanary-claim-gpu-a")["status"]["phase"] = "Running"
        assert d.claimer.tick() == "waiting"
        assert _testing(api) == ("true", "claim")
        patches = len(api.node_patches)
        assert d.claimer.tick() == "waiting" and len(api.node_patches) == patches   # no patch per look
        api.pod("fleetcanary", "fleetcanary-claim-gpu-a")["status"]["phase"] = "Succeeded"
        assert d.claimer.tick() == "deleted"
        assert _testing(api) == (None, None)
        assert api.invalid == []
    finally:
        d.server.stop()


def test_a_testing_label_someone_else_set_stays(tmp_path, api):
    api.nodes[NODE]["metadata"].setdefault("labels", {})["fleetcanary.io/testing"] = "true"
    _run_claim(tmp_path, api, testing_label=True)
    assert _testing(api) == ("true", None) and api.node_patches == []   # not ours: never touched


def test_the_testing_label_is_off_by_default(tmp_path, api):
    _run_claim(tmp_path, api)
    assert _testing(api) == (None, None) and api.node_patches == []


def _run_claim(tmp_path, api, **claim) -> None:
    """A claim pod created, running for a look, and ended."""
    t0 = time.time()
    now = [t0]
    d = daemon(tmp_path, api, now, **claim)
    d.claimer.inbox.mkdir(parents=True, exist_ok=True)
    try:
        now[0] = t0 + 3700
        held(d, t0)
        assert d.claimer.tick() == "created"
        api.pod("fleetcanary", "fleetcanary-claim-gpu-a")["status"]["phase"] = "Running"
        assert d.claimer.tick() == "waiting"
        api.pod("fleetcanary", "fleetcanary-claim-gpu-a")["status"]["phase"] = "Succeeded"
        assert d.claimer.tick() == "deleted"
    finally:
        d.server.stop()
