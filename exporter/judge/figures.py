"""The judged figures: which probe figures the node keeps and computes statistics for.

One row per figure. ``series`` names the labels that, with the GPU, identify one measured thing
(they become the ``series`` label, joined with "/"), so every judged series has the same label set
and the fleet's rules compare every figure with the same few expressions. A figure's peers are the
series with the same ``figure`` and ``series`` labels on nodes of the same pool, model and driver.

``fold`` turns a matrix into a per-GPU figure: the GPU peer-to-peer bandwidth is judged as each
source GPU's slowest link (one bad link moves it; 8 series per node, not 56). The pair matrix itself
stays in the raw metric for the dashboards.

This table is the only declaration of a judged figure. The fleet's rules (alerts/build.py) read from it the
figure's name, direction, alert stem, change-path floor and MADs, history floor and whether the fast path
judges it; the probe map (fleetcanary.probes) gives its probe's interval. The floors here are the shipped
defaults: a deployer overrides them once, in the rule settings (fleetcanary.core.rulesettings, the `alerts`
section of the exporter's config), and both the exporter (a quiet series' threshold, ``configured``) and the
rule generator read that. The metrics the daemon confirms after a jump are the fast figures' (``confirm_metrics``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetcanary.core.rulesettings import RuleSettings

QUIET_SHARE = 0.2   # a series is quiet when its run noise is under this share of its figure's change floor


@dataclass(frozen=True)
class Figure:
    key: str                  # the `figure` label value
    title: str                # human words
    alert: str                # CamelCase stem of its alerts' names (FleetCanary<alert>BelowPeers, ...)
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
    floor: float = 0.05       # change path: at least this far from the peers' median change ...
    k_mad: float = 7          # ... and more than this many MADs of the peers' change ratios
    history_floor: float = 0.10  # regression and driver change: at least this far from its own best day
    quiet: bool = False       # a series of it may be quiet (its median of stats.QUIET_MEDIAN_RUNS)
    for_minutes: float = 0    # the `for` of its peer alerts (0: its probe's default interval, from the probe map)
    # run-to-run noise under which its median is stats.QUIET_MEDIAN_RUNS (0: never): QUIET_SHARE of the change
    # floor, derived (``None``) unless given
    quiet_noise: float | None = None

    def __post_init__(self) -> None:
        if self.quiet_noise is None:
            object.__setattr__(self, "quiet_noise", self.floor * QUIET_SHARE if self.quiet else 0.0)

    @property
    def per_driver(self) -> bool:
        """Its series are per GPU driver (GPU figures): a driver upgrade restarts them, and a driver-change path
        judges them against the previous driver's best day."""
        return self.model_field == "gpu_model"

    def worse(self, a: float, b: float) -> float:
        return min(a, b) if self.higher_is_better else max(a, b)

    def better(self, a: float, b: float) -> float:
        return max(a, b) if self.higher_is_better else min(a, b)


FIGURES: tuple[Figure, ...] = (
    # A 2.5% floor: the fleet's best-measured figure (H200 run noise 0.6%); 5% on its own history.
    Figure("gpu_memory_bandwidth", "GPU memory bandwidth", "GPUMemoryBandwidth", "gpu_bandwidth",
           "fleetcanary_gpu_memory_bandwidth_bytes_per_second", ("direction",), gpu="gpu", floor=0.025,
           history_floor=0.05, quiet=True),
    Figure("gpu_p2p_bandwidth", "GPU peer-to-peer bandwidth (slowest link)", "GPUP2PBandwidth",
           "gpu_p2p", "fleetcanary_gpu_p2p_bandwidth_bytes_per_second", (), gpu="src_gpu", fold="dst_gpu"),
    # One series per node every 30 minutes leaves its peers' spread wider: 6 MADs. The floor is the GPUs' 2.5%: the
    # gate decides on a noisy series (9-12% on a 1 MiB all-reduce of 3.8% run noise), the floor on a quiet one (a 1
    # GiB all-reduce of 0.8% on H200, where a 4% floor found 1 of 6 3% drops; issue 38).
    Figure("collective_bus_bandwidth", "collective bus bandwidth", "CollectiveBandwidth", "collectives",
           "fleetcanary_collective_bus_bandwidth_bytes_per_second", ("collective", "size_bytes", "ranks", "backend"),
           floor=0.025, k_mad=6, quiet=True),
    Figure("host_memory_bandwidth", "host memory bandwidth", "HostMemoryBandwidth", "host_memory_bandwidth",
           "fleetcanary_host_memory_bandwidth_bytes_per_second", ("op",), model_field="cpu_model"),
    Figure("storage_read", "storage read throughput", "StorageRead", "storage",
           "fleetcanary_storage_read_bytes_per_second", ("target", "cache"), model_field=""),
    Figure("storage_first_byte", "storage first-byte latency", "StorageFirstByte", "storage",
           "fleetcanary_storage_first_byte_seconds", ("target", "cache"), higher_is_better=False, model_field="",
           floor=0.10),
    Figure("gpu_matmul_throughput", "GPU matrix-multiply throughput", "GPUMatmulThroughput", "gpu_compute",
           "fleetcanary_gpu_matmul_flops_per_second", ("dtype",), gpu="gpu"),
    # The daily burn: the level path only (5 burns are 5 days); FleetCanaryGPUThrottlingUnlikePeers judges each.
    Figure("gpu_sustained_ratio", "GPU sustained-over-initial throughput", "GPUSustainedThroughput",
           "gpu_sustained", "fleetcanary_gpu_sustained_throughput_ratio", (), gpu="gpu", history=False, fast=False,
           median_runs=5, for_minutes=60),  # a burn a day: its level path waits an hour, not a day
    Figure("train_step_time", "training step time", "TrainStepTime", "train_step", "fleetcanary_train_step_seconds",
           ("dtype",), gpu="gpu", higher_is_better=False),
)
BY_KEY = {f.key: f for f in FIGURES}
BY_PROBE: dict[str, tuple[Figure, ...]] = {}
for _f in FIGURES:
    BY_PROBE[_f.probe] = (*BY_PROBE.get(_f.probe, ()), _f)

SeriesKey = tuple[str, str, str]  # (figure, series, gpu)


def confirm_metrics(probe: str) -> tuple[str, ...]:
    """The gauges of a probe whose jump gets confirmation runs (daemon/confirm.py): its fast-path figures' (the
    fast path reads the best of the newest 3 runs, and confirmation runs bring those within about one interval).
    Derived here, not declared by the probe."""
    return tuple(dict.fromkeys(f.metric for f in BY_PROBE.get(probe, ()) if f.fast))


def configured(settings: RuleSettings | None = None) -> dict[str, Figure]:
    """The figures by key with the deployer's floors of the rule settings (its `figures` section) over the
    declared ones: what the rules compare with, and what the judge derives a quiet series' threshold from."""
    if settings is None:
        return dict(BY_KEY)
    out = {}
    for key, fig in BY_KEY.items():
        over = settings.figures.get(key)
        given = over.model_dump(exclude_none=True, include={"floor", "k_mad", "history_floor"}) if over else {}
        out[key] = replace(fig, **given, quiet_noise=None) if given else fig
    return out


def extract(probe: str, samples: list[dict[str, Any]]) -> dict[SeriesKey, float]:
    """The judged values of one run's metric samples: {(figure, series, gpu): value}. Samples
    that are not finite, not positive or lack a label are left out; folded labels keep the worst."""
    out: dict[SeriesKey, float] = {}
    for fig in BY_PROBE.get(probe, ()):
        for s in samples:
            if s.get("metric") != fig.metric:
                continue
            key = key_of(fig, s.get("labels") or {})
            try:
                value = float(s["value"])
            except (KeyError, TypeError, ValueError):
                continue
            if key is None or not value > 0 or value == float("inf"):
                continue
            out[key] = fig.worse(out[key], value) if key in out else value
    return out


def key_of(fig: Figure, labels: dict[str, Any]) -> SeriesKey | None:
    """The judged series a sample of the figure's metric belongs to; None where a label is missing (or the
    sample is a folded matrix's diagonal)."""
    try:
        series = "/".join(str(labels[k]) for k in fig.series)
        gpu = str(labels[fig.gpu]) if fig.gpu else ""
    except KeyError:
        return None
    if fig.fold:
        if str(labels.get(fig.fold, "")) == gpu:
            return None
        series = series or "slowest_link"
    return (fig.key, series, gpu)


# metric -> the figure whose judged median stands in for its gauge once the series has one (the daemon's
# exposition; each run stays in /results): every figure but the daily burn, whose median is of 5 days where each
# day's burn is the figure on-call reads. A folded figure's gauge is stood in where it is already folded (the P2P
# figure's slowest link per source GPU, dst_gpu empty), not a matrix's cells (gpu_p2p's `pairs`), which say which
# link is slow where the judge keeps only the slowest.
STANDS_IN: dict[str, Figure] = {f.metric: f for f in FIGURES if not f.median_runs}


def stood_in_key(metric: str, labels: dict[str, Any]) -> SeriesKey | None:
    """The judged series whose median stands in for this sample of a probe's gauge once it has one; None where
    the sample stays (not a judged figure's gauge, a matrix's cell, a diagonal)."""
    fig = STANDS_IN.get(metric)
    if fig is None or (fig.fold and str(labels.get(fig.fold, ""))):
        return None
    return key_of(fig, labels)
