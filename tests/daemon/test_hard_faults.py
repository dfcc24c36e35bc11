"""Hard faults decided at the edge (fleetcanary.daemon.hard_faults, xid_ledger, kube's per-fault conditions):
gpu_health's real reads of the recorded fake-NVML nodes classed into faults, held with hysteresis on a stepped
clock, said as health series by the real daemon and as node conditions through the API stand-in, whose status
patches are validated against the Kubernetes schema."""
from __future__ import annotations

import time

import pytest

from fleetcanary.daemon import hard_faults
from fleetcanary.daemon.kube import Kube
from fleetcanary.daemon.xid_ledger import XidLedger
from fleetcanary.probes.base import ProbeContext
from fleetcanary.probes.gpu_health import Config, GpuHealth
from tests.daemon.test_kube import api, kube_cfg  # noqa: F401 - the stand-in fixture
from tests.daemon.test_xid_watch import daemon_with
from tests.support.gpu import fake


def read(tmp_path, monkeypatch, facts: str) -> dict:
    fake(monkeypatch, facts)
    ctx = ProbeContext("t", str(tmp_path), time.monotonic() + 60, {"expected_count": 8})
    return GpuHealth().run(Config(xid_wait_seconds=0), ctx).extra


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_degraded_node_gets_one_condition_per_fault_class_naming_gpu_and_evidence(tmp_path, monkeypatch):
    faults = hard_faults.from_gpu_health(read(tmp_path, monkeypatch, "h100_8gpu_degraded"), 8)
    conds = hard_faults.conditions("FleetCanary", hard_faults.FaultTracker(3, 0, Clock()).observe(faults))
    assert set(conds) == {"FleetCanary" + t for t, _ in hard_faults.KINDS.values()}
    pcie = conds["FleetCanaryGPUPCIeDegraded"]
    assert pcie[:2] == ("True", "PCIeWidthDegraded") and "GPU 2 (GPU-5a7c1e02" in pcie[2] and "x8 of x16" in pcie[2]
    assert conds["FleetCanaryGPUNVLinkDown"][:2] == ("True", "NVLinkDown") and "1 of 18" in conds[
        "FleetCanaryGPUNVLinkDown"][2]
    assert conds["FleetCanaryGPUUncorrectableECC"][:2] == ("True", "UncorrectableECCErrors")
    assert conds["FleetCanaryGPURowRemapFailure"][:2] == ("True", "RowRemapPending")
    assert conds["FleetCanaryGPULost"] == ("False", "NoGPULost", "fleetcanary sees no such fault")
    states = hard_faults.gpu_states([str(i) for i in range(8)], faults, [], measured=True)
    assert states["6"] == ("failed", "uncorrectable_ecc") and states["2"] == ("degraded", "pcie_degraded")
    assert states["5"] == ("degraded", "nvlink_down") and states["0"] == ("healthy", "")
    assert hard_faults.node_state(states, faults, True) == ("failed", "uncorrectable_ecc")


def test_a_lost_gpu_and_a_healthy_node(tmp_path, monkeypatch):
    lost = hard_faults.from_gpu_health(read(tmp_path, monkeypatch, "h100_8gpu_gpu_lost"), 8)
    assert [(f.kind, f.reason) for f in lost] == [("lost", "GPUFellOffTheBus")]
    assert lost[0].evidence.startswith(f"GPU {lost[0].gpu} ")
    healthy = read(tmp_path, monkeypatch, "h100_8gpu_healthy")
    assert hard_faults.from_gpu_health(healthy, 8) == []
    missing = hard_faults.from_gpu_health(healthy, 9)
    assert [(f.kind, f.gpu, f.health) for f in missing] == [("lost", "", "gpus_missing")]
    assert "8 of 9 expected GPUs" in missing[0].evidence


def test_a_fault_clears_only_after_n_clean_observations_and_the_minimum_hold():
    clock = Clock()
    t = hard_faults.FaultTracker(clear_after=3, min_hold=600, clock=clock)
    f = hard_faults.Fault("nvlink", "5", "NVLinkDown", "nvlink_down", "GPU 5 has 1 of 18 NVLinks down")
    assert t.observe([f]) == [f]
    clock.t += 60
    assert t.observe([]) == [f] and t.observe([]) == [f]
    assert t.observe([f]) == [f]                        # a flap: the clean count starts again
    for _ in range(2):
        assert t.observe([]) == [f]
    assert t.observe([], clean_observation=False) == [f]    # an XID between runs never counts toward clearing
    assert t.observe([]) == [f]                         # three clean, but 60 s of the 600 s hold
    clock.t += 600
    assert t.observe([]) == []


def test_an_xid_sets_the_hardware_condition_with_its_class_and_first_action_and_expires():
    from fleetcanary.core import config as configmod

    xcfg = configmod.settings_model()(xid={"fault_hold_seconds": 600}).xid
    clock = Clock()
    ledger = XidLedger(xcfg, clock)
    ledger.record("3", 79, "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    ledger.record("4", 13, "pid=7, name=python3, Graphics SM Warp Exception")      # application: nothing
    ledger.record("1", 154, "GPU recovery action changed from 0x0 (None) to 0x2 (Reboot Required)")
    faults = hard_faults.from_xids(ledger.recent(), ledger.info)
    assert [(f.gpu, f.reason) for f in faults] == [("3", "HardwareXid"), ("1", "HardwareXid")]
    assert "XID 79 (bus, critical: GPU has fallen off the bus)" in faults[0].evidence
    assert "first action: Drain the node and reboot it" in faults[0].evidence
    assert "recovery_action Reboot Required" in faults[1].evidence
    clock.t += 601
    assert hard_faults.from_xids(ledger.recent(), ledger.info) == []


def test_gpu_health_measures_the_node_for_three_intervals_plus_its_timeout():
    assert hard_faults.RECENT_INTERVALS == 3
    assert hard_faults.recent(1000.0, 60.0, 30.0, now=1000.0 + 210.0)
    assert not hard_faults.recent(1000.0, 60.0, 30.0, now=1000.0 + 210.5)
    assert hard_faults.recent(1000.0, 60.0, None, now=1180.0) and not hard_faults.recent(1000.0, 60.0, None, 1181.0)
    assert not hard_faults.recent(None, 60.0, 30.0, now=1000.0)     # never succeeded
    assert not hard_faults.recent(1000.0, None, 30.0, now=1000.0)   # no interval: off, or not known yet


def test_escalation_needs_distinct_processes_within_the_window_and_honours_overrides():
    from fleetcanary.core import config as configmod

    xcfg = configmod.settings_model()(xid={"escalate_processes": 3, "escalate_window_seconds": 3600,
                                           "overrides": {79: {"class": "application"}}}).xid
    clock = Clock()
    ledger = XidLedger(xcfg, clock)
    assert [ledger.record("0", 31, f"pid={p}, name=x, MMU Fault")[1] for p in (1, 1, 2)] == [False] * 3
    clock.t += 3601                                     # pids 1 and 2 fall out of the window
    assert ledger.record("0", 31, "pid=3, name=x, MMU Fault")[1] is False
    assert ledger.record("0", 31, "pid=4, name=x, MMU Fault")[1] is False
    assert ledger.record("0", 31, "pid=5, name=x, MMU Fault")[1] is True
    assert ledger.record("0", 31, "pid=6, name=x, MMU Fault")[1] is False   # once per window
    ev, _ = ledger.record("2", 79, "pid=9, name=y, GPU has fallen off the bus.")
    assert ev.cls == "application"                      # the site's override
    assert hard_faults.from_xids([(ev, False)], ledger.info) == []


def test_per_fault_conditions_go_in_one_schema_valid_status_patch_beside_the_health_condition(api):  # noqa: F811
    k = Kube.in_cluster(kube_cfg(node_condition={"enabled": True, "per_fault": True}), "gpu-a",
                        token_file=str(api.token_file), ca_file=str(api.ca_file), environ=api.environ)
    f = hard_faults.Fault("pcie", "2", "PCIeWidthDegraded", "pcie_degraded", "GPU 2 (GPU-x, 0000:3a:00.0) x8 of x16")
    k.set_faults(hard_faults.conditions("FleetCanary", [f]))
    assert k.patch_condition() is True
    assert api.invalid == []
    conds = {c["type"]: c for c in api.nodes["gpu-a"]["status"]["conditions"]}
    assert len(api.patches) == 1 and len(conds) == 8
    assert conds["FleetCanaryHealthy"]["status"] == "True"
    assert conds["FleetCanaryGPUPCIeDegraded"]["status"] == "True"
    assert conds["FleetCanaryGPUPCIeDegraded"]["message"] == "GPU 2 (GPU-x, 0000:3a:00.0) x8 of x16"
    assert conds["FleetCanaryGPULost"]["status"] == "False"
    assert k.patch_condition() is False                 # nothing changed, no heartbeat due
    k.set_faults(hard_faults.conditions("FleetCanary", []))
    assert k.patch_condition() is True and api.invalid == []
    assert api.nodes["gpu-a"]["status"]["conditions"][1:] and all(
        c["status"] == "False" for c in api.nodes["gpu-a"]["status"]["conditions"] if c["type"] != "FleetCanaryHealthy")
    assert k.snapshot().fault_conditions["FleetCanaryGPUPCIeDegraded"] == "False"


def test_per_fault_off_patches_the_health_condition_alone(api):  # noqa: F811
    k = Kube.in_cluster(kube_cfg(node_condition={"enabled": True}), "gpu-a", token_file=str(api.token_file),
                        ca_file=str(api.ca_file), environ=api.environ)
    k.set_faults(hard_faults.conditions("FleetCanary", []))
    assert k.patch_condition() is True
    assert [c["type"] for c in api.patches[-1][1]["status"]["conditions"]] == ["FleetCanaryHealthy"]


# the degraded node's GPU 6 also raises XIDs 63 and 94 in gpu_health's event wait: 94 (memory, critical) is the
# worst reason it has, above its uncorrectable ECC count
@pytest.mark.parametrize("facts, gpu6", [("h100_8gpu_degraded", ("failed", "hardware_xid")),
                                         ("h100_8gpu_healthy", ("healthy", ""))])
def test_the_daemon_publishes_one_health_series_per_gpu_and_a_node_summary(tmp_path, monkeypatch, facts, gpu6):
    fake(monkeypatch, facts)
    d = daemon_with(tmp_path, {"xid_watch": "off", "expected_count": 8})
    try:
        before = d.store.exposition.decode()
        assert "fleetcanary_gpu_health_state{" not in before
        out = d.run_probe("gpu_health")
        assert out.outcome == "success", out.detail
        text = d.store.exposition.decode()
    finally:
        d.server.stop()
    lines = [ln for ln in text.splitlines() if ln.startswith("fleetcanary_gpu_health_state{")]
    assert len(lines) == 8, lines
    state, reason = gpu6
    assert f'fleetcanary_gpu_health_state{{gpu="6",reason="{reason}",state="{state}"}} 1.0' in text
    node = [ln for ln in text.splitlines() if ln.startswith("fleetcanary_node_health_state{")]
    assert node == [f'fleetcanary_node_health_state{{reason="{reason}",state="{state}"}} 1.0']


def test_a_fabric_completed_with_an_error_sets_at_once_and_one_still_registering_after_three_runs(
        tmp_path, monkeypatch):
    """The GB200 tray whose GPU 1 completed its fabric registration with an error and whose GPU 3 is still in
    progress: GPU 1 at the first run; GPU 3 (normal for a while after a boot) at the third consecutive one."""
    faults = hard_faults.from_gpu_health(read(tmp_path, monkeypatch, "gb200_4gpu_fabric_not_ready"), 4)
    assert [(f.kind, f.gpu, f.confirm) for f in faults] == [
        ("fabric", "1", 1), ("fabric", "3", hard_faults.FABRIC_PENDING_RUNS)]
    t = hard_faults.FaultTracker(clear_after=3, min_hold=0, clock=Clock())
    cond = hard_faults.conditions("FleetCanary", t.observe(faults))["FleetCanaryGPUFabricNotReady"]
    assert cond[:2] == ("True", "FabricNotReady")
    assert "GPU 1 (GPU-b2c00001" in cond[2] and "state completed but not healthy" in cond[2]
    assert "Insufficient Resources (23)" in cond[2] and "GPU 3" not in cond[2]
    assert t.observe(faults, clean_observation=False) == [faults[0]]    # an XID between runs is not a run
    assert t.observe(faults) == [faults[0]]
    cond = hard_faults.conditions("FleetCanary", t.observe(faults))["FleetCanaryGPUFabricNotReady"]
    assert "GPU 3 (GPU-b2c00003" in cond[2] and "fabric state in_progress" in cond[2]
    states = hard_faults.gpu_states(["0", "1", "2", "3"], t.faults(), [], measured=True)
    assert states == {"0": ("healthy", ""), "1": ("degraded", "fabric_not_ready"), "2": ("healthy", ""),
                      "3": ("degraded", "fabric_not_ready")}


def test_a_fabric_that_completes_before_the_third_run_never_sets_the_condition():
    pending = hard_faults.Fault("fabric", "3", "FabricNotReady", "fabric_not_ready", "GPU 3 fabric state in_progress",
                                confirm=3)
    t = hard_faults.FaultTracker(clear_after=3, min_hold=0, clock=Clock())
    assert t.observe([pending]) == [] and t.observe([pending]) == []
    assert t.observe([]) == []                          # completed: the count starts again
    assert t.observe([pending]) == [] and t.observe([pending]) == []
    assert t.observe([pending]) == [pending]


@pytest.mark.parametrize("facts", ["gb200_4gpu_fabric_ready", "h100_8gpu_healthy"])
def test_no_fabric_fault_on_a_ready_fabric_or_a_node_without_one(tmp_path, monkeypatch, facts):
    faults = hard_faults.from_gpu_health(read(tmp_path, monkeypatch, facts), None)
    assert faults == []
    assert hard_faults.conditions("FleetCanary", hard_faults.FaultTracker(3, 0, Clock()).observe(faults))[
        "FleetCanaryGPUFabricNotReady"][:2] == ("False", "FabricReady")


def test_the_daemon_degrades_the_gpus_whose_fabric_is_not_ready(tmp_path, monkeypatch):
    fake(monkeypatch, "gb200_4gpu_fabric_not_ready")
    d = daemon_with(tmp_path, {"xid_watch": "off", "expected_count": 4})
    try:
        texts = []
        for _ in range(hard_faults.FABRIC_PENDING_RUNS):
            out = d.run_probe("gpu_health")
            assert out.outcome == "success", out.detail
            texts.append(d.store.exposition.decode())
    finally:
        d.server.stop()
    first, last = texts[0], texts[-1]
    assert 'fleetcanary_gpu_health_state{gpu="1",reason="fabric_not_ready",state="degraded"} 1.0' in first
    assert 'fleetcanary_gpu_health_state{gpu="3",reason="",state="healthy"} 1.0' in first
    assert 'fleetcanary_gpu_health_state{gpu="3",reason="fabric_not_ready",state="degraded"} 1.0' in last
    assert 'fleetcanary_node_health_state{reason="fabric_not_ready",state="degraded"} 1.0' in last


def _gb200(**per_gpu) -> dict:
    """A gpu_health record of a GB200 tray (4 GPUs, registered in cluster C clique 7) with fabric fields changed
    per GPU index: gpu_1={"clique_id": 8}. Constructed, not recorded."""
    gpus = []
    for i in range(4):
        fab = {"state": "completed", "status": "success", "clique_id": 7,
               "cluster_uuid": "0b2a0000-0000-4000-8000-000000000001", "health": {}}
        fab.update(per_gpu.get(f"gpu_{i}", {}))
        gpus.append({"index": i, "uuid": f"GPU-{i}", "pci_bus_id": f"0000:0{i}:00.0", "nvlinks": [], "fabric": fab})
    return {"gpus": gpus}


def test_a_gpu_in_another_clique_than_its_node_left_its_clique():
    faults = hard_faults.from_gpu_health(_gb200(gpu_2={"clique_id": 8}), 4)
    assert [(f.kind, f.gpu, f.reason) for f in faults] == [("fabric", "2", "FabricCliqueMismatch")]
    assert "GPU 2 (GPU-2" in faults[0].evidence and "/8" in faults[0].evidence and "/7" in faults[0].evidence
    assert hard_faults.from_gpu_health(_gb200(), 4) == []
    # a tie goes to the domain of the lowest GPU index; a GPU still registering is not counted
    tie = hard_faults.from_gpu_health(_gb200(gpu_0={"clique_id": 8}, gpu_1={"clique_id": 8}), 4)
    assert sorted(f.gpu for f in tie if f.reason == "FabricCliqueMismatch") == ["2", "3"]
    pending = hard_faults.from_gpu_health(_gb200(gpu_3={"state": "in_progress", "clique_id": 0}), 4)
    assert [f.reason for f in pending] == ["FabricNotReady"]


def test_a_registered_fabric_with_an_unhealthy_health_mask_is_not_ready_at_once():
    faults = hard_faults.from_gpu_health(_gb200(gpu_1={"health": {"route_unhealthy": True}}), 4)
    assert [(f.gpu, f.reason, f.confirm) for f in faults] == [("1", "FabricNotReady", 1)]
    assert "route_unhealthy true" in faults[0].evidence
    assert hard_faults.from_gpu_health(_gb200(gpu_1={"health": {"route_unhealthy": False,
                                                                 "incorrect_configuration": "none"}}), 4) == []
