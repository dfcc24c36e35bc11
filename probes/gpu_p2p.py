"""The GPU peer-to-peer matrix: copy bandwidth for every ordered pair, peer access,
and the link type between the pair from NVML topology.

Unidirectional: a copy from src to dst, timed from enqueue to both devices being
idle (host clock around synchronize, since the copy involves two devices' streams);
bytes counted once. Bidirectional (optional): src->dst and dst->src at once on two
streams, bytes counted twice. The matrix shows what nvbandwidth's
device_to_device_memcpy_read/write show, in the fleet's metrics.

Published by default: each source GPU's slowest link, the lowest bandwidth of its copies to
the other GPUs, under the matrix's metric with dst_gpu empty (Prometheus drops the label; 8
series on 8 GPUs, not 56): one bad link moves it, and it is the figure the node judges
(fleetcanary.judge.figures folds a matrix the same way, so its statistics are the same with
either form). The matrix itself (which link) is in the run record, and as series only with
``pairs``. Peer access and the link type of each pair are in the run record; as series (two
more matrices, 112 series on 8 GPUs, which no rule reads) only with ``topology``, as the
bidirectional matrix only with ``bidirectional``.
"""
from __future__ import annotations

import functools
import time
from typing import ClassVar

from pydantic import Field

from fleetcanary.probes.base import (
    Figure,
    MetricSpec,
    Probe,
    ProbeContext,
    ProbeError,
    ProbeResult,
    ProbeSkipped,
    Sample,
)
from fleetcanary.probes.lib import nvml
from fleetcanary.probes.lib.gpu_probe import Device, GpuDeviceConfig, GpuSeconds

BW = "fleetcanary_gpu_p2p_bandwidth_bytes_per_second"
BIDI = "fleetcanary_gpu_p2p_bidirectional_bandwidth_bytes_per_second"
LINK = "fleetcanary_gpu_p2p_link_info"
ACCESS = "fleetcanary_gpu_p2p_access"


class Config(GpuDeviceConfig):
    device: Device = Field(
        "auto", description="auto: CUDA GPUs; cpu: copies between CPU tensors (tests), topology from NVML.")
    expected_gpu_seconds: GpuSeconds = 2.0
    cpu_devices: int = Field(2, ge=2, le=16, description="With device cpu and no NVML: pseudo-GPUs to pair.")
    bytes: int = Field(256 << 20, ge=1 << 20, description="Bytes per copy.")
    warmup: int = Field(1, ge=0, le=20, description="Untimed copies per pair.")
    repeats: int = Field(5, ge=1, le=100, description="Timed copies per pair; the median is published.")
    bidirectional: bool = Field(
        False, description="Opt-in: also measure both directions at once "
        "(fleetcanary_gpu_p2p_bidirectional_bandwidth_bytes_per_second: one series per pair, 28 on 8 GPUs, and "
        "the GPU time of those copies).")
    pairs: bool = Field(
        False, description="Opt-in: the bandwidth of every ordered pair as series "
        "(fleetcanary_gpu_p2p_bandwidth_bytes_per_second with its dst_gpu label: 56 series on 8 GPUs). Off: one "
        "series per source GPU, its slowest link, with dst_gpu empty (Prometheus drops it); the matrix is in the "
        "run record.")
    topology: bool = Field(
        False, description="Opt-in: peer access and link type of every ordered pair as series "
        "(fleetcanary_gpu_p2p_access, fleetcanary_gpu_p2p_link_info: 112 series on 8 GPUs). Off: both are in "
        "the run record's matrix only.")


class GpuP2P(Probe):
    name = "gpu_p2p"
    Config = Config
    exclusive = "gpu"
    failure_reasons = ("nvml_error", "cuda_error", "verification_failed", "out_of_memory")
    default_interval_seconds = 3600.0
    default_timeout_seconds = 300.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(BW, "gauge",
                   "Peer copy bandwidth from src_gpu to dst_gpu, median of the repeats; bytes counted once. By "
                   "default per source GPU, its slowest link (the lowest over its destinations; dst_gpu empty); "
                   "per pair with pairs.", "bytes_per_second", ("src_gpu", "dst_gpu")),
        MetricSpec(BIDI, "gauge", "Bandwidth of simultaneous copies both ways between the pair; bytes of both counted.",
                   "bytes_per_second", ("src_gpu", "dst_gpu")),
        MetricSpec(ACCESS, "gauge", "1 if src_gpu can access dst_gpu's memory directly (peer access); with "
                   "topology only.", "boolean", ("src_gpu", "dst_gpu")),
        MetricSpec(LINK, "gauge", "How the pair connects, from NVML topology: nvlink, pcie_single_switch, "
                   "pcie_multi_switch, pcie_host_bridge, numa_node, cross_socket, same_board or unknown; value 1; "
                   "with topology only.", "info", ("src_gpu", "dst_gpu", "link")),
    )

    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        from fleetcanary.probes.lib import gpu_probe, torch_util

        gpus = gpu_probe.acquire(config, ctx, nvml_on_cpu=True, min_gpus=2, inspect=_topology)
        kind = gpus.kind
        if gpus.facts is not None:  # the topology NVML gave, of the GPUs gated (or, device cpu, listed)
            links, nvml_access = gpus.facts
            indices = gpus.indices
        else:  # device cpu without NVML: pseudo-GPUs
            links, nvml_access = {}, {}
            indices = list(range(config.cpu_devices))
        torch = torch_util.import_torch()
        if kind == "cuda" and torch.cuda.device_count() < 2:
            raise ProbeSkipped("single_gpu", "torch sees fewer than two CUDA devices")
        res = ProbeResult(parameters={"device": kind, "bytes": config.bytes, "warmup": config.warmup,
                                      "repeats": config.repeats, "bidirectional": config.bidirectional,
                                      "pairs": config.pairs, "topology": config.topology,
                                      "timer": "perf_counter around synchronize of both devices"},
                          touched={"gpus": indices, "invasive": True, **gpus.record()})
        dev = (lambda i: torch.device("cuda", gpus.cuda(i))) if kind == "cuda" else (lambda i: torch.device("cpu"))
        bufs = {}
        with torch_util.cuda_errors():
            for i in indices:
                bufs[i] = torch.empty(config.bytes, dtype=torch.uint8, device=dev(i))
                torch_util.fill_random(torch, bufs[i])
            recv = {i: torch.empty(config.bytes, dtype=torch.uint8, device=dev(i)) for i in indices}
        gpu_seconds = {str(i): 0.0 for i in indices}
        matrix = {}

        def sync(*ids):
            if kind == "cuda":
                for i in ids:
                    torch.cuda.synchronize(gpus.cuda(i))

        for a in indices:
            for b in indices:
                if a == b:
                    continue
                access = (torch.cuda.can_device_access_peer(gpus.cuda(a), gpus.cuda(b)) if kind == "cuda"
                          else nvml_access.get((a, b), True))
                copy = functools.partial(recv[b].copy_, bufs[a], non_blocking=True)
                times = _timed(copy, a, b, config, sync, gpu_seconds)
                step = max(config.bytes // 4096, 1)
                if not torch.equal(recv[b][::step].cpu(), bufs[a][::step].cpu()):
                    raise ProbeError("verification_failed", f"copy {a}->{b} differs from its source")
                labels = {"src_gpu": str(a), "dst_gpu": str(b)}
                fig = Figure("p2p", "bytes_per_second", [config.bytes / t for t in times], labels)
                res.figures.append(fig)
                if config.pairs:
                    res.samples.append(Sample(BW, labels, fig.median))
                link = links.get((a, b), nvml.UNKNOWN)
                if config.topology:
                    res.samples.append(Sample(ACCESS, labels, 1.0 if access else 0.0))
                    res.samples.append(Sample(LINK, {**labels, "link": link}, 1.0))
                matrix[f"{a}->{b}"] = {"median_bytes_per_second": fig.median, "peer_access": bool(access), "link": link}
                if config.bidirectional and a < b:
                    fig2 = self._bidirectional(torch, kind, bufs, recv, a, b, config, sync, gpu_seconds, gpus.cuda)
                    res.figures.append(fig2)
                    res.samples.append(Sample(BIDI, labels, fig2.median))
        if not config.pairs:  # each source GPU's slowest link, as the judge folds the matrix
            for a in indices:
                row = [f.median for f in res.figures if f.name == "p2p" and f.labels["src_gpu"] == str(a)]
                if row:
                    res.samples.append(Sample(BW, {"src_gpu": str(a), "dst_gpu": ""}, min(row)))
        res.gpu_seconds = gpu_seconds
        res.extra["matrix"] = matrix
        return res

    @staticmethod
    def _bidirectional(torch, kind, bufs, recv, a, b, config, sync, gpu_seconds, cuda=lambda i: i) -> Figure:
        streams = (torch.cuda.Stream(cuda(a)), torch.cuda.Stream(cuda(b))) if kind == "cuda" else None

        def both_ways():
            if streams:
                with torch.cuda.stream(streams[0]):
                    recv[b].copy_(bufs[a], non_blocking=True)
                with torch.cuda.stream(streams[1]):
                    recv[a].copy_(bufs[b], non_blocking=True)
            else:
                recv[b].copy_(bufs[a])
                recv[a].copy_(bufs[b])

        times = _timed(both_ways, a, b, config, sync, gpu_seconds)
        return Figure("p2p_bidirectional", "bytes_per_second", [2 * config.bytes / t for t in times],
                      {"src_gpu": str(a), "dst_gpu": str(b)})


def _topology(session: nvml.Session, usable: list[nvml.GpuHandle]):
    """(link type, NVML peer-access status) of every ordered pair of the usable GPUs."""
    links: dict[tuple[int, int], str] = {}
    access: dict[tuple[int, int], bool | None] = {}
    bus = {h.index: session.identity(h)["pci_bus_id"] for h in usable}
    for a in usable:
        for b in usable:
            if a.index != b.index:
                links[(a.index, b.index)] = session.link_type(a, b, bus)
                access[(a.index, b.index)] = session.p2p_supported(a, b)
    return links, access


def _timed(copy, a: int, b: int, config: Config, sync, gpu_seconds: dict[str, float]) -> list[float]:
    """Warm-up then timed copies between a and b: host clock around synchronize of both
    devices; every copy's time counts as GPU time of both."""
    times = []
    for r in range(config.warmup + config.repeats):
        sync(a, b)
        t0 = time.perf_counter()
        copy()
        sync(a, b)
        t = time.perf_counter() - t0
        gpu_seconds[str(a)] += t
        gpu_seconds[str(b)] += t
        if r >= config.warmup:
            times.append(t)
    return times
