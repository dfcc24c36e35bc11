"""gpu_compute: real products on device "cpu" (tiny shapes), FLOP counting, the SDC consensus with a
planted wrong result, and the gating skips via fake NVML."""
import json

import pytest
from pydantic import ValidationError

from fleetcanary.probes.base import ProbeError, ProbeSkipped
from fleetcanary.probes.gpu_compute import METRIC, SDC_METRIC, Config, GpuCompute
from fleetcanary.probes.lib import matmul, sdc, torch_util
from tests.support.gpu import ctx, fake, value


@pytest.fixture(autouse=True)
def _restore_torch_globals(monkeypatch):
    """The probe sets process-wide determinism (a worker's own process in the daemon); undo it here."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch = torch_util.import_torch()
    yield
    torch.use_deterministic_algorithms(False)


SMALL = dict(device="cpu", size=32, warmup=1, repeats=3, per_repeat=1, sdc_size=16, sdc_products=2)


def status(result, gpu):
    """The GPU's SDC series: its current status at 1, no series for the others."""
    return {s.labels["status"]: s.value for s in result.samples
            if s.metric == SDC_METRIC and s.labels["gpu"] == gpu}


def test_default_dtypes_are_bf16_and_fp8():
    """fp16 and tf32 share bf16's tensor cores; the default judges bf16 and fp8's own path (issue 42: half the
    series)."""
    assert Config().dtypes == ("bf16", "fp8")


def test_cpu_products_give_bf16_and_fp16_figures_and_list_what_the_device_lacks(tmp_path):
    r = GpuCompute().run(Config(**SMALL, dtypes=("bf16", "fp16", "tf32", "fp8")), ctx(tmp_path))
    figs = {f.name: f for f in r.figures}
    assert set(figs) == {"bf16", "fp16"}
    for dt, f in figs.items():
        assert len(f.repeats) == 3 and f.median > 0
        assert f.labels == {"gpu": "0", "dtype": dt} and f.unit == "flops_per_second"
        assert value(r, METRIC, gpu="0", dtype=dt) == f.median
    assert set(r.extra["per_gpu"]["0"]["unsupported_dtypes"]) == {"tf32", "fp8"}
    assert r.gpu_seconds["0"] > r.extra["per_gpu"]["0"]["sdc_seconds"] > 0
    assert r.parameters["sdc"]["deterministic_algorithms"] is True
    assert r.parameters["sdc"]["cublas_workspace_config"] == matmul.CUBLAS_WORKSPACE


def test_flop_counting_is_2n3_per_product_and_warmup_counts_as_gpu_time(tmp_path, monkeypatch):
    calls = []

    def fixed(torch, device, fn):
        fn()
        calls.append(1)
        return 0.01

    monkeypatch.setattr(torch_util, "time_op", fixed)
    cfg = Config(**{**SMALL, "per_repeat": 3, "dtypes": ("bf16",), "sdc": False})
    r = GpuCompute().run(cfg, ctx(tmp_path))
    assert [f.median for f in r.figures] == [pytest.approx(3 * 2 * 32 ** 3 / 0.01)]
    assert len(calls) == 1 + 3
    assert r.gpu_seconds["0"] == pytest.approx(0.04)


def test_cpu_canary_is_bitwise_reproducible_across_runs_and_thread_counts():
    torch = torch_util.import_torch()
    dev = torch.device("cpu")
    before = torch.get_num_threads()
    try:
        seen = set()
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            seen.add(tuple(matmul.sdc_checksum(torch, dev, dt, 64, 2, 7)[0] for dt in ("bf16", "fp32")))
    finally:
        torch.set_num_threads(before)
    assert len(seen) == 1
    other_seed = tuple(matmul.sdc_checksum(torch, dev, dt, 64, 2, 8)[0] for dt in ("bf16", "fp32"))
    assert other_seed not in seen


def test_consensus_of_three_gpus_establishes_the_golden_in_the_state_dir_and_later_runs_use_it(tmp_path):
    r = GpuCompute().run(Config(**SMALL, cpu_gpus=3), ctx(tmp_path))
    assert r.extra["sdc"]["golden_source"] == "consensus" and r.extra["sdc"]["established"]
    assert all(status(r, g) == {"match": 1} for g in "012")
    stored = json.loads((tmp_path / sdc.GOLDEN_FILE).read_text())["goldens"]
    assert stored[r.extra["sdc"]["key"]]["agreeing"] == ["0", "1", "2"]
    # one GPU alone is judged against the stored golden, never against itself
    r1 = GpuCompute().run(Config(**SMALL), ctx(tmp_path))
    assert r1.extra["sdc"]["golden_source"] == "state" and status(r1, "0")["match"] == 1


def _plant_bit_flip(monkeypatch, bad_gpu: int, n_dtypes: int = 2):
    """Flip the lowest bit of one element of every canary product computed for GPU ``bad_gpu``."""
    torch = torch_util.import_torch()
    real_checksum, real_matmul = matmul.sdc_checksum, torch.matmul
    state = {"calls": 0, "bad": False}

    def checksum(*a, **k):
        state["bad"] = state["calls"] // n_dtypes == bad_gpu
        state["calls"] += 1
        try:
            return real_checksum(*a, **k)
        finally:
            state["bad"] = False

    def flipping(a, b, out=None):
        r = real_matmul(a, b, out=out)
        if state["bad"]:
            r.view(-1)[:1].view(torch.int16 if r.element_size() == 2 else torch.int32).bitwise_xor_(1)
        return r

    monkeypatch.setattr(matmul, "sdc_checksum", checksum)
    monkeypatch.setattr(torch, "matmul", flipping)


def test_a_planted_wrong_result_on_one_of_four_gpus_is_caught_and_named(tmp_path, monkeypatch):
    _plant_bit_flip(monkeypatch, bad_gpu=2)
    with pytest.raises(ProbeError) as ei:
        GpuCompute().run(Config(**SMALL, cpu_gpus=4), ctx(tmp_path))
    assert ei.value.reason == "wrong_result"
    assert "GPU(s) 2:" in ei.value.detail
    res = ei.value.result
    assert status(res, "2") == {"mismatch": 1}
    assert all(status(res, g)["match"] == 1 for g in "013")
    # the majority (3 of 4) made the golden; the bad GPU is not among the agreeing ones
    stored = json.loads((tmp_path / sdc.GOLDEN_FILE).read_text())["goldens"]
    assert stored[res.extra["sdc"]["key"]]["agreeing"] == ["0", "1", "3"]
    assert res.figures, "throughput figures still reach the record of the failed run"


def test_a_split_without_majority_is_reported_not_guessed_and_no_golden_is_written(tmp_path, monkeypatch):
    _plant_bit_flip(monkeypatch, bad_gpu=1)
    with pytest.raises(ProbeError) as ei:
        GpuCompute().run(Config(**SMALL, cpu_gpus=2), ctx(tmp_path))
    assert ei.value.reason == "sdc_no_consensus"
    assert "no strict majority among 2 GPUs" in ei.value.detail
    assert status(ei.value.result, "0")["no_consensus"] == 1 and status(ei.value.result, "1")["no_consensus"] == 1
    assert not (tmp_path / sdc.GOLDEN_FILE).exists()


def test_a_single_gpu_against_a_stored_golden_fails_when_it_differs(tmp_path, monkeypatch):
    GpuCompute().run(Config(**SMALL, cpu_gpus=2), ctx(tmp_path))
    _plant_bit_flip(monkeypatch, bad_gpu=0)
    with pytest.raises(ProbeError) as ei:
        GpuCompute().run(Config(**SMALL), ctx(tmp_path))
    assert ei.value.reason == "wrong_result" and "GPU(s) 0:" in ei.value.detail


def test_one_gpu_without_golden_is_unjudged_and_passes(tmp_path):
    r = GpuCompute().run(Config(**SMALL), ctx(tmp_path))
    assert status(r, "0")["unjudged"] == 1 and r.extra["sdc"]["golden"] is None
    assert not (tmp_path / sdc.GOLDEN_FILE).exists()


def test_a_shipped_golden_wins_and_a_broken_one_fails_cleanly(tmp_path):
    first = GpuCompute().run(Config(**SMALL, cpu_gpus=2), ctx(tmp_path / "a"))
    key = first.extra["sdc"]["key"]
    shipped = tmp_path / "shipped.json"
    shipped.write_text(json.dumps({"goldens": {key: {"checksum": "not-what-this-cpu-computes"}}}))
    with pytest.raises(ProbeError) as ei:
        GpuCompute().run(Config(**SMALL, sdc_golden_file=str(shipped)), ctx(tmp_path / "b"))
    assert ei.value.reason == "wrong_result" and "shipped golden" in ei.value.detail
    shipped.write_text("{not json")
    with pytest.raises(ProbeError) as ei:
        GpuCompute().run(Config(**SMALL, sdc_golden_file=str(shipped)), ctx(tmp_path / "c"))
    assert ei.value.reason == "golden_file_error" and str(shipped) in ei.value.detail


@pytest.mark.parametrize("sums, golden, want", [
    ({"0": "a", "1": "a", "2": "b", "3": "b"}, None, {"0": "no_consensus", "1": "no_consensus",
                                                     "2": "no_consensus", "3": "no_consensus"}),
    ({"0": "a", "1": "a", "2": "a", "3": "b"}, None, {"0": "match", "1": "match", "2": "match", "3": "mismatch"}),
    ({"0": "c", "1": "c"}, "a", {"0": "no_consensus", "1": "no_consensus"}),
    ({"0": "a", "1": "c"}, "a", {"0": "match", "1": "mismatch"}),
    ({"0": "c"}, "a", {"0": "mismatch"}),
    ({"0": "c"}, None, {"0": "unjudged"}),
])
def test_judge_decides_by_golden_then_by_strict_majority(sums, golden, want):
    v = sdc.judge(sums, golden, "state" if golden else "none", min_consensus=2)
    assert v.status == want
    assert v.established == (golden is None and "match" in want.values())


def test_bad_config_is_refused():
    with pytest.raises(ValidationError):
        Config(dtypes=("int4",))
    with pytest.raises(ValidationError):
        Config(size=4)


def test_no_gpu_here_skips_with_no_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETCANARY_FAKE_NVML", raising=False)
    with pytest.raises(ProbeSkipped) as ei:
        GpuCompute().run(Config(), ctx(tmp_path))
    assert ei.value.reason == "no_gpu"


def test_busy_node_and_spent_budget_skip(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_busy")
    with pytest.raises(ProbeSkipped) as ei:
        GpuCompute().run(Config(), ctx(tmp_path))
    assert ei.value.reason == "gpu_busy"
    fake(monkeypatch, "h100_8gpu_healthy")
    with pytest.raises(ProbeSkipped) as ei:
        GpuCompute().run(Config(expected_gpu_seconds=1.0),
                         ctx(tmp_path, gpu={"budget_left_seconds": {str(i): 0.5 for i in range(8)}}))
    assert ei.value.reason == "budget"
