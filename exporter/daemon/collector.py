"""Render the daemon's state into the Prometheus text exposition, with prometheus_client.

Every metric the exporter itself defines is declared once below (name, type, help,
labels); the collector builds its families from those declarations and docs/metrics.md
lists them. Probe metrics come from the probes' own specs. A custom collector yields
the families from the state's snapshot (as client_python recommends for exporters: no
global registry, no multiprocess mode); called with the state's lock held, once per
result update.
"""
from __future__ import annotations

import platform
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily

from fleetcanary.core import statefile
from fleetcanary.core.environment import STABLE_FIELDS
from fleetcanary.core.record import CRASH_REASONS, SKIP_REASONS
from fleetcanary.core.version import git_commit, version
from fleetcanary.daemon import claim_inbox
from fleetcanary.daemon.kube import ERROR_REASONS, OPERATIONS
from fleetcanary.judge import figures as figmod
from fleetcanary.judge.exposition import METRICS as JUDGE_METRICS
from fleetcanary.judge.exposition import families as judge_families
from fleetcanary.judge.exposition import smoothed as judge_smoothed

SCHEDULED = "From the last scheduled run; a scrape never triggers a probe."
NODE_EXTRA_LABELS = ("pool", "node_name", "gpu_product", "instance_type", "zone")


@dataclass(frozen=True)
class ExporterMetric:
    """One metric the exporter defines. ``name`` is the exposed name (counters with _total,
    info gauges with _info)."""

    name: str
    type: str          # gauge, counter or info
    help: str
    labels: tuple[str, ...] = ()

    def family(self, value: float | None = None):
        if self.type == "counter":
            return CounterMetricFamily(self.name.removesuffix("_total"), self.help, value=value,
                                       labels=None if value is not None else list(self.labels))
        if self.type == "info":
            return InfoMetricFamily(self.name.removesuffix("_info"), self.help)
        return GaugeMetricFamily(self.name, self.help, value=value,
                                 labels=None if value is not None else list(self.labels))


def _m(name: str, mtype: str, help_text: str, labels: tuple[str, ...] = ()) -> ExporterMetric:
    return ExporterMetric(name, mtype, help_text, labels)


PROBE_SUCCESS = _m("fleetcanary_probe_success", "gauge",
                   "1 if the probe's last run that was not skipped succeeded, 0 if it failed, timed out or crashed; "
                   "a skip is no verdict (absent until a run was not skipped; skips: fleetcanary_probe_runs_total "
                   f"outcome=\"skipped\" and fleetcanary_probe_skips_total). {SCHEDULED}", ("probe",))
PROBE_DURATION = _m("fleetcanary_probe_duration_seconds", "gauge",
                    "Wall time of the probe's last run that was not skipped, worker start to end. "
                    f"{SCHEDULED}", ("probe",))
PROBE_LAST_SUCCESS = _m("fleetcanary_probe_last_success_timestamp_seconds", "gauge",
                        "Unix time the probe last finished a successful run.", ("probe",))
PROBE_RUNS = _m("fleetcanary_probe_runs_total", "counter",
                "Probe runs by outcome: success, failure and skipped from 0, timeout and crash once they happen.",
                ("probe", "outcome"))
PROBE_SKIPS = _m("fleetcanary_probe_skips_total", "counter", "Skipped probe runs by reason.", ("probe", "reason"))
PROBE_FAILURES = _m("fleetcanary_probe_failures_total", "counter",
                    "Failed probe runs by the probe's failure reason.", ("probe", "reason"))
PROBE_CRASHES = _m("fleetcanary_probe_crashes_total", "counter",
                   "Crashed probe runs by reason: " + ", ".join(CRASH_REASONS) + ".", ("probe", "reason"))
PROBE_INTERVAL = _m("fleetcanary_probe_interval_seconds", "gauge",
                    "The probe's configured interval, one series per enabled probe (a probe that is off, or a "
                    "target probe with no target, publishes no fleetcanary_probe_* series); staleness and coverage "
                    "rules use it.", ("probe",))
PROBE_CONFIRMATIONS = _m("fleetcanary_probe_confirmation_runs_total", "counter",
                         "Extra runs started a few minutes apart after a run in which a figure the alerts' fast path "
                         "judges jumped, while they confirm it (confirm_change, confirm_runs); counted in runs_total "
                         "too. Probes with such figures only, once above 0.", ("probe",))
PROBE_INVALID = _m("fleetcanary_probe_invalid_samples_total", "counter",
                   "Samples a probe returned that its metric specs do not declare; dropped. Once above 0.", ("probe",))
GPU_LAST_MEASURED = _m("fleetcanary_gpu_last_measured_timestamp_seconds", "gauge",
                       "Coverage: unix time a successful run of the invasive probe last measured the GPU (0: not "
                       "since the state directory began); time() minus it is how long the GPU has gone unmeasured. "
                       "One series per GPU and enabled invasive probe; gpu empty for a probe measured per node "
                       "(train_step, fabric).", ("gpu", "probe"))
GPU_PROBE_SECONDS = _m("fleetcanary_gpu_probe_seconds_total", "counter",
                       "GPU time spent by invasive probes, per GPU, seconds.", ("gpu",))
CONFIG_RELOAD_OK = _m("fleetcanary_config_last_reload_successful", "gauge",
                      "1 if the last config load or reload succeeded; 0 keeps the previous config running.")
CONFIG_RELOAD_TS = _m("fleetcanary_config_last_reload_success_timestamp_seconds", "gauge",
                      "Unix time of the last successful config load.")
CONFIG_RELOADS = _m("fleetcanary_config_reloads_total", "counter", "Config reloads by result (success, failure).",
                    ("result",))
HISTORY_ERRORS = _m("fleetcanary_history_write_errors_total", "counter",
                    "Result records that could not be appended to the history file.")
CLOCK_JUMPS = _m("fleetcanary_clock_jumps_total", "counter",
                 "Wall-clock steps of 5 s or more seen against the monotonic clock; every probe is planned again "
                 "after one.")
STATE_ERRORS = _m("fleetcanary_state_errors_total", "counter",
                   "State files (gpu-budget.json, coverage.json, phase.json, judge/figures.jsonl, results.jsonl; "
                   "inbox: the claim inbox's records) and their entries or lines set aside, by file and kind: "
                   + ", ".join(statefile.KINDS) + " (future: stamped past the clock, a stepped clock). The daemon "
                   "starts without them; a series appears once it happened.", ("file", "kind"))
BUILD_INFO = _m("fleetcanary_build_info", "info", "Build identity; value 1.", ("version", "commit", "python_version"))
NODE_INFO = _m("fleetcanary_node_info", "info",
               "The stable part of this node's environment record; value 1. The node label comes from relabeling; "
               "gpu_product, instance_type and zone come from the Kubernetes node's labels (empty elsewhere).",
               STABLE_FIELDS + NODE_EXTRA_LABELS)
KUBE_ERRORS = _m("fleetcanary_kubernetes_api_errors_total", "counter",
                 "Kubernetes API calls that failed, by operation (read_node, list_pods, patch_node_status) and reason; "
                 "the last known state stays in force.", ("operation", "reason"))
CLAIM_REJECTED = _m("fleetcanary_claim_records_rejected_total", "counter",
                    "Records in the claim inbox that were refused and moved aside (inbox/quarantine) instead of "
                    "published, by reason: not_a_file, too_large, unreadable, not_json, too_deep, malformed, "
                    "unknown_probe, not_asked, wrong_node, bad_time, bad_gpu_seconds, too_many_series, error. "
                    "A reason appears once it has happened.", ("reason",))
KUBE_LAST_SYNC = _m("fleetcanary_kubernetes_last_sync_timestamp_seconds", "gauge",
                    "Unix time node labels and pods were last read successfully.")
KUBE_GPUS_REQUESTED = _m("fleetcanary_kubernetes_gpus_requested", "gauge",
                         "GPU devices held by pods on this node at the last sync: requested as extended resources "
                         "(kubernetes.gpu_resource_names: nvidia.com/gpu, gpu.shared, mig-*) plus those allocated to "
                         "their ResourceClaims by a GPU DRA driver; above 0 and without the kubelet's per-GPU view, "
                         "invasive GPU probes skip (gpu_allocated) unless the policy is ignore.")
KUBE_CONDITION = _m("fleetcanary_kubernetes_node_condition_healthy", "gauge",
                    "1 if the node condition was last set True, 0 if False.", ("type",))
GPU_HEALTH = _m("fleetcanary_gpu_health_state", "gauge",
                "The GPU's health as this node decides it from gpu_health's reads and the XIDs it saw (daemon/"
                "hard_faults.py): one series per GPU, value 1, labelled with its current state (failed, degraded, "
                "unmeasured, healthy) and the worst reason that applies (lost, hardware_xid, "
                "application_xid_repeated, uncorrectable_ecc, row_remap_failed, nvlink_down, fabric_not_ready, "
                "pcie_degraded, row_remap_pending, xid_warning, no_recent_run; empty while healthy). A fault holds "
                "until kubernetes.node_condition.clear_after_observations clean runs and min_hold_seconds.",
                ("gpu", "state", "reason"))
NODE_HEALTH = _m("fleetcanary_node_health_state", "gauge",
                 "The node's summary of fleetcanary_gpu_health_state: value 1, labelled with its worst GPU's state "
                 "and reason (gpus_missing: fewer GPUs than expected; no_recent_run: gpu_health has not succeeded "
                 "for 3 intervals). One series.", ("state", "reason"))
HTTP_REFUSED = _m("fleetcanary_http_connections_refused_total", "counter",
                  "HTTP connections refused (503 and closed from the accept loop) or cut, by reason: capacity (every "
                  "slot taken, none waiting for a request), per_client (the address held its share), cut (the "
                  "connection that had waited longest for its request's headers, for a new one). Once above 0.",
                  ("reason",))
HTTP_ERRORS = _m("fleetcanary_http_connection_errors_total", "counter",
                 "HTTP connections that ended in an error, by reason: reset (the client reset or closed it "
                 "mid-request), timeout (its request or its reading of the answer outlived the deadline), internal (a "
                 "fault of the server's, logged as one line). Once above 0.", ("reason",))
CONFIRM_REQUESTS = _m("fleetcanary_confirm_requests_total", "counter",
                      "POST /confirm requests (server.confirm_requests), by outcome: accepted (a run scheduled), "
                      "unauthorized, rate_limited, bad_request, too_large. Once above 0.", ("outcome",))

# Reason series that alert or recording rules read with increase(): published at 0 from the start, since
# increase() over a series born at 1 misses that first event. Every other reason appears once its count
# is above 0. (kind, probe, reason); tests/daemon/test_collector.py checks the rules read no other.
DECLARED_AT_ZERO: frozenset[tuple[str, str, str]] = frozenset({
    ("skips", "fabric", "peer_unavailable"),        # fabric's partner-availability recording rules
    ("failures", "collectives", "wrong_result"),    # FleetCanaryCollectiveWrongResult
})

# Outcomes of fleetcanary_probe_runs_total published from 0 for an enabled probe: the rules and dashboards
# read them with increase() (FleetCanaryProbeStale's skipped, the success ratio, fabric's partner ratio).
# timeout and crash appear once they happen; FleetCanaryProbeFailing sums failure, timeout and crash.
RUNS_FROM_ZERO = ("success", "failure", "skipped")

# Every exporter metric, in exposition order; docs/metrics.md lists them.
EXPORTER_METRICS: tuple[ExporterMetric, ...] = (
    *(v for v in globals().values() if isinstance(v, ExporterMetric)),
    *(ExporterMetric(*m) for m in JUDGE_METRICS),  # the node's statistics (fleetcanary.judge)
)


class _StateCollector:
    def __init__(self, store) -> None:
        self.store = store

    def collect(self):
        s = self.store
        probes = list(s.probes)
        success, dur, last_ok = (m.family() for m in (PROBE_SUCCESS, PROBE_DURATION, PROBE_LAST_SUCCESS))
        runs, skips, fails, crashes = (m.family() for m in (PROBE_RUNS, PROBE_SKIPS, PROBE_FAILURES, PROBE_CRASHES))
        interval, invalid = (m.family() for m in (PROBE_INTERVAL, PROBE_INVALID))
        confirmations = PROBE_CONFIRMATIONS.family()
        for name in probes:
            st = s.state[name]
            cls = s.probes[name]
            if name not in s.enabled:
                continue  # a probe that is off: nothing (~10 series each)
            if name in s.intervals:
                interval.add_metric([name], s.intervals[name])
            for outcome, n in st.runs.items():
                if n or outcome in RUNS_FROM_ZERO:
                    runs.add_metric([name, outcome], n)
            # A reason appears once it has happened (a zero for every probe and reason is ~300 series a node),
            # but for those the rules read with increase(), declared at 0 so that they see the first one.
            for fam, kind, reasons, counts in ((skips, "skips", SKIP_REASONS, st.skips),
                                               (fails, "failures", cls.all_failure_reasons(), st.failures),
                                               (crashes, "crashes", CRASH_REASONS, st.crashes)):
                for reason in reasons:
                    if counts.get(reason, 0) or (kind, name, reason) in DECLARED_AT_ZERO:
                        fam.add_metric([name, reason], counts.get(reason, 0))
            if st.invalid_samples:
                invalid.add_metric([name], st.invalid_samples)
            if st.confirmations:  # once there is one: a share of runs_total, no rule reads it
                confirmations.add_metric([name], st.confirmations)
            if st.verdict is not None:  # a skip is no verdict: the last run that measured or failed to
                success.add_metric([name], 1.0 if st.verdict.outcome == "success" else 0.0)
                dur.add_metric([name], st.verdict.wall_seconds)
            if st.last_success_ts is not None:
                last_ok.add_metric([name], st.last_success_ts)
        yield from (success, dur, last_ok, runs, skips, fails, crashes, interval, invalid, confirmations)

        # Probe families, from their declared specs; a judged figure's gauge until the judge has its median
        # (which stands in for it after; each run stays in /results).
        now = time.time()
        smoothed = set() if s.judge is None else judge_smoothed(s.judge, now, s.judge_hold)
        for name in probes:
            cls = s.probes[name]
            st = s.state[name]
            for spec in cls.metrics:
                help_text = f"{spec.help} {SCHEDULED}" if spec.type == "gauge" else spec.help
                if spec.type == "gauge":
                    fam = GaugeMetricFamily(spec.name, help_text, labels=list(spec.labels))
                    for key, v in st.gauges.get(spec.name, {}).items():
                        if not smoothed or figmod.stood_in_key(spec.name, dict(key)) not in smoothed:
                            fam.add_metric([v2 for _, v2 in key], v)
                elif spec.type == "counter":
                    fam = CounterMetricFamily(spec.name.removesuffix("_total"), help_text, labels=list(spec.labels))
                    for key, v in s.counters.get(spec.name, {}).items():
                        if spec.published(dict(key), v):  # zero_published: some series only while above 0
                            fam.add_metric([v2 for _, v2 in key], v)
                else:
                    fam = HistogramMetricFamily(spec.name, help_text, labels=list(spec.labels))
                    for key, h in s.histograms.get(spec.name, {}).items():
                        buckets = [(repr(float(b)), c) for b, c in zip(h.buckets, h.counts, strict=True)]
                        buckets.append(("+Inf", h.count))
                        fam.add_metric([v2 for _, v2 in key], buckets, h.total)
                yield fam

        gpu = GPU_PROBE_SECONDS.family()
        for g, secs in sorted(s.gpu_seconds.items()):
            gpu.add_metric([g], secs)
        yield gpu
        covered = GPU_LAST_MEASURED.family()
        for g, probe, ts in s.coverage():
            covered.add_metric([g, probe], ts)
        yield covered
        yield CONFIG_RELOAD_OK.family(s.config_reload_ok)
        yield CONFIG_RELOAD_TS.family(s.config_reload_ts)
        # the exporter's own error counters, as the probes' reason labels: a series once above 0 (no rule reads
        # them; a healthy node has none, docs/metrics.md "What is left out while it is 0")
        reloads = CONFIG_RELOADS.family()
        for result, n in s.config_reloads.items():
            if n:
                reloads.add_metric([result], n)
        yield reloads
        yield HISTORY_ERRORS.family(s.history_write_errors or None)
        rejected = CLAIM_REJECTED.family()
        for reason, n in sorted(claim_inbox.REJECTED.snapshot().items()):
            rejected.add_metric([reason], n)
        yield rejected
        yield CLOCK_JUMPS.family(s.clock_jumps or None)
        state_errors = STATE_ERRORS.family()
        for (file, kind), n in sorted(statefile.ERRORS.snapshot().items()):
            state_errors.add_metric([file, kind], n)
        yield state_errors
        build = BUILD_INFO.family()
        build.add_metric([], {"version": version(), "commit": git_commit(),
                              "python_version": platform.python_version()})
        yield build
        node = NODE_INFO.family()
        node.add_metric([], s.node_labels())
        yield node
        gpu_health = GPU_HEALTH.family()
        for g, (state, reason) in sorted(s.health_gpus.items(), key=lambda kv: (len(kv[0]), kv[0])):
            gpu_health.add_metric([g, state, reason], 1)
        yield gpu_health
        node_health = NODE_HEALTH.family()
        if s.health_node is not None:
            node_health.add_metric(list(s.health_node), 1)
        yield node_health
        if s.judge is not None:
            yield from judge_families(s.judge, s.node_labels(), now, s.judge_hold, s.judge_fresh)
        if s.kube is not None:
            yield from _kube_families(s.kube, s.kube_condition_type)


def _kube_families(k, condition_type: str):
    errors = KUBE_ERRORS.family()
    for op in OPERATIONS:
        for reason in ERROR_REASONS:
            if k.errors.get((op, reason), 0):  # once it has happened; no rule reads these
                errors.add_metric([op, reason], k.errors[(op, reason)])
    yield errors
    if k.last_success is not None:
        yield KUBE_LAST_SYNC.family(k.last_success)
    if k.gpus_requested is not None:
        yield KUBE_GPUS_REQUESTED.family(k.gpus_requested)
    if k.condition_status is not None:
        cond = KUBE_CONDITION.family()
        cond.add_metric([condition_type], 1 if k.condition_status == "True" else 0)
        yield cond


def render(store) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_StateCollector(store))
    return generate_latest(reg)
