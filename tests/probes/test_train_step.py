"""train_step: the default canary on device "cpu" against its shipped golden, a planted change
caught by the loss check, bf16 within its tolerance, the DataLoader check, and config errors."""
import pytest
from pydantic import ValidationError

from fleetcanary.probes.base import ProbeError, ProbeSkipped
from fleetcanary.probes.lib import tiny_lm, torch_util
from fleetcanary.probes.train_step import (
    DL_FIRST,
    DL_SAMPLES,
    GOLDEN_FP32_LOSS,
    LOSS_DEV,
    LOSS_OK,
    STEP,
    TOKENS,
    Config,
    TrainStep,
)
from tests.support.gpu import ctx, value

# A tiny non-default shape for the tests that are not about the shipped golden.
TINY = dict(device="cpu", dtype="fp32", layers=1, d_model=16, heads=2, seq_len=8, batch=2, vocab=32, steps=4,
            warmup_steps=1)


@pytest.fixture(autouse=True)
def _restore_determinism():
    yield
    torch_util.import_torch().use_deterministic_algorithms(False)


def test_default_fp32_canary_on_cpu_meets_the_shipped_golden(tmp_path):
    r = TrainStep().run(Config(device="cpu", dtype="fp32"), ctx(tmp_path))
    loss = r.extra["loss"]
    assert loss["pass"] and loss["relative_deviation"] <= 1e-3
    assert value(r, LOSS_OK, gpu="cpu", dtype="fp32") == 1.0
    assert value(r, LOSS_DEV, gpu="cpu", dtype="fp32") == loss["relative_deviation"]
    step = value(r, STEP, gpu="cpu", dtype="fp32")
    assert step > 0 and value(r, TOKENS, gpu="cpu", dtype="fp32") == pytest.approx(8 * 64 / step)
    assert len(r.figures[0].repeats) == 20 - 3  # warm-up steps are left out of the median


def test_a_planted_change_fails_the_loss_check(tmp_path, monkeypatch):
    real = tiny_lm.build

    def planted(torch, shape, seed):
        m = real(torch, shape, seed)
        with torch.no_grad():
            m.blocks[0].fc.weight.mul_(1.5)  # a wrong init scale in one layer: the kind of change a bad kernel makes
        return m

    monkeypatch.setattr(tiny_lm, "build", planted)
    with pytest.raises(ProbeError) as ei:
        TrainStep().run(Config(device="cpu", dtype="fp32"), ctx(tmp_path))
    assert ei.value.reason == "loss_mismatch" and "golden 5.094761" in ei.value.detail
    res = ei.value.result
    assert value(res, LOSS_OK, gpu="cpu", dtype="fp32") == 0.0
    assert value(res, STEP, gpu="cpu", dtype="fp32") > 0, "the step time is still published beside the failed check"


def test_bf16_autocast_stays_within_its_tolerance_of_the_fp32_golden(tmp_path):
    r = TrainStep().run(Config(device="cpu", dtype="bf16"), ctx(tmp_path))
    assert r.extra["loss"]["golden"] == GOLDEN_FP32_LOSS and r.extra["loss"]["tolerance"] == 1e-2
    assert r.extra["loss"]["pass"]


def test_the_canary_is_bitwise_reproducible_on_cpu(tmp_path):
    a = TrainStep().run(Config(**TINY, golden_loss=3.5, loss_tolerance=0.5), ctx(tmp_path))
    b = TrainStep().run(Config(**TINY, golden_loss=3.5, loss_tolerance=0.5), ctx(tmp_path))
    assert a.extra["loss"]["after_steps"] == b.extra["loss"]["after_steps"]


def test_dataloader_reads_every_file_and_reports_rates(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(10):
        (data / f"s{i:02d}.bin").write_bytes(b"x" * (100 + i))
    r = TrainStep().run(Config(**TINY, golden_loss=3.5, loss_tolerance=0.5, dataset_dir=str(data),
                               dataloader_batch_size=4, dataloader_workers=1), ctx(tmp_path))
    dl = r.extra["dataloader"]
    assert (dl["samples"], dl["bytes"], dl["files"]) == (10, sum(100 + i for i in range(10)), 10)
    assert value(r, DL_SAMPLES) > 0 and 0 < value(r, DL_FIRST) <= dl["seconds"]


def test_a_missing_dataset_dir_fails_with_dataset_error(tmp_path):
    with pytest.raises(ProbeError) as ei:
        TrainStep().run(Config(**TINY, golden_loss=3.5, loss_tolerance=0.5, dataset_dir=str(tmp_path / "nope")),
                        ctx(tmp_path))
    assert ei.value.reason == "dataset_error" and "nope" in ei.value.detail


@pytest.mark.parametrize("bad, msg", [
    (dict(d_model=64, heads=5), "heads (5) must divide d_model (64)"),
    (dict(layers=4), "needs golden_loss"),
    (dict(steps=3, warmup_steps=3, golden_loss=1.0), "warmup_steps must be fewer than steps"),
])
def test_bad_config_is_one_clear_error(bad, msg):
    with pytest.raises(ValidationError) as ei:
        Config(**bad)
    assert msg in str(ei.value)


def test_no_gpu_here_skips_with_no_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETCANARY_FAKE_NVML", raising=False)
    with pytest.raises(ProbeSkipped) as ei:
        TrainStep().run(Config(), ctx(tmp_path))
    assert ei.value.reason == "no_gpu"
