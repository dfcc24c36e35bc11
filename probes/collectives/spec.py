"""The collectives probe's settings and definitions, shared by the probe, its rank
program and the nccl-tests runner (so none of them imports another)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from fleetcanary.probes.lib.gpu_probe import GpuProbeConfig, GpuSeconds

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
# One size per regime: 8 B is latency-bound (its bus bandwidth is 1 / latency), 1 MiB sits where NCCL's protocols
# (LL, LL128, Simple) change over, 64 MiB is bandwidth-bound on one NVLink node. Each size is 4 judged series a node
# (8 in Prometheus); a sweep like nccl-tests' is `sizes_bytes`.
DEFAULT_SIZES = (8, 1 << 20, 64 << 20)
ELEMENT = 4  # float32
FAULT_ENV = "FLEETCANARY_COLLECTIVES_FAULT"
LABELS = ("collective", "size_bytes", "ranks", "backend")
BUSBW = "fleetcanary_collective_bus_bandwidth_bytes_per_second"
ALGBW = "fleetcanary_collective_algorithm_bandwidth_bytes_per_second"
LAT = "fleetcanary_collective_latency_seconds"
MAX_TOPO_BYTES = 256 << 10


def bus_factor(collective: str, n: int) -> float:
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


class Config(GpuProbeConfig):
    expected_gpu_seconds: GpuSeconds = 5.0
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="auto: NCCL with one rank per GPU where GPUs exist, else gloo with cpu_ranks ranks.")
    cpu_ranks: int = Field(2, ge=2, le=64, description="gloo ranks (processes) when running on the CPU.")
    min_gpus: int = Field(2, ge=1, le=64, description="Fewer usable GPUs than this skips with single_gpu.")
    collectives: tuple[Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"], ...] = Field(
        ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"), description="Collectives to sweep.")
    sizes_bytes: tuple[int, ...] = Field(
        DEFAULT_SIZES, description="Message sizes, bytes (nccl-tests' size definition); each a label value.")
    gloo_max_bytes: int = Field(
        4 << 20, ge=8, description="With gloo, sizes above this are left out (CPU ranks over loopback are slow).")
    warmup_iterations: int = Field(5, ge=0, le=100, description="Untimed iterations per size.")
    iterations: int = Field(20, ge=1, le=1000, description="Timed iterations per size.")
    collective_timeout_seconds: float = Field(
        60.0, gt=0, description="Timeout of one collective; capped below the probe's deadline.")
    nccl_tests_dir: str | None = Field(
        None, description="A directory with nccl-tests binaries (all_reduce_perf, ...): run those instead.")
    topology_dump: bool = Field(True, description="Keep the topology NCCL chose (NCCL_TOPO_DUMP_FILE) in the record.")
    detail: bool = Field(
        False, description="Opt-in: the algorithm bandwidth and the time per operation as series beside the bus "
        "bandwidth (fleetcanary_collective_algorithm_bandwidth_bytes_per_second, "
        "fleetcanary_collective_latency_seconds: 24 series at the default collectives and sizes). Off: both in the "
        "run record's figures only.")
