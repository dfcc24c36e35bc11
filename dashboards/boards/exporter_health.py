"""Exporter health: the canary's own cost and failures."""
from dashboards.common import RATE, dashboard, node_var, panel, pool_var, query_var

J = 'job=~"$job", node=~"$node"'
N = 'node=~"$node"'

panels = [
    panel("timeseries", "Exporters up",
          "1 per exporter Prometheus scrapes successfully. Good: every node at 1; "
          "FleetCanaryExporterDown fires when one is missing.", "none",
          [(f"up{{{J}}}", "{{node}}")], w=8),
    panel("timeseries", "Scrape duration",
          "How long Prometheus takes to scrape each exporter. Good: a few milliseconds; /metrics serves bytes "
          "rendered when a result arrives, so a scrape never waits for a probe.", "s",
          [(f"scrape_duration_seconds{{{J}}}", "{{node}}")], w=8),
    panel("timeseries", "Probe durations (slowest node)",
          "Wall time of each probe's last run on the slowest node. Good: well under the probe's deadline.", "s",
          [(f"max by (probe) (fleetcanary_probe_duration_seconds{{{N}}})", "{{probe}}")], w=8),
    panel("timeseries", "Failures, timeouts and crashes (per hour)",
          "Probe runs that ended in failure, timeout (deadline reached; the worker's process group was killed) "
          "or crash (killed by a signal, out of memory, or a garbled result). Good: zero.", "none",
          [(f"sum by (probe, outcome) "
            f'(increase(fleetcanary_probe_runs_total{{{N}, outcome=~"failure|timeout|crash"}}[1h]))',
            "{{probe}} {{outcome}}")], w=12),
    panel("timeseries", "Config reloads",
          "Reloads (SIGHUP) in the last hour by result, and whether the last one succeeded. Good: no failures; "
          "a failed reload keeps the old config and sets last_reload_successful to 0.", "none",
          [(f"sum by (result) (increase(fleetcanary_config_reloads_total{{{N}}}[1h]))", "reloads {{result}}"),
           (f"min(fleetcanary_config_last_reload_successful{{{N}}})", "last reload successful (min)")], w=12),
    panel("timeseries", "Resident memory",
          "The exporter's RSS (probes run in separate worker processes and are not counted). Good: flat, around "
          "45-55 MiB; growth over days is a leak.", "bytes",
          [(f"process_resident_memory_bytes{{{J}}}", "{{node}}")], w=8),
    panel("timeseries", "CPU used by the exporter",
          "CPU seconds per second of the exporter process itself. Good: well under 0.01 (1% of a core).",
          "percentunit", [(f"rate(process_cpu_seconds_total{{{J}}}[{RATE}])", "{{node}}")], w=8),
    panel("timeseries", "Open file descriptors",
          "Descriptors the exporter holds. Good: flat; a climb is a leak.", "none",
          [(f"process_open_fds{{{J}}}", "{{node}}")], w=8),
    panel("timeseries", "History and figure store errors, invalid samples (per hour)",
          "Result records that could not be written to the history file, figure store writes that failed (the "
          "figures stay in memory, lost at the next restart) and store lines that did not parse at start (a torn "
          "write at a power cut: skipped), all in the state directory; and samples a probe returned outside its "
          "declared metrics. Good: zero; write errors are a full or read-only state directory.", "none",
          [(f"sum by (node) (increase(fleetcanary_history_write_errors_total{{{N}}}[1h]))", "{{node}} history"),
           (f"sum by (node, kind) (increase(fleetcanary_judge_store_errors_total{{{N}}}[1h]))",
            "{{node}} figure store {{kind}}"),
           # invalid samples appear once there is one: 0 for each enabled probe until then
           (f"sum by (node, probe) (increase(fleetcanary_probe_invalid_samples_total{{{N}}}[1h])) "
            f"or sum by (node, probe) (0 * fleetcanary_probe_interval_seconds{{{N}}})",
            "{{node}} {{probe}} invalid")], w=12),
    panel("timeseries", "Figure store size",
          "Size of each node's figure store (STATE_DIR/judge/figures.jsonl): every judged figure of the last 15 "
          "days, from which the node computes its medians, baselines and drift. It must survive exporter "
          "restarts: on a state directory that does not (an emptyDir), every pod restart starts the node's "
          "statistics again from nothing. Good: growing for 15 days after a node starts, then flat (about 3 MiB "
          "for an 8-GPU node at the default intervals); a drop to near zero is a lost state directory (a "
          "reimaged node or a new pod): no baseline there for a day or more.", "bytes",
          [(f"fleetcanary_judge_store_bytes{{{J}}}", "{{node}}")], w=12),
    panel("timeseries", "Confirmation runs (share of runs, per hour)",
          "Extra runs the exporter started 5 minutes apart after a run whose figure jumped 5% (or 3 times its "
          "own run noise) or more from its last 3 runs, up to 3 while they still see the jump, so the judge's "
          "median turns within about one interval (docs/alerting.md). Good: a few percent (junk runs and real "
          "drops), up to about 15% on heavy-tailed 8-GPU figures; a probe near 100% has a figure too noisy for "
          "its confirm_change.", "percentunit",
          # a probe's confirmation counter appears with its first confirmation: 0 until then
          [(f"(sum by (probe) (increase(fleetcanary_probe_confirmation_runs_total{{{N}}}[1h])) "
            f"or 0 * sum by (probe) (increase(fleetcanary_probe_runs_total{{{N}}}[1h]))) / sum by (probe) "
            f"(increase(fleetcanary_probe_runs_total{{{N}}}[1h]))", "{{probe}}")], w=12),
]

dashboard = dashboard(
    "fleetcanary / Exporter health", "fleetcanary-exporter",
    "The canary's own health: scrapes, probe durations, failures, reloads, memory and CPU.",
    panels, [query_var("job", "Job", "label_values(fleetcanary_build_info, job)"), pool_var(), node_var(multi=True)])
