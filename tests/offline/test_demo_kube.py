"""The demo's Kubernetes side: its small API server, and a real `fleetcanary remediate` process with the demo's
config acting on it (the long demo test shows the same end to end, through Prometheus and Alertmanager)."""
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from fleetcanary.offline import demo_fleet as fleet
from fleetcanary.offline import demo_kube
from fleetcanary.probes.lib import yamltext
from tests.support.helpers import StopWaiting, free_port, http_get, wait_for

ROOT = Path(__file__).resolve().parents[2]
NAMES = fleet.node_names(6)
BAD = fleet.degraded_node(NAMES)


def call(url: str, method: str, body: bytes | None, ctype: str = "application/merge-patch+json") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_stale_patch_is_refused_and_a_fresh_one_merges(tmp_path):
    c = demo_kube.Cluster(NAMES).start()
    try:
        url = f"{c.url}/api/v1/nodes/{BAD}"
        code, node = call(url, "GET", None)
        assert code == 200 and node["metadata"]["name"] == BAD
        rv = node["metadata"]["resourceVersion"]
        fresh = {"metadata": {"resourceVersion": rv, "labels": {"a": "1"}}}
        code, out = call(url, "PATCH", json.dumps(fresh).encode())
        assert code == 200 and out["metadata"]["labels"]["a"] == "1"
        stale = {"metadata": {"resourceVersion": rv, "labels": {"a": None}}}
        code, out = call(url, "PATCH", json.dumps(stale).encode())
        assert code == 409 and out["reason"] == "Conflict"
        assert c.node(BAD)["metadata"]["labels"]["a"] == "1"
        code, out = call(url, "PATCH", json.dumps({"metadata": {"labels": {"a": None}}}).encode())
        assert code == 200 and "a" not in out["metadata"]["labels"]
    finally:
        c.stop()


def test_bad_requests_get_a_status_and_change_nothing():
    c = demo_kube.Cluster(NAMES).start()
    try:
        before = c.node(BAD)
        assert call(f"{c.url}/api/v1/nodes/{BAD}", "PATCH", b"[1]")[0] == 400
        assert call(f"{c.url}/api/v1/nodes/{BAD}", "PATCH", b"{}", "application/json")[0] == 415
        assert call(f"{c.url}/api/v1/nodes/nosuch", "PATCH", b"{}")[0] == 404
        assert call(f"{c.url}/api/v1/namespaces/default/events", "POST", b"not json", "application/json")[0] == 400
        assert call(f"{c.url}/api/v1/namespaces/default/pods", "GET", None)[0] == 404
        status_url = f"{c.url}/api/v1/nodes/{BAD}/status"
        cond = {"type": "FleetCanaryGPULost", "status": "True"}
        assert call(status_url, "PATCH", json.dumps({"status": {"conditions": [cond]}}).encode())[0] == 415
        strategic = "application/strategic-merge-patch+json"
        for bad_body in ({"metadata": {"labels": {"a": "1"}}, "status": {}},
                         {"status": {"conditions": [{"type": "X", "status": "Maybe"}]}},
                         {"status": {"conditions": [{"status": "True"}]}}):
            assert call(status_url, "PATCH", json.dumps(bad_body).encode(), strategic)[0] == 422, bad_body
        assert c.node(BAD) == before and c.events == []
    finally:
        c.stop()


def test_a_status_patch_merges_conditions_by_type_and_the_pod_list_is_empty():
    c = demo_kube.Cluster(NAMES).start()
    try:
        strategic = "application/strategic-merge-patch+json"
        url = f"{c.url}/api/v1/nodes/{BAD}/status"
        first = [{"type": "FleetCanaryGPULost", "status": "False", "reason": "NoGPULost", "message": "m"},
                 {"type": "FleetCanaryGPUUncorrectableECC", "status": "False", "reason": "NoUncorrectableECC"}]
        rv = c.node(BAD)["metadata"]["resourceVersion"]
        code, out = call(url, "PATCH", json.dumps({"status": {"conditions": first}}).encode(), strategic)
        assert code == 200 and out["metadata"]["resourceVersion"] != rv
        ecc = {"type": "FleetCanaryGPUUncorrectableECC", "status": "True", "reason": "UncorrectableECCErrors",
               "message": "GPU 6 counted 1"}
        code, out = call(url, "PATCH", json.dumps({"status": {"conditions": [ecc]}}).encode(), strategic)
        assert code == 200
        conds = {x["type"]: x for x in c.node(BAD)["status"]["conditions"]}
        assert set(conds) == {"Ready", "FleetCanaryGPULost", "FleetCanaryGPUUncorrectableECC"}  # none replaced
        assert conds["Ready"]["status"] == "True" and conds["FleetCanaryGPULost"]["status"] == "False"
        assert conds["FleetCanaryGPUUncorrectableECC"] == ecc   # merged into the one of that type
        assert demo_kube.fault_conditions(c.node(BAD)).keys() == {"FleetCanaryGPULost",
                                                                  "FleetCanaryGPUUncorrectableECC"}
        assert c.node(BAD)["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert all("conditions" not in (c.node(n)["status"]) or len(c.node(n)["status"]["conditions"]) == 1
                   for n in NAMES if n != BAD)
        code, pods = call(f"{c.url}/api/v1/pods?fieldSelector=spec.nodeName%3D{BAD}", "GET", None)
        assert code == 200 and pods["kind"] == "PodList" and pods["items"] == []
    finally:
        c.stop()


def test_the_demos_rule_is_the_shipped_hard_fault_rule():
    shipped = yamltext.load((ROOT / "deploy/components/remediate/remediate.yaml").read_text())
    assert next(r for r in shipped["rules"] if r["name"] == "hard-fault") == fleet.HARD_FAULT_RULE


def test_remediate_with_the_demos_config_taints_the_bad_node_only(tmp_path):
    c = demo_kube.Cluster(NAMES).start()
    listen = f"127.0.0.1:{free_port()}"
    cfg = tmp_path / "remediate.yaml"
    cfg.write_text(yaml.safe_dump(fleet.remediate_config(listen, c.url, str(tmp_path / "audit.jsonl"))))
    log = tmp_path / "remediate.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fleetcanary", "remediate", "--config", str(cfg)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ))
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise StopWaiting(f"remediate exited {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                return http_get(f"http://{listen}/healthz", timeout=2)[0] == 200
            except OSError:
                return False
        wait_for(up, timeout=60, what="fleetcanary remediate serving")
        alert = {"status": "firing", "fingerprint": "0123abcd",
                 "labels": {"alertname": "FleetCanaryGPUUncorrectableECC", "severity": "critical", "node": BAD,
                            "gpu": "6"},
                 "annotations": {"summary": "GPU 6 has 1 uncorrectable ECC error"}}
        req = urllib.request.Request(f"http://{listen}/webhook", method="POST",
                                     data=json.dumps({"version": "4", "status": "firing", "alerts": [alert]}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        wait_for(lambda: demo_kube.touched(c.node(BAD)) and c.events, timeout=30, what="the bad node quarantined")
        assert demo_kube.touched(c.node(BAD)) == ["taint fleetcanary.io/quarantine:NoSchedule",
                                                  "label fleetcanary.io/health=failed"]
        assert all(not demo_kube.touched(c.node(n)) for n in NAMES if n != BAD)
        (event,) = c.events
        assert event["reason"] == "Quarantined" and event["involvedObject"]["name"] == BAD
        assert "FleetCanaryGPUUncorrectableECC (critical, gpu=6)" in event["message"]
        assert "GPU 6 has 1 uncorrectable ECC error" in event["message"]
        lines = demo_kube.report(c, BAD)
        assert lines[0].endswith("taint fleetcanary.io/quarantine:NoSchedule, label fleetcanary.io/health=failed")
        assert "  remediate on healthy nodes: 5 of 5 untouched" in lines
        # no exporter ran here: the report says no condition was written rather than that all are clear
        assert f"  node conditions on {BAD}: none written by its exporter" in lines
        assert lines[-1].startswith("  node conditions on healthy nodes: 0 of 5 with every fault condition False")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        c.stop()
