"""GPU memory bandwidth per GPU: device-to-device, host-to-device and device-to-host copies.

Byte counting, as nvbandwidth and the CUDA samples do: a device-to-device copy reads
and writes device memory, so it counts 2 x size; host-to-device and device-to-host
count size once (the bytes crossing PCIe or C2C). Host buffers are pinned, so the
copies are DMA transfers that show link health rather than pageable staging.

Each direction: ``warmup`` untimed copies, then ``repeats`` copies each timed with
CUDA events; the median is published and the repeats kept in the record. Buffers are
at least 4x the GPU's L2 cache so the device-to-device figure is HBM, not L2.
The same code runs on device "cpu" for tests, where all three are memcpy.

MIG: the free MIG devices the gate offers (probes/lib/gpu_gate.py) are measured too, each in a process of its
own pointed at its MIG UUID (CUDA enumerates one MIG device per process). Their figures go into the record
(``per_mig``) and their GPU seconds to the parent GPU's budget, not into the metric: a slice's bandwidth is
not comparable with whole GPUs' in the fleet rules.
"""
from __future__ import annotations

import functools
from typing import ClassVar, Literal

from pydantic import Field

from fleetcanary.probes.base import Figure, MetricSpec, Probe, ProbeContext, ProbeError, ProbeResult, figure_sample
from fleetcanary.probes.lib.gpu_probe import GpuDeviceConfig

METRIC = "fleetcanary_gpu_memory_bandwidth_bytes_per_second"
DIRECTIONS = ("d2d", "h2d", "d2h")
DEFAULT_L2_BYTES = 64 << 20  # when torch cannot tell


class Config(GpuDeviceConfig):
    d2d_bytes: int = Field(1 << 30, ge=1 << 20,
                           description="Device-to-device buffer, bytes (raised to 4x L2 if below).")
    host_bytes: int = Field(256 << 20, ge=1 << 20, description="Host<->device buffer, bytes (pinned host memory).")
    warmup: int = Field(2, ge=0, le=20, description="Untimed copies per direction.")
    repeats: int = Field(10, ge=1, le=200, description="Timed copies per direction; the median is published.")
    directions: tuple[Literal["d2d", "h2d", "d2h"], ...] = Field(DIRECTIONS, description="Directions to measure.")


class GpuBandwidth(Probe):
    name = "gpu_bandwidth"
    Config = Config
    exclusive = "gpu"
    failure_reasons = ("nvml_error", "cuda_error", "verification_failed", "out_of_memory")
    default_interval_seconds = 900.0
    default_timeout_seconds = 120.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(METRIC, "gauge",
                   "GPU memory copy bandwidth, median of the timed repeats. d2d counts bytes read plus bytes "
                   "written (2 x buffer); h2d and d2h count the buffer once (pinned host memory).",
                   "bytes_per_second", ("gpu", "direction")),
    )

    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        from fleetcanary.probes.lib import gpu_probe, torch_util

        gpus = gpu_probe.acquire(config, ctx, mig=True)
        kind = gpus.kind
        indices = gpus.indices if kind == "cuda" else [0]
        torch = torch_util.import_torch()

        res = ProbeResult(parameters={"device": kind, "warmup": config.warmup, "repeats": config.repeats,
                                      "byte_counting": "d2d: read+write (2x size); h2d, d2h: size once",
                                      "timer": "cuda events" if kind == "cuda" else "perf_counter"},
                          touched={"gpus": indices, "invasive": True, **gpus.record()})
        per_gpu = {}
        for idx in indices:
            device = torch.device(kind, gpus.cuda(idx)) if kind == "cuda" else torch.device("cpu")
            with torch_util.cuda_errors(gpu=idx):
                figs, gpu_seconds, sizes = self._measure(torch, torch_util, device, config)
            for f in figs:
                f.labels = {"gpu": str(idx), "direction": f.name}
                res.figures.append(f)
                res.samples.append(figure_sample(f, METRIC))
            res.gpu_seconds[str(idx)] = gpu_seconds
            per_gpu[str(idx)] = {"gpu_seconds": gpu_seconds, **sizes}
        res.extra["per_gpu"] = per_gpu
        if kind == "cuda" and gpus.mig:
            res.extra["per_mig"] = gpu_probe.measure_mig(gpus.mig, _on_mig, config.model_dump(mode="json"), res,
                                                           ctx.deadline_monotonic)
        return res

    @staticmethod
    def _measure(torch, tu, device, config: Config):
        l2 = tu.l2_cache_bytes(torch, device)
        d2d_bytes = max(config.d2d_bytes, 4 * (l2 or DEFAULT_L2_BYTES)) if device.type == "cuda" else config.d2d_bytes
        sizes = {"d2d_bytes": d2d_bytes, "host_bytes": config.host_bytes, "l2_cache_bytes": l2}
        pinned = device.type == "cuda"
        figs, gpu_seconds = [], 0.0
        ctx_mgr = torch.cuda.device(device) if device.type == "cuda" else _Null()
        with ctx_mgr:
            for direction in config.directions:
                if direction == "d2d":
                    src = torch.empty(d2d_bytes, dtype=torch.uint8, device=device)
                    dst = torch.empty_like(src)
                    counted = 2 * d2d_bytes
                elif direction == "h2d":
                    src = torch.empty(config.host_bytes, dtype=torch.uint8, pin_memory=pinned)
                    dst = torch.empty(config.host_bytes, dtype=torch.uint8, device=device)
                    counted = config.host_bytes
                else:
                    src = torch.empty(config.host_bytes, dtype=torch.uint8, device=device)
                    dst = torch.empty(config.host_bytes, dtype=torch.uint8, pin_memory=pinned)
                    counted = config.host_bytes
                tu.fill_random(torch, src)
                copy = functools.partial(dst.copy_, src, non_blocking=True)
                times = []
                for i in range(config.warmup + config.repeats):
                    t = tu.time_op(torch, device, copy)
                    gpu_seconds += t
                    if i >= config.warmup:
                        times.append(t)
                # Check the copy landed: compare a strided sample of both buffers.
                step = max(src.numel() // 4096, 1)
                if not torch.equal(src[::step].cpu(), dst[::step].cpu()):
                    raise ProbeError("verification_failed", f"{direction} copy on {device} differs from its source")
                figs.append(Figure(direction, "bytes_per_second", [counted / t for t in times]))
                del src, dst, copy
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        return figs, gpu_seconds, sizes


def _on_mig(config: dict) -> dict:
    """One MIG device's figures, in the process gpu_probe.on_mig started (CUDA device 0 is the MIG device)."""
    from fleetcanary.probes.lib import torch_util

    torch = torch_util.import_torch()
    with torch_util.cuda_errors():
        figs, gpu_seconds, sizes = GpuBandwidth._measure(torch, torch_util, torch.device("cuda", 0), Config(**config))
    return {"gpu_seconds": gpu_seconds, "figures": {f.name: f.median for f in figs}, **sizes}


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
