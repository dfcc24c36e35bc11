"""The judged figures: which probe figures the node keeps and computes statistics for.

One row per figure. ``series`` names the labels that, with the GPU, identify one measured thing
(they become the ``series`` label, joined with "/"), so every judged series has the same label set
and the fleet's rules compare every figure with the same few expressions. A figure's peers are the
series with the same ``figure`` and ``series`` labels on nodes of the same pool, model and driver.

``fold`` turns a matrix into a per-GPU figure: the GPU peer-to-peer bandwidth is judged as each
source GPU's slowest link (one bad link moves it; 8 series per node, not 56). The pair matrix itself
stays in the raw metric for the dashboards.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Figure:
    key: str                  # the `figure` label value
    title: str                # human words
    probe: str                # the probe that measures it
    metric: str               # the probe's gauge
    series: tuple[str, ...]   # labels that, with the GPU, identify one series (joined into `series`)
    gpu: str = ""             # the label holding the GPU index ("" for a node-level figure)
    higher_is_better: bool = True
    fold: str = ""            # a label folded away with the worst value (the P2P matrix: dst_gpu)
    model_field: str = "gpu_model"  # the environment field peers share ("" for none: storage)
    history: bool = True      # a baseline, change and drift (False for the daily burn)
    fast: bool = True         # the newest runs' best is published (the fleet's fast path reads it)
    median_runs: int = 0      # runs in its median (0: stats.MEDIAN_RUNS; the daily burn: 5 days)
    quiet_noise: float = 0.0  # run-to-run noise under which its median is stats.QUIET_MEDIAN_RUNS (0: never);
                              # a fifth of the change the fleet needs (alerts/build.py's floor)

    def worse(self, a: float, b: float) -> float:
        return min(a, b) if self.higher_is_better else max(a, b)

    def better(self, a: float, b: float) -> float:
        return max(a, b) if self.higher_is_better else min(a, b)


FIGURES: tuple[Figure, ...] = (
    Figure("gpu_memory_bandwidth", "GPU memory bandwidth", "gpu_bandwidth",
           "fleetcanary_gpu_memory_bandwidth_bytes_per_second", ("direction",), gpu="gpu", quiet_noise=0.005),
    Figure("gpu_p2p_bandwidth", "GPU peer-to-peer bandwidth (slowest link of the source GPU)", "gpu_p2p",
           "fleetcanary_gpu_p2p_bandwidth_bytes_per_second", (), gpu="src_gpu", fold="dst_gpu"),
    Figure("collective_bus_bandwidth", "collective bus bandwidth", "collectives",
           "fleetcanary_collective_bus_bandwidth_bytes_per_second", ("collective", "size_bytes", "ranks", "backend"),
           quiet_noise=0.008),
    Figure("host_memory_bandwidth", "host memory bandwidth", "host_memory_bandwidth",
           "fleetcanary_host_memory_bandwidth_bytes_per_second", ("op",), model_field="cpu_model"),
    Figure("storage_read", "storage read throughput", "storage", "fleetcanary_storage_read_bytes_per_second",
           ("target", "cache"), model_field=""),
    Figure("storage_first_byte", "storage first-byte latency", "storage", "fleetcanary_storage_first_byte_seconds",
           ("target", "cache"), higher_is_better=False, model_field=""),
    Figure("gpu_matmul_throughput", "GPU matrix-multiply throughput", "gpu_compute",
           "fleetcanary_gpu_matmul_flops_per_second", ("dtype",), gpu="gpu"),
    Figure("gpu_sustained_ratio", "GPU sustained-over-initial throughput", "gpu_sustained",
           "fleetcanary_gpu_sustained_throughput_ratio", (), gpu="gpu", history=False, fast=False,
           median_runs=5),
    Figure("train_step_time", "training step time", "train_step", "fleetcanary_train_step_seconds", ("dtype",),
           gpu="gpu", higher_is_better=False),
)
BY_KEY = {f.key: f for f in FIGURES}
BY_PROBE: dict[str, tuple[Figure, ...]] = {}
for _f in FIGURES:
    BY_PROBE[_f.probe] = (*BY_PROBE.get(_f.probe, ()), _f)

SeriesKey = tuple[str, str, str]  # (figure, series, gpu)


def extract(probe: str, samples: list[dict[str, Any]]) -> dict[SeriesKey, float]:
    """The judged values of one run's metric samples: {(figure, series, gpu): value}. Samples
    that are not finite, not positive or lack a label are left out; folded labels keep the worst."""
    out: dict[SeriesKey, float] = {}
    for fig in BY_PROBE.get(probe, ()):
        for s in samples:
            if s.get("metric") != fig.metric:
                continue
            labels = s.get("labels") or {}
            try:
                value = float(s["value"])
                series = "/".join(str(labels[k]) for k in fig.series)
                gpu = str(labels[fig.gpu]) if fig.gpu else ""
            except (KeyError, TypeError, ValueError):
                continue
            if not value > 0 or value == float("inf"):
                continue
            if fig.fold:
                if str(labels.get(fig.fold, "")) == gpu:
                    continue
                series = series or "slowest_link"
            key = (fig.key, series, gpu)
            out[key] = fig.worse(out[key], value) if key in out else value
    return out
