"""deploy/components/remediate (through deploy/overlays/remediate): it builds offline, validates against the
Kubernetes schema, grants the controller the least it needs, runs two locked-down replicas with a config the
controller accepts in dry-run, and its alert rules pass promtool and fire when the breaker opens."""
from __future__ import annotations

import subprocess

import yaml

from fleetcanary.probes.lib import yamltext
from fleetcanary.remediate import config
from tests.support.helpers import require_binary
from tests.support.kubernetes_schemas import kubernetes_validate
from tests.test_deploy import K8S_VERSION, ROOT, kustomize, one

COMPONENT = ROOT / "deploy/components/remediate"


def test_the_overlay_builds_and_validates_with_least_privilege():
    docs = kustomize("deploy/overlays/remediate")
    for d in docs:
        if not d["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    role = one(docs, "ClusterRole", "fleetcanary-remediate")
    assert {(res, v) for r in role["rules"] for res in r["resources"] for v in r["verbs"]} == {
        ("nodes", "get"), ("nodes", "list"), ("nodes", "patch"), ("events", "create")}
    lease = one(docs, "Role", "fleetcanary-remediate-lease")
    assert lease["metadata"]["namespace"] == "fleetcanary"
    assert [(r["apiGroups"], r["resources"], sorted(r["verbs"])) for r in lease["rules"]] == [
        (["coordination.k8s.io"], ["leases"], ["create", "get", "update"])]
    dep = one(docs, "Deployment", "fleetcanary-remediate")
    assert dep["spec"]["replicas"] == 2
    spec = dep["spec"]["template"]["spec"]
    sc = spec["containers"][0]["securityContext"]
    assert spec["securityContext"]["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert spec["serviceAccountName"] == "fleetcanary-remediate"
    svc = one(docs, "Service", "fleetcanary-remediate")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    # the exporter's own grants are unchanged by the component
    exporter = one(docs, "ClusterRole", "fleetcanary")
    assert {(res, v) for r in exporter["rules"] for res in r["resources"] for v in r["verbs"]} == {
        ("nodes", "get"), ("pods", "list"), ("resourceslices", "list"), ("resourceclaims", "get")}


def test_the_shipped_config_is_valid_and_dry_run(tmp_path):
    docs = kustomize("deploy/overlays/remediate")
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(
        "fleetcanary-remediate-config")]
    f = tmp_path / "remediate.yaml"
    f.write_text(cm["data"]["remediate.yaml"])
    s = config.load(f)
    assert s.dry_run is True and len(s.rules) >= 2
    volumes = one(docs, "Deployment", "fleetcanary-remediate")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": cm["metadata"]["name"]}} in volumes


def test_the_alertmanager_example_checks_and_routes_to_the_service():
    r = subprocess.run([require_binary("amtool"), "check-config", str(COMPONENT / "alertmanager-route.example.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    am = yamltext.load((COMPONENT / "alertmanager-route.example.yml").read_text())
    (hook,) = next(x for x in am["receivers"] if x["name"] == "fleetcanary-remediate")["webhook_configs"]
    assert hook["url"] == "http://fleetcanary-remediate.fleetcanary.svc:9841/webhook" and hook["send_resolved"]


def test_the_breaker_alert_passes_promtool_and_fires(tmp_path):
    rule = yamltext.load((COMPONENT / "prometheusrule.yaml").read_text())
    breaker = next(r for r in rule["spec"]["groups"][0]["rules"] if r["alert"] == "FleetCanaryRemediationBreakerOpen")
    annotations = {k: v.replace("{{ $labels.pool }}", "a") for k, v in breaker["annotations"].items()}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m",
                   "input_series": [{"series": 'fleetcanary_remediate_breaker_open{pool="a",pod="r-0"}',
                                     "values": "0 0 1 1"},
                                    {"series": 'fleetcanary_remediate_leader{pod="r-0"}', "values": "1x10"}],
                   "alert_rule_test": [
                       {"eval_time": "1m", "alertname": "FleetCanaryRemediationBreakerOpen", "exp_alerts": []},
                       {"eval_time": "3m", "alertname": "FleetCanaryRemediationBreakerOpen",
                        "exp_alerts": [{"exp_labels": {"pool": "a", "severity": "critical"},
                                        "exp_annotations": annotations}]},
                       {"eval_time": "10m", "alertname": "FleetCanaryRemediationNoLeader", "exp_alerts": []}]}]}))
    promtool = require_binary("promtool")
    r = subprocess.run([promtool, "test", "rules", "test.yml"], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
