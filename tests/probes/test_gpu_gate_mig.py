"""The GPU gate on MIG, DRA and shared GPUs (fleetcanary.probes.lib.gpu_gate), on the recorded 8-GPU node (fake
NVML) with MIG devices, minor numbers and MPS added to its facts: a held MIG slice leaves only its parent GPU
alone, free MIG devices are offered to probes that take them, DRA devices named by minor hold that GPU, an
unplaced DRA device holds every GPU, and MPS is named as the reason."""
from __future__ import annotations

import json

import pytest

from fleetcanary.probes.base import ProbeSkipped
from fleetcanary.probes.lib import gpu_gate, nvml
from fleetcanary.probes.testing.nvml_fake import FACTS_DIR

FACTS = json.loads((FACTS_DIR / "h100_8gpu_healthy.json").read_text())
UUIDS = [d["uuid"] for d in FACTS["devices"]]


def mig_uuid(gpu: int, slot: int) -> str:
    return f"MIG-{gpu:08x}-0000-4000-8000-{slot:012x}"


def node(monkeypatch, tmp_path, mig_gpus=(), **per_device) -> None:
    """The recorded node with `mig_gpus` in MIG mode (two 3g.40gb devices each) and extra facts per device."""
    facts = json.loads(json.dumps(FACTS))
    for i in mig_gpus:
        facts["devices"][i]["mig"] = [1, 1]
        facts["devices"][i]["mig_devices"] = [{"uuid": mig_uuid(i, s)} for s in range(2)]
    for key, values in per_device.items():
        if key == "process_names":
            facts["process_names"] = values
            continue
        for i, v in values.items():
            if key == "mig_processes":
                facts["devices"][i]["mig_devices"][v[0]]["processes"] = v[1]
            else:
                facts["devices"][i][key] = v
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(facts))
    monkeypatch.setenv(nvml.FAKE_ENV, str(path))


def gate(kube: dict, policy: str = "gpu", mig: bool = False, gpu: dict | None = None) -> gpu_gate.Gate:
    with nvml.open_session() as session:
        return gpu_gate.gate(session, session.handles(), gpu or {}, kube, 1.0, policy, mig=mig)


def test_one_held_mig_slice_leaves_the_nodes_other_gpus_measured(monkeypatch, tmp_path):
    """GPUs 2 and 6 in MIG mode, one slice of GPU 2 held by a pod: GPU 2 is off limits, the six whole GPUs are
    measured, and a probe that takes MIG devices gets GPU 6's two free slices."""
    node(monkeypatch, tmp_path, mig_gpus=(2, 6))
    held = {"allocated_gpu_uuids": [], "allocated_mig_uuids": [mig_uuid(2, 1)]}
    for policy in ("node", "gpu"):
        g = gate(held, policy, mig=True)
        assert [h.index for h in g.usable] == [0, 1, 3, 4, 5, 7]
        assert g.skipped == {2: "gpu_allocated"}
        assert g.mig == {6: [mig_uuid(6, 0), mig_uuid(6, 1)]}
        assert g.uuids == {i: UUIDS[i] for i in (0, 1, 3, 4, 5, 7)}
    g = gate(held)                      # a probe that cannot run on a MIG device
    assert g.skipped == {2: "gpu_allocated", 6: "unsupported"} and g.mig == {}
    assert g.record()["skipped_gpus"] == {"2": "gpu_allocated", "6": "unsupported"}


def test_a_busy_mig_device_is_left_out_and_the_free_one_measured(monkeypatch, tmp_path):
    node(monkeypatch, tmp_path, mig_gpus=(6,), mig_processes={6: (0, [4242])})
    g = gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": []}, mig=True)
    assert g.mig == {6: [mig_uuid(6, 1)]}
    assert g.record()["measured_mig_devices"] == {"6": [mig_uuid(6, 1)]}


def test_a_node_all_in_mig_mode_measures_its_free_slices_or_skips_unsupported(monkeypatch, tmp_path):
    node(monkeypatch, tmp_path, mig_gpus=range(8))
    g = gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": [mig_uuid(0, 0)]}, mig=True)
    assert g.usable == [] and sorted(g.mig) == [1, 2, 3, 4, 5, 6, 7]
    with pytest.raises(ProbeSkipped) as e:
        gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": []})
    assert e.value.reason == "unsupported"
    assert "GPUs [0, 1, 2, 3, 4, 5, 6, 7] are in MIG mode and this probe measures whole GPUs" in e.value.detail


def test_dra_devices_named_by_minor_hold_those_gpus(monkeypatch, tmp_path):
    """NVIDIA's DRA driver names GPUs gpu-<minor>; minors need not follow the NVML index."""
    node(monkeypatch, tmp_path, minor={i: 7 - i for i in range(8)})
    g = gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": [], "allocated_gpu_minors": [0, 1, 2]}, "node")
    assert g.skipped == {5: "gpu_allocated", 6: "gpu_allocated", 7: "gpu_allocated"}
    assert [h.index for h in g.usable] == [0, 1, 2, 3, 4]


def test_a_dra_device_nobody_could_place_holds_every_gpu(monkeypatch, tmp_path):
    node(monkeypatch, tmp_path)
    with pytest.raises(ProbeSkipped) as e:
        gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": [],
              "allocated_unmapped_devices": ["gpu.nvidia.com/node-a/gpu-vfio-0"]})
    assert e.value.reason == "gpu_allocated"


def test_an_mps_server_is_named_as_the_reason(monkeypatch, tmp_path):
    """GPU 4's only compute process is the MPS server: gpu_mps (policy gpu measures the rest; node stops)."""
    node(monkeypatch, tmp_path, processes={4: [777]}, process_names={"777": "nvidia-cuda-mps-server"})
    g = gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": []}, "gpu")
    assert g.skipped == {4: "gpu_mps"} and len(g.usable) == 7
    with pytest.raises(ProbeSkipped) as e:
        gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": []}, "node")
    assert e.value.reason == "gpu_mps"


def test_mps_clients_or_a_reachable_control_pipe_name_mps(monkeypatch, tmp_path):
    node(monkeypatch, tmp_path, mps_processes={1: [901]}, processes={3: [55]})
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "absent"))
    g = gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": []})
    assert g.skipped == {1: "gpu_mps", 3: "gpu_busy"}      # a process whose name NVML does not give: busy
    (tmp_path / "mps").mkdir()
    (tmp_path / "mps" / "control").write_text("")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "mps"))
    g = gate({"allocated_gpu_uuids": [], "allocated_mig_uuids": []})
    assert g.skipped == {1: "gpu_mps", 3: "gpu_mps"}       # a control daemon here: its server is that process


@pytest.mark.parametrize("probe", ["gpu_bandwidth", "gpu_compute"])
def test_bandwidth_and_compute_take_the_free_mig_devices(monkeypatch, tmp_path, probe):
    """The probes that run on a MIG device get GPU 6's free slices beside the whole GPUs; here torch has no CUDA,
    so the run ends after the gate, saying what it would have measured."""
    from fleetcanary.probes import PROBES
    from tests.support.gpu import ctx

    node(monkeypatch, tmp_path, mig_gpus=(2, 6))
    cls = PROBES[probe]
    with pytest.raises(ProbeSkipped) as e:
        cls().run(cls.Config(), ctx(tmp_path, kube={"allocated_gpu_uuids": [],
                                                    "allocated_mig_uuids": [mig_uuid(2, 0)]}))
    assert e.value.reason == "dependency_missing"
    assert (f"the gate left GPUs [0, 1, 3, 4, 5, 7], MIG devices {{'6': ['{mig_uuid(6, 0)}', '{mig_uuid(6, 1)}']}}"
            " (skipped: {'2': 'gpu_allocated'})") in e.value.detail
