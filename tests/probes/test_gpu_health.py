"""gpu_health against fake NVML built from recorded node facts: every metric, every skip."""
import json

import pytest

from fleetcanary.daemon.state import ResultStore
from fleetcanary.probes.base import ProbeError, ProbeSkipped
from fleetcanary.probes.gpu_health import Config, GpuHealth, _nvlink_errors
from fleetcanary.probes.lib.nvml import THROTTLE_REASONS
from tests.support.gpu import FIXTURES, ctx, fake, samples, value
from tests.support.helpers import run_job

P = "fleetcanary_gpu_"


def run(tmp_path, **cfg):
    return GpuHealth().run(Config(xid_wait_seconds=0.2, **cfg), ctx(tmp_path))


def test_degraded_h100_node_shows_every_fault(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_degraded")
    r = run(tmp_path, expected_gpus=8)
    # identity and counts
    infos = [k for k in samples(r) if k[0] == P + "info"]
    assert len(infos) == 8
    assert dict(infos[0][1])["model"] == "NVIDIA H100 80GB HBM3"
    assert value(r, "fleetcanary_gpus_visible") == 8
    assert value(r, "fleetcanary_gpus_healthy") == 8
    assert value(r, "fleetcanary_gpus_expected") == 8
    # the downtrained link on GPU 2, the healthy one on GPU 1
    assert value(r, P + "pcie_link_width", gpu="2") == 8 and value(r, P + "pcie_link_width_max", gpu="2") == 16
    assert value(r, P + "pcie_link_width", gpu="1") == 16
    assert value(r, P + "pcie_link_generation", gpu="2") == 5 and value(r, P + "pcie_link_generation_max", gpu="2") == 5
    # NVLink 7 of GPU 5 is down, with its error counters; the rest are up. Per GPU by default: the links
    # active and present, the error counters each summed over the GPU's links, the link label empty
    assert value(r, P + "nvlink_links_up", gpu="5") == 17 and value(r, P + "nvlink_links_down", gpu="5") == 1
    assert value(r, P + "nvlink_links_up", gpu="4") == 18 and value(r, P + "nvlink_links_down", gpu="4") is None
    assert not [k for k in samples(r) if k[0] == P + "nvlink_up"]  # per link with per_link only
    assert value(r, P + "nvlink_errors_total", gpu="5", link="", counter="crc_flit") == 88211
    assert value(r, P + "nvlink_errors_total", gpu="5", link="", counter="replay") == 1423
    assert value(r, P + "nvlink_errors_total", gpu="4", link="", counter="replay") == 0  # the exporter hides it
    assert sum(1 for k in samples(r) if k[0] == P + "nvlink_errors_total") == 8 * 4
    # throttling on GPU 3, idle-only elsewhere: the active reasons only
    assert value(r, P + "clock_throttle_active", gpu="3", reason="hw_slowdown") == 1
    assert value(r, P + "clock_throttle_active", gpu="3", reason="sw_thermal_slowdown") == 1
    assert value(r, P + "clock_throttle_active", gpu="0", reason="hw_slowdown") is None
    assert value(r, P + "clock_throttle_active", gpu="0", reason="gpu_idle") == 1
    assert {v for k, v in samples(r).items() if k[0] == P + "clock_throttle_active"} == {1.0}
    assert sum(1 for k in samples(r) if k[0] == P + "clock_throttle_active") < 8 * len(THROTTLE_REASONS)
    # ECC and the pending remapped row on GPU 6 (the probe reads every counter; the exporter publishes
    # the zeros it must, test_health_metrics_render_in_the_exposition_from_a_worker)
    assert value(r, P + "ecc_errors_total", gpu="6", type="uncorrected", counter="volatile") == 1
    assert value(r, P + "ecc_errors_total", gpu="0", type="corrected", counter="aggregate") == 3
    assert value(r, P + "remapped_rows_pending", gpu="6") == 1
    assert value(r, P + "remapped_rows_total", gpu="6", cause="uncorrectable") == 1
    assert value(r, P + "remapped_rows_failed", gpu="6") is None  # 0: no series
    assert value(r, P + "remapped_rows_pending", gpu="0") is None
    assert value(r, P + "lost", gpu="0") is None  # a GPU that answers
    # critical XIDs caught by the event wait
    assert value(r, P + "xid_errors_total", gpu="6", xid="63", **{"class": "memory"}, severity="warning") == 1
    assert value(r, P + "xid_errors_total", gpu="6", xid="94", **{"class": "memory"}, severity="critical") == 1
    assert 0 <= value(r, P + "xid_watch_seconds_total") <= 1.0
    # 63 (a row marked for remapping, applied at the next reset) is a warning in the catalogue; 94 is critical
    assert [e["xid"] for e in r.extra["critical_xid_events"]] == [94]
    # modes and power: labels of the GPU's info series
    info = next(dict(k[1]) for k in samples(r) if k[0] == P + "info" and dict(k[1])["gpu"] == "4")
    assert (info["persistence_mode"], info["mig_mode"], info["power_limit_watts"]) == ("enabled", "disabled", "700")
    assert not [k for k in samples(r) if k[0] in (P + "persistence_mode", P + "mig_mode", P + "power_limit_watts")]
    assert all(s.labels.get("gpu") != "" for s in r.samples)
    assert r.touched == {"gpus": list(range(8)), "invasive": False}


def test_nvlink_errors_sum_over_links_and_per_link_is_opt_in(tmp_path, monkeypatch):
    """Two links of GPU 5 count errors: the default sums them per GPU; per_link gives one series per link."""
    facts = json.loads((FIXTURES / "h100_8gpu_degraded.json").read_text())
    facts["devices"][5]["nvlinks"][6]["errors"] = {"replay": 7, "recovery": 1, "crc_flit": 100, "crc_data": 0}
    path = tmp_path / "two_links.json"
    path.write_text(json.dumps(facts))
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(path))
    r = run(tmp_path)
    assert value(r, P + "nvlink_errors_total", gpu="5", link="", counter="replay") == 1423 + 7
    assert value(r, P + "nvlink_errors_total", gpu="5", link="", counter="crc_flit") == 88211 + 100
    assert {dict(k[1])["link"] for k in samples(r) if k[0] == P + "nvlink_errors_total"} == {""}
    assert r.parameters["per_link"] is False
    r = run(tmp_path, per_link=True)
    assert value(r, P + "nvlink_errors_total", gpu="5", link="7", counter="replay") == 1423
    assert value(r, P + "nvlink_errors_total", gpu="5", link="6", counter="replay") == 7
    assert value(r, P + "nvlink_errors_total", gpu="5", link="", counter="replay") is None
    assert sum(1 for k in samples(r) if k[0] == P + "nvlink_errors_total") == 8 * 18 * 4
    # the state per link too, beside the per-GPU counts the alert reads
    assert sum(1 for k in samples(r) if k[0] == P + "nvlink_up") == 8 * 18
    assert value(r, P + "nvlink_up", gpu="5", link="7") == 0 and value(r, P + "nvlink_up", gpu="5", link="6") == 1
    assert value(r, P + "nvlink_links_up", gpu="5") == 17 and value(r, P + "nvlink_links_down", gpu="5") == 1


def test_a_gpu_sum_is_left_out_when_a_link_missed_its_read():
    """A total short of one link would drop, and increase() would count that as a reset: no total then."""
    links = [{"link": 0, "errors": {"replay": 5, "crc_flit": 2}},
             {"link": 1, "errors": {"replay": None, "crc_flit": 3}}]
    assert _nvlink_errors("0", links, per_link=False) == [({"gpu": "0", "link": "", "counter": "crc_flit"}, 5.0)]
    assert _nvlink_errors("0", links, per_link=True) == [
        ({"gpu": "0", "link": "0", "counter": "replay"}, 5.0), ({"gpu": "0", "link": "0", "counter": "crc_flit"}, 2.0),
        ({"gpu": "0", "link": "1", "counter": "crc_flit"}, 3.0)]
    assert _nvlink_errors("0", [], per_link=False) == []


def test_gpu_fell_off_the_bus(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_gpu_lost")
    r = run(tmp_path, expected_gpus=8)
    assert value(r, P + "lost", gpu="4") == 1
    assert value(r, P + "lost", gpu="3") is None  # a GPU that answers has no series
    assert value(r, "fleetcanary_gpus_visible") == 8
    assert value(r, "fleetcanary_gpus_healthy") == 7
    assert value(r, "fleetcanary_gpus_expected") == 8
    assert len([k for k in samples(r) if k[0] == P + "info"]) == 7
    assert value(r, P + "pcie_link_width", gpu="4") is None
    assert r.extra["gpus"][4] == {"index": 4, "lost": True, "error": "GPU is lost"}


def test_expected_count_comes_from_the_daemon_then_the_node_label(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_healthy")
    c = ctx(tmp_path, gpu={"expected_count": 8})
    assert value(GpuHealth().run(Config(xid_wait_seconds=0), c), "fleetcanary_gpus_expected") == 8
    c = ctx(tmp_path, kube={"expected_gpus": 4})
    assert value(GpuHealth().run(Config(xid_wait_seconds=0), c), "fleetcanary_gpus_expected") == 4
    r = GpuHealth().run(Config(xid_wait_seconds=0), ctx(tmp_path))
    assert value(r, "fleetcanary_gpus_expected") is None
    assert value(r, P + "xid_watch_seconds_total") == 0


def test_no_driver_skips_with_no_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETCANARY_FAKE_NVML", raising=False)
    with pytest.raises(ProbeSkipped) as ei:
        run(tmp_path)
    assert ei.value.reason == "no_gpu"


def test_broken_nvml_is_a_failure_not_a_skip(tmp_path, monkeypatch):
    p = tmp_path / "broken.json"
    p.write_text('{"init_error": 999, "devices": []}')
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(p))
    with pytest.raises(ProbeError) as ei:
        run(tmp_path)
    assert ei.value.reason == "nvml_error"


def test_health_metrics_render_in_the_exposition_from_a_worker(tmp_path):
    """Through a real worker process and the store: cumulative device counters are set, not summed."""
    env = {"FLEETCANARY_FAKE_NVML": str(FIXTURES / "h100_8gpu_degraded.json")}
    store = ResultStore({"gpu_health": GpuHealth}, ["gpu_health"])
    for _ in range(2):
        out = run_job(GpuHealth, {"xid_wait_seconds": 0.1}, tmp_path, 30, env=env, collect_gpu_facts=True)
        assert out.outcome == "success", out
        store.apply(out)
    text = store.exposition.decode()
    assert 'fleetcanary_gpu_nvlink_errors_total{counter="crc_flit",gpu="5",link=""} 88211.0' in text
    assert 'link="7"' not in text.split("fleetcanary_gpu_nvlink_errors_total", 1)[1].split("# HELP", 1)[0]
    # device counters at 0 are no series, but for the uncorrected volatile ECC count the alert reads from 0
    assert 'fleetcanary_gpu_nvlink_errors_total{counter="replay",gpu="4",link=""}' not in text
    assert 'fleetcanary_gpu_ecc_errors_total{counter="volatile",gpu="0",type="uncorrected"} 0.0' in text
    assert 'fleetcanary_gpu_ecc_errors_total{counter="volatile",gpu="6",type="uncorrected"} 1.0' in text
    assert 'fleetcanary_gpu_ecc_errors_total{counter="volatile",gpu="0",type="corrected"}' not in text
    assert 'fleetcanary_gpu_ecc_errors_total{counter="aggregate",gpu="0",type="corrected"} 3.0' in text
    assert 'fleetcanary_gpu_remapped_rows_total{cause="uncorrectable",gpu="6"} 1.0' in text
    assert 'fleetcanary_gpu_remapped_rows_total{cause="correctable",gpu="6"}' not in text
    assert 'fleetcanary_gpu_nvlink_links_up{gpu="5"} 17.0' in text
    # events add up across runs
    assert 'fleetcanary_gpu_xid_errors_total{class="memory",gpu="6",severity="warning",xid="63"} 2.0' in text
    assert out.environment["gpu_model"] == "NVIDIA H100 80GB HBM3" and out.environment["gpu_count"] == 8
    assert out.environment["driver_version"] == "550.90.07" and out.environment["cuda_driver_version"] == "12.4"


def test_recorded_h200_facts_replay(tmp_path, monkeypatch):
    """Facts recorded on a real H200 by scripts/record-nvml-facts: a single SXM GPU in a VM,
    no NVLink visible, PCIe Gen5 x16, idle clocks."""
    fake(monkeypatch, "h200_1gpu_recorded")
    r = run(tmp_path, expected_gpus=1)
    assert value(r, "fleetcanary_gpus_visible") == 1 and value(r, "fleetcanary_gpus_healthy") == 1
    assert value(r, P + "pcie_link_generation", gpu="0") == 5 and value(r, P + "pcie_link_width", gpu="0") == 16
    assert not [k for k in samples(r) if k[0] in (P + "nvlink_up", P + "nvlink_links_up", P + "nvlink_links_down")]
    assert value(r, P + "clock_throttle_active", gpu="0", reason="gpu_idle") == 1
    assert value(r, P + "remapped_rows_pending", gpu="0") is None
    info = next(dict(k[1]) for k in samples(r) if k[0] == P + "info")
    assert info["model"] == "NVIDIA H200" and info["pci_bus_id"] == "00000000:00:06.0"
    assert info["power_limit_watts"] == "700"


def test_the_nvlink_fabric_is_recorded_per_gpu_and_labels_gpu_info_at_no_series_cost(tmp_path, monkeypatch):
    fake(monkeypatch, "gb200_4gpu_fabric_ready")
    ready = run(tmp_path)
    fake(monkeypatch, "gb200_4gpu_fabric_not_ready")
    not_ready = run(tmp_path)
    cluster = "8c4d2f1a-6b3e-4d5f-9a7b-1c2d3e4f5a6b"
    assert [g["fabric"] for g in ready.extra["gpus"]] == [
        {"state": "completed", "status": "success", "clique_id": 32766, "cluster_uuid": cluster, "health": {}}] * 4
    fabric = [g["fabric"] for g in not_ready.extra["gpus"]]
    assert fabric[1] == {"state": "completed", "status": "Insufficient Resources (23)", "clique_id": 32766,
                         "cluster_uuid": cluster, "health": {}}
    assert fabric[3]["state"] == "in_progress" and fabric[3]["status"] is None   # NVML: status only once completed
    assert len(samples(ready)) == len(samples(not_ready))   # labels of fleetcanary_gpu_info, no series of their own

    def fabric_labels(r):
        return [(i["fabric_state"], i["nvlink_domain"]) for i in
                sorted((dict(k[1]) for k in samples(r) if k[0] == P + "info"), key=lambda i: i["gpu"])]
    domain = f"{cluster}/32766"
    assert fabric_labels(ready) == [("completed", domain)] * 4
    assert fabric_labels(not_ready) == [("completed", domain), ("unhealthy", domain), ("completed", domain),
                                        ("in_progress", "")]
    fake(monkeypatch, "h100_8gpu_healthy")                   # facts without a fabric: NVML_ERROR_NOT_SUPPORTED
    no_fabric = run(tmp_path)
    assert [g["fabric"] for g in no_fabric.extra["gpus"]] == [None] * 8
    assert fabric_labels(no_fabric) == [("", "")] * 8


@pytest.mark.parametrize("missing, state", [(["nvmlDeviceGetGpuFabricInfoV"], "completed"),
                                            (["nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"], None)])
def test_an_older_driver_reads_the_v1_fabric_call_and_one_without_either_reports_no_fabric(
        tmp_path, monkeypatch, missing, state):
    facts = json.loads((FIXTURES / "gb200_4gpu_fabric_ready.json").read_text())
    path = tmp_path / "facts.json"
    path.write_text(json.dumps({**facts, "missing_calls": missing}))
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(path))
    fabric = [g["fabric"] for g in run(tmp_path).extra["gpus"]]
    assert [f and f["state"] for f in fabric] == [state] * 4


def _variant(tmp_path, monkeypatch, base: str, change) -> None:
    """Facts `base` changed by `change(facts)`, as the fake NVML's file."""
    facts = json.loads((FIXTURES / f"{base}.json").read_text())
    change(facts)
    path = tmp_path / f"{base}-variant.json"
    path.write_text(json.dumps(facts))
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(path))


@pytest.mark.parametrize("code", [999, 3])  # NVML_ERROR_UNKNOWN; NOT_SUPPORTED on every link of an NVLink GPU
def test_a_gpu_whose_every_nvlink_query_fails_reads_as_links_down_not_as_no_links(tmp_path, monkeypatch, code):
    """leptonai/gpud#1085's blind spot: a GPU that answers no NVLink query had no NVLink series, so the NVLink-down
    alert could not fire for it. Its links now read as down: as many as its model's other GPUs have."""
    def fail_gpu_5(facts):
        facts["devices"][5]["nvlinks"] = [{"error": code}] * 18
    _variant(tmp_path, monkeypatch, "h100_8gpu_healthy", fail_gpu_5)
    r = run(tmp_path)
    assert value(r, P + "nvlink_links_up", gpu="5") == 0 and value(r, P + "nvlink_links_down", gpu="5") == 18
    assert value(r, P + "nvlink_links_up", gpu="4") == 18 and value(r, P + "nvlink_links_down", gpu="4") is None
    assert value(r, P + "nvlink_errors_total", gpu="5", link="", counter="replay") is None  # no counter was read
    g5 = r.extra["gpus"][5]
    assert len(g5["nvlinks"]) == 18 and not any(link["up"] for link in g5["nvlinks"])
    assert all(link["error"] for link in g5["nvlinks"])
    from fleetcanary.daemon import hard_faults

    faults = [f for f in hard_faults.from_gpu_health(r.extra, 8) if f.kind == "nvlink"]
    assert [(f.gpu, f.reason) for f in faults] == [("5", "NVLinkDown")]


def test_a_gpu_without_nvlink_on_a_node_without_nvlink_still_has_no_nvlink_series(tmp_path, monkeypatch):
    def no_links(facts):
        for d in facts["devices"]:
            d["nvlinks"] = [{"error": 3}] * 18   # NVML_ERROR_NOT_SUPPORTED: PCIe cards
    _variant(tmp_path, monkeypatch, "h100_8gpu_healthy", no_links)
    r = run(tmp_path)
    assert not [k for k in samples(r) if "nvlink" in k[0]]
    assert all(g["nvlinks"] == [] for g in r.extra["gpus"])


def test_a_lone_nvl72_gpu_with_a_fabric_and_no_readable_link_has_its_18_links_down(tmp_path, monkeypatch):
    def one_gpu_no_links(facts):
        facts["devices"] = facts["devices"][:1]
        facts["devices"][0]["nvlinks"] = [{"error": 3}] * 18
    _variant(tmp_path, monkeypatch, "gb200_4gpu_fabric_ready", one_gpu_no_links)
    r = run(tmp_path)
    assert value(r, P + "nvlink_links_down", gpu="0") == 18


def test_the_fabric_health_mask_is_decoded_and_an_unhealthy_fabric_is_labelled_so(tmp_path, monkeypatch):
    """nvmlGpuFabricInfo_v2_t.healthMask (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*): degraded bandwidth TRUE (1 << 0),
    route unhealthy FALSE (2 << 4), incorrect configuration NONE (1 << 8), partition assigned TRUE (1 << 12)."""
    from fleetcanary.probes.lib import nvml

    mask = (1 << 0) | (2 << 4) | (1 << 8) | (1 << 12)
    assert nvml.fabric_health(mask) == {"degraded_bandwidth": True, "route_unhealthy": False,
                                        "incorrect_configuration": "none", "partition_assigned": True}
    assert nvml.fabric_health(0) == {}

    def degrade_gpu_2(facts):
        facts["devices"][2]["fabric"]["health_mask"] = mask
    _variant(tmp_path, monkeypatch, "gb200_4gpu_fabric_ready", degrade_gpu_2)
    r = run(tmp_path)
    assert r.extra["gpus"][2]["fabric"]["health"]["degraded_bandwidth"] is True
    assert nvml.fabric_problems(r.extra["gpus"][2]["fabric"]) == ["degraded_bandwidth true"]
    states = {dict(k[1])["gpu"]: dict(k[1])["fabric_state"] for k in samples(r) if k[0] == P + "info"}
    assert states == {"0": "completed", "1": "completed", "2": "unhealthy", "3": "completed"}


def _proc(root, pid1: str, *comms: str):
    """A /proc tree: PID 1's comm and one process per `comms` (real files, read as the host's /proc is)."""
    for pid, comm in enumerate((pid1, *comms), start=1):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
    (root / "self").mkdir()   # not a PID: skipped
    return str(root)


def test_fabric_services_are_read_from_the_hosts_proc_and_unknown_from_a_containers_own(tmp_path):
    from fleetcanary.probes.lib import fabric_services as fs

    host = _proc(tmp_path / "host", "systemd", "sshd", "nv-fabricmanager")
    assert fs.service_states(host) == {"fabricmanager": "running", "imex": "not_running"}
    both = _proc(tmp_path / "gb200", "systemd", "nvidia-imex", "nv-fabricmanager")
    assert fs.service_states(both) == {"fabricmanager": "running", "imex": "running"}
    # a container's own PID namespace (no hostPID): what is not seen is not known to be stopped
    own = _proc(tmp_path / "pod", "fleetcanary", "python3")
    assert fs.service_states(own) == {"fabricmanager": "unknown", "imex": "unknown"}
    assert fs.service_states(str(tmp_path / "missing")) == {"fabricmanager": "unknown", "imex": "unknown"}
    cfg = tmp_path / "nodes_config.cfg"
    cfg.write_text("# IMEX domain\n10.0.0.1\n10.0.0.2\n\n10.0.0.3\n")
    assert fs.imex_nodes(str(cfg)) == 3 and fs.imex_nodes(str(tmp_path / "none.cfg")) is None


def test_gpu_health_publishes_the_fabric_services_on_a_fabric_node_only(tmp_path, monkeypatch):
    proc = _proc(tmp_path / "proc", "systemd", "nvidia-imex")
    fake(monkeypatch, "gb200_4gpu_fabric_ready")
    r = run(tmp_path, host_proc_path=proc, imex_nodes_config=str(tmp_path / "absent.cfg"))
    assert value(r, "fleetcanary_nvlink_fabric_services_info", fabricmanager="not_running", imex="running") == 1
    assert r.extra["fabric_services"] == {"fabricmanager": "not_running", "imex": "running", "imex_nodes": None}
    fake(monkeypatch, "h100_8gpu_healthy")   # no fabric in these facts: nothing to say, no series
    r = run(tmp_path, host_proc_path=proc)
    assert not [k for k in samples(r) if k[0] == "fleetcanary_nvlink_fabric_services_info"]
    assert r.extra["fabric_services"] is None


def test_an_nvl72_racks_72_gpus_read_as_one_nvlink_domain(tmp_path, monkeypatch):
    """gpu_health on the constructed NVL72 rack (tests/support/nvl72.py: 18 trays x 4 GPUs, one cluster UUID and
    clique): every GPU's fleetcanary_gpu_info says completed in the one domain, with a healthy decoded health mask;
    with the fabric gone, every GPU is in_progress with no domain."""
    from tests.support import nvl72

    infos, health = [], []
    for facts in nvl72.write_rack(tmp_path / "up").values():
        r = nvl72.gpu_health(facts, monkeypatch, tmp_path)
        infos += [dict(k[1]) for k in samples(r) if k[0] == P + "info"]
        health += [g["fabric"]["health"] for g in r.extra["gpus"]]
    assert len(infos) == 72 and len({i["uuid"] for i in infos}) == 72
    assert {(i["fabric_state"], i["nvlink_domain"]) for i in infos} == {("completed", nvl72.DOMAIN)}
    assert health[0] == {"degraded_bandwidth": False, "route_recovery": False, "route_unhealthy": False,
                         "access_timeout_recovery": False, "incorrect_configuration": "none",
                         "partition_assigned": True}
    down = nvl72.gpu_health(nvl72.write_rack(tmp_path / "down", fabric_up=False)["nvl72-a-05"], monkeypatch,
                            tmp_path)
    assert {(dict(k[1])["fabric_state"], dict(k[1])["nvlink_domain"]) for k in samples(down) if k[0] == P + "info"} \
        == {("in_progress", "")}
