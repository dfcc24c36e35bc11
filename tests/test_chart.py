"""charts/fleetcanary with the real helm (`make tools`: pinned, verified): `helm lint`, and `helm template` of every
documented values combination (each feature alone, all together), each rendering validated against the Kubernetes
schemas and the Prometheus Operator's CRD schemas; the feature renders what its kustomize component renders; a
typo'd value fails; no object nears kubectl's last-applied annotation limit; claim pods stay outside the
DaemonSet's selector and the admission policy admits them alone."""
from __future__ import annotations

import copy
import functools
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetcanary.core import config as configmod
from fleetcanary.probes.lib import yamltext
from tests.support import prometheus_operator
from tests.support.helpers import require_tool
from tests.support.kubernetes_schemas import kubernetes_validate
from tests.support.pod_security import pod_specs, violations
from tests.test_admission_policy import privileged, refusals
from tests.test_deploy import K8S_VERSION, kustomize, one, selects

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "fleetcanary"
RELEASE, NAMESPACE = "fleetcanary", "gpu-monitoring"
# bytes of all annotations of an object, kubectl.kubernetes.io/last-applied-configuration (the object) among them
LAST_APPLIED_LIMIT = 262_144
ALL = {"gpuAllocation": {"enabled": True}, "xidWatch": {"enabled": True}, "hostState": {"enabled": True},
       "scheduledRuns": {"enabled": True}, "fabric": {"enabled": True}, "nodeCondition": {"enabled": True},
       "remediate": {"enabled": True}}
# The documented combinations (docs/deploy.md, "Helm"): each feature alone, the ways to scrape, all together.
COMBINATIONS = {
    "defaults": {},
    "gpu-allocation": {"gpuAllocation": {"enabled": True}},
    "xid-watch": {"xidWatch": {"enabled": True}},
    "host-state": {"hostState": {"enabled": True}},
    "scheduled-runs": {"scheduledRuns": {"enabled": True}},
    "scheduled-runs-without-policy": {"scheduledRuns": {"enabled": True, "admissionPolicy": {"enabled": False}}},
    "fabric": {"fabric": {"enabled": True}},
    "fabric-tcp": {"fabric": {"enabled": True, "rdma": False}},
    "cpu-only": {"cpuOnly": {"enabled": True}},
    "node-condition": {"nodeCondition": {"enabled": True}},
    "remediate": {"remediate": {"enabled": True}},
    "service-monitor": {"monitor": {"kind": "ServiceMonitor"}},
    "no-operator": {"monitor": {"kind": "none"}, "prometheusRule": {"enabled": False},
                    "dashboards": {"enabled": False}},
    "default-runtime": {"runtimeClassName": "", "priorityClass": {"create": False, "name": ""}},
    "gpu-access-volume-mounts": {"gpuAccess": {"mode": "volumeMounts"}},
    "gpu-access-privileged": {"gpuAccess": {"mode": "privileged"}},
    "gke": {"gpuAccess": {"mode": "gke"}, "runtimeClassName": ""},
    "nvlink-services": {"nvlinkServices": {"enabled": True}},
    "namespace": {"namespace": {"create": True}},
    "all": {**ALL, "monitor": {"kind": "ServiceMonitor"}, "namespace": {"create": True}},
}


def helm() -> str:
    return require_tool("helm")


@functools.cache
def _render(values_json: str, release: str = RELEASE) -> tuple[dict, ...]:
    r = subprocess.run([helm(), "template", release, str(CHART), "--namespace", NAMESPACE, "--values", "-"],
                       input=values_json, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return tuple(d for d in yamltext.load_all(r.stdout) if d)


def render(values: dict, release: str = RELEASE) -> list[dict]:
    return copy.deepcopy(list(_render(json.dumps(values, sort_keys=True), release)))


def config_of(docs) -> dict:
    return yamltext.load(one(docs, "ConfigMap", f"{RELEASE}-config")["data"]["config.yaml"])


@pytest.mark.parametrize("values", [{}, COMBINATIONS["all"]], ids=["defaults", "all"])
def test_helm_lint_passes(values, tmp_path):
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    r = subprocess.run([helm(), "lint", "--strict", str(CHART), "--values", str(f)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 chart(s) failed" in r.stdout


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_every_combination_renders_valid_objects(name):
    docs = render(COMBINATIONS[name])
    kinds = set()
    for d in docs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            prometheus_operator.validate(d)
        else:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        kinds.add(d["kind"])
        size = len(json.dumps(d, separators=(",", ":")))
        assert size < LAST_APPLIED_LIMIT // 2, (d["kind"], d["metadata"]["name"], size)
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} <= kinds
    # the exporter's config is one `fleetcanary check-config` accepts
    configmod.settings_model()(**config_of(docs))


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_the_namespace_gets_the_pod_security_level_the_features_need(name):
    docs = render({**COMBINATIONS[name], "namespace": {"create": True}})
    ns = one(docs, "Namespace")
    assert ns["metadata"]["name"] == NAMESPACE
    level = ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    specs = [spec for _, _, spec in pod_specs(docs)]
    assert specs and all(violations(spec, level) == [] for spec in specs), name
    order = ("restricted", "baseline", "privileged")
    needed = max((next(lvl for lvl in order if not violations(s, lvl)) for s in specs), key=order.index)
    assert level == needed, (name, level, needed)


# A feature's values and the kustomize overlay (base + its component) whose pod it must match.
PARITY = {"deploy": {}, **{f"deploy/overlays/{n}": COMBINATIONS[n] for n in (
    "gpu-allocation", "xid-watch", "host-state", "scheduled-runs", "fabric", "cpu-only")},
    "deploy/examples/production": ALL}


def _pod(docs) -> dict:
    spec = copy.deepcopy(one(docs, "DaemonSet")["spec"]["template"]["spec"])
    for v in spec["volumes"]:
        if "configMap" in v:
            v["configMap"]["name"] = "CONFIG"  # kustomize's hash suffix, the chart's release name
    for c in spec.get("initContainers", []) + spec["containers"]:
        caps = c["securityContext"].get("capabilities", {})
        if caps.get("add") == []:
            del caps["add"]
        caps["add"] = sorted(caps.get("add", []))
        for key in ("volumeMounts", "env", "ports"):
            c[key] = sorted(c.get(key, []), key=lambda x: x.get("name") or x["mountPath"])
    for key in ("volumes", "initContainers"):
        spec[key] = sorted(spec.get(key, []), key=lambda x: x["name"])
    return spec


@pytest.mark.parametrize("path", list(PARITY))
def test_a_feature_renders_the_pod_its_kustomize_component_does(path):
    chart = render(PARITY[path])
    kust = kustomize(path)
    assert _pod(chart) == _pod(kust), path
    # and the same exporter config, but for where the fabric finds its members (this release's namespace, labels)
    mine, theirs = (configmod.settings_model()(**c).model_dump() for c in (config_of(chart), _kconfig(kust)))
    for cfg in (mine, theirs):
        cfg["probes"]["fabric"]["params"].pop("kubernetes_namespace")
        cfg["probes"]["fabric"]["params"].pop("kubernetes_label_selector")
    assert mine == theirs, path


def _kconfig(docs) -> dict:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("fleetcanary-config")]
    return yamltext.load(cm["data"]["config.yaml"])


@pytest.mark.parametrize("values, wrong", [
    ({"gpuAllocaton": {"enabled": True}}, "gpuAllocaton"),
    ({"scheduledRuns": {"enabled": True, "admisionPolicy": {"enabled": False}}}, "admisionPolicy"),
    ({"dashboards": {"lable": "x"}}, "lable"),
    ({"config": {"probes": {"gpu_healt": {"enabled": False}}}}, "gpu_healt"),
    ({"fabric": {"port": 80}}, "port"),
    ({"monitor": {"kind": "Probe"}}, "kind"),
    ({"hostState": {"enabled": "yes"}}, "enabled"),
])
def test_a_typo_or_a_wrong_value_fails_the_install(values, wrong):
    r = subprocess.run([helm(), "template", RELEASE, str(CHART), "--values", "-"], input=json.dumps(values),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and wrong in r.stderr, r.stderr


def test_the_schema_is_closed_at_every_level():
    schema = json.loads((CHART / "values.schema.json").read_text())
    open_ = []

    def walk(node, where):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and node.get("additionalProperties") is not False:
                open_.append(where)
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    walk(schema, "#")
    assert not open_, open_
    values = yamltext.load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"]), set(values) - set(schema["properties"])


def test_each_gpu_access_mode_reaches_the_gpus_without_requesting_one():
    """The exporter never requests nvidia.com/gpu; how it reaches the GPUs is per platform (docs/deploy.md)."""
    def container(values):
        docs = render(values)
        spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
        c = spec["containers"][0]
        assert "nvidia.com/gpu" not in json.dumps(c.get("resources", {}))
        return spec, c, {e["name"]: e.get("value") for e in c["env"]}
    spec, c, env = container({})
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and c["securityContext"]["privileged"] is False
    spec, c, env = container(COMBINATIONS["gpu-access-volume-mounts"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/var/run/nvidia-container-devices/all")
    vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert vol["hostPath"] == {"path": "/dev/null", "type": "CharDevice"}
    assert c["securityContext"]["privileged"] is False
    spec, c, env = container(COMBINATIONS["gpu-access-privileged"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and c["securityContext"]["privileged"] is True
    spec, c, env = container(COMBINATIONS["gke"])
    assert "runtimeClassName" not in spec and c["securityContext"]["privileged"] is True
    assert "NVIDIA_VISIBLE_DEVICES" not in env and env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/usr/local/nvidia")
    assert next(v for v in spec["volumes"] if v["name"] == mount["name"])["hostPath"]["path"] == \
        "/home/kubernetes/bin/nvidia"
    spec, c, env = container({**COMBINATIONS["gke"], "cpuOnly": {"enabled": True}})  # no GPUs: none of it
    assert c["securityContext"]["privileged"] is False and "LD_LIBRARY_PATH" not in env


def test_the_image_flavour_picks_the_tag_of_the_driver_the_nodes_run():
    def image(values):
        return one(render(values), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"]
    repo, version = "ghcr.io/fleetcanary/fleetcanary", _chart()["appVersion"]
    assert image({}) == f"{repo}:{version}"
    assert image({"image": {"flavour": "cuda12"}}) == f"{repo}:{version}-cuda12"  # R535/R550/R570 nodes
    assert image({"cpuOnly": {"enabled": True}}) == f"{repo}:{version}-cpu"
    assert image({"image": {"tag": "mine"}}) == f"{repo}:mine"


def test_nvlink_services_read_the_hosts_processes_read_only():
    docs = render(COMBINATIONS["nvlink-services"])
    spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["/host/proc"]["readOnly"] is True and mounts["/host/etc/nvidia-imex"]["readOnly"] is True
    assert "hostPID" not in spec  # the host's /proc read-only, not its PID namespace
    params = config_of(docs)["probes"]["gpu_health"]["params"]
    assert params["host_proc_path"] == "/host/proc"
    assert params["imex_nodes_config"] == "/host/etc/nvidia-imex/nodes_config.cfg"


def test_runtime_class_priority_image_and_resources_are_values():
    ds = one(render({}), "DaemonSet")["spec"]["template"]["spec"]
    assert ds["runtimeClassName"] == "nvidia" and ds["priorityClassName"] == RELEASE
    assert ds["containers"][0]["image"] == f"ghcr.io/fleetcanary/fleetcanary:{_chart()['appVersion']}"
    ds = one(render({"runtimeClassName": "", "priorityClass": {"create": False, "name": "system-node-critical"},
                     "image": {"repository": "r.example/fc", "digest": "sha256:" + "0" * 64},
                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                     "tolerations": [{"operator": "Exists"}], "nodeSelector": {"pool": "a100"}}),
             "DaemonSet")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in ds and ds["priorityClassName"] == "system-node-critical"
    assert ds["containers"][0]["image"] == "r.example/fc@sha256:" + "0" * 64
    # helm merges maps: the limit stays unless set (or set to null)
    assert ds["containers"][0]["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"},
                                                "limits": {"memory": "12Gi"}}
    assert ds["tolerations"] == [{"operator": "Exists"}]
    assert ds["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "a100"}  # merged, as helm merges maps


def _chart() -> dict:
    return yamltext.load((CHART / "Chart.yaml").read_text())


def test_the_chart_runs_the_image_of_this_version():
    import tomllib

    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert _chart()["appVersion"] == want and _chart()["version"] == want


def test_one_prometheus_rule_per_group_as_fleetcanary_rules_makes_them():
    source = [g for f in ("fleetcanary.rules.yml", "fleetcanary.alerts.yml")
              for g in yamltext.load((ROOT / "alerts" / f).read_text())["groups"]]
    docs = render({})
    rules = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert [g for d in rules for g in d["spec"]["groups"]] == source
    assert all(len(d["spec"]["groups"]) == 1 and d["metadata"]["labels"]["release"] == "kube-prometheus-stack"
               for d in rules)
    fewer = [d for d in render({"prometheusRule": {"disabledGroups": ["fleetcanary-nic"],
                                                   "labels": {"release": "kps"}}}) if d["kind"] == "PrometheusRule"]
    kept = [g["name"] for g in source if g["name"] != "fleetcanary-nic"]
    assert [d["spec"]["groups"][0]["name"] for d in fewer] == kept
    assert {d["metadata"]["labels"]["release"] for d in fewer} == {"kps"}


def test_one_dashboard_config_map_per_dashboard_for_the_grafana_sidecar():
    json_files = {p.name: json.loads(p.read_text()) for p in (ROOT / "dashboards/json").glob("*.json")}
    maps = [d for d in render({}) if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]]
    assert len(maps) == len(json_files)
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["annotations"] == {"grafana_folder": "fleetcanary"}
        ((name, text),) = m["data"].items()
        assert json.loads(text) == json_files[name]
    maps = [d for d in render({"dashboards": {"label": "dash", "labelValue": "yes", "folderAnnotation": "k8s-folder",
                                              "folder": "GPU", "namespace": "grafana"}})
            if d["kind"] == "ConfigMap" and "dash" in d["metadata"]["labels"]]
    assert len(maps) == len(json_files)
    assert all(m["metadata"]["labels"]["dash"] == "yes" and m["metadata"]["annotations"] == {"k8s-folder": "GPU"}
               and m["metadata"]["namespace"] == "grafana" for m in maps)


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
def test_the_monitor_selects_the_exporter_pods_for_kube_prometheus_stack(kind):
    docs = render({"monitor": {"kind": kind}})
    mon, ds = one(docs, kind), one(docs, "DaemonSet")
    assert mon["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    if kind == "PodMonitor":
        assert selects(mon["spec"]["selector"], pod_labels)
        ep = mon["spec"]["podMetricsEndpoints"][0]
    else:  # the monitor selects the Service, the Service the pods
        svc = one(docs, "Service")
        assert selects(mon["spec"]["selector"], svc["metadata"]["labels"])
        assert selects({"matchLabels": svc["spec"]["selector"]}, pod_labels)
        ep = mon["spec"]["endpoints"][0]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in ep["relabelings"]


def test_two_releases_do_not_select_each_others_pods():
    a, b = one(render({}), "DaemonSet"), one(render({}, release="other"), "DaemonSet")
    assert not selects(a["spec"]["selector"], b["spec"]["template"]["metadata"]["labels"])
    assert one(render({}, release="other"), "ClusterRole")["metadata"]["name"] == "other-fleetcanary"


def test_claim_pods_are_outside_the_selector_and_alone_admitted():
    from fleetcanary.daemon.claim import claim_pod

    docs = render(COMBINATIONS["all"])
    cfg = configmod.settings_model()(**config_of(docs)).kubernetes.claim
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "fleetcanary-x1", "uid": "u-1"}
    pod = claim_pod(cfg, "gpu-a", NAMESPACE, {"jobs": []}, 8, owner)
    ds = one(docs, "DaemonSet")
    assert not selects(ds["spec"]["selector"], pod["metadata"]["labels"])
    for d in docs:  # nothing that selects exporter pods selects a claim pod
        sel = d.get("spec", {}).get("selector") or d.get("spec", {}).get("podSelector")
        if isinstance(sel, dict) and d["kind"] != "DaemonSet":
            sel = sel if {"matchLabels", "matchExpressions"} & set(sel) else {"matchLabels": sel}
            assert not selects(sel, pod["metadata"]["labels"]) or d["metadata"]["name"].endswith("remediate")
    # the claim's service account and class are the release's own; the policy admits this pod, not a privileged one
    assert cfg.service_account == one(docs, "ServiceAccount", f"{RELEASE}-claim")["metadata"]["name"]
    assert cfg.priority_class == one(docs, "PriorityClass", f"{RELEASE}-claim")["metadata"]["name"]
    policy = one(docs, "ValidatingAdmissionPolicy")
    user = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
    assert refusals(policy, pod, user=user) == []
    bad = copy.deepcopy(pod)
    privileged(bad)
    assert refusals(policy, bad, user=user)
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    role = one(docs, "Role", f"{RELEASE}-claim")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete"]},
                             {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],  # a DRA node's
                              "verbs": ["create", "get", "delete"]}]
    assert "ValidatingAdmissionPolicy" not in {d["kind"] for d in render(COMBINATIONS["scheduled-runs-without-policy"])}


def test_the_remediation_controller_is_dry_run_unless_told():
    docs = render(COMBINATIONS["remediate"])
    cfg = yamltext.load(one(docs, "ConfigMap", f"{RELEASE}-remediate-config")["data"]["remediate.yaml"])
    assert cfg["dry_run"] is True and cfg["rules"]
    docs = render({"remediate": {"enabled": True, "dryRun": False, "config": {"breaker": {"max_nodes": 1}}}})
    cfg = yamltext.load(one(docs, "ConfigMap", f"{RELEASE}-remediate-config")["data"]["remediate.yaml"])
    assert cfg["dry_run"] is False and cfg["breaker"]["max_nodes"] == 1
    assert one(docs, "Deployment")["spec"]["replicas"] == 2


def test_the_helm_the_tests_run_is_the_pinned_verified_one():
    """`make tools` puts helm at .tools/bin, checked against the sha256 pinned in scripts/fetch-helm."""
    import hashlib
    import re

    path = Path(helm())
    script = (ROOT / "scripts/fetch-helm").read_text()
    pins = dict(re.findall(r"^(HELM_SHA256|HELM_VERSION)=(\S+)$", script, re.MULTILINE))
    assert set(pins) == {"HELM_SHA256", "HELM_VERSION"}
    r = subprocess.run([str(path), "version", "--short"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(pins["HELM_VERSION"]), r.stdout
    if path.parent == ROOT / ".tools" / "bin":
        assert hashlib.sha256(path.read_bytes()).hexdigest() == pins["HELM_SHA256"]


def test_scheduled_runs_refuse_a_cluster_without_the_admission_policy_api():
    """Before 1.30 there is no admissionregistration.k8s.io/v1 policy: the chart fails rather than grant an
    unnarrowed `create pods`, unless the policy is turned off on purpose."""
    def template(values, version):
        return subprocess.run([helm(), "template", RELEASE, str(CHART), "--kube-version", version, "--values", "-"],
                              input=json.dumps(values), capture_output=True, text=True, timeout=120)

    r = template(COMBINATIONS["scheduled-runs"], "1.29.4")
    assert r.returncode != 0 and "Kubernetes 1.30" in r.stderr, r.stderr
    assert template(COMBINATIONS["scheduled-runs"], "1.30.0").returncode == 0
    assert template(COMBINATIONS["scheduled-runs-without-policy"], "1.29.4").returncode == 0
    assert template({}, "1.27.0").returncode == 0
