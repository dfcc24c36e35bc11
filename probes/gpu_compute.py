"""GPU compute per GPU: matrix-multiply throughput per dtype, and a silent-data-corruption canary.

Throughput: for each configured dtype (by default bf16, and fp8 where the GPU supports it; fp16
and tf32 on request), ``warmup`` untimed then ``repeats`` timed repeats of ``per_repeat`` n x n x n
products, each repeat between CUDA events; 2 n^3 FLOP per product. The median is
published, the repeats and their dispersion kept in the record. The default (n = 8192,
3 + 10 repeats of 2 products per dtype) is estimated at 0.1-0.2 s of GPU time per GPU on
an H100/H200-class GPU from the issue's ~780 TFLOP/s bf16 figure (not yet measured here:
docs/gpu-validation.md); ``expected_gpu_seconds`` charges 0.3 s.

SDC canary (after the throughput runs, so the algorithm selection it sees is the one a
warmed-up process gets): ``sdc_products`` deterministic products per dtype (bf16 on tensor
cores, fp32 on the FMA units) with fixed seeds and shapes, inputs generated on the CPU,
deterministic algorithms and a fixed cuBLAS workspace; the SHA-256 of the result bytes is
compared bitwise with a golden built by consensus across GPUs of the same model, driver
and software stack (probes/lib/sdc.py). A GPU that differs fails the run with
``wrong_result`` and is named; a split without a strict majority fails with
``sdc_no_consensus`` and is reported as such.

The sustained (burn) mode is the separate probe ``gpu_sustained``: it has its own daily
interval, timeout and budget, which a probe's single schedule could not hold.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

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
from fleetcanary.probes.lib.gpu_probe import GpuDeviceConfig, GpuSeconds

METRIC = "fleetcanary_gpu_matmul_flops_per_second"
SDC_METRIC = "fleetcanary_gpu_sdc_status"
SDC_STATUSES = ("match", "mismatch", "no_consensus", "unjudged")
Dtype = Literal["bf16", "fp16", "tf32", "fp8"]


class Config(GpuDeviceConfig):
    expected_gpu_seconds: GpuSeconds = 0.3
    cpu_gpus: int = Field(
        1, ge=1, le=16, description="device cpu only: measure the CPU as this many GPUs, so the SDC consensus runs "
        "its multi-GPU path in tests.")
    dtypes: tuple[Dtype, ...] = Field(
        ("bf16", "fp8"),
        description="Product dtypes to time; those the GPU lacks (tf32 below compute capability 8.0, fp8 below "
        "8.9; tf32/fp8 on cpu) are left out and listed in the record. The default times bf16 (the training "
        "dtype) and fp8 (its own tensor-core path): fp16 runs on bf16's tensor cores at its rate and tf32 at half "
        "of it, so a GPU slow in one is slow in those; each dtype is 8 judged series a node (two in Prometheus).")
    size: int = Field(8192, ge=16, le=32768, description="n of the timed n x n x n products.")
    warmup: int = Field(3, ge=0, le=50, description="Untimed repeats per dtype (they also raise clocks from idle).")
    repeats: int = Field(10, ge=1, le=200, description="Timed repeats per dtype; the median is published.")
    per_repeat: int = Field(2, ge=1, le=64, description="Back-to-back products in one timed repeat.")
    sdc: bool = Field(True, description="Run the silent-data-corruption canary after the throughput runs.")
    sdc_size: int = Field(2048, ge=8, le=16384, description="n of the canary's deterministic products.")
    sdc_products: int = Field(4, ge=1, le=64,
                              description="Deterministic products per canary dtype (each its own seed).")
    sdc_dtypes: tuple[Literal["bf16", "fp32"], ...] = Field(
        ("bf16", "fp32"), description="bf16 exercises the tensor cores, fp32 (TF32 off) the FMA units.")
    sdc_seed: int = Field(20240919, description="Seed of the first canary product.")
    sdc_min_consensus: int = Field(
        2, ge=2, le=64, description="GPUs that must vote before a golden is established (a strict majority of them "
        "must agree).")
    sdc_golden_file: str | None = Field(
        None, description="A shipped golden file (same format as state_dir/sdc_golden.json); its entries win.")


class GpuCompute(Probe):
    name = "gpu_compute"
    Config = Config
    exclusive = "gpu"
    failure_reasons = ("nvml_error", "cuda_error", "out_of_memory", "wrong_result", "sdc_no_consensus",
                       "golden_file_error")
    default_interval_seconds = 1800.0
    default_timeout_seconds = 120.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(METRIC, "gauge",
                   "Matrix-multiply throughput per GPU and dtype: 2 n^3 floating-point operations per n x n x n "
                   "product over its CUDA-event time, median of the timed repeats.",
                   "flops_per_second", ("gpu", "dtype")),
        MetricSpec(SDC_METRIC, "gauge",
                   "Silent-data-corruption canary verdict per GPU, 1 on its current status (match, mismatch, "
                   "no_consensus, unjudged; the other statuses have no series): the checksum of deterministic "
                   "products against the golden that a majority of the same model's GPUs agreed on.",
                   "boolean", ("gpu", "status")),
    )

    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        from fleetcanary.probes.lib import gpu_probe, matmul, sdc, torch_util

        gpus = gpu_probe.acquire(config, ctx, mig=True, inspect=lambda s, usable: (s.identity(usable[0])["model"],
                                                                          s.driver_version()))
        kind = gpus.kind
        model, driver = gpus.facts or ("cpu", "none")
        indices = gpus.indices if kind == "cuda" else list(range(config.cpu_gpus))
        torch = torch_util.import_torch()
        determinism = matmul.set_deterministic(torch) if config.sdc else {}

        res = ProbeResult(parameters={"device": kind, "size": config.size, "warmup": config.warmup,
                                      "repeats": config.repeats, "per_repeat": config.per_repeat,
                                      "flop_counting": "2 n^3 per product",
                                      "timer": "cuda events" if kind == "cuda" else "perf_counter",
                                      "sdc": {"enabled": config.sdc, "size": config.sdc_size,
                                              "products": config.sdc_products, "dtypes": list(config.sdc_dtypes),
                                              "seed": config.sdc_seed, **determinism}},
                          touched={"gpus": indices, "invasive": True, **gpus.record()})
        per_gpu, checksums = {}, {}
        for idx in indices:
            device = torch.device(kind, gpus.cuda(idx)) if kind == "cuda" else torch.device("cpu")
            with torch_util.cuda_errors(gpu=idx):
                figs, gpu_seconds, unsupported = self._throughput(torch, torch_util, matmul, device, config)
                sums, sdc_seconds = {}, 0.0
                if config.sdc:
                    for dt in config.sdc_dtypes:
                        sums[dt], s = matmul.sdc_checksum(torch, device, dt, config.sdc_size, config.sdc_products,
                                                          config.sdc_seed)
                        sdc_seconds += s
            for f in figs:
                f.labels = {"gpu": str(idx), "dtype": f.name}
                res.figures.append(f)
                res.samples.append(figure_sample(f, METRIC))
            res.gpu_seconds[str(idx)] = gpu_seconds + sdc_seconds
            per_gpu[str(idx)] = {"gpu_seconds": gpu_seconds + sdc_seconds, "sdc_seconds": sdc_seconds,
                                 "unsupported_dtypes": unsupported, "sdc_checksums": sums}
            if sums:
                checksums[str(idx)] = "|".join(f"{dt}:{sums[dt]}" for dt in config.sdc_dtypes)
        res.extra["per_gpu"] = per_gpu
        if kind == "cuda" and gpus.mig:  # figures in the record only (gpu_bandwidth's docstring says why)
            res.extra["per_mig"] = gpu_probe.measure_mig(gpus.mig, _on_mig, config.model_dump(mode="json"), res,
                                                           ctx.deadline_monotonic)
        if config.sdc:
            identity = {"model": model, "driver": driver, **matmul.stack_identity(torch, torch.device(kind)),
                        "size": config.sdc_size, "products": config.sdc_products, "dtypes": list(config.sdc_dtypes),
                        "seed": config.sdc_seed}
            self._judge(sdc, ctx, config, identity, checksums, res)
        return res

    @staticmethod
    def _throughput(torch, tu, matmul, device, config: Config):
        figs, gpu_seconds, unsupported = [], 0.0, {}
        ctx_mgr = torch.cuda.device(device) if device.type == "cuda" else _Null()
        with ctx_mgr:
            for dt in config.dtypes:
                ok, why = matmul.supported(torch, device, dt)
                if not ok:
                    unsupported[dt] = why
                    continue
                rates, secs = matmul.timed_throughput(torch, tu, device, dt, config.size, config.warmup,
                                                      config.repeats, config.per_repeat)
                gpu_seconds += secs
                figs.append(Figure(dt, "flops_per_second", rates))
            if device.type == "cuda":
                torch.cuda.empty_cache()
        return figs, gpu_seconds, unsupported

    @staticmethod
    def _judge(sdc, ctx: ProbeContext, config: Config, identity: dict, checksums: dict[str, str],
               res: ProbeResult) -> None:
        key = sdc.golden_key(identity)
        store = sdc.GoldenStore(ctx.state_dir, config.sdc_golden_file)
        try:
            golden, source = store.get(key)
        except sdc.GoldenFileError as exc:
            raise ProbeError("golden_file_error", str(exc), result=res) from None
        v = sdc.judge(checksums, golden, source, config.sdc_min_consensus)
        if v.established:
            store.put(key, v.golden, identity, sorted(checksums), [g for g, s in v.status.items() if s == "match"])
        for gpu, st in v.status.items():  # the current status only: the others have no series
            res.samples.append(Sample(SDC_METRIC, {"gpu": gpu, "status": st}, 1.0))
        res.extra["sdc"] = {"key": key, "identity": identity, **v.record()}
        if v.wrong:
            raise ProbeError("wrong_result", f"GPU(s) {', '.join(v.wrong)}: SDC canary checksum differs from the "
                             f"{v.golden_source} golden {v.golden[:23]}...", result=res)
        if v.no_consensus:
            raise ProbeError("sdc_no_consensus", v.detail, result=res)


def _on_mig(config: dict) -> dict:
    """One MIG device's throughput, in the process gpu_probe.on_mig started (CUDA device 0 is the MIG device)."""
    from fleetcanary.probes.lib import matmul, torch_util

    torch = torch_util.import_torch()
    with torch_util.cuda_errors():
        figs, gpu_seconds, unsupported = GpuCompute._throughput(torch, torch_util, matmul, torch.device("cuda", 0),
                                                                Config(**config))
    return {"gpu_seconds": gpu_seconds, "figures": {f.name: f.median for f in figs}, "unsupported_dtypes": unsupported}


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
