"""Pod Security Standards on the rendered manifests (tests/support/pod_security.py): every workload of every
variant passes the level its namespace enforces; an overlay that needs more than restricted labels its namespace
with the level it needs (and no more); the checker itself catches each control it claims to."""
from __future__ import annotations

import copy

import pytest

from tests.support.pod_security import pod_specs, violations
from tests.test_deploy import VARIANTS, kustomize, one

ENFORCE = "pod-security.kubernetes.io/enforce"


@pytest.fixture(scope="module", params=VARIANTS)
def rendered(request):
    return request.param, kustomize(request.param)


def level_needed(spec: dict) -> str:
    return next(lvl for lvl in ("restricted", "baseline", "privileged") if not violations(spec, lvl))


def test_every_workload_passes_the_level_its_namespace_enforces(rendered):
    path, docs = rendered
    ns = one(docs, "Namespace")
    level = ns["metadata"]["labels"][ENFORCE]
    assert {ns["metadata"]["labels"].get(f"pod-security.kubernetes.io/{m}") for m in ("warn", "audit")} <= {level}
    found = {name: violations(spec, level) for name, namespace, spec in pod_specs(docs)
             if namespace == ns["metadata"]["name"]}
    assert found and not any(found.values()), (path, level, found)


def test_an_overlay_asks_for_no_more_than_it_needs(rendered):
    path, docs = rendered
    level = one(docs, "Namespace")["metadata"]["labels"][ENFORCE]
    needed = max((level_needed(spec) for _, _, spec in pod_specs(docs)), key=("restricted", "baseline",
                                                                            "privileged").index)
    assert level == needed, (path, level, needed)


def test_the_claim_pod_passes_the_scheduled_runs_namespace():
    from fleetcanary.core import config as configmod
    from fleetcanary.daemon.claim import claim_pod

    docs = kustomize("deploy/overlays/scheduled-runs")
    level = one(docs, "Namespace")["metadata"]["labels"][ENFORCE]
    cfg = configmod.settings_model()(kubernetes={"claim": {"enabled": True, "image": "x"}}).kubernetes.claim
    body = claim_pod(cfg, "gpu-a", "fleetcanary", {"jobs": []}, 8)
    assert violations(body["spec"], level) == []
    assert level_needed(body["spec"]) == "privileged"  # the hostPath inbox: nothing less would admit it


BASE = {"securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False,
                                                         "capabilities": {"drop": ["ALL"]}}}],
        "volumes": [{"name": "tmp", "emptyDir": {}}]}


@pytest.mark.parametrize("change, baseline, restricted", [
    (lambda s: s.update(hostNetwork=True), "host namespaces", "host namespaces"),
    (lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/dev/kmsg"}}), "hostPath", "volume types"),
    (lambda s: s["containers"][0]["securityContext"].update(privileged=True), "privileged", "privileged"),
    (lambda s: s["containers"][0]["securityContext"]["capabilities"].update(add=["IPC_LOCK"]), "capabilities",
     "capabilities"),
    (lambda s: s["containers"][0]["securityContext"]["capabilities"].update(add=["CHOWN"]), None, "capabilities"),
    (lambda s: s["containers"][0]["securityContext"].update(runAsUser=0), None, "running as non-root user"),
    (lambda s: s["securityContext"].update(runAsNonRoot=False), None, "running as non-root"),
    (lambda s: s["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"), None, "privilege escalation"),
    (lambda s: s["securityContext"].pop("seccompProfile"), None, "seccomp"),
    (lambda s: s["securityContext"].update(seccompProfile={"type": "Unconfined"}), "seccomp", "seccomp"),
    (lambda s: s["containers"][0].update(ports=[{"containerPort": 9835, "hostPort": 9835}]), "host ports",
     "host ports"),
    (lambda s: s.update(initContainers=[{"name": "i", "securityContext": {"runAsUser": 0}}]), None,
     "privilege escalation"),
])
def test_the_checker_catches_each_control(change, baseline, restricted):
    assert violations(BASE, "restricted") == [] and violations(BASE, "baseline") == []
    spec = copy.deepcopy(BASE)
    change(spec)
    b, r = violations(spec, "baseline"), violations(spec, "restricted")
    assert (baseline is None and not b) or any(v.startswith(baseline) for v in b), b
    assert any(v.startswith(restricted) for v in r), r
    assert violations(spec, "privileged") == []
