"""Coverage: how much of each pool the invasive GPU probes actually measured. alerts/build.py puts these in
their own group, "fleetcanary-coverage", evaluated as often as the peer groups (coverage moves once per run).

Each node publishes, per GPU and enabled invasive probe, when a successful run last measured that GPU
(fleetcanary_gpu_last_measured_timestamp_seconds; 0 for never). A GPU held by a tenant, busy, or out of GPU-time
budget skips, and its peer and history alerts go quiet for want of runs; these rules say so:

- pool:fleetcanary_gpu_measured:ratio_1d, the share of a pool's (GPU, probe) pairs measured in the last day
  (a probe whose interval is longer than half a day: in its last 2 intervals). The dashboards' coverage panels
  and the busy-share table in docs/detection.md read it.
- FleetCanaryPoolUnmeasured (warning, not a page): in a pool, fewer than `coverage_min_share` of the GPUs had a
  fresh run of a probe in its last `coverage_intervals` intervals. Nothing is broken on a node, so no node is
  named; the description gives the skip reasons that kept the probe off the pool's GPUs.
"""
from __future__ import annotations

from fleetcanary.core.rulesettings import RuleSettings
from fleetcanary.rules.common import Group, Shard, alert, record

COVERED = "fleetcanary_gpu_last_measured_timestamp_seconds"
POOL = "on(node) group_left(pool) node:fleetcanary_pool:info"
DAY = 86400


def measured(window: str, pool: str = "") -> str:
    """1 for each (GPU, probe) series whose last fresh run is within `window` seconds (an expression over the
    probe's fleetcanary_probe_interval_seconds), else 0; each with its node's pool (`pool`: a matcher on it)."""
    return f"((time() - {COVERED}) < bool on(node, probe) group_left() ({window})) * {POOL}{pool and '{' + pool + '}'}"


def share(window: str, by: str, pool: str = "") -> str:
    """The share of (GPU, probe) pairs measured within `window`, by `by` (the recording rule, the alert, the
    dashboards' coverage panel): the mean of the 0-or-1 `measured`, one pass over the GPUs' series. Every
    series of the numerator has its probe's interval (the node publishes both for the same enabled probes), so
    this is the sum over the count of the same series (the form before 42, which read them twice)."""
    return f"avg by ({by}) ({measured(window, pool)})"


def intervals(n: int) -> str:
    return f"{n} * fleetcanary_probe_interval_seconds"


def groups(s: RuleSettings, shards: list[Shard]) -> list[Group]:
    return [Group("rules", "fleetcanary-coverage", "interval", recording_rules()),
            Group("alerts", "fleetcanary-coverage-alerts", "interval",
                  alert_rules(s.coverage_min_share, s.coverage_intervals))]


def recording_rules() -> list[dict]:
    def rec(name, expr):
        return record(name, " ".join(expr.split()))

    return [
        rec("pool:fleetcanary_gpu_measured:ratio_1d",
            share(f"clamp_min({intervals(2)}, {DAY})", "pool")),
    ]


def alert_rules(min_share: float, n_intervals: int) -> list[dict]:
    """The alert (its summary and description)."""
    skips = ("sort_desc(sum by (reason) (increase(fleetcanary_probe_skips_total{probe='%s'}[1d]) "
             "* on(node) group_left(pool) node:fleetcanary_pool:info{pool='%s'}) > 0)")
    expr = f"{share(intervals(n_intervals), 'pool, probe')} < {min_share:g}"
    return [alert(
        "FleetCanaryPoolUnmeasured", expr, "30m", {"severity": "warning"},
        "Most of a pool's GPUs went unmeasured by a probe",
        f"In pool {{{{ $labels.pool }}}}, {{{{ $value | humanizePercentage }}}} of the GPUs had a successful "
        f"{{{{ $labels.probe }}}} run in its last {n_intervals} intervals (this alert: under "
        f"{min_share:.0%}); the peer and history alerts cannot judge the rest. Skips in the pool in the last "
        f"day, by reason: {{{{ range query (printf \"{skips}\" $labels.probe $labels.pool) }}}}"
        "{{ .Labels.reason }} {{ .Value | printf \"%.0f\" }}; {{ else }}none{{ end }}")]


# (what it means, first checks, likely causes): alerts/runbooks.py writes docs/runbooks.md from these
RUNBOOKS: dict[str, tuple[str, str, str]] = {
    "FleetCanaryPoolUnmeasured": (
        "Most of the pool's GPUs had no successful run of this probe for several of its intervals. Nothing is known "
        "to be wrong with them: they were not measured, so a slow GPU there would go unseen. A warning for the "
        "platform team, not a page.",
        "The description's skip reasons. `gpu_allocated`/`gpu_busy`/`gpu_mps`: tenants hold the GPUs (expected on a "
        "full pool; deploy/overlays/gpu-allocation lets the free GPUs of a partly held node be measured, and "
        "opportunistic runs use the gaps between jobs; on nodes held whole for days, "
        "deploy/overlays/scheduled-runs asks "
        "the scheduler for GPU time with a lowest-priority claim pod). `budget`: the GPU-time budget is spent "
        "(`gpu.budget_ratio`). `dependency_missing` on GPU nodes: the image has a CPU build of torch (run the CUDA "
        "image, docs/image.md); `driver_too_old`: the node's driver is older than the image's torch CUDA needs (the "
        "cuda image R580+, the cuda12 image R525+; FleetCanaryCUDAProbesDriverTooOld names the nodes and their "
        "driver); `unsupported`: torch's CUDA cannot start for another cause (the record's detail quotes torch). "
        "Other reasons, or none: the probe fails or does not run; see "
        "FleetCanaryProbeFailing and the exporter-health dashboard. Per GPU: "
        "`time() - fleetcanary_gpu_last_measured_timestamp_seconds{probe=\"...\"}`; the pool's share over time: "
        "`pool:fleetcanary_gpu_measured:ratio_1d` (fleet-overview dashboard, Coverage).",
        "A pool fully allocated for days (training runs), the node-wide fallback where the kubelet's pod-resources "
        "socket is not mounted (one GPU held blocks the node), a budget set too low, a probe failing on every node "
        "(a driver or image change)."),
}
