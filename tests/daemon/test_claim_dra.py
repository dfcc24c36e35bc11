"""Claim pods on a DRA node (fleetcanary.daemon.claim, daemon/claim_dra.py) against the API stand-in: a node
without nvidia.com/gpu whose ResourceSlices publish GPUs gets a ResourceClaim of the gpu.nvidia.com device class
and a pod that references it (both valid against the Kubernetes 1.34 schema, the first with resource.k8s.io/v1,
and the newest kubernetes-validate has); both go once the pod has ended. A node with the device plugin keeps
requesting nvidia.com/gpu."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.daemon.test_claim import NODE, held_for_an_hour
from tests.support.kube_api import DRA_SCHEMA_VERSION, KubeAPI, node
from tests.support.kubernetes_schemas import kubernetes_validate
from tests.test_deploy import K8S_VERSION

SLICES = json.loads((Path(__file__).resolve().parent.parent / "fixtures" / "dra" / "resourceslices.json").read_text())


@pytest.fixture
def api(tmp_path):
    a = KubeAPI(tmp_path)
    a.nodes[NODE] = node(NODE, {}, None)       # no nvidia.com/gpu: the GPU Operator runs the DRA driver
    a.resource_slices = SLICES
    yield a
    a.close()


def test_a_dra_node_gets_a_resource_claim_and_a_pod_that_uses_it(tmp_path, api):
    d, _ = held_for_an_hour(tmp_path, api)
    try:
        assert d.kube.snapshot().dra_gpus == 7
        assert d.claimer.tick() == "created"
        assert d.claimer.tick() == "waiting"
        (claim,) = api.claims_created
        (pod,) = api.created
        api.pod("fleetcanary", pod["metadata"]["name"])["status"]["phase"] = "Succeeded"
        assert d.claimer.tick() == "deleted"
    finally:
        d.server.stop()
    assert api.invalid == []                   # the stand-in validated the claim on create
    assert claim["metadata"]["name"] == pod["metadata"]["name"] == "fleetcanary-claim-gpu-a"
    assert claim["spec"]["devices"]["requests"] == [
        {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 7}}]
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    spec = pod["spec"]
    assert spec["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "fleetcanary-claim-gpu-a"}]
    (c,) = spec["containers"]
    assert c["resources"]["claims"] == [{"name": "gpus"}] and "nvidia.com/gpu" not in c["resources"]["limits"]
    assert api.deleted == ["fleetcanary-claim-gpu-a"] and api.resource_claims == []   # the claim went with it
    for version in (DRA_SCHEMA_VERSION, K8S_VERSION):
        kubernetes_validate.validate(pod, version, strict=True)
        kubernetes_validate.validate({k: v for k, v in claim.items() if k != "status"}, version, strict=True)


def test_a_claim_left_by_an_earlier_exporter_is_kept_and_a_refusal_counted(tmp_path, api):
    d, now = held_for_an_hour(tmp_path, api)
    api.resource_claims.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                "metadata": {"name": "fleetcanary-claim-gpu-a", "namespace": "fleetcanary"},
                                "spec": {"devices": {"requests": []}}})
    try:
        assert d.claimer.tick() == "created"              # 409 on the claim: the pod is still made
        api.pods.clear()
        api.fail["create_resourceclaim"] = 403
        now[0] += 7200
        assert d.claimer.tick() == "error"
        text = d.store.exposition.decode()
    finally:
        d.server.stop()
    assert len(api.created) == 1
    assert 'fleetcanary_kubernetes_api_errors_total{operation="create_resourceclaim",reason="forbidden"} 1.0' in text


def test_a_device_plugin_node_keeps_requesting_nvidia_com_gpu(tmp_path, api):
    api.nodes[NODE] = node(NODE, {}, 8)
    d, _ = held_for_an_hour(tmp_path, api)
    try:
        assert d.claimer.tick() == "created"
    finally:
        d.server.stop()
    (pod,) = api.created
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "resourceClaims" not in pod["spec"] and api.claims_created == []
