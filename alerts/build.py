#!/usr/bin/env python3
"""Generate the recording and alert rules (alerts/fleetcanary.rules.yml and
alerts/fleetcanary.alerts.yml) from the family table below.

Rules are data: each probe family names its metric, the labels that identify one
measured thing, the labels its peers share, the smoothing window (at least 5 runs at
the default interval), its direction, and whether it gets self-history rules. The
same rule shapes then apply to every family. `python alerts/build.py` rewrites the
files; a test fails when they differ from what this generates.

Prometheus 2.42 (Debian bookworm): quantile, quantile_over_time, offset,
keep_firing_for (new in 2.42). Nothing experimental.

Thresholds (defaults): an outlier is at least 10% worse than its peer median AND more
than 5 median absolute deviations of the peers' ratios (about 3.4 sigma for normal
noise), with at least 5 peers; self-history: 10% below the median of the previous 3
days (10% above it for a lower-is-better family: the training step time), with no driver
change in that window.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import rules_fabric  # noqa: E402 - beside this script, as runbooks.py

RUNBOOK = "https://github.com/fleetcanary/fleetcanary/blob/main/docs/runbooks.md"
REL_DROP = 0.10
K_MAD = 5
MIN_PEERS = 5


@dataclass
class Family:
    key: str              # short name used in alert names and runbooks
    title: str            # human words
    metric: str           # raw metric or a recorded one
    level: str            # "gpu" or "node": the first part of recorded names
    entity: tuple[str, ...]   # labels identifying one measured thing (node is always among them)
    peers: tuple[str, ...]    # labels peers share besides model/pool
    window: str           # smoothing window holding >= 5 runs
    higher_is_better: bool
    join: str             # "gpu_model" (per GPU), "node_model" (per node), "cpu_model", or "pool"
    interval_minutes: int
    history: bool = False
    severity: str = "warning"
    alert: str = ""       # CamelCase stem of the alert name
    rel: float = REL_DROP  # the relative floor: at least this far from the peer median
    for_minutes: int = 0   # override the peer alert's `for` (default: 2 intervals, at least 15 minutes)

    @property
    def group(self) -> tuple[str, ...]:
        extra = {"gpu_model": ("model", "pool"), "node_model": ("model", "pool"), "cpu_model": ("cpu_model", "pool"),
                 "pool": ("pool",)}[self.join]
        return extra + self.peers

    @property
    def lvl_group(self) -> str:
        return "_".join(x for x in ("pool", "model" if "model" in self.group else "cpu_model"
                                    if "cpu_model" in self.group else "") if x)


FAMILIES = [
    # HBM copy bandwidth is very stable (CV 0.5-0.8% per run on an H200, docs/gpu-validation.md): a 4% floor
    # with the 5-MAD gate catches 5% degradations without false alerts (benchmarks/detection), where 10% could not.
    Family("gpu_memory_bandwidth", "GPU memory bandwidth", "fleetcanary_gpu_memory_bandwidth_bytes_per_second", "gpu",
           ("node", "gpu", "direction"), ("direction",), "75m", True, "gpu_model", 15, history=True,
           alert="GPUMemoryBandwidth", rel=0.04),
    Family("gpu_p2p_bandwidth", "GPU peer-to-peer bandwidth", "fleetcanary_gpu_p2p_bandwidth_bytes_per_second", "gpu",
           ("node", "src_gpu", "dst_gpu"), ("src_gpu", "dst_gpu"), "6h", True, "node_model", 60, alert="GPUP2PBandwidth"),
    Family("collective_bus_bandwidth", "collective bus bandwidth",
           "fleetcanary_collective_bus_bandwidth_bytes_per_second", "node",
           ("node", "collective", "size_bytes", "ranks", "backend"), ("collective", "size_bytes", "ranks", "backend"),
           "3h", True, "node_model", 30, history=True, alert="CollectiveBandwidth"),
    Family("host_memory_bandwidth", "host memory bandwidth", "fleetcanary_host_memory_bandwidth_bytes_per_second",
           "node", ("node", "op"), ("op",), "1h", True, "cpu_model", 10, history=True, alert="HostMemoryBandwidth"),
    Family("storage_read", "storage read throughput", "fleetcanary_storage_read_bytes_per_second", "node",
           ("node", "target", "cache"), ("target", "cache"), "3h", True, "pool", 30, history=True,
           alert="StorageRead"),
    Family("storage_first_byte", "storage first-byte latency", "fleetcanary_storage_first_byte_seconds", "node",
           ("node", "target", "cache"), ("target", "cache"), "3h", False, "pool", 30, alert="StorageFirstByte"),
    # Matmul throughput per GPU and dtype (gpu_compute, every 30 minutes): 6 runs in the window.
    Family("gpu_matmul_throughput", "GPU matrix-multiply throughput", "fleetcanary_gpu_matmul_flops_per_second", "gpu",
           ("node", "gpu", "dtype"), ("dtype",), "3h", True, "gpu_model", 30, history=True,
           alert="GPUMatmulThroughput"),
    # Sustained/initial throughput of the daily burn (gpu_sustained): a 3-day median holds 3 runs, the MAD gate
    # and the peer floor guard against a single odd burn; `for` is an hour, not two daily intervals. No
    # self-history: a 3-day smoothing needs a week of runs before a history ratio means anything.
    Family("gpu_sustained_ratio", "GPU sustained-over-initial throughput", "fleetcanary_gpu_sustained_throughput_ratio",
           "gpu", ("node", "gpu"), (), "3d", True, "gpu_model", 1440, alert="GPUSustainedThroughput", for_minutes=60),
    # Training-step time of the canary transformer (train_step, hourly): 5 runs in the window. Lower is
    # better, so its history alerts fire on a rise (ratio above 1 + rel) and name it RiseAfterDriverChange.
    Family("train_step_time", "training step time", "fleetcanary_train_step_seconds", "gpu",
           ("node", "gpu", "dtype"), ("dtype",), "5h", False, "gpu_model", 60, history=True, alert="TrainStepTime"),
    Family("inference_ttft", "inference time to first token (p95)", "node:fleetcanary_inference_ttft_seconds:p95_30m",
           "node", ("node", "target", "model"), ("target", "model"), "30m", False, "pool", 1,
           alert="InferenceTTFT"),
]


def rec(name: str, expr: str) -> dict:
    return {"record": name, "expr": " ".join(expr.split())}


def names(f: Family) -> dict[str, str]:
    base = f.metric.split(":")[1] if ":" in f.metric else f.metric
    g = "pool_model" if "model" in f.group else ("pool_cpu_model" if "cpu_model" in f.group else "pool")
    return {
        "smoothed": f"{f.level}:{base}:median{f.window}",
        "peer_median": f"{g}:{base}:peer_median",
        "ratio": f"{f.level}:{base}:peer_ratio",
        "mad": f"{g}:{base}:peer_ratio_mad",
        "count": f"{g}:{base}:peer_count",
        "history_ratio": f"{f.level}:{base}:history_ratio",
        "pre_change_ratio": f"{f.level}:{base}:pre_driver_change_ratio",
    }


def join_expr(f: Family, inner: str) -> str:
    if f.join == "gpu_model":
        return (f"{inner} * on(node, gpu) group_left(model) node_gpu:fleetcanary_gpu_model:info "
                f"* on(node) group_left(pool) node:fleetcanary_pool:info")
    if f.join == "node_model":
        return (f"{inner} * on(node) group_left(model) node:fleetcanary_gpu_model:info "
                f"* on(node) group_left(pool) node:fleetcanary_pool:info")
    if f.join == "cpu_model":
        return f"{inner} * on(node) group_left(cpu_model, pool) node:fleetcanary_cpu_model_pool:info"
    return f"{inner} * on(node) group_left(pool) node:fleetcanary_pool:info"


def family_rules(f: Family) -> list[dict]:
    n = names(f)
    g = ", ".join(f.group)
    raw = f.metric
    return [
        rec(n["smoothed"], join_expr(f, f"quantile_over_time(0.5, {raw}[{f.window}])")),
        rec(n["peer_median"], f"quantile by ({g}) (0.5, {n['smoothed']})"),
        rec(n["ratio"], f"{n['smoothed']} / on({g}) group_left() {n['peer_median']}"),
        rec(n["mad"], f"quantile by ({g}) (0.5, abs({n['ratio']} - 1))"),
        rec(n["count"], f"count by ({g}) ({n['smoothed']})"),
    ]


def history_rules(f: Family) -> list[dict]:
    n = names(f)
    ent = ", ".join(f.entity)
    return [
        rec(n["history_ratio"], f"{n['smoothed']} / ignoring(model, cpu_model, pool) "
            f"quantile_over_time(0.5, {f.metric}[3d] offset {f.window})"),
        rec(n["pre_change_ratio"], f"{n['smoothed']} / ignoring(model, cpu_model, pool) "
            f"quantile_over_time(0.5, {f.metric}[3d] offset 1d)"),
    ]


def inventory_rules() -> list[dict]:
    return [
        rec("node_gpu:fleetcanary_gpu_model:info", "max by (node, gpu, model) (fleetcanary_gpu_info)"),
        rec("node:fleetcanary_gpu_model:info", "max by (node, model) (fleetcanary_gpu_info)"),
        rec("node:fleetcanary_pool:info", "max by (node, pool) (fleetcanary_node_info)"),
        rec("node:fleetcanary_cpu_model_pool:info", "max by (node, cpu_model, pool) (fleetcanary_node_info)"),
        rec("node:fleetcanary_driver_versions:count1d",
            "count by (node) (count by (node, driver_version) (max_over_time(fleetcanary_node_info[1d])))"),
        rec("node:fleetcanary_driver_versions:count3d",
            "count by (node) (count by (node, driver_version) (max_over_time(fleetcanary_node_info[3d])))"),
        rec("node:fleetcanary_inference_ttft_seconds:p95_30m",
            "histogram_quantile(0.95, sum by (node, target, model, le) "
            "(rate(fleetcanary_inference_time_to_first_token_seconds_bucket[30m])))"),
        rec("node:fleetcanary_inference_itl_seconds:p95_30m",
            "histogram_quantile(0.95, sum by (node, target, model, le) "
            "(rate(fleetcanary_inference_inter_token_latency_seconds_bucket[30m])))"),
        rec("node:fleetcanary_inference_errors:ratio_rate15m",
            'sum by (node, target, model) (rate(fleetcanary_inference_requests_total{outcome!="success"}[15m])) '
            "/ sum by (node, target, model) (rate(fleetcanary_inference_requests_total[15m]))"),
        rec("gpu:fleetcanary_gpu_sustained_slowdown_ratio:by_model",
            "fleetcanary_gpu_sustained_slowdown_ratio * on(node, gpu) group_left(model) node_gpu:fleetcanary_gpu_model:info "
            "* on(node) group_left(pool) node:fleetcanary_pool:info"),
        rec("pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_median",
            "quantile by (model, pool) (0.5, gpu:fleetcanary_gpu_sustained_slowdown_ratio:by_model)"),
        rec("pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_count",
            "count by (model, pool) (gpu:fleetcanary_gpu_sustained_slowdown_ratio:by_model)"),
        rec("node:fleetcanary_gpu_probe_seconds:duty_cycle_1h",
            "sum by (node, gpu) (rate(fleetcanary_gpu_probe_seconds_total[1h]))"),
    ]


def annotations(summary: str, description: str, key: str) -> dict:
    return {"summary": summary, "description": description, "runbook_url": f"{RUNBOOK}#{key.lower()}"}


def peer_alert(f: Family) -> dict:
    n = names(f)
    g = ", ".join(f.group)
    if f.higher_is_better:
        cond = (f"((1 - {n['ratio']}) > on({g}) group_left() ({K_MAD} * {n['mad']})) "
                f"and ({n['ratio']} < {1 - f.rel:g}) and on({g}) ({n['count']} >= {MIN_PEERS})")
        words = "below"
        value = "{{ $value | humanizePercentage }} below"
    else:
        cond = (f"(({n['ratio']} - 1) > on({g}) group_left() ({K_MAD} * {n['mad']})) "
                f"and ({n['ratio']} > {1 + f.rel:g}) and on({g}) ({n['count']} >= {MIN_PEERS})")
        words = "slower than"
        value = "{{ $value | humanizePercentage }} slower than"
    name = f"FleetCanary{f.alert}BelowPeers" if f.higher_is_better else f"FleetCanary{f.alert}SlowerThanPeers"
    ent = ", ".join(f"{x} {{{{ $labels.{x} }}}}" for x in f.entity)
    for_m = f.for_minutes or (2 * f.interval_minutes if f.interval_minutes >= 10 else 15)
    return {"alert": name, "expr": " ".join(cond.split()), "for": f"{for_m}m", "keep_firing_for": f"{2 * for_m}m",
            "labels": {"severity": f.severity, "family": f.key},
            "annotations": annotations(f"{f.title} {words} its peers",
                                       f"{ent}: {value} the median of its peers ({', '.join(f.group)}); "
                                       f"at least {f.rel:.0%} and {K_MAD} MADs off, with {MIN_PEERS}+ peers.",
                                       name)}


def history_alerts(f: Family) -> list[dict]:
    """Against its own past: below 1 - rel of it (higher is better), or above 1 + rel (lower is better:
    a step time that rises)."""
    n = names(f)
    ent = ", ".join(f"{x} {{{{ $labels.{x} }}}}" for x in f.entity)
    reg = f"FleetCanary{f.alert}Regression"
    drv = f"FleetCanary{f.alert}{'Drop' if f.higher_is_better else 'Rise'}AfterDriverChange"
    worse = f"< {1 - f.rel:g}" if f.higher_is_better else f"> {1 + f.rel:g}"
    for_m = max(3 * f.interval_minutes, 30)
    return [
        {"alert": reg, "expr": f"({n['history_ratio']} {worse}) unless on(node) "
                               f"(node:fleetcanary_driver_versions:count3d > 1)",
         "for": f"{for_m}m", "keep_firing_for": f"{2 * for_m}m", "labels": {"severity": "warning", "family": f.key},
         "annotations": annotations(f"{f.title} {'below' if f.higher_is_better else 'above'} its own history",
                                    f"{ent}: {{{{ $value | humanizePercentage }}}} of its median over the previous "
                                    f"3 days (the driver did not change in that time).", reg)},
        {"alert": drv, "expr": f"({n['pre_change_ratio']} {worse}) and on(node) "
                               f"(node:fleetcanary_driver_versions:count1d > 1)",
         "for": f"{for_m}m", "keep_firing_for": f"{2 * for_m}m", "labels": {"severity": "warning", "family": f.key},
         "annotations": annotations(f"{f.title} {'dropped' if f.higher_is_better else 'rose'} after a driver change",
                                    f"{ent}: {{{{ $value | humanizePercentage }}}} of its median before the driver "
                                    f"changed on this node in the last day.", drv)},
    ]


def hard_alerts() -> list[dict]:
    def a(name, expr, for_, sev, summary, desc, keep=None):
        d = {"alert": name, "expr": " ".join(expr.split()), "for": for_, "labels": {"severity": sev},
             "annotations": annotations(summary, desc, name)}
        if keep:
            d["keep_firing_for"] = keep
        return d

    return [
        a("FleetCanaryProbeFailing",
          'sum by (node, probe) (increase(fleetcanary_probe_runs_total{outcome=~"failure|timeout|crash"}[1h])) >= 3',
          "10m", "warning", "A probe keeps failing",
          "Probe {{ $labels.probe }} on {{ $labels.node }} failed, timed out or crashed {{ $value | humanize }} times in the "
          "last hour."),
        a("FleetCanaryProbeStale",
          "((time() - fleetcanary_probe_last_success_timestamp_seconds) > 3 * fleetcanary_probe_interval_seconds) "
          "and on(node, probe) (fleetcanary_probe_enabled == 1) "
          'unless on(node, probe) (increase(fleetcanary_probe_runs_total{outcome="skipped"}[1h]) > 0)',
          "15m", "warning", "A probe has not succeeded for 3 intervals",
          "Probe {{ $labels.probe }} on {{ $labels.node }} last succeeded {{ $value | humanizeDuration }} ago and "
          "did not skip; its runs fail or do not happen."),
        a("FleetCanaryGPUsMissing", "fleetcanary_gpus_healthy < fleetcanary_gpus_expected", "5m", "critical",
          "Fewer GPUs than expected", "{{ $labels.node }} has {{ $value }} usable GPUs, fewer than it should."),
        a("FleetCanaryGPULost", "fleetcanary_gpu_lost == 1", "2m", "critical", "A GPU fell off the bus",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} is enumerated but cannot be queried (XID 79 class)."),
        a("FleetCanaryPCIeLinkWidthDegraded", "fleetcanary_gpu_pcie_link_width < fleetcanary_gpu_pcie_link_width_max",
          "15m", "warning", "A GPU's PCIe link is narrower than its maximum",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} runs its PCIe link at x{{ $value }}, below its maximum width."),
        a("FleetCanaryPCIeLinkGenerationDegraded",
          "(fleetcanary_gpu_pcie_link_generation < fleetcanary_gpu_pcie_link_generation_max) "
          'unless on(node, gpu) (fleetcanary_gpu_clock_throttle_active{reason="gpu_idle"} == 1)',
          "30m", "warning", "A busy GPU's PCIe link runs below its maximum generation",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} is at PCIe Gen{{ $value }} while not idle (idle GPUs "
          "lower the generation to save power; those are left out)."),
        a("FleetCanaryNVLinkDown", "fleetcanary_gpu_nvlink_up == 0", "5m", "critical", "An NVLink is down",
          "NVLink {{ $labels.link }} of GPU {{ $labels.gpu }} on {{ $labels.node }} is inactive."),
        a("FleetCanaryGPUCriticalXid", "increase(fleetcanary_gpu_xid_errors_total[15m]) > 0", "0m", "critical",
          "A GPU reported a critical XID", "GPU {{ $labels.gpu }} on {{ $labels.node }} reported XID "
          "{{ $labels.xid }}.", keep="1h"),
        a("FleetCanaryGPUUncorrectableECC",
          'increase(fleetcanary_gpu_ecc_errors_total{type="uncorrected", counter="volatile"}[1h]) > 0', "0m",
          "critical", "Uncorrectable ECC errors on a GPU",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} had {{ $value }} uncorrectable ECC errors in the last hour.",
          keep="1h"),
        a("FleetCanaryGPURowRemapPending", "fleetcanary_gpu_remapped_rows_pending == 1", "5m", "warning",
          "A GPU has a pending row remap", "GPU {{ $labels.gpu }} on {{ $labels.node }} needs a reset to apply a "
          "row remapping."),
        a("FleetCanaryGPURowRemapFailed", "fleetcanary_gpu_remapped_rows_failed == 1", "0m", "critical",
          "A GPU failed a row remap", "GPU {{ $labels.gpu }} on {{ $labels.node }} could not remap a row; it needs "
          "service."),
        a("FleetCanaryCollectiveWrongResult",
          'increase(fleetcanary_probe_failures_total{probe="collectives", reason="wrong_result"}[2h]) > 0', "0m",
          "critical", "A collective returned wrong data",
          "The collectives probe on {{ $labels.node }} found wrong elements in a collective's output.", keep="2h"),
        a("FleetCanaryGPUWrongResult", 'max by (node, gpu) (fleetcanary_gpu_sdc_status{status="mismatch"}) == 1',
          "0m", "critical", "A GPU computed a wrong result (silent data corruption)",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} produced a checksum for the deterministic canary products that "
          "differs from the golden its model's GPUs agreed on.", keep="2h"),
        a("FleetCanaryGPUSDCNoConsensus",
          'max by (node, gpu) (fleetcanary_gpu_sdc_status{status="no_consensus"}) == 1', "0m", "warning",
          "The SDC canary found no majority",
          "The GPUs of {{ $labels.node }} disagree on the canary checksum with no strict majority (or all disagree "
          "with the stored golden); GPU {{ $labels.gpu }} is one of them. Not judged; a person must.", keep="1h"),
        a("FleetCanaryGPUThrottlingUnlikePeers",
          f"(gpu:fleetcanary_gpu_sustained_slowdown_ratio:by_model > 0.05) "
          f"and on(model, pool) (pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_median < 0.01) "
          f"and on(model, pool) (pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_count >= {MIN_PEERS})",
          "10m", "critical", "A GPU throttles under load where its peers do not",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} spent {{ $value | humanizePercentage }} of its sustained burn "
          "in a thermal, power-brake or HW slowdown; the median of its peers (same model and pool) is under 1%."),
        a("FleetCanaryTrainStepLossWrong", "fleetcanary_train_step_loss_check_pass == 0", "0m", "critical",
          "The training-step canary's loss is off its golden",
          "The canary transformer trained on GPU {{ $labels.gpu }} of {{ $labels.node }} ({{ $labels.dtype }}) ended "
          "with a loss outside its tolerance of the golden value.", keep="1h"),
        a("FleetCanaryInferenceErrors", "node:fleetcanary_inference_errors:ratio_rate15m > 0.1", "15m", "warning",
          "Inference canary requests fail",
          "{{ $value | humanizePercentage }} of canary requests from {{ $labels.node }} to {{ $labels.target }} "
          "failed in the last 15 minutes."),
        a("FleetCanaryInferenceTTFTSLOBreach", "node:fleetcanary_inference_ttft_seconds:p95_30m > 2", "15m",
          "warning", "Inference TTFT p95 over its bound",
          "p95 TTFT from {{ $labels.node }} to {{ $labels.target }} is {{ $value | humanizeDuration }} (bound 2 s, "
          "MLPerf's server limit; change it in alerts/build.py)."),
        a("FleetCanaryInferenceITLSLOBreach", "node:fleetcanary_inference_itl_seconds:p95_30m > 0.2", "15m",
          "warning", "Inference ITL p95 over its bound",
          "p95 inter-token latency from {{ $labels.node }} to {{ $labels.target }} is {{ $value | humanizeDuration }} "
          "(bound 200 ms)."),
        a("FleetCanaryInferenceQualityFailing", "fleetcanary_inference_quality_pass == 0", "10m", "critical",
          "An inference endpoint answers a golden prompt wrongly",
          "Check {{ $labels.check }} fails against {{ $labels.target }} (seen from {{ $labels.node }})."),
        a("FleetCanaryInferenceOutputChanged", "fleetcanary_inference_output_stable == 0", "30m", "info",
          "Greedy output changed", "The temperature-0 output of {{ $labels.target }} differs from the first one seen "
          "for this model (a quantization, kernel or sampling change?)."),
        a("FleetCanaryExporterDown", 'up{job="fleetcanary"} == 0', "5m", "warning", "fleetcanary is not scraped",
          "Prometheus cannot scrape fleetcanary on {{ $labels.node }}."),
        a("FleetCanaryConfigReloadFailed", "fleetcanary_config_last_reload_successful == 0", "5m", "warning",
          "fleetcanary kept its old config", "The config reload on {{ $labels.node }} failed; the previous config "
          "keeps running."),
    ]


def build() -> tuple[dict, dict]:
    recording = {"groups": [{"name": "fleetcanary-inventory", "interval": "1m", "rules": inventory_rules()},
                            {"name": "fleetcanary-peers", "interval": "1m",
                             "rules": [r for f in FAMILIES for r in family_rules(f)]},
                            {"name": "fleetcanary-history", "interval": "15m",
                             "rules": [r for f in FAMILIES if f.history for r in history_rules(f)]},
                            {"name": "fleetcanary-fabric", "interval": "1m", "rules": rules_fabric.recording_rules()}]}
    alerts = {"groups": [{"name": "fleetcanary-hard-failures", "rules": hard_alerts()},
                         {"name": "fleetcanary-peer-outliers", "rules": [peer_alert(f) for f in FAMILIES]},
                         {"name": "fleetcanary-regressions",
                          "rules": [a for f in FAMILIES if f.history for a in history_alerts(f)]},
                         {"name": "fleetcanary-fabric-alerts", "rules": rules_fabric.alert_rules(RUNBOOK)}]}
    return recording, alerts


HEADER = "# Generated by alerts/build.py; do not edit. Change the family table there and rerun it.\n"


def runbooks_markdown() -> str:
    import runbooks as rb

    _, alerts = build()
    out = ["# Runbooks", "", "Generated by alerts/build.py from alerts/runbooks.py; do not edit. One section per "
           "alert: what it means, the first checks, the likely causes.", ""]
    by_family = {f.key: f for f in FAMILIES}
    for group in alerts["groups"]:
        for a in group["rules"]:
            name = a["alert"]
            fam = by_family.get(a["labels"].get("family", ""))
            if name in rb.HARD:
                meaning, checks, causes = rb.HARD[name]
            elif name in rules_fabric.RUNBOOKS:
                meaning, checks, causes = rules_fabric.RUNBOOKS[name]
            elif name.endswith(("DropAfterDriverChange", "RiseAfterDriverChange")):
                meaning, checks, causes = rb.driver_text(fam.title, fam.key, not fam.higher_is_better)
            elif name.endswith("Regression"):
                meaning, checks, causes = rb.regression_text(fam.title, fam.key, not fam.higher_is_better)
            else:
                meaning, checks, causes = rb.peer_text(fam.title, fam.key, not fam.higher_is_better)
            out += [f"## {name}", "", f"Severity: {a['labels']['severity']}. Fires after {a.get('for', '0m')}"
                    + (f", keeps firing for {a['keep_firing_for']} after it clears." if a.get("keep_firing_for")
                       else "."), "", f"**What it means.** {meaning}", "", f"**First checks.** {checks}", "",
                    f"**Likely causes.** {causes}", "", f"Expression: `{a['expr']}`", ""]
    return "\n".join(out)


def render() -> dict[str, str]:
    recording, alerts = build()
    dump = lambda d: HEADER + yaml.safe_dump(d, sort_keys=False, width=120)  # noqa: E731
    return {"fleetcanary.rules.yml": dump(recording), "fleetcanary.alerts.yml": dump(alerts),
            "../docs/runbooks.md": runbooks_markdown()}


def main() -> int:
    for name, text in render().items():
        (HERE / name).write_text(text)
        print(f"wrote alerts/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
