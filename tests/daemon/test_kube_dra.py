"""The API server's DRA view (fleetcanary.daemon.kube, daemon/kube_dra.py) against the local API stand-in: on a
node without nvidia.com/gpu, GPUs held through ResourceClaims (allocated by gpu.nvidia.com, reserved for pods
bound to this node) count as requested; renamed and MIG resources count too; a cluster without resource.k8s.io
costs one round of 404s and is asked again later; a claim that cannot be read is counted, never raised."""
from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcanary.daemon import kube_dra
from fleetcanary.daemon.kube import Kube
from tests.daemon.test_kube import kube_cfg
from tests.support.kube_api import KubeAPI, node, pod

SLICES = json.loads((Path(__file__).resolve().parent.parent / "fixtures" / "dra" / "resourceslices.json").read_text())
NODE = "gpu-a"


def claim_pod(ns: str, name: str, node_name: str, claim: str, template: bool = False) -> dict:
    """A pod using a claim: by name, or made from a template (then named in status.resourceClaimStatuses)."""
    p = pod(ns, name, node_name)
    ref = {"name": "gpus", **({"resourceClaimTemplateName": "two-gpus"} if template else {"resourceClaimName": claim})}
    p["spec"]["resourceClaims"] = [ref]
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
    p["metadata"]["uid"] = f"uid-{name}"
    if template:
        p["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": claim}]
    return p


def resource_claim(ns: str, name: str, devices: list[str], reserved: list[str], driver="gpu.nvidia.com") -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": driver}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpus", "driver": driver, "pool": NODE, "device": d} for d in devices]}},
                "reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in reserved]}}


def make(api, **over) -> Kube:
    return Kube.in_cluster(kube_cfg(**over), NODE, token_file=str(api.token_file), ca_file=str(api.ca_file),
                           environ=api.environ)


def dra_node(tmp_path, versions=("v1",)) -> KubeAPI:
    api = KubeAPI(tmp_path)
    api.resource_versions = versions
    api.nodes[NODE] = node(NODE, {}, None)                  # a DRA node: no nvidia.com/gpu
    api.resource_slices = SLICES
    api.pods = [claim_pod("research", "train-0", NODE, "train-0-gpus-x7k2p", template=True),
                claim_pod("research", "train-0-peer", NODE, "train-0-gpus-x7k2p"),   # shares the claim
                claim_pod("inference", "vllm", NODE, "vllm-gpu"),
                claim_pod("network", "rdma", NODE, "rdma-nic"),
                claim_pod("research", "elsewhere", "gpu-b", "elsewhere-gpus"),
                pod("batch", "legacy", NODE, gpus=0)]
    api.resource_claims = [
        resource_claim("research", "train-0-gpus-x7k2p", ["gpu-3", "gpu-5"], ["train-0", "train-0-peer"]),
        resource_claim("inference", "vllm-gpu", ["gpu-6"], ["vllm"]),
        resource_claim("network", "rdma-nic", ["eth2"], ["rdma"], driver="dra.net"),
        resource_claim("research", "elsewhere-gpus", ["gpu-1"], ["elsewhere"])]
    return api


def test_gpus_held_through_claims_on_this_node_count_as_requested(tmp_path):
    api = dra_node(tmp_path)
    try:
        k = make(api)
        assert k.sync()
        s = k.snapshot()
        ctx = k.context()
    finally:
        api.close()
    assert (s.gpus_requested, s.gpus_claimed, s.dra_gpus) == (3, 3, 7)   # a shared claim once; the NIC is no GPU
    assert s.gpu_pods == ["inference/vllm", "research/train-0", "research/train-0-peer"]
    assert ctx["gpus_allocated"] is True and ctx["allocated_gpu_count"] == 3
    assert k.slices().get("gpu.nvidia.com", NODE, "gpu-3").uuid.startswith("GPU-")
    paths = [r[1] for r in api.requests if "resource.k8s.io" in r[1]]
    assert not any("resourceclaims?" in p or p.endswith("/resourceclaims") for p in paths)   # by name, no list
    assert sum("resourceslices" in p for p in paths) == 1


def test_an_older_cluster_is_read_through_v1beta1(tmp_path):
    api = dra_node(tmp_path, versions=("v1beta1",))
    for s in api.resource_slices:
        for d in s["spec"]["devices"]:
            d["basic"] = {"attributes": d.pop("attributes")}
    try:
        k = make(api)
        assert k.sync()
    finally:
        api.close()
    assert k.snapshot().gpus_requested == 3 and k.slices().api_version == "resource.k8s.io/v1beta1"


def test_a_cluster_without_dra_is_asked_once_and_again_only_later(tmp_path):
    api = dra_node(tmp_path, versions=())
    try:
        k = make(api)
        for _ in range(3):
            assert k.sync()
        s = k.snapshot()
    finally:
        api.close()
    assert s.gpus_requested == 0 and s.slices is None and s.errors == {}
    assert sum("resource.k8s.io" in r[1] for r in api.requests) == 3   # v1, v1beta2, v1beta1 once


def test_a_node_with_the_device_plugin_and_no_claim_pods_reads_no_dra(tmp_path):
    api = KubeAPI(tmp_path)
    api.nodes[NODE] = node(NODE, {}, 8)
    api.pods = [pod("team1", "trainer", NODE, gpus=2)]
    try:
        k = make(api)
        assert k.sync()
    finally:
        api.close()
    assert k.snapshot().gpus_requested == 2
    assert not any("resource.k8s.io" in r[1] for r in api.requests)


def test_renamed_and_mig_resources_count_as_gpus(tmp_path):
    api = KubeAPI(tmp_path)
    api.nodes[NODE] = node(NODE, {}, 8)
    shared, mig = pod("nb", "alice", NODE), pod("inf", "small", NODE)
    shared["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu.shared": "1"}}
    mig["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.10gb": "2", "cpu": "4"}}
    api.pods = [shared, mig]
    try:
        k = make(api)
        assert k.sync()
        assert k.snapshot().gpus_requested == 3
        k2 = make(api, gpu_resource_names=["nvidia.com/gpu"])
        assert k2.sync()
        assert k2.snapshot().gpus_requested == 0
    finally:
        api.close()


def test_a_claim_that_cannot_be_read_is_counted_and_the_pods_still_are(tmp_path):
    api = dra_node(tmp_path)
    api.fail["read_resourceclaim"] = 403
    try:
        k = make(api)
        k.sync()
        s = k.snapshot()
    finally:
        api.close()
    assert s.errors[("read_resourceclaim", "forbidden")] == 1
    assert s.gpus_requested == 0 and s.gpus_claimed is None and s.dra_gpus == 7


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                       lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                       max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(st.lists(JSONISH, max_size=4))
def test_claims_of_any_shape_never_raise(claims):
    out = kube_dra.claimed(claims, [("ns", "p", "uid-p")], ("gpu.nvidia.com",))
    assert len(out.devices) <= sum(1 for _ in claims) * 100


def test_rbac_without_resourceslices_is_counted_once_per_backoff_not_every_sync(tmp_path):
    api = dra_node(tmp_path)
    api.fail["list_resourceslices"] = 403
    try:
        k = make(api)
        for _ in range(5):
            assert k.sync()
        s = k.snapshot()
    finally:
        api.close()
    assert s.errors == {("list_resourceslices", "forbidden"): 1}
    assert sum("resourceslices" in r[1] for r in api.requests) == 1
