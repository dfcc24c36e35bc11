"""DRA in the kubelet's pod-resources view (fleetcanary.daemon.pod_resources, daemon/dra.py) against a real gRPC
server on a unix socket serving recorded-shape responses (tests/fixtures/pod_resources/dra_*.json): whole GPUs,
MIG devices, a node with both the device plugin and DRA; the devices mapped to GPUs through the node's
ResourceSlices (tests/fixtures/dra), or by name where no slice is read; and a daemon on the recorded 8-GPU
NVML facts with 3 GPUs held through DRA that runs its invasive probe on the other 5."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcanary.daemon import dra
from fleetcanary.daemon.pod_resources import Client
from tests.daemon.test_pod_resources import NVML, UUIDS, daemon, listed, serve
from tests.support.kube_api import KubeAPI, node

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dra"
SLICES = json.loads((FIXTURES / "resourceslices.json").read_text())
NODE = "gpu-a"
MIG = [d["attributes"]["uuid"]["string"] for d in SLICES[0]["spec"]["devices"] if "parentUUID" in d["attributes"]]


@pytest.fixture
def sock(tmp_path) -> Path:
    return tmp_path / "kubelet.sock"


def node_slices() -> dra.SliceMap:
    return dra.slice_map([s for s in SLICES if s["spec"]["nodeName"] == NODE], api_version="resource.k8s.io/v1")


def test_whole_gpus_held_through_claims_map_to_their_uuids_through_the_slices(sock):
    a = listed(sock, "dra_whole_gpus")
    assert sorted(d.name for d in a.dra) == ["gpu-3", "gpu-5", "gpu-6"]        # the NIC driver's device: not a GPU
    assert a.devices == {} and a.gpu_uuids == []
    assert a.pods == ["inference/vllm-dra-5f7d9c8b4-q8w2e", "research/train-dra-0"]
    holder = next(h for d, h in a.dra.items() if d.name == "gpu-3")
    assert (holder.container, holder.resource) == ("trainer", "claim:research/train-dra-0-gpus-x7k2p")
    ctx = a.context(node_slices())
    assert ctx["allocated_gpu_uuids"] == sorted([UUIDS[3], UUIDS[5], UUIDS[6]])
    assert "allocated_gpu_minors" not in ctx and "allocated_unmapped_devices" not in ctx
    assert ctx["dra_devices"] == 3


def test_without_slices_the_names_give_gpu_minors(sock):
    ctx = listed(sock, "dra_whole_gpus").context(None)
    assert ctx["allocated_gpu_uuids"] == [] and ctx["allocated_gpu_minors"] == [3, 5, 6]


def test_a_held_mig_device_names_itself_and_its_parent(sock):
    ctx = listed(sock, "dra_mig").context(node_slices())
    assert ctx["allocated_mig_uuids"] == [MIG[1]] and ctx["allocated_gpu_uuids"] == [UUIDS[2]]
    assert listed(sock, "dra_mig").context(None)["allocated_gpu_minors"] == [2]   # gpu-2-mig-...: GPU minor 2


def test_a_node_with_the_device_plugin_and_dra_lists_both(sock):
    a = listed(sock, "dra_mixed")
    ctx = a.context(node_slices())
    assert ctx["allocated_gpu_uuids"] == sorted([UUIDS[0], UUIDS[4], UUIDS[7]])  # gpu.shared replica of GPU 7
    assert a.pods == ["batch/legacy-job-0", "notebooks/jupyter-carol", "research/train-dra-1"]


def test_the_gpu_resource_names_come_from_the_config(sock):
    """Without nvidia.com/gpu.shared in kubernetes.gpu_resource_names, its replica is not a GPU held."""
    k = serve(sock, "dra_mixed")
    try:
        a = Client(str(sock), timeout_seconds=5, resource_names=("nvidia.com/gpu",)).list()
        b = Client(str(sock), timeout_seconds=5, dra_drivers=()).list()
    finally:
        k.stop()
    assert a.gpu_uuids == [UUIDS[0]] and len(a.dra) == 1
    assert b.dra == {} and b.gpu_uuids == sorted([UUIDS[0], UUIDS[7]])


def test_a_gpu_drivers_device_no_slice_or_name_places_holds_every_gpu():
    r = dra.resolve([dra.Device("gpu.nvidia.com", NODE, "gpu-vfio-0"), dra.Device("gpu.nvidia.com", NODE, "gpu-1")],
                    node_slices())
    assert r.unmapped == ["gpu.nvidia.com/gpu-a/gpu-vfio-0"] and r.gpu_uuids == {UUIDS[1]}


def test_v1beta1_slices_put_attributes_under_basic():
    old = json.loads(json.dumps(SLICES[0]))
    for d in old["spec"]["devices"]:
        d["basic"] = {"attributes": d.pop("attributes")}
    m = dra.slice_map([old])
    assert m.get("gpu.nvidia.com", NODE, "gpu-0").uuid == UUIDS[0]
    assert m.get("gpu.nvidia.com", NODE, "gpu-2-mig-19-0-1").parent_uuid == UUIDS[2]


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                       lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                       max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(JSONISH)
def test_slices_of_any_shape_never_raise(junk):
    """ResourceSlices are outside input: whatever the shape, a map (maybe empty) and no exception."""
    m = dra.slice_map([junk] if isinstance(junk, dict) else junk if isinstance(junk, list) else [])
    assert all(d.uuid.startswith(("GPU-", "MIG-")) for d in m.devices.values())


# --- the daemon ------------------------------------------------------------------------------------------------
def with_api(d, api, tmp_path):
    from fleetcanary.daemon.kube import Kube

    d.kube = Kube.in_cluster(d.settings.kubernetes, NODE, token_file=str(api.token_file), ca_file=str(api.ca_file),
                             environ=api.environ)
    assert d.kube.sync()


@pytest.mark.parametrize("slices", [True, False], ids=["by-resourceslices", "by-name"])
def test_a_daemon_with_three_gpus_held_through_dra_runs_the_invasive_probe_on_the_other_five(
        tmp_path, sock, monkeypatch, slices):
    """The recorded 8-GPU node, the kubelet listing gpu-3, gpu-5 and gpu-6 held through ResourceClaims: with the
    node's ResourceSlices from the API server (a DRA node: no nvidia.com/gpu in its allocatable) the worker's
    gate gets their UUIDs; without an API server, their minors; either way it measures 0, 1, 2, 4 and 7."""
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(NVML))
    k = serve(sock, "dra_whole_gpus")
    d = daemon(tmp_path, sock)
    api = KubeAPI(tmp_path) if slices else None
    try:
        if api is not None:
            api.nodes[NODE] = node(NODE, {}, None)
            api.resource_slices = SLICES
            with_api(d, api, tmp_path)
            assert d.kube.snapshot().dra_gpus == 7                       # GPU 2 publishes MIG devices instead
            assert any("/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dgpu-a" in r[1]
                       for r in api.requests)
        d.pod_resources.refresh()
        ctx = d.gpu_allocation()
        out = d.run_probe("gpu_bandwidth")
    finally:
        d.server.stop()
        k.stop()
        if api is not None:
            api.close()
    if slices:
        assert ctx["allocated_gpu_uuids"] == sorted([UUIDS[3], UUIDS[5], UUIDS[6]])
    else:
        assert ctx["allocated_gpu_minors"] == [3, 5, 6] and ctx["allocated_gpu_uuids"] == []
    assert (out.outcome, out.reason) == ("skipped", "dependency_missing"), out  # past the gate: a CPU torch
    assert ("the gate left GPUs [0, 1, 2, 4, 7] (skipped: {'3': 'gpu_allocated', '5': 'gpu_allocated', "
            "'6': 'gpu_allocated'})") in out.detail


def test_a_pod_that_lets_go_of_a_dra_gpu_frees_it_for_an_opportunistic_run(tmp_path, sock, monkeypatch):
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(NVML))
    d = daemon(tmp_path, sock)
    freed: list[set[str]] = []
    monkeypatch.setattr(d, "run_opportunistic", lambda gpus=None: freed.append(gpus) or [])
    d.store.set_environment({**d.store.node_environment,
                             "gpus": [{"index": i, "uuid": u} for i, u in enumerate(UUIDS)]})
    d.kube = type("K", (), {"slices": staticmethod(node_slices)})()
    try:
        for name in ("dra_whole_gpus", "none"):
            k = serve(sock, name)
            try:
                d.pod_resources.refresh()
            finally:
                k.stop()
    finally:
        d.server.stop()
    assert freed == [{"3", "5", "6"}]


def test_a_daemon_with_held_mig_slices_measures_the_nodes_other_gpus(tmp_path, sock, monkeypatch):
    """Device plugin, MIG mixed strategy (tests/fixtures/pod_resources/mig_mixed.json): three slices held, on
    GPUs 0 and 1 (in MIG mode, NVML listing their MIG devices). Only those two parents are off limits; the other
    six GPUs are measured (before, one held slice skipped every MIG-mode GPU, and with MIG devices NVML could
    not place, every GPU in MIG mode)."""
    held = json.loads((Path(__file__).resolve().parent.parent / "fixtures" / "pod_resources" / "mig_mixed.json")
                      .read_text())
    migs = [c["devices"][0]["device_ids"][0] for p in held["pod_resources"] for c in p["containers"]]
    facts = json.loads(NVML.read_text())
    facts["devices"][0].update(mig=[1, 1], mig_devices=[{"uuid": migs[0]}, {"uuid": migs[1]},
                                                        {"uuid": "MIG-0e0e0e0e-0000-4000-8000-000000000003"}])
    facts["devices"][1].update(mig=[1, 1], mig_devices=[{"uuid": migs[2]}])
    path = tmp_path / "mig-facts.json"
    path.write_text(json.dumps(facts))
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(path))
    k = serve(sock, "mig_mixed")
    d = daemon(tmp_path, sock)
    try:
        d.pod_resources.refresh()
        assert sorted(d.gpu_allocation()["allocated_mig_uuids"]) == sorted(migs)
        out = d.run_probe("gpu_p2p")
    finally:
        d.server.stop()
        k.stop()
    assert (out.outcome, out.reason) == ("skipped", "dependency_missing"), out
    assert ("the gate left GPUs [2, 3, 4, 5, 6, 7] (skipped: {'0': 'gpu_allocated', '1': 'gpu_allocated'})"
            in out.detail), out.detail


def test_an_unplaced_dra_device_is_said_once_and_holds_every_gpu(sock, caplog):
    import logging

    from fleetcanary.daemon import podresources_pb2 as pb
    from fleetcanary.daemon.pod_resources import Watcher
    from tests.daemon.test_pod_resources import Kubelet

    r = pb.ListPodResourcesResponse()
    c = r.pod_resources.add(name="vfio-vm", namespace="vms").containers.add(name="compute")
    c.dynamic_resources.add(claim_name="vm-gpu", claim_namespace="vms").claim_resources.add(
        driver_name="gpu.nvidia.com", pool_name=NODE, device_name="gpu-vfio-0")
    k = Kubelet(sock, r)
    try:
        w = Watcher(Client(str(sock), timeout_seconds=5), slices=node_slices)
        w.refresh()
        with caplog.at_level(logging.WARNING, logger="fleetcanary.pod_resources"):
            ctxs = [w.context() for _ in range(3)]
    finally:
        k.stop()
        w.client.close()
    assert all(x["allocated_unmapped_devices"] == ["gpu.nvidia.com/gpu-a/gpu-vfio-0"] for x in ctxs)
    lines = [m.getMessage() for m in caplog.records]
    assert len(lines) == 1 and "gpu-vfio-0" in lines[0] and "every GPU counts as held" in lines[0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["gpu.nvidia.com", "dra.net", ""]), st.text(max_size=12),
                          st.text(max_size=24)), max_size=8))
def test_any_dynamic_resources_parse_and_place_or_hold_everything(devices):
    """Whatever driver, pool and device names a kubelet sends: parsed without an exception; each GPU-driver
    device is placed (slice or name) or listed as unmapped, so none is ever taken for free."""
    from fleetcanary.daemon import podresources_pb2 as pb
    from fleetcanary.daemon.pod_resources import parse

    r = pb.ListPodResourcesResponse()
    d = r.pod_resources.add(name="p", namespace="ns").containers.add(name="c").dynamic_resources.add(claim_name="x")
    for driver, pool, name in devices:
        d.claim_resources.add(driver_name=driver, pool_name=pool, device_name=name)
    a = parse(pb.ListPodResourcesResponse.FromString(r.SerializeToString()))
    ctx = a.context(node_slices())
    gpu_devices = {(p, n) for drv, p, n in devices if drv == "gpu.nvidia.com" and n}
    placed = len(ctx["allocated_gpu_uuids"]) + len(ctx.get("allocated_gpu_minors", []))
    assert len(a.dra) == len(gpu_devices)
    assert (placed > 0 or ctx.get("allocated_unmapped_devices")) if gpu_devices else "dra_devices" not in ctx
