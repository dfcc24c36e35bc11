"""GPU behaviour under sustained load: a matmul burn with an NVML trace every 100 ms.

Why a probe of its own rather than a mode of gpu_compute: it needs its own schedule (daily
by default against gpu_compute's 15 minutes), its own deadline (the burn is 20 s) and its
own GPU-time budget entry; one probe has one schedule, and two configs of one probe would
need instances the probe map does not have. The products come from the same code
(probes/lib/matmul.py).

All usable GPUs burn together (a training job heats a whole node at once, and a shared
power or cooling fault only shows then): chunks of ``per_chunk`` products are queued on
every GPU in turn, each chunk between CUDA events, at most two chunks in flight per GPU.
A thread in the worker reads each GPU's SM and memory clocks, power, temperature and
throttle reasons every ``sample_interval_seconds`` (probes/lib/load_trace.py).

Published per GPU: the ratio of the sustained throughput (median chunk rate over the last
``tail_fraction`` of the burn) to the initial throughput (median over the first
``initial_seconds`` after the first two chunks) and the share of the burn spent in a slowdown (thermal,
power brake, HW slowdown; the power cap is excluded because a healthy GPU reaches it under a
full burn too). A GPU whose ratio or slowdown throttling differs from its peers' is the one
with a failing fan, bad thermal contact or a power brake. The sustained throughput itself, the
clocks and power over the tail, the hottest temperature, the seconds in each throttle reason that was
active at all and the burn's length are in the run record (/results), and series only with ``detail``. Nothing about
the GPU's clocks, power limit or modes is changed.

If a compute process appears on a burning GPU (a job started), the burn stops at once and
the run skips with gpu_busy.

GPU-time budget: a burn of 20 s (charged as ``expected_gpu_seconds`` = 22 s) is more than
the 18 s an hour that the default gpu.budget_ratio of 0.5% allows, so a sliding hour would
always skip it. The daemon holds each probe to the ratio over a window as long as its
interval (one hour to one day): at the daily default that is 432 s per GPU per day, of
which the other GPU probes' runs of the last day use their share, and hourly probes count
this burn as its amortized 22/24 s an hour (daemon/scheduler.py GpuBudget;
benchmarks/overhead.py sums the same per-hour shares). A shorter interval makes the burn
count more often and, below an hour, in full against the hour.
"""
from __future__ import annotations

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
    ProbeSkipped,
    Sample,
    figure_sample,
)
from fleetcanary.probes.lib.gpu_probe import BusyPolicy, Device, GpuDeviceConfig, GpuSeconds

P = "fleetcanary_gpu_sustained_"
THROUGHPUT = P + "flops_per_second"
RATIO = P + "throughput_ratio"
CLOCK = P + "clock_hertz"
POWER = P + "power_watts"
TEMP = P + "temperature_celsius"
CPU_CHUNK_SECONDS = 0.01  # on the CPU (tests), a chunk repeats its products at least this long
THROTTLE = P + "throttle_seconds"
SLOWDOWN = P + "slowdown_ratio"
BURN = P + "burn_seconds"


class Config(GpuDeviceConfig):
    device: Device = Field(
        "auto", description="auto: CUDA GPUs (skip with no_gpu without one); cpu: the same code on the CPU, for tests "
        "(NVML is still read when present, e.g. the fake NVML).")
    busy_policy: BusyPolicy = Field(
        "node", description="node: any busy GPU skips the run; gpu: burn the idle GPUs only.")
    expected_gpu_seconds: GpuSeconds = Field(
        22.0, description="GPU seconds one run is assumed to cost (the burn plus set-up), for the budget check.")
    burn_seconds: float = Field(20.0, ge=0.2, le=600, description="Length of the burn, seconds.")
    dtype: Literal["bf16", "fp16"] = Field("bf16", description="Product dtype of the burn.")
    size: int = Field(8192, ge=16, le=32768, description="n of the n x n x n products.")
    per_chunk: int = Field(8, ge=1, le=256, description="Products per timed chunk.")
    sample_interval_seconds: float = Field(0.1, ge=0.02, le=1.0, description="NVML sampling period, seconds.")
    initial_seconds: float = Field(2.0, gt=0, description="Window at the start whose chunks give the initial rate.")
    tail_fraction: float = Field(0.25, gt=0, le=0.5, description="Share of the burn at its end that gives the "
                                 "sustained rate, clocks and power.")
    detail: bool = Field(
        False, description="Opt-in: the sustained throughput, the SM and memory clocks and the board power over the "
        "burn's tail, the seconds in each throttle reason and the burn's length as series "
        "(fleetcanary_gpu_sustained_flops_per_second, _clock_hertz, _power_watts, _throttle_seconds, _burn_seconds, "
        "_temperature_celsius: 6 series per GPU and one per throttle reason seen, 56 or more on an 8-GPU node). Off: "
        "in the run record only; the throughput ratio and slowdown share are published either way.")

    @model_validator(mode="after")
    def _windows(self) -> Config:
        if self.initial_seconds >= self.burn_seconds * (1 - self.tail_fraction):
            raise ValueError("initial_seconds must end before the tail window starts "
                             "(initial_seconds < burn_seconds x (1 - tail_fraction))")
        return self


class GpuSustained(Probe):
    name = "gpu_sustained"
    Config = Config
    exclusive = "gpu"
    failure_reasons = ("nvml_error", "cuda_error", "out_of_memory", "too_few_chunks")
    default_interval_seconds = 86400.0
    default_timeout_seconds = 180.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(THROUGHPUT, "gauge", "Matmul throughput at the end of the sustained burn (median chunk rate over "
                   "its last quarter), 2 n^3 FLOP per product; with detail only.", "flops_per_second",
                   ("gpu", "dtype"), opt_in="detail"),
        MetricSpec(RATIO, "gauge", "Sustained throughput over the initial throughput of the same burn (1 = no "
                   "slowdown under load).", "ratio", ("gpu",)),
        MetricSpec(CLOCK, "gauge", "SM and memory clock over the burn's last quarter (median of the NVML samples); "
                   "with detail only.", "hertz", ("gpu", "clock"), opt_in="detail"),
        MetricSpec(POWER, "gauge", "Board power over the burn's last quarter (median of the NVML samples); with "
                   "detail only.", "watts", ("gpu",), opt_in="detail"),
        MetricSpec(TEMP, "gauge", "Hottest GPU temperature seen during the burn; with detail only (the slowdown "
                   "share says whether the heat slowed it).", "celsius", ("gpu",), opt_in="detail"),
        MetricSpec(THROTTLE, "gauge", "Seconds of the burn each throttle (clocks event) reason was active, from "
                   "NVML samples; reasons overlap. A reason never active in the burn has no series; with detail only.",
                   "seconds",
                   ("gpu", "reason"), opt_in="detail"),
        MetricSpec(SLOWDOWN, "gauge", "Share of the burn with a thermal, power-brake or hardware slowdown reason "
                   "active. The power cap is left out: a full-load burn reaches it on healthy GPUs too (see "
                   "throttle_seconds and the sustained ratio).", "ratio", ("gpu",)),
        MetricSpec(BURN, "gauge", "Length of the last burn; with detail only.", "seconds", ("gpu",), opt_in="detail"),
    )

    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        from fleetcanary.probes.lib import gpu_probe, load_trace, matmul, torch_util

        # The session stays open for the load trace; device cpu reads the first GPU's where NVML is.
        first = None if config.device == "auto" else (lambda handles: handles[:1])
        with gpu_probe.acquire(config, ctx, nvml_on_cpu=True, select=first, keep_session=True) as gpus:
            kind = gpus.kind
            indices = gpus.indices if kind == "cuda" else [0]
            torch = torch_util.import_torch()
            with torch_util.cuda_errors():
                return self._burn(torch, matmul, load_trace, gpus.session, gpus.handles, kind, indices, config,
                                  gpus.gate, gpus.cuda)

    def _burn(self, torch, matmul, load_trace, session, handles, kind, indices, config: Config, gate,
              cuda=lambda i: i) -> ProbeResult:
        devices = {i: (torch.device(kind, cuda(i)) if kind == "cuda" else torch.device("cpu")) for i in indices}
        fns = {i: matmul.operands(torch, d, config.dtype, config.size) for i, d in devices.items()}
        work = config.per_chunk * matmul.flops(config.size)
        chunks: dict[int, list[tuple[float, float]]] = {i: [] for i in indices}  # (end offset s, FLOP/s)
        sampler = load_trace.Sampler(session, handles, config.sample_interval_seconds) if session else None
        if kind == "cuda":
            for i in indices:  # one untimed chunk: contexts, cuBLAS handles, clocks up
                with torch.cuda.device(devices[i]):
                    for _ in range(config.per_chunk):
                        fns[i]()
            for i in indices:
                torch.cuda.synchronize(devices[i])
        t0 = time.monotonic()
        if sampler:
            sampler.start(t0)
        stopped_early = None
        try:
            if kind == "cuda":
                stopped_early = self._cuda_loop(torch, devices, fns, config, chunks, work, sampler, t0)
            else:
                while time.monotonic() - t0 < config.burn_seconds:
                    if sampler and sampler.intruder:
                        stopped_early = sorted(sampler.intruder)
                        break
                    # a chunk of at least CPU_CHUNK_SECONDS: tiny products would make millions of chunks a burn
                    a, k = time.perf_counter(), 0
                    while True:
                        for _ in range(config.per_chunk):
                            fns[0]()
                        k += 1
                        b = time.perf_counter()
                        if b - a >= CPU_CHUNK_SECONDS:
                            break
                    chunks[0].append((time.monotonic() - t0, k * work / (b - a)))
        finally:
            burn = time.monotonic() - t0
            traces = sampler.stop() if sampler else {}
        if stopped_early:
            raise ProbeSkipped("gpu_busy", f"a compute process started on GPU(s) {stopped_early} during the burn; "
                               f"stopped after {burn:.1f} s")
        res = ProbeResult(parameters={"device": kind, "dtype": config.dtype, "size": config.size,
                                      "per_chunk": config.per_chunk, "burn_seconds": config.burn_seconds,
                                      "sample_interval_seconds": config.sample_interval_seconds,
                                      "initial_seconds": config.initial_seconds, "tail_fraction": config.tail_fraction,
                                      "detail": config.detail,
                                      "flop_counting": "2 n^3 per product",
                                      "timer": "cuda events" if kind == "cuda" else "perf_counter"},
                          touched={"gpus": indices, "invasive": True, **(gate.record() if gate else {})})
        tail_from = burn * (1 - config.tail_fraction)
        per_gpu = {}
        for i in indices:
            c = chunks[i]
            initial = [r for t, r in c[2:] if t <= config.initial_seconds + (c[1][0] if len(c) > 1 else 0)]
            tail = [r for t, r in c if t >= tail_from]
            if len(initial) < 1 or len(tail) < 1:
                raise ProbeError("too_few_chunks", f"GPU {i}: {len(c)} chunks in {burn:.1f} s; lower per_chunk or "
                                 "size, or raise burn_seconds")
            g = str(i)
            sustained = Figure("sustained", "flops_per_second", tail, labels={"gpu": g, "dtype": config.dtype})
            first = Figure("initial", "flops_per_second", initial, labels={"gpu": g, "dtype": config.dtype})
            ratio = sustained.median / first.median
            res.figures += [sustained, first, Figure("sustained_ratio", "ratio", [ratio], labels={"gpu": g})]
            res.samples.append(Sample(RATIO, {"gpu": g}, ratio))
            if config.detail:
                res.samples += [figure_sample(sustained, THROUGHPUT), Sample(BURN, {"gpu": g}, burn)]
            trace = traces.get(i if kind == "cuda" else (handles[0].index if handles else -1), [])
            acc = load_trace.account(trace, burn, tail_from) if trace else None
            if acc:
                for reason, secs in acc["throttle_seconds"].items() if config.detail else ():
                    if secs > 0:  # a reason the burn never saw is not a series (9 reasons a GPU)
                        res.samples.append(Sample(THROTTLE, {"gpu": g, "reason": reason}, secs))
                if acc["slowdown_ratio"] is not None:
                    res.samples.append(Sample(SLOWDOWN, {"gpu": g}, acc["slowdown_ratio"]))
                if config.detail:
                    for clock, key in (("sm", "sm_mhz_tail"), ("memory", "mem_mhz_tail")):
                        if acc[key] is not None:
                            res.samples.append(Sample(CLOCK, {"gpu": g, "clock": clock}, acc[key] * 1e6))
                    if acc["power_w_tail"] is not None:
                        res.samples.append(Sample(POWER, {"gpu": g}, acc["power_w_tail"]))
                if config.detail and acc["temp_c_max"] is not None:
                    res.samples.append(Sample(TEMP, {"gpu": g}, acc["temp_c_max"]))
            res.gpu_seconds[g] = burn
            per_gpu[g] = {"chunks": len(c), "initial_chunks": len(initial), "tail_chunks": len(tail),
                          "chunk_rates": [[round(t, 3), r] for t, r in c],
                          "trace": [s.to_list() for s in trace], "trace_fields": ["t", "sm_mhz", "mem_mhz",
                                                                                  "power_w", "temp_c", "mask"],
                          "accounting": acc}
        res.extra["per_gpu"] = per_gpu
        if sampler and sampler.errors:
            res.extra["nvml_read_errors"] = sampler.errors[:10]
        return res

    @staticmethod
    def _cuda_loop(torch, devices, fns, config, chunks, work, sampler, t0):
        base = {}
        for i, d in devices.items():
            with torch.cuda.device(d):
                base[i] = torch.cuda.Event(enable_timing=True)
                base[i].record()
        pending: dict[int, list] = {i: [] for i in devices}
        while True:
            elapsed = time.monotonic() - t0
            if sampler and sampler.intruder:
                return sorted(sampler.intruder)
            done = elapsed >= config.burn_seconds
            for i, d in devices.items():
                q = pending[i]
                while q and (done or len(q) >= 2):
                    s, e = q.pop(0)
                    e.synchronize()
                    chunks[i].append((base[i].elapsed_time(e) / 1e3, work / (s.elapsed_time(e) / 1e3)))
                if done:
                    continue
                with torch.cuda.device(d):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    for _ in range(config.per_chunk):
                        fns[i]()
                    e.record()
                q.append((s, e))
            if done:
                return None

