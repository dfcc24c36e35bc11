"""Render the store into the Prometheus text exposition, with prometheus_client.

A custom collector yields metric families from the store's snapshot (as
client_python recommends for exporters: no global registry, no multiprocess mode).
Called with the store's lock held, once per result update.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily

import platform

from probes.base import SKIP_REASONS

from .environment import STABLE_FIELDS
from .isolation import CRASH_REASONS
from .version import git_commit, version

SCHEDULED = "From the last scheduled run; a scrape never triggers a probe."
NODE_EXTRA_LABELS = ("pool", "node_name", "gpu_product", "instance_type", "zone")

# Metrics the exporter itself defines (name, type, help); docs/metrics.md lists them.
EXPORTER_METRICS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("fleetcanary_probe_success", "gauge", f"1 if the probe's last run succeeded, else 0. {SCHEDULED}", ("probe",)),
    ("fleetcanary_probe_duration_seconds", "gauge", f"Wall time of the probe's last run, worker start to end. {SCHEDULED}", ("probe",)),
    ("fleetcanary_probe_last_run_timestamp_seconds", "gauge", "Unix time the probe last finished a run, whatever its outcome.", ("probe",)),
    ("fleetcanary_probe_last_success_timestamp_seconds", "gauge", "Unix time the probe last finished a successful run.", ("probe",)),
    ("fleetcanary_probe_runs_total", "counter", "Probe runs by outcome: success, failure, timeout, crash, skipped.", ("probe", "outcome")),
    ("fleetcanary_probe_skips_total", "counter", "Skipped probe runs by reason.", ("probe", "reason")),
    ("fleetcanary_probe_failures_total", "counter", "Failed probe runs by the probe's failure reason.", ("probe", "reason")),
    ("fleetcanary_probe_crashes_total", "counter", "Crashed probe runs by reason: exception, killed_by_signal, "
     "oom_killed, exit_nonzero, bad_result, result_too_large, spawn_failed.", ("probe", "reason")),
    ("fleetcanary_probe_enabled", "gauge", "1 if the probe is enabled in the running config.", ("probe",)),
    ("fleetcanary_probe_interval_seconds", "gauge", "The probe's configured interval; staleness alerts use it.", ("probe",)),
    ("fleetcanary_probe_invalid_samples_total", "counter", "Samples a probe returned that its metric specs do not declare; dropped.", ("probe",)),
    ("fleetcanary_gpu_probe_seconds_total", "counter", "GPU time spent by invasive probes, per GPU, seconds.", ("gpu",)),
    ("fleetcanary_config_last_reload_successful", "gauge", "1 if the last config load or reload succeeded; 0 keeps the previous config running.", ()),
    ("fleetcanary_config_last_reload_success_timestamp_seconds", "gauge", "Unix time of the last successful config load.", ()),
    ("fleetcanary_config_reloads_total", "counter", "Config reloads by result (success, failure).", ("result",)),
    ("fleetcanary_history_write_errors_total", "counter", "Result records that could not be appended to the history file.", ()),
    ("fleetcanary_clock_jumps_total", "counter", "Wall-clock steps of 5 s or more seen against the monotonic clock; "
     "every probe is planned again after one.", ()),
    ("fleetcanary_start_time_seconds", "gauge", "Unix time the exporter started.", ()),
    ("fleetcanary_build_info", "gauge", "Build identity; value 1.", ("version", "commit", "python_version")),
    ("fleetcanary_node_info", "gauge", "The stable part of this node's environment record; value 1. The node label comes from "
     "relabeling; gpu_product, instance_type and zone come from the Kubernetes node's labels (empty elsewhere).",
     STABLE_FIELDS + NODE_EXTRA_LABELS),
    ("fleetcanary_kubernetes_api_errors_total", "counter", "Kubernetes API calls that failed, by operation (read_node, "
     "list_pods, patch_node_status) and reason; the last known state stays in force.", ("operation", "reason")),
    ("fleetcanary_kubernetes_last_sync_timestamp_seconds", "gauge", "Unix time node labels and pods were last read "
     "successfully.", ()),
    ("fleetcanary_kubernetes_gpus_requested", "gauge", "nvidia.com/gpu requested by pods on this node at the last sync; "
     "above 0, invasive GPU probes skip (gpu_allocated) unless the policy is ignore.", ()),
    ("fleetcanary_kubernetes_node_condition_healthy", "gauge", "1 if the node condition was last set True, 0 if False.",
     ("type",)),
)


HELP = {name: help_text for name, _, help_text, _ in EXPORTER_METRICS}


class _StoreCollector:
    def __init__(self, store) -> None:
        self.store = store

    def collect(self):
        s = self.store
        probes = list(s.probes)
        success = GaugeMetricFamily("fleetcanary_probe_success", HELP["fleetcanary_probe_success"], labels=["probe"])
        dur = GaugeMetricFamily("fleetcanary_probe_duration_seconds", HELP["fleetcanary_probe_duration_seconds"], labels=["probe"])
        last = GaugeMetricFamily("fleetcanary_probe_last_run_timestamp_seconds", HELP["fleetcanary_probe_last_run_timestamp_seconds"], labels=["probe"])
        last_ok = GaugeMetricFamily("fleetcanary_probe_last_success_timestamp_seconds", HELP["fleetcanary_probe_last_success_timestamp_seconds"], labels=["probe"])
        runs = CounterMetricFamily("fleetcanary_probe_runs", HELP["fleetcanary_probe_runs_total"], labels=["probe", "outcome"])
        skips = CounterMetricFamily("fleetcanary_probe_skips", HELP["fleetcanary_probe_skips_total"], labels=["probe", "reason"])
        fails = CounterMetricFamily("fleetcanary_probe_failures", HELP["fleetcanary_probe_failures_total"], labels=["probe", "reason"])
        crashes = CounterMetricFamily("fleetcanary_probe_crashes", HELP["fleetcanary_probe_crashes_total"], labels=["probe", "reason"])
        enabled = GaugeMetricFamily("fleetcanary_probe_enabled", HELP["fleetcanary_probe_enabled"], labels=["probe"])
        interval = GaugeMetricFamily("fleetcanary_probe_interval_seconds", HELP["fleetcanary_probe_interval_seconds"], labels=["probe"])
        invalid = CounterMetricFamily("fleetcanary_probe_invalid_samples", HELP["fleetcanary_probe_invalid_samples_total"], labels=["probe"])
        for name in probes:
            st = s.state[name]
            cls = s.probes[name]
            enabled.add_metric([name], 1.0 if name in s.enabled else 0.0)
            if name in s.intervals:
                interval.add_metric([name], s.intervals[name])
            for outcome, n in st.runs.items():
                runs.add_metric([name, outcome], n)
            # Pre-declare every reason at 0, so rate() and increase() see the first one.
            for reason in SKIP_REASONS:
                skips.add_metric([name, reason], st.skips.get(reason, 0))
            for reason in cls.all_failure_reasons():
                fails.add_metric([name, reason], st.failures.get(reason, 0))
            for reason in CRASH_REASONS:
                crashes.add_metric([name, reason], st.crashes.get(reason, 0))
            invalid.add_metric([name], st.invalid_samples)
            if st.last is not None:
                success.add_metric([name], 1.0 if st.last.outcome == "success" else 0.0)
                dur.add_metric([name], st.last.duration_seconds)
                last.add_metric([name], st.last_run_ts or 0.0)
            if st.last_success_ts is not None:
                last_ok.add_metric([name], st.last_success_ts)
        yield from (success, dur, last, last_ok, runs, skips, fails, crashes, enabled, interval, invalid)

        # Probe families, from their declared specs.
        for name in probes:
            cls = s.probes[name]
            st = s.state[name]
            for spec in cls.metrics:
                help_text = f"{spec.help} {SCHEDULED}" if spec.type == "gauge" else spec.help
                if spec.type == "gauge":
                    fam = GaugeMetricFamily(spec.name, help_text, labels=list(spec.labels))
                    for key, v in st.gauges.get(spec.name, {}).items():
                        fam.add_metric([v2 for _, v2 in key], v)
                elif spec.type == "counter":
                    fam = CounterMetricFamily(spec.name.removesuffix("_total"), help_text, labels=list(spec.labels))
                    for key, v in s.counters.get(spec.name, {}).items():
                        fam.add_metric([v2 for _, v2 in key], v)
                else:
                    fam = HistogramMetricFamily(spec.name, help_text, labels=list(spec.labels))
                    for key, h in s.histograms.get(spec.name, {}).items():
                        buckets = [(_fmt(b), c) for b, c in zip(h.buckets, h.counts)] + [("+Inf", h.count)]
                        fam.add_metric([v2 for _, v2 in key], buckets, h.total)
                yield fam

        gpu = CounterMetricFamily("fleetcanary_gpu_probe_seconds", HELP["fleetcanary_gpu_probe_seconds_total"], labels=["gpu"])
        for g, secs in sorted(s.gpu_seconds.items()):
            gpu.add_metric([g], secs)
        yield gpu
        yield GaugeMetricFamily("fleetcanary_config_last_reload_successful", HELP["fleetcanary_config_last_reload_successful"], value=s.config_reload_ok)
        yield GaugeMetricFamily("fleetcanary_config_last_reload_success_timestamp_seconds", HELP["fleetcanary_config_last_reload_success_timestamp_seconds"],
                                value=s.config_reload_ts)
        reloads = CounterMetricFamily("fleetcanary_config_reloads", HELP["fleetcanary_config_reloads_total"], labels=["result"])
        for result, n in s.config_reloads.items():
            reloads.add_metric([result], n)
        yield reloads
        yield CounterMetricFamily("fleetcanary_history_write_errors", HELP["fleetcanary_history_write_errors_total"], value=s.history_write_errors)
        yield CounterMetricFamily("fleetcanary_clock_jumps", HELP["fleetcanary_clock_jumps_total"], value=s.clock_jumps)
        yield GaugeMetricFamily("fleetcanary_start_time_seconds", HELP["fleetcanary_start_time_seconds"], value=s.start_time)
        build = InfoMetricFamily("fleetcanary_build", HELP["fleetcanary_build_info"])
        build.add_metric([], {"version": version(), "commit": git_commit(), "python_version": platform.python_version()})
        yield build
        node = InfoMetricFamily("fleetcanary_node", HELP["fleetcanary_node_info"])
        node.add_metric([], s.node_labels())
        yield node
        if s.kube is not None:
            yield from _kube_families(s.kube, s.kube_condition_type)


def _kube_families(k, condition_type: str):
    from .kube import ERROR_REASONS, OPERATIONS

    errors = CounterMetricFamily("fleetcanary_kubernetes_api_errors", HELP["fleetcanary_kubernetes_api_errors_total"],
                                 labels=["operation", "reason"])
    for op in OPERATIONS:
        for reason in ERROR_REASONS:
            errors.add_metric([op, reason], k.errors.get((op, reason), 0))
    yield errors
    if k.last_success is not None:
        yield GaugeMetricFamily("fleetcanary_kubernetes_last_sync_timestamp_seconds",
                                HELP["fleetcanary_kubernetes_last_sync_timestamp_seconds"], value=k.last_success)
    if k.gpus_requested is not None:
        yield GaugeMetricFamily("fleetcanary_kubernetes_gpus_requested", HELP["fleetcanary_kubernetes_gpus_requested"],
                                value=k.gpus_requested)
    if k.condition_status is not None:
        cond = GaugeMetricFamily("fleetcanary_kubernetes_node_condition_healthy",
                                 HELP["fleetcanary_kubernetes_node_condition_healthy"], labels=["type"])
        cond.add_metric([condition_type], 1 if k.condition_status == "True" else 0)
        yield cond


def _fmt(b: float) -> str:
    return repr(float(b))


def render(store) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_StoreCollector(store))
    return generate_latest(reg)
