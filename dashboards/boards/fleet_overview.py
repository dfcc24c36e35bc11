"""Fleet overview: the worst judged series against their peers and their own history, the peer groups, probe
health and firing alerts."""
from dashboards.common import (
    FIGURES,
    S,
    change_ratio,
    columns,
    dashboard,
    in_pool,
    instant,
    level_ratio,
    model_var,
    own,
    panel,
    pct,
    per_figure,
    pool_var,
    query_var,
    rules,
    sel,
    shortfall,
    spread,
)

GPU = 'model=~"$model", pool=~"$pool"'
RUNS_OK = 'increase(fleetcanary_probe_runs_total{outcome="success"}[1h])'
RUNS_RAN = 'increase(fleetcanary_probe_runs_total{outcome!="skipped"}[1h])'
J = ('pool=~"$pool"', 'figure=~"$figure"')
# Nodes with a GPU of another model than the chosen ones are left out (nodes without GPUs stay).
OTHER_MODELS = 'unless on(node) node:fleetcanary_gpu_model:info{model!~"$model"}'
CUR, PREV = 'baseline="current_driver"', 'baseline="previous_driver"'
STATES = 'fleetcanary_judge_series{figure=~"$figure"}'
WORST = columns({"Value": "worse by"})
COVERAGE = rules.rules_coverage  # the coverage expressions the rules use
FIRING = 'ALERTS{alertstate="firing", alertname=~"FleetCanary.*"}'
# when each firing alert became active: ALERTS_FOR_STATE carries the alert's labels without alertstate
FIRING_SINCE = f'(ALERTS_FOR_STATE{{alertname=~"FleetCanary.*"}} and ignoring(alertstate) {FIRING})'

PEERS = ("Peers: the nodes of the same pool, model and driver version measuring the same figure and series "
         "(docs/alerting.md). Worse by: how far the series is on the bad side of the reference, 0.05 = 5% "
         "(below for bandwidths and FLOP/s, above for latencies and step times); the worst 5 per figure. ")


def worst(ratio, *m: str) -> str:
    return f"topk by (figure) (5, ({shortfall(ratio, *J, *m)}) {OTHER_MODELS})"


panels = [
    panel("table", "Worst series against their peers' change (alert path change)", PEERS +
          "Each series' change against its own best day on its driver (fleetcanary_judge_change, the confirmed "
          "figure over the best daily median of the last 14 days) over the median change of its peers with the "
          "same baseline: baseline=current_driver, or baseline=previous_driver for two weeks after a driver "
          "upgrade, judged against the nodes upgraded the same way. A GPU's own offset cancels here. "
          f"Good: every value under its figure's floor ({per_figure('floor')}); ...BelowPeers / "
          "...SlowerThanPeers path=change fires above the floor and 7 MADs of the peers' change ratios (6 for "
          f"collective bus bandwidth) with {S.min_peers}+ peer nodes.", "percentunit",
          [instant(worst(change_ratio))], w=12, h=9, transformations=[WORST]),
    panel("table", "Worst series against their peers' level (alert path level)", PEERS +
          "Each series' median of its newest 5 runs (fleetcanary_judge_median) over the median of its peers' "
          "medians: judges series without a baseline (a new or reimaged node, the first day on a new driver) "
          f"and GPUs that were always slow. Good: every value under {pct(S.level_floor)}; path=level fires "
          f"above {pct(S.level_floor)} and {S.level_k_mad:g} MADs of the peers' level ratios.", "percentunit",
          [instant(worst(lambda *m: level_ratio("median", *m)))], w=12, h=9, transformations=[WORST]),
    panel("table", "Newest runs far from their peers (alert path fast)", PEERS +
          "The best of each series' newest 3 runs (fleetcanary_judge_newest: low only when all three are, held "
          "low while the median of 7 is) over "
          f"the peers' median level. Good: every value under {pct(S.fast_floor)}; the critical ...FarBelowPeers"
          f" / ...FarSlowerThanPeers fires above {pct(S.fast_floor)} and {S.level_k_mad:g} MADs at once.",
          "percentunit", [instant(worst(lambda *m: level_ratio("newest", *m)))], w=8, h=9, transformations=[WORST]),
    panel("table", "Worst series against their own best day (regression, driver change)",
          "Each series' change against its own best day, worse by (0.05 = 5% below its best day; above, for "
          "latencies and step times), the worst 5 per figure; baseline=current_driver is ...Regression, "
          "baseline=previous_driver ...DropAfterDriverChange (two weeks after an upgrade). A fault the GPU keeps "
          "stays here: the best day is never a day of the fault. Good: every value under "
          f"{per_figure('history_floor')}. An upgrade that cost every GPU alike shows on every upgraded node "
          "(see the cohort panel).", "percentunit",
          [instant(worst(own("change")))], w=8, h=9, transformations=[WORST]),
    panel("table", "Worst series: drift (the last day against the best day)",
          "The median of each series' runs of the last 24 h over its best day on the current driver "
          "(fleetcanary_judge_drift), worse by; the worst 5 per figure. A slow ramp shows here before the 5-run "
          f"figure's noise lets the other paths see it. Good: every value under {pct(S.drift_floor)}; ...Drift "
          f"fires above {pct(S.drift_floor)} for an hour.", "percentunit",
          [instant(worst(own("drift")))], w=8, h=9, transformations=[WORST]),
    panel("table", "Judged series by state",
          "Series each node judges, summed by figure and state: warming (fewer than 5 runs on the driver now "
          "running: no median, no peer verdict), smoothed (a median, no baseline yet: the level and fast paths "
          "judge it), baselined (a change against its own best day: every path), stale (no run for a day: "
          "nothing published). A reimaged node is warming for 5 runs and smoothed until it has a complete day "
          "(3 runs over 6 h); a driver upgrade starts both again. Good: nearly every series baselined.", "none",
          [instant(f"sum by (figure, state) ({in_pool(STATES)})")],
          w=8, h=9, transformations=[columns({"Value": "series"})]),
    panel("table", "Peer groups: nodes reporting",
          "The fewest nodes reporting a median in any series of a peer group (pool, model, driver version, "
          "figure), smallest first. A rolling driver upgrade splits a pool into two groups by driver. Good: "
          f"{S.min_peers} or more everywhere; below, no peer path judges that group and the own-history paths "
          "(own_fast, regression, drift, driver change) are all that is left.", "none",
          [instant(f"sort(min by (pool, model, driver_version, figure) "
                   f"({spread('pool:fleetcanary_judge_median:peer_nodes' + sel(*J))}))")],
          w=8, h=9, transformations=[columns({"Value": "nodes"})]),
    panel("table", "Peer groups: spread of their ratios (MAD)",
          "The widest median absolute deviation of the peers' level ratios (A) and change ratios (B, "
          "current driver) in each peer group, over its series. The alerts gate at 5 MADs (level, fast) and 7 "
          "(change): a group whose spread times that exceeds the floor has its gate raised by its own noise. "
          f"Good: level MAD under {pct(S.level_floor / S.level_k_mad)}, change MAD under about "
          f"{pct(FIGURES['gpu_memory_bandwidth'].floor / FIGURES['gpu_memory_bandwidth'].k_mad)} for GPU memory "
          "bandwidth and a fraction of a percent elsewhere.", "percentunit",
          [instant("max by (pool, model, driver_version, figure) "
                   f"({spread('pool:fleetcanary_judge_median:peer_mad' + sel(*J))})",
                   ref="A"),
           instant("max by (pool, model, driver_version, figure) "
                   f"({spread('pool:fleetcanary_judge_change:peer_mad' + sel(*J, CUR))})", ref="B")],
          w=8, h=9, transformations=[{"id": "merge", "options": {}},
                                     columns({"Value #A": "level MAD", "Value #B": "change MAD"})]),
    panel("timeseries", "Driver upgrades: each cohort's change against its previous driver",
          "For the two weeks after a driver upgrade, the median over its series of the upgraded cohort's median "
          "change against the best day on the previous driver (pool:fleetcanary_judge_change:peer_median, "
          "baseline=previous_driver), per pool, model, figure and upgrade. This is the driver's own effect, "
          "common to the cohort: the per-GPU alerts cancel it (path change) and only "
          "...DropAfterDriverChange sees it, per GPU, when it passes that figure's history floor. "
          "Good: near 1 (above for the latencies means slower); no line at all when no node changed its "
          "driver in two weeks.", "percentunit",
          [("quantile by (pool, model, driver_version, baseline_driver, figure) (0.5, "
            f"pool:fleetcanary_judge_change:peer_median{sel(*J, PREV)})",
            "{{figure}} {{pool}} {{model}} {{baseline_driver}} to {{driver_version}}")], w=12, h=9),
    panel("table", "Worst GPUs: sustained over initial throughput (last burn)",
          "Throughput at the end of the daily sustained burn over its throughput at the start, per GPU: "
          "1 is no slowdown under load. Healthy GPUs that reach their power cap drop alike, so compare with "
          "the same model. Good: every GPU near its peers; one well below throttles (fan, thermal contact, "
          "power brake), FleetCanaryGPUSustainedThroughputBelowPeers.", "percentunit",
          [instant("bottomk(10, fleetcanary_gpu_sustained_throughput_ratio "
                   "* on(node) group_left(model) node:fleetcanary_gpu_model:info{model=~\"$model\"} "
                   "* on(node) group_left(pool) node:fleetcanary_pool:info{pool=~\"$pool\"})")], w=8),
    panel("table", "Most throttled GPUs: slowdown share of the burn",
          "Share of the last sustained burn each GPU spent in a thermal, power-brake or hardware slowdown "
          "(the power cap is left out). Good: 0 on every GPU; FleetCanaryGPUThrottlingUnlikePeers fires above 5% "
          "while the peer median stays under 1%.", "percentunit",
          [instant("topk(10, fleetcanary_gpu_sustained_slowdown_ratio * on(node) group_left(model) "
                   "node:fleetcanary_gpu_model:info{model=~\"$model\"} "
                   "* on(node) group_left(pool) node:fleetcanary_pool:info{pool=~\"$pool\"})")], w=8),
    panel("table", "Wrong results: SDC canary verdicts and training-loss checks",
          "GPUs per silent-data-corruption verdict (match, mismatch = a wrong checksum against the golden "
          "its model's GPUs agreed on, no_consensus, unjudged), and training-step loss checks failing per dtype. "
          "Good: every GPU in match and 0 failing loss checks; any mismatch is critical "
          "(FleetCanaryGPUWrongResult): drain the GPU.", "none",
          [instant(f'sum by (status) ({in_pool("fleetcanary_gpu_sdc_status")})', ref="A"),
           instant(f'sum by (dtype) ({in_pool("1 - fleetcanary_train_step_loss_check_pass")})', ref="B")], w=8),
    panel("table", "RDMA ports down or below their rate, per node",
          "Per node: RDMA ports not ACTIVE/LinkUp (A) and up ports trained below their expected rate (B), "
          "worst first. Good: 0 and 0; unused ports of dual-port HCAs count as down here but do not alert "
          "(FleetCanaryRDMAPortDown needs the port expected or up in the last day).", "none",
          [instant(f'topk(10, sum by (node) ({in_pool("1 - fleetcanary_rdma_port_up")}))', ref="A"),
           instant(f'topk(10, sum by (node) ({in_pool("fleetcanary_rdma_port_rate_below_expected")}))', ref="B")],
          w=8),
    panel("table", "Worst fabric nodes: share of distinct partners slow (last hour)",
          "The fabric probe meets a different partner every slot. For each node: the share of the distinct "
          "partners it met in the last hour whose pair bandwidth was below 70% of the pool's reference, with the "
          "number of partners measured. Good: 0 everywhere; one bad link shows as 1 of N on two nodes; a node "
          "slow with most partners (at least 3 measured) is the culprit (FleetCanaryFabricNodeSlow).",
          "percentunit",
          [instant('topk(10, node:fleetcanary_fabric_partners_slow:ratio1h '
                   '* on(node) group_left(pool) node:fleetcanary_pool:info{pool=~"$pool"})', ref="A"),
           instant('node:fleetcanary_fabric_partners_measured:count1h '
                   '* on(node) group_left(pool) node:fleetcanary_pool:info{pool=~"$pool"}', ref="B")], w=12),
    panel("table", "Slowest canaries: TTFT p95 against the pool",
          "Each node's p95 time to first token over the last 30 minutes to each endpoint, over the median of the "
          "pool's nodes calling the same endpoint and model (higher is worse). Good: every ratio below 1.1; "
          "FleetCanaryInferenceTTFTSlowerThanPeers is meant to fire above it for 30 minutes.", "percentunit",
          [instant('topk(10, (node:fleetcanary_inference_ttft_seconds:p95_30m * on(node) group_left(pool) '
                   'node:fleetcanary_pool:info{pool=~"$pool"}) / on(pool, target, model) group_left '
                   'pool:fleetcanary_inference_ttft_seconds:peer_median_p95_30m)')], w=12),
    panel("stat", "Nodes reporting", "Exporters Prometheus scrapes in the pool. Good: the number of GPU nodes "
          "you run; a drop means exporters down (FleetCanaryExporterDown).", "none",
          [f'count({in_pool("fleetcanary_build_info")})'], w=4, h=6),
    panel("timeseries", "Run success ratio per probe (last hour)",
          "Successful runs over runs that were not skipped, over all nodes in the pool. "
          "Good: 1.0 for every probe; a dip names the probe to open in Exporter health.", "percentunit",
          [(f"sum by (probe) ({in_pool(RUNS_OK)}) / sum by (probe) ({in_pool(RUNS_RAN)})", "{{probe}}")], w=10, h=6),
    panel("timeseries", "Staleness: intervals since last success (worst node)",
          "Time since each probe last succeeded, in units of its interval, on the worst node. "
          "Good: below 2; FleetCanaryProbeStale fires when a probe has not succeeded for several intervals.",
          "none",
          [("max by (probe) (" + in_pool("(time() - fleetcanary_probe_last_success_timestamp_seconds)"
                                         " / fleetcanary_probe_interval_seconds") + ")",
            "{{probe}}")], w=10, h=6),
    panel("timeseries", "Coverage: share of the pool's GPUs measured in the last day",
          "Of each pool's (GPU, invasive probe) pairs, the share a successful run measured in the last day (a daily "
          "probe: in its last 2 intervals), from each node's fleetcanary_gpu_last_measured_timestamp_seconds "
          "(pool:fleetcanary_gpu_measured:ratio_1d). GPUs held by tenants, busy or out of GPU-time budget skip, "
          "and the peer and history alerts cannot judge what was not measured. Good: near 1 on an idle pool; on "
          "a busy pool, the share you accept going unjudged (the free GPUs of a partly held node are measured "
          "with deploy/overlays/gpu-allocation).", "percentunit",
          [('pool:fleetcanary_gpu_measured:ratio_1d{pool=~"$pool"}', "{{pool}}")], w=12, h=8),
    panel("table", f"Coverage per probe: GPUs measured in their last {S.coverage_intervals} intervals",
          "Per pool and invasive probe, the share of GPUs with a successful run in the probe's last "
          f"{S.coverage_intervals} intervals, what FleetCanaryPoolUnmeasured (warning) fires on below "
          f"{S.coverage_min_share:.0%}. Good: near 1; a low probe beside 'Skips by reason' says why.",
          "percentunit",
          [instant(COVERAGE.share(COVERAGE.intervals(S.coverage_intervals), "pool, probe", 'pool=~"$pool"'))],
          w=12, h=8),
    panel("table", "Firing fleetcanary alerts: which node, since when, how bad",
          "Every fleetcanary alert firing now, one row each: its node, GPU, figure and series, the path that "
          "fired, its severity, since when it has been active (ALERTS_FOR_STATE) and, for a judged series, how "
          "far its change against its own best day is below its peers' median change (0.05 = 5% worse; the "
          "change path fires beyond the figure's floor and "
          f"{FIGURES['gpu_memory_bandwidth'].k_mad:g} MADs). A node opens its dashboard. Good: empty. "
          "Each alert's runbook is linked from its runbook_url.", "none",
          [instant(f'{FIRING_SINCE} * 1000', ref="A"),
           instant(f"({shortfall(change_ratio, J[0])}) and on(node, gpu, figure, series) {FIRING}", ref="B")],
          w=24, h=8, transformations=[{"id": "merge", "options": {}},
                                     columns({"Value #A": "firing since", "Value #B": "worse than peers by"},
                                             hide=("Time", "job", "instance", "__name__", "alertstate"))],
          overrides=[{"matcher": {"id": "byName", "options": "firing since"},
                      "properties": [{"id": "unit", "value": "dateTimeAsIso"}]},
                     {"matcher": {"id": "byName", "options": "worse than peers by"},
                      "properties": [{"id": "unit", "value": "percentunit"}]}]),
    panel("table", "Skips by reason (last hour)",
          "Probe runs that did not run, by reason: gpu_busy and gpu_allocated are the canary keeping out of "
          "jobs' way; no_gpu, driver_unavailable or budget_exhausted on a GPU node need a look; "
          "peer_unavailable is a fabric partner that missed its meeting (many on one node: "
          "FleetCanaryFabricNodeUnreachable). "
          "Good: only the job-protection reasons.", "none",
          [instant(f'sum by (probe, reason) ({in_pool("increase(fleetcanary_probe_skips_total[1h])")}) > 0')],
          w=12, h=8),
]

dashboard = dashboard(
    "fleetcanary / Fleet overview", "fleetcanary-fleet",
    "The fleet against itself: the worst judged series per figure against their peers and their own best day "
    "(the statistics each node publishes, the peer groups' medians), the peer groups, probe health, alerts and "
    "skips.",
    panels, [pool_var(), model_var(), query_var("figure", "Figure", "label_values(fleetcanary_judge_series, figure)")])
