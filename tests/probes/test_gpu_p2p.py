"""gpu_p2p: the full ordered-pair matrix with real copies on device "cpu" and topology from fake NVML."""
import pytest

from fleetcanary.judge.figures import extract
from fleetcanary.probes.base import ProbeSkipped
from fleetcanary.probes.gpu_p2p import ACCESS, BIDI, BW, LINK, Config, GpuP2P
from tests.support.gpu import ctx, fake, samples, value

SMALL = dict(device="cpu", bytes=1 << 20, warmup=0, repeats=2)


def test_eight_gpu_hgx_matrix_with_nvlink_links(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_healthy")
    r = GpuP2P().run(Config(**SMALL, topology=True, pairs=True), ctx(tmp_path))
    bws = [k for k in samples(r) if k[0] == BW]
    assert len(bws) == 8 * 7
    assert all(v > 0 for k, v in samples(r).items() if k[0] == BW)
    assert value(r, LINK, src_gpu="0", dst_gpu="7", link="nvlink") == 1
    assert value(r, ACCESS, src_gpu="3", dst_gpu="2") == 1
    assert len([k for k in samples(r) if k[0] in (LINK, ACCESS)]) == 2 * 8 * 7
    assert r.extra["matrix"]["0->1"]["link"] == "nvlink"
    assert set(r.gpu_seconds) == {str(i) for i in range(8)}


def test_by_default_each_gpus_slowest_link_is_published_the_matrix_is_in_the_record(tmp_path, monkeypatch):
    """8 series on 8 GPUs, not 56: each source GPU's slowest link, dst_gpu empty; the matrix and the topology
    are in the record. The judge folds a matrix to the same figure, so its statistics do not depend on pairs."""
    fake(monkeypatch, "h100_8gpu_healthy")
    r = GpuP2P().run(Config(**SMALL), ctx(tmp_path))
    assert {k[0] for k in samples(r)} == {BW}
    assert {dict(k[1])["dst_gpu"] for k in samples(r)} == {""} and len(samples(r)) == 8
    row = [v["median_bytes_per_second"] for k, v in r.extra["matrix"].items() if k.startswith("3->")]
    assert len(row) == 7 and value(r, BW, src_gpu="3", dst_gpu="") == min(row)
    assert r.extra["matrix"]["3->2"]["peer_access"] is True and r.extra["matrix"]["3->2"]["link"] == "nvlink"
    assert r.parameters["topology"] is False and r.parameters["bidirectional"] is False
    assert r.parameters["pairs"] is False
    default = extract("gpu_p2p", [{"metric": s.metric, "labels": s.labels, "value": s.value} for s in r.samples])
    pairs = [{"metric": BW, "labels": {"src_gpu": k.split("->")[0], "dst_gpu": k.split("->")[1]},
              "value": v["median_bytes_per_second"]} for k, v in r.extra["matrix"].items()]
    assert default == extract("gpu_p2p", pairs) and len(default) == 8


def test_without_nvlink_the_pcie_topology_level_is_the_link(tmp_path, monkeypatch):
    import json

    facts = json.loads(fake(monkeypatch, "h100_8gpu_healthy").read_text())
    for d in facts["devices"]:
        d["nvlinks"] = []
    p = tmp_path / "pcie.json"
    p.write_text(json.dumps(facts))
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(p))
    r = GpuP2P().run(Config(**SMALL, topology=True), ctx(tmp_path))
    assert value(r, LINK, src_gpu="0", dst_gpu="1", link="pcie_multi_switch") == 1
    assert value(r, LINK, src_gpu="0", dst_gpu="3", link="numa_node") == 1
    assert value(r, LINK, src_gpu="0", dst_gpu="4", link="cross_socket") == 1


def test_lost_gpu_leaves_the_matrix_of_the_rest(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_gpu_lost")
    r = GpuP2P().run(Config(**SMALL, pairs=True), ctx(tmp_path))
    pairs = {(dict(k[1])["src_gpu"], dict(k[1])["dst_gpu"]) for k in samples(r) if k[0] == BW}
    assert len(pairs) == 7 * 6 and not any("4" in p for p in pairs)
    r = GpuP2P().run(Config(**SMALL), ctx(tmp_path))
    assert {dict(k[1])["src_gpu"] for k in samples(r) if k[0] == BW} == {"0", "1", "2", "3", "5", "6", "7"}


def test_bidirectional_counts_both_directions(tmp_path):
    r = GpuP2P().run(Config(**SMALL, cpu_devices=3, bidirectional=True, topology=True, pairs=True), ctx(tmp_path))
    assert len([k for k in samples(r) if k[0] == BIDI]) == 3
    assert len([k for k in samples(r) if k[0] == BW]) == 6
    assert value(r, LINK, src_gpu="0", dst_gpu="1", link="unknown") == 1


def test_single_gpu_node_skips_with_single_gpu(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_1gpu")
    with pytest.raises(ProbeSkipped) as ei:
        GpuP2P().run(Config(), ctx(tmp_path))
    assert ei.value.reason == "single_gpu"


def test_busy_node_skips(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_busy")
    with pytest.raises(ProbeSkipped) as ei:
        GpuP2P().run(Config(), ctx(tmp_path))
    assert ei.value.reason == "gpu_busy"


def test_no_gpu_here(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETCANARY_FAKE_NVML", raising=False)
    with pytest.raises(ProbeSkipped) as ei:
        GpuP2P().run(Config(), ctx(tmp_path))
    assert ei.value.reason == "no_gpu"


def test_recorded_single_h200_skips(tmp_path, monkeypatch):
    fake(monkeypatch, "h200_1gpu_recorded")
    with pytest.raises(ProbeSkipped) as ei:
        GpuP2P().run(Config(device="cpu"), ctx(tmp_path))
    assert ei.value.reason == "single_gpu"
