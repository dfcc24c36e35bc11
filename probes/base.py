"""The probe contract.

A probe is a class with a ``name``, a pydantic ``Config`` (extra="forbid", a default
for every field, the unit in the field name or its description), a static tuple of
``MetricSpec``, an optional ``exclusive`` class and ``run(config, ctx)``.

``run`` executes inside a short-lived worker process, never in the daemon. It
returns a ``ProbeResult``: samples for its declared metrics plus a record (figures
with their raw repeats, median and dispersion, the parameters, what it touched).
It never imports prometheus_client: the exporter renders.

Not applicable here -> raise ``ProbeSkipped(reason)`` with a reason from
``SKIP_REASONS``. Broken -> raise ``ProbeError(reason, detail)`` with a reason the
probe declares in ``failure_reasons``. Anything else is a crash.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from fleetcanary.probes.lib.stats import dispersion

# Why a probe did not run. Fixed and small: it becomes a label value.
SKIP_REASONS: tuple[str, ...] = (
    "no_gpu",            # no NVIDIA driver/GPU visible to this node
    "single_gpu",        # the probe needs two or more GPUs
    "not_configured",    # the probe has no targets configured
    "gpu_busy",          # a compute process or utilization over threshold on a target GPU
    "gpu_allocated",     # Kubernetes has allocated a target GPU to a pod
    "gpu_mps",           # an MPS server shares a target GPU (a tenant's MPS clients)
    "budget",            # the GPU-time budget over the probe's window (its interval, 1 h to 1 day) is spent
    "dependency_missing",  # an optional package (torch, or torch with CUDA on a GPU node) is not installed
    "low_disk_space",    # free space under the configured floor
    "unsupported",       # the hardware or platform lacks the feature (a CUDA torch that cannot start for another cause)
    "driver_too_old",    # the node's NVIDIA driver is older than the image's torch CUDA needs (docs/image.md)
    "peer_unavailable",  # a cross-node probe's partner of the slot did not meet it in time (absent, busy, late)
    "not_assigned",      # other nodes probe the targets (the inference canary's k probers per endpoint)
    "preempted",         # a scheduled claim pod (overlays/scheduled-runs) was preempted mid-run
)

# Failure reasons every probe may use in addition to its own ``failure_reasons``.
COMMON_FAILURE_REASONS: tuple[str, ...] = ("other",)

MetricType = Literal["gauge", "counter", "histogram"]


class ProbeSkipped(Exception):
    """The probe does not apply here now. ``reason`` is one of SKIP_REASONS."""

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in SKIP_REASONS:
            raise ValueError(f"unknown skip reason {reason!r}; use one of {SKIP_REASONS}")
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class ProbeError(Exception):
    """The probe ran and found something broken. ``reason`` is a bounded label value.

    ``result``: what the run did measure (per-target success gauges, failure counters,
    quality checks). It is published with the failure, so the evidence of what broke
    reaches the metrics; the run still counts as a failure."""

    def __init__(self, reason: str, detail: str = "", result: ProbeResult | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.result = result


class ProbeTimeout(ProbeError):
    """The probe's own bounded wait ran out (a collective timed out): the run ends as a
    ``timeout``, the same outcome as a deadline kill, with ``reason`` saying which wait."""


@dataclass(frozen=True)
class MetricSpec:
    """A metric a probe may emit. ``name`` is the full name, with the fleetcanary_ prefix."""

    name: str
    type: MetricType
    help: str
    unit: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    # counter only: the value is the device's own running total (ECC errors, NVLink
    # replays), set as read, rather than an increment added to the exporter's total.
    cumulative: bool = False
    # counter only: which of its series the exporter publishes at 0. None: all of them. Otherwise those
    # whose labels match one of these label sets (an alert reads them with increase(), which misses the
    # first event of a series born above 0), and every other series only while it is above 0: a device
    # counter that stays at 0 on a healthy node is not a series there.
    zero_published: tuple[tuple[tuple[str, str], ...], ...] | None = None
    # the probe's boolean param that publishes this family (opt-in detail, docs/metrics.md); "" always published
    opt_in: str = ""

    def __post_init__(self) -> None:
        if not self.name.startswith("fleetcanary_"):
            raise ValueError(f"metric {self.name} must start with fleetcanary_")
        if self.type == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name} must end with _total")
        if self.type == "histogram" and not self.buckets:
            raise ValueError(f"histogram {self.name} needs buckets")
        if self.zero_published is not None and self.type != "counter":
            raise ValueError(f"{self.name}: zero_published applies to counters")

    def published(self, labels: dict[str, str], value: float) -> bool:
        """Whether the exporter publishes this series of the metric at `value` (zero_published)."""
        if self.zero_published is None or value != 0:
            return True
        return any(all(labels.get(k) == v for k, v in match) for match in self.zero_published)


@dataclass
class Sample:
    """One value for a declared metric.

    gauge: the value replaces the previous one. counter: the value is an increment
    (or, for a ``cumulative`` spec, the device's running total). histogram: one observation.
    """

    metric: str
    labels: dict[str, str]
    value: float


@dataclass
class Figure:
    """A measured figure: raw repeats kept beside the reduced value."""

    name: str                  # e.g. "copy", "d2d", "all_reduce"
    unit: str                  # e.g. "bytes_per_second", "seconds"
    repeats: list[float]
    labels: dict[str, str] = field(default_factory=dict)
    higher_is_better: bool = True
    median: float = math.nan
    dispersion: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.repeats:
            self.dispersion = dispersion(self.repeats)
            self.median = self.dispersion["median"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "labels": dict(self.labels),
            "higher_is_better": self.higher_is_better,
            "median": self.median,
            "dispersion": self.dispersion,
            "repeats": list(self.repeats),
        }


@dataclass
class ProbeResult:
    samples: list[Sample] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    touched: dict[str, Any] = field(default_factory=dict)   # GPUs, paths, targets used
    gpu_seconds: dict[str, float] = field(default_factory=dict)  # gpu index -> seconds
    extra: dict[str, Any] = field(default_factory=dict)     # probe-specific record fields

    def to_dict(self) -> dict[str, Any]:
        return {
            "figures": [f.to_dict() for f in self.figures],
            "parameters": self.parameters,
            "touched": self.touched,
            "gpu_seconds": self.gpu_seconds,
            **({"extra": self.extra} if self.extra else {}),
        }


class ProbeConfig(BaseModel):
    """Base for every probe's Config: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class ProbeContext:
    """What the worker hands a probe besides its config."""

    node_name: str
    state_dir: str
    deadline_monotonic: float          # time.monotonic() value the run must end before
    gpu: dict[str, Any] = field(default_factory=dict)  # daemon-side GPU gating settings
    kube: dict[str, Any] = field(default_factory=dict)  # allocation facts, when known


class Probe:
    """Base class. Subclasses set the ClassVars and implement ``run``."""

    name: ClassVar[str]
    Config: ClassVar[type[ProbeConfig]] = ProbeConfig
    metrics: ClassVar[tuple[MetricSpec, ...]] = ()
    exclusive: ClassVar[str | None] = None      # "gpu": never overlaps another "gpu" probe
    # What a successful run of an invasive ("gpu") probe counts as measured, for the coverage figure
    # (fleetcanary_gpu_last_measured_timestamp_seconds): "gpu", each GPU it spent GPU time on; "node", the node.
    coverage: ClassVar[str] = "gpu"
    # True: the daemon starts runs on the wall clock's multiples of the interval, without jitter,
    # so the same probe on every node starts together (the fabric probe's pairs meet in a slot).
    slot_aligned: ClassVar[bool] = False
    failure_reasons: ClassVar[tuple[str, ...]] = ()
    # (Which gauges get confirmation runs after a jump is no part of a probe: the fast-path figures' gauges,
    # fleetcanary.judge.figures.confirm_metrics.)
    # optional: what produces each outcome or failure reason, for docs/metrics.md
    reason_docs: ClassVar[dict[str, str]] = {}
    # Defaults for the schedule, overridable in config.
    default_interval_seconds: ClassVar[float] = 300.0
    default_timeout_seconds: ClassVar[float] = 60.0
    default_enabled: ClassVar[bool] = True
    # A probe of targets its config lists (storage, object storage, inference): with none it is off in all but
    # name (each run skips not_configured, in /results) and publishes no fleetcanary_probe_* series.
    needs_targets: ClassVar[bool] = False

    def run(self, config: ProbeConfig, ctx: ProbeContext) -> ProbeResult:  # pragma: no cover
        raise TypeError(f"{type(self).__name__} must implement run()")

    @classmethod
    def configured(cls, config: ProbeConfig) -> bool:
        """Whether the probe has something to measure (needs_targets: a target)."""
        return not cls.needs_targets or bool(config.targets)

    @classmethod
    def spec(cls, metric: str) -> MetricSpec:
        for s in cls.metrics:
            if s.name == metric:
                return s
        raise KeyError(f"{cls.name} declares no metric {metric}")

    @classmethod
    def all_failure_reasons(cls) -> tuple[str, ...]:
        return tuple(cls.failure_reasons) + COMMON_FAILURE_REASONS


def figure_sample(fig: Figure, metric: str, labels: dict[str, str] | None = None) -> Sample:
    """The gauge sample a figure publishes: its median."""
    return Sample(metric, dict(labels if labels is not None else fig.labels), fig.median)
