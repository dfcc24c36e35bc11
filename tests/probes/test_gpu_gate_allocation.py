"""The GPU gate with the kubelet's per-GPU allocation (fleetcanary.probes.lib.gpu_gate): on the recorded 8-GPU
node (fake NVML), GPUs held by pods are left out and the free ones are measured, under either policy; MIG
slices in use leave their parent GPU alone; without per-GPU knowledge the node-wide view skips every GPU."""
from __future__ import annotations

import json

import pytest

from fleetcanary.probes.base import ProbeSkipped
from fleetcanary.probes.lib import gpu_gate, nvml
from fleetcanary.probes.testing.nvml_fake import FACTS_DIR
from tests.support.gpu import fake

FIXTURES = FACTS_DIR


def uuids(name: str = "h100_8gpu_healthy") -> list[str]:
    return [d["uuid"] for d in json.loads((FIXTURES / f"{name}.json").read_text())["devices"]]


def gate(kube: dict, policy: str = "node", gpu: dict | None = None) -> gpu_gate.Gate:
    with nvml.open_session() as session:
        return gpu_gate.gate(session, session.handles(), gpu or {}, kube, 1.0, policy)


@pytest.mark.parametrize("policy", ["node", "gpu"])
def test_three_gpus_held_by_pods_leave_the_other_five_measured(monkeypatch, policy):
    fake(monkeypatch, "h100_8gpu_healthy")
    u = uuids()
    g = gate({"allocated_gpu_uuids": [u[3], u[5], u[6]], "allocated_mig_uuids": []}, policy)
    assert [h.index for h in g.usable] == [0, 1, 2, 4, 7]
    assert g.skipped == {3: "gpu_allocated", 5: "gpu_allocated", 6: "gpu_allocated"}
    assert g.record() == {"measured_gpus": [0, 1, 2, 4, 7],
                          "skipped_gpus": {"3": "gpu_allocated", "5": "gpu_allocated", "6": "gpu_allocated"}}


def test_every_gpu_held_skips_with_gpu_allocated(monkeypatch):
    fake(monkeypatch, "h100_8gpu_healthy")
    with pytest.raises(ProbeSkipped) as e:
        gate({"allocated_gpu_uuids": uuids(), "allocated_mig_uuids": []})
    assert e.value.reason == "gpu_allocated"


def test_without_the_kubelets_view_one_pod_with_a_gpu_skips_the_whole_node(monkeypatch):
    fake(monkeypatch, "h100_8gpu_healthy")
    with pytest.raises(ProbeSkipped) as e:
        gate({"gpus_allocated": True, "allocated_gpu_count": 1})
    assert e.value.reason == "gpu_allocated"


def test_a_gpu_busy_without_an_allocation_still_stops_the_node_policy(monkeypatch):
    """Processes on GPUs no pod holds (a job outside Kubernetes): policy node leaves the node alone, gpu measures
    the rest."""
    fake(monkeypatch, "h100_8gpu_busy")
    with pytest.raises(ProbeSkipped) as e:
        gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": []}, "node")
    assert e.value.reason == "gpu_busy"
    g = gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": []}, "gpu")
    assert [h.index for h in g.usable] == [4, 5, 6, 7]


def test_a_mig_slice_nvml_cannot_place_leaves_every_mig_gpu_alone(monkeypatch, tmp_path):
    """Facts without a MIG device list (NVML that cannot list them): which GPU holds the slice is unknown, so
    every GPU in MIG mode counts as held."""
    facts = json.loads((FIXTURES / "h100_8gpu_healthy.json").read_text())
    facts["devices"][2]["mig"] = [1, 1]          # GPU 2 in MIG mode, its slices handed to pods
    path = tmp_path / "mig.json"
    path.write_text(json.dumps(facts))
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(path))
    g = gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": ["MIG-9f1a2b3c-0d4e-5f60-8172-93a4b5c6d7e8"]})
    assert g.skipped == {2: "gpu_allocated"} and len(g.usable) == 7
    g = gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": []})
    assert g.skipped == {2: "unsupported"} and len(g.usable) == 7   # a MIG-mode GPU cannot be measured whole
