"""The GPU peer-to-peer matrix: copy bandwidth for every ordered pair, peer access,
and the link type between the pair from NVML topology.

Unidirectional: a copy from src to dst, timed from enqueue to both devices being
idle (host clock around synchronize, since the copy involves two devices' streams);
bytes counted once. Bidirectional (optional): src->dst and dst->src at once on two
streams, bytes counted twice. The matrix shows what nvbandwidth's
device_to_device_memcpy_read/write show, in the fleet's metrics.
"""
from __future__ import annotations

import time
from typing import ClassVar, Literal

from pydantic import Field

from fleetcanary.probes.lib import nvml
from fleetcanary.probes.base import Figure, MetricSpec, Probe, ProbeConfig, ProbeContext, ProbeError, ProbeResult, ProbeSkipped, Sample

BW = "fleetcanary_gpu_p2p_bandwidth_bytes_per_second"
BIDI = "fleetcanary_gpu_p2p_bidirectional_bandwidth_bytes_per_second"
LINK = "fleetcanary_gpu_p2p_link_info"
ACCESS = "fleetcanary_gpu_p2p_access"


class Config(ProbeConfig):
    device: Literal["auto", "cpu"] = Field(
        "auto", description="auto: CUDA GPUs; cpu: copies between CPU tensors (tests), topology from NVML.")
    cpu_devices: int = Field(2, ge=2, le=16, description="With device cpu and no NVML: pseudo-GPUs to pair.")
    bytes: int = Field(256 << 20, ge=1 << 20, description="Bytes per copy.")
    warmup: int = Field(1, ge=0, le=20, description="Untimed copies per pair.")
    repeats: int = Field(5, ge=1, le=100, description="Timed copies per pair; the median is published.")
    bidirectional: bool = Field(False, description="Also measure both directions at once.")
    busy_policy: Literal["node", "gpu"] = Field("node", description="node: any busy GPU skips the run.")
    expected_gpu_seconds: float = Field(2.0, gt=0, description="GPU seconds a run is assumed to cost, per GPU.")


class GpuP2P(Probe):
    name = "gpu_p2p"
    Config = Config
    exclusive = "gpu"
    confirm_metrics = (BW,)
    failure_reasons = ("nvml_error", "cuda_error", "verification_failed", "out_of_memory")
    default_interval_seconds = 3600.0
    default_timeout_seconds = 300.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(BW, "gauge", "Peer copy bandwidth from src_gpu to dst_gpu, median of the repeats; bytes counted once.",
                   "bytes_per_second", ("src_gpu", "dst_gpu")),
        MetricSpec(BIDI, "gauge", "Bandwidth of simultaneous copies both ways between the pair; bytes of both counted.",
                   "bytes_per_second", ("src_gpu", "dst_gpu")),
        MetricSpec(ACCESS, "gauge", "1 if src_gpu can access dst_gpu's memory directly (peer access).",
                   "boolean", ("src_gpu", "dst_gpu")),
        MetricSpec(LINK, "gauge", "How the pair connects, from NVML topology: nvlink, pcie_single_switch, "
                   "pcie_multi_switch, pcie_host_bridge, numa_node, cross_socket, same_board or unknown; value 1.",
                   "info", ("src_gpu", "dst_gpu", "link")),
    )

    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        from fleetcanary.probes.lib import gpu_gate, torch_util

        links: dict[tuple[int, int], str] = {}
        nvml_access: dict[tuple[int, int], bool | None] = {}
        gate = None
        if config.device == "auto":
            session = gpu_gate.open_session()  # no driver: skipped before paying for the torch import
        else:  # cpu: topology from NVML where it exists, else pseudo-GPUs
            try:
                session = nvml.open_session()
            except nvml.NvmlUnavailable:
                session = None
        torch = torch_util.import_torch()
        if session is not None:
            with session:
                handles = session.handles()
                if len([h for h in handles if not h.lost]) < 2:
                    raise ProbeSkipped("single_gpu", f"{len(handles)} GPU(s) on this node")
                if config.device == "auto":
                    gate = gpu_gate.gate(session, handles, ctx.gpu, ctx.kube, config.expected_gpu_seconds,
                                         config.busy_policy)
                    usable = gate.usable
                else:
                    usable = [h for h in handles if not h.lost]
                bus = {h.index: session.identity(h)["pci_bus_id"] for h in usable}
                for a in usable:
                    for b in usable:
                        if a.index != b.index:
                            links[(a.index, b.index)] = session.link_type(a, b, bus)
                            nvml_access[(a.index, b.index)] = session.p2p_supported(a, b)
            indices = [h.index for h in usable]
        else:
            indices = list(range(config.cpu_devices))
        if len(indices) < 2:
            raise ProbeSkipped("single_gpu", f"only {len(indices)} usable GPU(s)")

        kind = torch_util.resolve_device_kind(config.device)
        if kind == "cuda" and torch.cuda.device_count() < 2:
            raise ProbeSkipped("single_gpu", "torch sees fewer than two CUDA devices")
        res = ProbeResult(parameters={"device": kind, "bytes": config.bytes, "warmup": config.warmup,
                                      "repeats": config.repeats, "bidirectional": config.bidirectional,
                                      "timer": "perf_counter around synchronize of both devices"},
                          touched={"gpus": indices, "invasive": True, **(gate.record() if gate else {})})
        dev = (lambda i: torch.device("cuda", i)) if kind == "cuda" else (lambda i: torch.device("cpu"))
        bufs = {}
        try:
            for i in indices:
                bufs[i] = torch.empty(config.bytes, dtype=torch.uint8, device=dev(i))
                torch_util.fill_random(torch, bufs[i])
            recv = {i: torch.empty(config.bytes, dtype=torch.uint8, device=dev(i)) for i in indices}
        except torch.cuda.OutOfMemoryError as exc:
            raise ProbeError("out_of_memory", str(exc).splitlines()[0]) from None
        gpu_seconds = {str(i): 0.0 for i in indices}
        matrix = {}

        def sync(*ids):
            if kind == "cuda":
                for i in ids:
                    torch.cuda.synchronize(i)

        for a in indices:
            for b in indices:
                if a == b:
                    continue
                access = torch.cuda.can_device_access_peer(a, b) if kind == "cuda" else nvml_access.get((a, b), True)
                times = _timed(lambda: recv[b].copy_(bufs[a], non_blocking=True), a, b, config, sync, gpu_seconds)
                step = max(config.bytes // 4096, 1)
                if not torch.equal(recv[b][::step].cpu(), bufs[a][::step].cpu()):
                    raise ProbeError("verification_failed", f"copy {a}->{b} differs from its source")
                labels = {"src_gpu": str(a), "dst_gpu": str(b)}
                fig = Figure("p2p", "bytes_per_second", [config.bytes / t for t in times], labels)
                res.figures.append(fig)
                res.samples.append(Sample(BW, labels, fig.median))
                res.samples.append(Sample(ACCESS, labels, 1.0 if access else 0.0))
                link = links.get((a, b), nvml.UNKNOWN)
                res.samples.append(Sample(LINK, {**labels, "link": link}, 1.0))
                matrix[f"{a}->{b}"] = {"median_bytes_per_second": fig.median, "peer_access": bool(access), "link": link}
                if config.bidirectional and a < b:
                    fig2 = self._bidirectional(torch, kind, bufs, recv, a, b, config, sync, gpu_seconds)
                    res.figures.append(fig2)
                    res.samples.append(Sample(BIDI, labels, fig2.median))
        res.gpu_seconds = gpu_seconds
        res.extra["matrix"] = matrix
        return res

    @staticmethod
    def _bidirectional(torch, kind, bufs, recv, a, b, config, sync, gpu_seconds) -> Figure:
        streams = (torch.cuda.Stream(a), torch.cuda.Stream(b)) if kind == "cuda" else None

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
