"""deploy/: kustomize builds, every manifest validates against the Kubernetes schemas, the DaemonSet
is what a careful platform team would apply, and the generated PrometheusRule and dashboards match their
sources."""
import copy
import functools
import json
import re
import subprocess
from pathlib import Path

import pydantic
import pytest
import yaml

from fleetcanary.core import config as configmod
from fleetcanary.probes.lib import yamltext
from harness.kube_api import K8S_VERSION
from tests.support import prometheus_operator
from tests.support.helpers import require_binary
from tests.support.kubernetes_schemas import kubernetes_validate

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
# Each rendering and the components (deploy/components/*) it includes: an overlay is the base and one component;
# the production example combines every component of a GPU fleet.
PRODUCTION = "deploy/examples/production"
FEATURES = {"deploy": set(), **{f"deploy/overlays/{c}": {c} for c in (
    "cpu-only", "node-conditions", "local-nvme-storage", "fabric", "gpu-allocation", "xid-watch", "scheduled-runs",
    "host-state")},
    PRODUCTION: {"host-state", "gpu-allocation", "xid-watch", "scheduled-runs", "fabric", "node-conditions",
                 "remediate"}}
VARIANTS = list(FEATURES)


def kustomize(path: str) -> list[dict]:
    """The rendered manifests (a fresh copy: tests change them); each path is rendered once per process."""
    return copy.deepcopy(_kustomize(path))


@functools.cache
def _kustomize(path: str) -> tuple[dict, ...]:
    kubectl = require_binary("kubectl")
    r = subprocess.run([kubectl, "kustomize", str(ROOT / path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return tuple(d for d in yamltext.load_all(r.stdout) if d)


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def config_of(docs) -> dict:
    """The fleetcanary config in the generated (hash-suffixed) ConfigMap."""
    maps = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("fleetcanary-config")]
    assert len(maps) == 1
    return yamltext.load(maps[0]["data"]["config.yaml"])


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request):
    return request.param, kustomize(request.param)


def test_every_core_manifest_validates_against_the_kubernetes_schema(variant):
    path, docs = variant
    kinds = set()
    for d in docs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            prometheus_operator.validate(d)  # the Prometheus Operator's CRD schemas
            continue
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        kinds.add(d["kind"])
    # kubectl's client-side apply writes the object into an annotation; all of them may be 262,144 bytes at most
    sizes = {(d["kind"], d["metadata"]["name"]): len(json.dumps(d, separators=(",", ":"))) for d in docs}
    assert max(sizes.values()) < 262_144 // 2, max(sizes.items(), key=lambda kv: kv[1])
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet",
            "Service"} <= kinds, path


def test_a_broken_monitor_or_rule_is_refused_by_the_crd_check():
    docs = kustomize("deploy")
    pm, pr = one(docs, "PodMonitor"), one(docs, "PrometheusRule", "fleetcanary-peers")
    prometheus_operator.validate(pm)
    prometheus_operator.validate(pr)
    pm["spec"]["podMetricsEndpoints"][0]["relabeling"] = []   # relabelings, misspelt
    pr["spec"]["groups"][0]["rules"][0]["exp"] = "up"
    for d in (pm, pr):
        with pytest.raises(pydantic.ValidationError):
            prometheus_operator.validate(d)


def test_a_broken_manifest_is_refused_by_the_schema_check():
    ds = one(kustomize("deploy"), "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["prot"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


def test_the_daemonset_is_locked_down(variant):
    path, docs = variant
    ds = one(docs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    sc = c["securityContext"]
    has = FEATURES[path].__contains__
    added = sorted(sc.get("capabilities", {}).get("add", []))
    assert added == sorted(cap for f, cap in (("xid-watch", "SYSLOG"), ("fabric", "IPC_LOCK")) if has(f)), path
    if has("gpu-allocation") or has("xid-watch"):  # root's socket, root's kernel log: UID 0, no escalation
        assert spec["securityContext"]["runAsNonRoot"] is False and sc["runAsUser"] == 0
    else:
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc.get("privileged")
    assert "hostNetwork" not in spec and "hostPID" not in spec
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert set(c["resources"]["requests"]) == {"cpu", "memory"}, "no nvidia.com/gpu request, ever"
    assert set(c["resources"]["limits"]) == {"memory"}, "no CPU limit (a quota biases the host figures)"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    state = volumes[mounts["/var/lib/fleetcanary"]]
    if has("host-state"):  # the state directory on the host, handed to the exporter's UID at start
        assert state["hostPath"] == {"path": "/var/lib/fleetcanary", "type": "DirectoryOrCreate"}
    else:
        assert "emptyDir" in state
    cfg = configmod.settings_model()(**config_of(docs))
    longest = max(e.timeout_seconds for e in cfg.probe_entries().values() if e.enabled)
    assert spec["terminationGracePeriodSeconds"] > longest, (spec["terminationGracePeriodSeconds"], longest)
    # hostPath only where a configured storage target needs it
    targets = {t.path for t in cfg.probes.storage.params.targets} if cfg.probes.storage.enabled else set()
    host_mounts = {m for m, v in mounts.items() if "hostPath" in volumes[v]}
    # RDMA's device files, nothing else (test_the_fabric_overlay_adds_only_what_rdma_needs)
    if cfg.probes.fabric.enabled:
        targets |= {"/dev/infiniband"}
    if has("xid-watch"):  # the kernel log, read-only
        targets |= {"/dev/kmsg"}
        assert next(m for m in c["volumeMounts"] if m["name"] == "kmsg")["readOnly"] is True
    inits = {i["name"]: i for i in spec.get("initContainers", [])}
    assert set(inits) == {n for f, n in (("scheduled-runs", "inbox-owner"), ("host-state", "state-owner")) if has(f)}
    if has("scheduled-runs"):  # the claim pods' inbox, shared with them, owned by the exporter's UID
        targets |= {"/var/lib/fleetcanary/inbox"}
        init = inits["inbox-owner"]
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
        assert init["securityContext"]["allowPrivilegeEscalation"] is False and init["image"] == c["image"]
        assert {e["name"] for e in c["env"]} >= {"POD_NAMESPACE", "POD_NAME", "POD_UID"}
        assert cfg.kubernetes.claim.enabled and cfg.kubernetes.claim.image == c["image"]
    if has("host-state"):
        targets |= {"/var/lib/fleetcanary"}
        init = inits["state-owner"]
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
        assert init["securityContext"]["allowPrivilegeEscalation"] is False and init["image"] == c["image"]
    if has("gpu-allocation"):  # the kubelet's pod-resources socket, read-only
        targets |= {cfg.kubernetes.pod_resources_socket.rsplit("/", 1)[0]}
        assert next(m for m in c["volumeMounts"] if m["name"] == "pod-resources")["readOnly"] is True
    assert host_mounts == targets, (host_mounts, targets)
    if has("cpu-only"):
        assert "runtimeClassName" not in spec and "NVIDIA_VISIBLE_DEVICES" not in env
        assert not any(e.enabled for n, e in cfg.probe_entries().items() if n.startswith("gpu_"))
    else:
        assert spec["runtimeClassName"] == "nvidia"
        assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
        assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "compute,utility"
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_the_fabric_overlay_adds_only_what_rdma_needs():
    docs = kustomize("deploy/overlays/fabric")
    c = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert {"name": "fabric", "containerPort": 29400, "protocol": "TCP"} in c["ports"]
    cfg = configmod.settings_model()(**config_of(docs))
    fab = cfg.probes.fabric
    assert fab.enabled and fab.params.port == 29400 and fab.params.members_from == "kubernetes"
    assert fab.interval_seconds == fab.params.slot_seconds
    assert fab.params.secret_file.startswith("/etc/fleetcanary-fabric/")
    assert not any(d["kind"] == "Secret" for d in docs), "the fleet secret is never shipped"
    np = one(docs, "NetworkPolicy")
    fleet = {"app.kubernetes.io/name": "fleetcanary"}
    assert np["spec"]["podSelector"]["matchLabels"] == fleet and np["spec"]["policyTypes"] == ["Ingress"]
    from_fleet = [r for r in np["spec"]["ingress"] if r.get("from")]
    assert [p["podSelector"]["matchLabels"] for r in from_fleet for p in r["from"]] == [fleet]
    assert from_fleet[0]["ports"][0]["port"] <= fab.params.port <= from_fleet[0]["ports"][0]["endPort"]
    open_to_all = [r for r in np["spec"]["ingress"] if not r.get("from")]
    assert [p["port"] for r in open_to_all for p in r["ports"]] == [9835], "only the metrics port is open to all"


def test_rbac_grants_the_least_it_needs(variant):
    path, docs = variant
    # the remediation controller's own objects: tests/remediate/test_manifests.py
    docs = [d for d in docs if not d["metadata"]["name"].startswith("fleetcanary-remediate")]
    granted = {(res, verb) for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]
               for res in r["resources"] for verb in r["verbs"]}
    base = {("nodes", "get"), ("pods", "list"), ("resourceslices", "list"), ("resourceclaims", "get")}  # DRA too
    cfg = configmod.settings_model()(**config_of(docs))
    if cfg.kubernetes.node_condition.enabled:
        assert granted == base | {("nodes/status", "patch")}, path
    else:
        assert granted == base, path
    # namespaced: a claim's pod and, on a DRA node, its ResourceClaim (overlays/scheduled-runs), nothing else
    in_ns = {(res, verb) for d in docs if d["kind"] == "Role" for r in d["rules"]
             for res in r["resources"] for verb in r["verbs"]}
    assert in_ns == ({(res, verb) for res in ("pods", "resourceclaims") for verb in ("create", "get", "delete")}
                     if cfg.kubernetes.claim.enabled else set()), path
    sa = one(docs, "ServiceAccount", "fleetcanary")["metadata"]["name"]
    for b in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "fleetcanary"}]
    claim_sa = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] != sa]
    assert all(d["automountServiceAccountToken"] is False for d in claim_sa)  # the claim pod: no API at all


def test_the_config_map_is_a_valid_fleetcanary_config(variant, tmp_path):
    _, docs = variant
    f = tmp_path / "config.yaml"
    f.write_text(yaml.safe_dump(config_of(docs)))
    # the files it names (the fabric overlay's secret) are mounted in the pod, not on this machine
    settings = configmod.load(f, check_files=False)
    assert settings.state_dir == "/var/lib/fleetcanary"


def test_pod_monitor_sets_the_node_label_and_matches_the_pods():
    docs = kustomize("deploy")
    pm = one(docs, "PodMonitor")
    ds = one(docs, "DaemonSet")
    assert pm["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    ep = pm["spec"]["podMetricsEndpoints"][0]
    ports = {p["name"] for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ep["port"] in ports and ep["path"] == "/metrics"
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in ep["relabelings"]
    svc = one(docs, "Service")
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_prometheus_rule_matches_its_source(tmp_path):
    docs = kustomize("deploy")
    rules = [d for d in docs if d["kind"] == "PrometheusRule"]
    source = [g for f in ("fleetcanary.rules.yml", "fleetcanary.alerts.yml")
              for g in yamltext.load((ROOT / "alerts" / f).read_text())["groups"]]
    by_name = sorted(source, key=lambda g: g["name"])  # kustomize sorts objects of a kind by name
    assert [d["spec"]["groups"] for d in sorted(rules, key=lambda d: d["metadata"]["name"])] == [[g] for g in by_name]
    f = tmp_path / "rules.yml"
    f.write_text(yaml.safe_dump({"groups": [g for d in rules for g in d["spec"]["groups"]]}))
    r = subprocess.run([require_binary("promtool"), "check", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    maps = [d for d in docs if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"].get("labels", {})]
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" and len(m["data"]) == 1 for m in maps)
    shipped = sorted(p.name for p in (ROOT / "dashboards/json").glob("*.json"))
    assert sorted(k for m in maps for k in m["data"]) == shipped


def test_plain_prometheus_scrape_example_is_valid(tmp_path):
    cfg = yamltext.load((DEPLOY / "prometheus-scrape.example.yml").read_text())
    cfg["rule_files"] = [str(ROOT / "alerts/fleetcanary.rules.yml"), str(ROOT / "alerts/fleetcanary.alerts.yml")]
    job = cfg["scrape_configs"][0]
    # Debian's Prometheus is built without Kubernetes service discovery, so promtool checks everything
    # else (relabeling, rules) with the discovery swapped for a static target; the discovery block is
    # checked against the fields Prometheus documents for kubernetes_sd_configs.
    sd = job.pop("kubernetes_sd_configs")
    assert [set(s) <= {"role", "namespaces", "selectors", "api_server", "kubeconfig_file", "attach_metadata"}
            for s in sd] == [True]
    assert sd[0]["role"] == "pod" and set(sd[0]["namespaces"]) <= {"names", "own_namespace"}
    assert all(set(x) <= {"role", "label", "field"} and x["role"] in ("pod", "node", "service", "endpoints",
                                                                       "endpointslice", "ingress")
               for x in sd[0]["selectors"])
    job["static_configs"] = [{"targets": ["127.0.0.1:9835"]}]
    f = tmp_path / "prometheus.yml"
    f.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([require_binary("promtool"), "check", "config", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"} in job["relabel_configs"]


def test_dockerfile_is_multi_stage_and_non_root():
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    assert len(stages) >= 2
    final = text[text.rindex("\nFROM "):]
    user = re.findall(r"^USER\s+(\S+)", final, re.MULTILINE)
    assert user and not user[-1].startswith(("0", "root")), user
    assert ":latest" not in text
    assert "COPY --from=build" in final
    # The image installs the wheel (the artefact users install), stamped with its commit.
    assert re.search(r"python -m build --wheel", text) and re.search(r'pip install "\$\{wheel\}', text)
    assert "FLEETCANARY_GIT_COMMIT" in text


def test_systemd_unit_verifies():
    analyze = require_binary("systemd-analyze")
    r = subprocess.run([analyze, "verify", str(DEPLOY / "systemd/fleetcanary.service")], capture_output=True,
                       text=True, timeout=60)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines()
                if ln.strip() and "/opt/fleetcanary/bin/fleetcanary is not executable" not in ln]
    assert not problems, problems


def test_locust_loadtest_example_builds_validates_and_wires_workers_to_the_master():
    docs = kustomize("deploy/loadtest")
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    master = one(docs, "Job", "locust-master")
    svc = one(docs, "Service", "locust-master")
    workers = one(docs, "Deployment", "locust-worker")
    settings = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("loadtest-settings")]
    assert len(settings) == 1 and settings[0]["data"]["LOCUST_HOST"].startswith("http")
    # the result goes to the master's log (a finished Job's volume cannot be read) after a drain
    assert settings[0]["data"]["FLEETCANARY_LOCUST_OUT"] == "-"
    assert float(settings[0]["data"]["FLEETCANARY_DRAIN_SECONDS"]) > 0
    # the default image has no Locust: the example names one built with the loadtest extra
    assert master["spec"]["template"]["spec"]["containers"][0]["image"].endswith("-loadtest")
    assert "EXTRAS=kube,loadtest" in (ROOT / "deploy/loadtest/kustomization.yaml").read_text()
    margs = " ".join(master["spec"]["template"]["spec"]["containers"][0]["args"])
    wargs = " ".join(workers["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "fleetcanary.offline.locustfile" in margs and "--master" in margs and "--expect-workers" in margs
    assert "fleetcanary.offline.locustfile" in wargs and f"--master-host {svc['metadata']['name']}" in wargs
    assert svc["spec"]["selector"] == master["spec"]["template"]["metadata"]["labels"]
    for pod in (master, workers):
        spec = pod["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_manifests_run_the_image_of_this_version(variant):
    """Every fleetcanary image the manifests name (containers, init containers, the claim pod's config) is tagged
    with the package's version, the version fleetcanary_build_info reports."""
    import tomllib

    from fleetcanary.core.version import version

    path, docs = variant
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version() == want
    images = [c["image"] for d in docs if d["kind"] == "DaemonSet"
              for kind in ("containers", "initContainers") for c in d["spec"]["template"]["spec"].get(kind, [])]
    cfg = configmod.settings_model()(**config_of(docs))
    if cfg.kubernetes.claim.enabled:
        images.append(cfg.kubernetes.claim.image)
        # the admission policy admits the claim image alone: the same image, named in its expression
        policy = one(docs, "ValidatingAdmissionPolicy")
        named = re.findall(r"c\.image == '([^']+)'", " ".join(v["expression"] for v in policy["spec"]["validations"]))
        assert named == [cfg.kubernetes.claim.image], (path, named)
    ours = [i for i in images if i.rsplit(":", 1)[0].endswith("/fleetcanary")]
    flavour = "-cpu" if "cpu-only" in path else ""  # the CPU flavour's tag where the GPUs are not used
    assert ours and all(i.rsplit(":", 1)[1] == want + flavour for i in ours), (path, images, want)


MIB, GIB = 1 << 20, 1 << 30


def _bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": MIB, "Gi": GIB}
    return int(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else int(quantity)


def test_resources_match_the_measured_use(variant):
    """The exporter's requests and limits against benchmarks/results/overhead.json (benchmarks/overhead.py on this
    project's machine; the GPU node's CUDA contexts estimated there, marked so): the request covers the steady
    state, the limit the worst overlap of probes with host bandwidth's arrays at their 1 GiB cap, with 10% to
    spare; the CPU request twice the measured average."""
    path, docs = variant
    measured = json.loads((ROOT / "benchmarks/results/overhead.json").read_text())
    mem = measured["container_memory"]
    res = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["resources"]
    steady = mem["daemon_peak_rss_bytes"] + mem["non_exclusive_bytes"]["gpu_health"]
    assert _bytes(res["requests"]["memory"]) >= steady
    hmb_cap = 3 * GIB + 64 * MIB  # three arrays at max_array_bytes and the interpreter
    others = mem["non_exclusive_sum_bytes"] - mem["non_exclusive_bytes"]["host_memory_bandwidth"] + hmb_cap
    gpu = not path.endswith("cpu-only")
    largest = mem["gpu_node_estimate"]["largest_exclusive_bytes"] if gpu else mem["largest_exclusive_bytes"]
    worst = mem["daemon_peak_rss_bytes"] + largest + others
    assert worst * 1.1 <= _bytes(res["limits"]["memory"]) <= worst * 1.5, (path, worst / GIB, res["limits"])
    cpu_average = measured["cpu_seconds_per_hour_all_probes"] / 3600
    assert int(res["requests"]["cpu"].removesuffix("m")) / 1000 >= 2 * cpu_average


def selects(selector: dict, labels: dict) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) against a set of labels."""
    ops = {"In": lambda k, v: k in labels and labels[k] in v, "NotIn": lambda k, v: labels.get(k) not in v,
           "Exists": lambda k, v: k in labels, "DoesNotExist": lambda k, v: k not in labels}
    return (all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
            and all(ops[e["operator"]](e["key"], e.get("values")) for e in selector.get("matchExpressions", [])))


def claim_pod_of(docs) -> dict:
    """The claim pod fleetcanary.daemon.claim builds with the rendered config, owned by an exporter pod."""
    from fleetcanary.daemon.claim import claim_pod

    cfg = configmod.settings_model()(**config_of(docs)).kubernetes.claim
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "fleetcanary-x1", "uid": "u-1"}
    return claim_pod(cfg, "gpu-a", one(docs, "Namespace")["metadata"]["name"], {"jobs": []}, 8, owner)


@pytest.mark.parametrize("path", [p for p, f in FEATURES.items() if "scheduled-runs" in f])
def test_the_daemonset_never_selects_its_claim_pods(path):
    """The DaemonSet controller adopts an orphan its selector matches and deletes surplus pods per node: a claim
    pod must be outside the selector, owned by the exporter pod but never by a controller."""
    docs = kustomize(path)
    pod = claim_pod_of(docs)
    ds = one(docs, "DaemonSet")
    assert selects(ds["spec"]["selector"], ds["spec"]["template"]["metadata"]["labels"])  # the check can match
    assert not selects(ds["spec"]["selector"], pod["metadata"]["labels"]), pod["metadata"]["labels"]
    for kind in ("Service", "PodMonitor", "NetworkPolicy"):  # scraped, served and let in as an exporter: no
        for d in (d for d in docs if d["kind"] == kind and not d["metadata"]["name"].startswith("fleetcanary-rem")):
            sel = d["spec"].get("selector") or d["spec"].get("podSelector")
            sel = sel if "matchLabels" in sel or "matchExpressions" in sel else {"matchLabels": sel}
            assert not selects(sel, pod["metadata"]["labels"]), (kind, d["metadata"]["name"])
    assert all(r.get("controller") is False and r.get("blockOwnerDeletion") is False
               for r in pod["metadata"]["ownerReferences"])


COMPONENTS = sorted(p.name for p in (DEPLOY / "components").iterdir()
                    if (p / "kustomization.yaml").is_file() and p.name != "privileged-namespace")
MARKS = {"gpu-allocation": "pod-resources", "xid-watch": "kmsg", "host-state": "state-owner",
         "scheduled-runs": "inbox-owner", "fabric": "infiniband", "local-nvme-storage": "local-nvme"}


COMBINED = [tuple(COMPONENTS), tuple(c for c in COMPONENTS if c not in MARKS),
            *(tuple(c for c in COMPONENTS if c != left) for left in COMPONENTS)]


@pytest.mark.parametrize("pair", COMBINED, ids=lambda p: "all" if len(p) == len(COMPONENTS) else "+".join(p))
def test_components_combine(pair, tmp_path):
    """Every component at once, those without a host path at once, and each left out of all (two overlays each
    added the base: a duplicate Namespace): each keeps what it adds, and the namespace is privileged exactly when
    one of them mounts a host path."""
    rel = Path("../" * len(tmp_path.parts[1:]))  # kustomize refuses absolute paths to components
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(rel / DEPLOY.relative_to("/") / "base")],
        "components": [str(rel / DEPLOY.relative_to("/") / "components" / c) for c in pair]}))
    r = subprocess.run([require_binary("kubectl"), "kustomize", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    docs = [d for d in yamltext.load_all(r.stdout) if d]
    spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    names = {v["name"] for v in spec["volumes"]} | {i["name"] for i in spec.get("initContainers", [])}
    assert {MARKS[c] for c in pair if c in MARKS} <= names, (pair, names)
    caps = spec["containers"][0]["securityContext"]["capabilities"].get("add", [])
    assert sorted(caps) == sorted(cap for c, cap in (("xid-watch", "SYSLOG"), ("fabric", "IPC_LOCK")) if c in pair)
    level = one(docs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    assert level == ("privileged" if set(pair) & set(MARKS) else "restricted"), (pair, level)
    kubernetes_validate.validate(one(docs, "DaemonSet"), K8S_VERSION, strict=True)  # the merged pod (all: above)
