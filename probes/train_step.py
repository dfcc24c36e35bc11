"""Training-step canary: a small fixed-seed transformer trained K steps on synthetic tokens.

On one GPU (the first idle one) or the CPU: step time (median over the steps after
``warmup_steps``, CUDA events around forward, backward and the optimizer step), tokens/s,
and the loss on a fixed evaluation batch after K steps against its golden value, so the
performance figure never stands without its quality check. A loss off its golden by more
than the dtype's tolerance fails the run (``loss_mismatch``).

Golden: the fp32 loss at the default shape, established on the CPU (bitwise the same
across runs and thread counts there; torch 2.13.0) and shipped below. Other dtypes and
devices are checked against that fp32 golden within a tolerance per dtype (relative):
fp32 1e-3 (reduction order differs between devices), bf16 and fp16 1e-2. On the CPU,
bf16 and fp16 autocast landed within 2.2e-5 of fp32 over three seeds at this shape; the
GPU session confirms the GPU's distance (docs/gpu-validation.md). A non-default shape,
steps, learning rate or seed needs its own ``golden_loss``: measure it with
`fleetcanary once --probe train_step` on a GPU of known health (device cpu and dtype fp32
give the reference), and set it in the config.

Optional: DataLoader throughput over the files of ``dataset_dir`` (samples/s, bytes/s and
the first batch's latency), through torch's DataLoader with ``dataloader_workers`` workers.
"""
from __future__ import annotations

import functools
import os
import time
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from fleetcanary.probes.base import (
    Figure,
    MetricSpec,
    Probe,
    ProbeContext,
    ProbeError,
    ProbeResult,
    Sample,
    figure_sample,
)
from fleetcanary.probes.lib.gpu_probe import BusyPolicy, Device, GpuDeviceConfig, GpuSeconds

STEP = "fleetcanary_train_step_seconds"
TOKENS = "fleetcanary_train_step_tokens_per_second"
LOSS_OK = "fleetcanary_train_step_loss_check_pass"
LOSS_DEV = "fleetcanary_train_step_loss_deviation_ratio"
DL_SAMPLES = "fleetcanary_dataloader_samples_per_second"
DL_BYTES = "fleetcanary_dataloader_bytes_per_second"
DL_FIRST = "fleetcanary_dataloader_first_batch_seconds"

DEFAULT_SHAPE = dict(layers=2, d_model=64, heads=4, seq_len=64, batch=8, vocab=256, steps=20, lr=1e-3, seed=1234)
# fp32 loss on the evaluation batch after the default training, CPU, torch 2.13.0 (tests/probes/test_train_step.py
# re-derives it).
GOLDEN_FP32_LOSS = 5.094761371612549
TOLERANCE = {"fp32": 1e-3, "bf16": 1e-2, "fp16": 1e-2}


class Config(GpuDeviceConfig):
    device: Device = Field(
        "auto", description="auto: the first idle CUDA GPU (skip with no_gpu without one); cpu: the CPU.")
    busy_policy: BusyPolicy = Field(
        "node", description="node: any busy GPU skips the run; gpu: use the first idle GPU.")
    expected_gpu_seconds: GpuSeconds = 0.3
    dtype: Literal["fp32", "bf16", "fp16"] = Field("bf16", description="fp32, or autocast to bf16/fp16.")
    layers: int = Field(DEFAULT_SHAPE["layers"], ge=1, le=48, description="Transformer blocks.")
    d_model: int = Field(DEFAULT_SHAPE["d_model"], ge=16, le=8192, description="Model width.")
    heads: int = Field(DEFAULT_SHAPE["heads"], ge=1, le=128, description="Attention heads (divide d_model).")
    seq_len: int = Field(DEFAULT_SHAPE["seq_len"], ge=8, le=16384, description="Tokens per sequence.")
    batch: int = Field(DEFAULT_SHAPE["batch"], ge=1, le=4096, description="Sequences per step.")
    vocab: int = Field(DEFAULT_SHAPE["vocab"], ge=16, le=262144, description="Vocabulary size.")
    steps: int = Field(DEFAULT_SHAPE["steps"], ge=2, le=10000, description="K: training steps.")
    warmup_steps: int = Field(3, ge=0, le=100, description="First steps left out of the step-time median.")
    lr: float = Field(DEFAULT_SHAPE["lr"], gt=0, le=1, description="AdamW learning rate.")
    seed: int = Field(DEFAULT_SHAPE["seed"], description="Seed of weights and data.")
    golden_loss: float | None = Field(
        None, gt=0, description="Expected fp32 loss after K steps; required when the shape, steps, lr or seed differ "
        "from the defaults (whose golden is shipped).")
    loss_tolerance: float | None = Field(
        None, gt=0, lt=1, description="Relative tolerance of the loss check; default per dtype: fp32 1e-3, "
        "bf16 and fp16 1e-2.")
    dataset_dir: str | None = Field(None, description="Directory whose files the DataLoader check reads (optional).")
    dataloader_batch_size: int = Field(16, ge=1, le=4096, description="Files per DataLoader batch.")
    dataloader_batches: int = Field(20, ge=1, le=10000, description="Batches read (one pass at most).")
    dataloader_workers: int = Field(2, ge=0, le=64, description="DataLoader worker processes.")

    @model_validator(mode="after")
    def _check(self) -> Config:
        if self.d_model % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide d_model ({self.d_model})")
        if self.warmup_steps >= self.steps:
            raise ValueError("warmup_steps must be fewer than steps")
        if self.golden_loss is None and any(getattr(self, k) != v for k, v in DEFAULT_SHAPE.items()):
            raise ValueError("a non-default shape, steps, lr or seed needs golden_loss (the shipped golden is for "
                             "the defaults)")
        return self

    def shape_key(self) -> dict:
        return {k: getattr(self, k) for k in DEFAULT_SHAPE}


class TrainStep(Probe):
    name = "train_step"
    Config = Config
    exclusive = "gpu"
    coverage = "node"  # one GPU measures the node's training step
    failure_reasons = ("nvml_error", "cuda_error", "out_of_memory", "loss_mismatch", "dataset_error")
    default_interval_seconds = 3600.0
    default_timeout_seconds = 180.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(STEP, "gauge", "Training step time (forward, backward, optimizer step) of the canary transformer, "
                   "median over the steps after warm-up.", "seconds", ("gpu", "dtype")),
        MetricSpec(TOKENS, "gauge", "Training tokens per second of the canary (batch x sequence over the median "
                   "step time).", "tokens_per_second", ("gpu", "dtype")),
        MetricSpec(LOSS_OK, "gauge", "1 when the loss after K steps is within its dtype's tolerance of the golden "
                   "value, else 0.", "boolean", ("gpu", "dtype")),
        MetricSpec(LOSS_DEV, "gauge", "Relative deviation of the loss after K steps from its golden value.",
                   "ratio", ("gpu", "dtype")),
        MetricSpec(DL_SAMPLES, "gauge", "DataLoader throughput over the configured dataset directory, files per "
                   "second.", "ops_per_second"),
        MetricSpec(DL_BYTES, "gauge", "DataLoader read throughput over the configured dataset directory.",
                   "bytes_per_second"),
        MetricSpec(DL_FIRST, "gauge", "Time from creating the DataLoader iterator to its first batch (worker "
                   "start-up and first reads).", "seconds"),
    )

    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        from fleetcanary.probes.lib import gpu_probe, torch_util

        gpus = gpu_probe.acquire(config, ctx)
        kind = gpus.kind
        index = gpus.indices[0] if kind == "cuda" else 0
        torch = torch_util.import_torch()
        device = torch.device(kind, gpus.cuda(index)) if kind == "cuda" else torch.device("cpu")
        label = {"gpu": str(index) if kind == "cuda" else "cpu", "dtype": config.dtype}
        res = ProbeResult(parameters={"device": kind, "dtype": config.dtype, **config.shape_key(),
                                      "warmup_steps": config.warmup_steps,
                                      "timer": "cuda events" if kind == "cuda" else "perf_counter"},
                          touched={"gpus": [index] if kind == "cuda" else [], "invasive": True,
                                   **gpus.record()})
        with torch_util.cuda_errors():
            times, loss, n_params = self._train(torch, device, config)
        tokens = config.batch * config.seq_len
        step = Figure("step_time", "seconds", times[config.warmup_steps:], labels=dict(label), higher_is_better=False)
        tps = Figure("tokens_per_second", "tokens_per_second", [tokens / t for t in times[config.warmup_steps:]],
                     labels=dict(label))
        res.figures += [step, tps]
        res.samples += [figure_sample(step, STEP), Sample(TOKENS, dict(label), tokens / step.median)]
        if kind == "cuda":
            res.gpu_seconds[str(index)] = sum(times)
        golden = config.golden_loss if config.golden_loss is not None else GOLDEN_FP32_LOSS
        tol = config.loss_tolerance if config.loss_tolerance is not None else TOLERANCE[config.dtype]
        dev = abs(loss - golden) / golden
        ok = dev <= tol
        res.samples += [Sample(LOSS_OK, dict(label), 1.0 if ok else 0.0), Sample(LOSS_DEV, dict(label), dev)]
        res.extra["loss"] = {"after_steps": loss, "golden": golden, "golden_source": "config" if config.golden_loss
                             else "shipped fp32 (CPU)", "relative_deviation": dev, "tolerance": tol, "pass": ok,
                             "parameters": n_params}
        if config.dataset_dir:
            self._dataloader(torch, config, res)
        if not ok:
            raise ProbeError("loss_mismatch", f"loss after {config.steps} steps {loss:.6f}, golden {golden:.6f}: "
                             f"{dev:.2e} off, tolerance {tol:.0e} ({config.dtype})", result=res)
        return res

    @staticmethod
    def _train(torch, device, config: Config):
        from fleetcanary.probes.lib import tiny_lm

        torch.use_deterministic_algorithms(True)
        shape = tiny_lm.Shape(config.layers, config.d_model, config.heads, config.seq_len, config.batch, config.vocab)
        model = tiny_lm.build(torch, shape, config.seed).to(device)
        data = [(x.to(device), y.to(device)) for x, y in tiny_lm.batches(torch, shape, config.seed, config.steps + 1)]
        opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
        amp = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[config.dtype]
        scaler = torch.amp.GradScaler("cuda") if (amp is torch.float16 and device.type == "cuda") else None
        times = []

        def step(x, y):
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            if scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()

        from fleetcanary.probes.lib import torch_util as tu

        for x, y in data[:config.steps]:
            times.append(tu.time_op(torch, device, functools.partial(step, x, y)))
        with torch.no_grad(), torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = float(model(*data[config.steps]).item())
        return times, loss, tiny_lm.params(model)

    @staticmethod
    def _dataloader(torch, config: Config, res: ProbeResult) -> None:
        from fleetcanary.probes.lib.dataset import FileDataset, collate

        try:
            ds = FileDataset(config.dataset_dir)
        except OSError as exc:
            raise ProbeError("dataset_error", str(exc), result=res) from None
        if len(ds) == 0:
            raise ProbeError("dataset_error", f"{config.dataset_dir}: no files", result=res)
        loader = torch.utils.data.DataLoader(ds, batch_size=config.dataloader_batch_size, shuffle=False,
                                             num_workers=config.dataloader_workers, collate_fn=collate)
        t0 = time.perf_counter()
        it = iter(loader)
        first, samples, nbytes = None, 0, 0
        try:
            for i, (n, b) in enumerate(it):
                if first is None:
                    first = time.perf_counter() - t0
                samples += n
                nbytes += b
                if i + 1 >= config.dataloader_batches:
                    break
        except OSError as exc:
            raise ProbeError("dataset_error", str(exc).splitlines()[0], result=res) from None
        finally:
            del it
        wall = time.perf_counter() - t0
        res.samples += [Sample(DL_SAMPLES, {}, samples / wall), Sample(DL_BYTES, {}, nbytes / wall),
                        Sample(DL_FIRST, {}, first)]
        res.extra["dataloader"] = {"samples": samples, "bytes": nbytes, "seconds": wall, "first_batch_seconds": first,
                                   "workers": config.dataloader_workers, "files": len(ds)}
        res.touched["paths"] = [os.path.abspath(config.dataset_dir)]
