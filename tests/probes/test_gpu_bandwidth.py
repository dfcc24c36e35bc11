"""gpu_bandwidth: real copies on device "cpu", byte counting, and every gating skip via fake NVML."""
import pytest

from fleetcanary.probes.base import ProbeSkipped
from fleetcanary.probes.gpu_bandwidth import METRIC, Config, GpuBandwidth
from fleetcanary.probes.lib import gpu_gate, nvml, torch_util
from tests.support.gpu import ctx, fake, value

SMALL = dict(device="cpu", d2d_bytes=4 << 20, host_bytes=2 << 20, warmup=1, repeats=3)


def test_cpu_copies_produce_all_directions_with_median_and_dispersion(tmp_path):
    r = GpuBandwidth().run(Config(**SMALL), ctx(tmp_path))
    figs = {f.name: f for f in r.figures}
    assert set(figs) == {"d2d", "h2d", "d2h"}
    for d, f in figs.items():
        assert len(f.repeats) == 3 and f.median > 0
        assert f.labels == {"gpu": "0", "direction": d}
        assert value(r, METRIC, gpu="0", direction=d) == f.median
        assert {"mad", "cv", "min", "max"} <= set(f.dispersion)
    assert r.parameters["device"] == "cpu" and r.parameters["timer"] == "perf_counter"
    assert r.gpu_seconds["0"] > 0
    assert r.extra["per_gpu"]["0"]["d2d_bytes"] == 4 << 20


def test_byte_counting_d2d_read_plus_write_h2d_d2h_once(tmp_path, monkeypatch):
    calls = []

    def fixed(torch, device, fn):
        fn()
        calls.append(1)
        return 0.01

    monkeypatch.setattr(torch_util, "time_op", fixed)
    r = GpuBandwidth().run(Config(**SMALL), ctx(tmp_path))
    figs = {f.name: f.median for f in r.figures}
    assert figs["d2d"] == pytest.approx(2 * (4 << 20) / 0.01)
    assert figs["h2d"] == pytest.approx((2 << 20) / 0.01)
    assert figs["d2h"] == pytest.approx((2 << 20) / 0.01)
    assert len(calls) == 3 * (1 + 3)  # warm-up and repeats per direction
    assert r.gpu_seconds["0"] == pytest.approx(0.12)  # warm-up counts as GPU time too


def cpu_torch() -> str:
    """The message for this CPU torch (imported when a test needs it: at collection it cost each worker ~1.5 s)."""
    import torch

    return (f"torch {torch.__version__} is a CPU build and NVML sees GPUs: a GPU node needs torch "
            "with CUDA (the CUDA image, docs/image.md)")


def test_no_gpu_here_skips_with_no_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETCANARY_FAKE_NVML", raising=False)
    with pytest.raises(ProbeSkipped) as ei:
        GpuBandwidth().run(Config(), ctx(tmp_path))
    assert ei.value.reason == "no_gpu"


def test_a_job_on_the_node_skips_with_gpu_busy(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_busy")
    with pytest.raises(ProbeSkipped) as ei:
        GpuBandwidth().run(Config(), ctx(tmp_path))
    assert ei.value.reason == "gpu_busy"
    assert "[0, 1, 2, 3]" in ei.value.detail


def test_a_pod_with_a_gpu_skips_with_gpu_allocated_where_only_the_node_wide_view_exists(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_healthy")
    with pytest.raises(ProbeSkipped) as ei:
        GpuBandwidth().run(Config(), ctx(tmp_path, kube={"gpus_allocated": True, "allocated_gpu_count": 1}))
    assert ei.value.reason == "gpu_allocated"


def test_gpus_known_to_be_allocated_are_left_out_and_the_rest_measured(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_healthy")
    with pytest.raises(ProbeSkipped) as ei:   # past the gate: this torch has no CUDA
        GpuBandwidth().run(Config(), ctx(tmp_path, kube={"allocated_gpus": ["3"]}))
    assert ei.value.reason == "dependency_missing"
    assert "the gate left GPUs [0, 1, 2, 4, 5, 6, 7] (skipped: {'3': 'gpu_allocated'})" in ei.value.detail


def test_spent_budget_skips_with_budget(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_healthy")
    left = {str(i): 0.2 for i in range(8)}
    with pytest.raises(ProbeSkipped) as ei:
        GpuBandwidth().run(Config(expected_gpu_seconds=1.0), ctx(tmp_path, gpu={"budget_left_seconds": left}))
    assert ei.value.reason == "budget"


def test_idle_healthy_node_passes_the_gate_then_torch_finds_no_cuda(tmp_path, monkeypatch):
    """NVML sees eight GPUs and this torch is the CPU build: a missing dependency, said so (not no_gpu: the GPUs
    are there, the image is wrong)."""
    fake(monkeypatch, "h100_8gpu_healthy")
    with pytest.raises(ProbeSkipped) as ei:
        GpuBandwidth().run(Config(), ctx(tmp_path))
    assert (ei.value.reason, ei.value.detail) == (
        "dependency_missing", f"{cpu_torch()}; the gate left GPUs [0, 1, 2, 3, 4, 5, 6, 7] (skipped: {{}})")


def stub_torch(version: str, cuda: str, error: str | None):
    """A torch module's CUDA face (the CUDA boundary): its build and what cuda.init() raises."""
    import types

    def init():
        if error is not None:
            raise RuntimeError(error)

    return types.SimpleNamespace(__version__=version, version=types.SimpleNamespace(cuda=cuda),
                                 cuda=types.SimpleNamespace(init=init))


TOO_OLD = "The NVIDIA driver on your system is too old (found version 12040).\nPlease update your GPU driver"


def test_a_cuda_13_torch_on_an_r550_driver_is_driver_too_old_and_names_the_image_to_run():
    torch = stub_torch("2.14.1+cu130", "13.0", TOO_OLD)
    assert torch_util.why_no_cuda(torch, ("550.90.07", "12.4")) == (
        "driver_too_old", "driver 550.90.07 runs CUDA 12.4, torch 2.14.1+cu130 needs CUDA 13.0 (driver 580.65.06 or "
        "newer): run the cuda12 image (tag <version>-cuda12) or upgrade the driver (docs/image.md); torch: The NVIDIA "
        "driver on your system is too old (found version 12040).")


def test_the_driver_version_alone_decides_even_when_torch_words_it_otherwise():
    reason, detail = torch_util.why_no_cuda(stub_torch("2.10.0+cu128", "12.8", "no CUDA-capable device is detected"),
                                            ("520.61.05", "11.8"))
    assert reason == "driver_too_old"
    assert "needs CUDA 12.8 (driver 525.60.13 or newer): upgrade the driver" in detail  # no image runs on R520


def test_cuda_error_35_is_driver_too_old_where_nvml_gave_no_cuda_version():
    torch = stub_torch("2.14.1+cu130", "13.0", "CUDA driver version is insufficient for CUDA runtime version")
    reason, detail = torch_util.why_no_cuda(torch, ("unknown", "unknown"))
    assert reason == "driver_too_old" and detail.startswith("driver unknown runs CUDA unknown")


def test_a_cuda_12_8_torch_on_a_cuda_12_4_driver_is_not_too_old():
    """CUDA minor version compatibility: a 12.8 runtime runs on any 12.x driver from 525.60.13, so another cause
    that stops it is unsupported, in torch's own words."""
    torch = stub_torch("2.10.0+cu128", "12.8", "no CUDA-capable device is detected")
    assert torch_util.why_no_cuda(torch, ("550.90.07", "12.4")) == (
        "unsupported", "NVML sees GPUs, torch 2.10.0+cu128 (CUDA 12.8) cannot use them: no CUDA-capable device is "
        "detected")


def test_the_gpu_probe_on_a_node_whose_driver_is_too_old_skips_driver_too_old(tmp_path, monkeypatch):
    """Fake NVML (eight H100s, driver 550.90.07: CUDA 12.4) and torch's CUDA face saying what a CUDA 13.0 build says
    there: the run skips driver_too_old, naming the driver, the CUDA both sides have and the image to run."""
    import torch

    fake(monkeypatch, "h100_8gpu_healthy")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch, "__version__", "2.14.1+cu130")
    monkeypatch.setattr(torch.cuda, "init", stub_torch("", "", TOO_OLD).cuda.init)
    with pytest.raises(ProbeSkipped) as ei:
        GpuBandwidth().run(Config(), ctx(tmp_path))
    assert ei.value.reason == "driver_too_old"
    assert ei.value.detail.startswith("driver 550.90.07 runs CUDA 12.4, torch 2.14.1+cu130 needs CUDA 13.0 (driver "
                                      "580.65.06 or newer): run the cuda12 image")
    assert ei.value.detail.endswith("the gate left GPUs [0, 1, 2, 3, 4, 5, 6, 7] (skipped: {})")


def test_gpu_policy_measures_only_the_idle_gpus(monkeypatch):
    fake(monkeypatch, "h100_8gpu_busy")
    with nvml.open_session() as s:
        g = gpu_gate.gate(s, s.handles(), {"busy_utilization_ratio": 0.05}, {}, 1.0, policy="gpu")
    assert [h.index for h in g.usable] == [4, 5, 6, 7]
    assert g.skipped == {0: "gpu_busy", 1: "gpu_busy", 2: "gpu_busy", 3: "gpu_busy"}


def test_utilization_alone_marks_a_gpu_busy(monkeypatch, tmp_path):
    import json

    facts = json.loads((fake(monkeypatch, "h100_8gpu_healthy")).read_text())
    facts["devices"][5]["utilization"] = 40
    p = tmp_path / "util.json"
    p.write_text(json.dumps(facts))
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(p))
    with nvml.open_session() as s:
        g = gpu_gate.gate(s, s.handles(), {"busy_utilization_ratio": 0.5}, {}, 1.0, policy="gpu")
        assert 5 in [h.index for h in g.usable]
        g = gpu_gate.gate(s, s.handles(), {"busy_utilization_ratio": 0.3}, {}, 1.0, policy="gpu")
        assert g.skipped == {5: "gpu_busy"}


def test_lost_gpu_is_not_touched(monkeypatch):
    fake(monkeypatch, "h100_8gpu_gpu_lost")
    with nvml.open_session() as s:
        g = gpu_gate.gate(s, s.handles(), {}, {}, 1.0)
    assert 4 not in [h.index for h in g.usable] and g.skipped == {4: "unsupported"}
