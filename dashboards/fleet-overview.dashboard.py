"""Fleet overview: the worst members per probe family, probe health and firing alerts."""
from common import dashboard, in_pool, instant, model_var, panel, pool_var

GPU = 'model=~"$model", pool=~"$pool"'
RUNS_OK = 'increase(fleetcanary_probe_runs_total{outcome="success"}[1h])'
RUNS_RAN = 'increase(fleetcanary_probe_runs_total{outcome!="skipped"}[1h])'
PEERS = ("The ratio of each member's smoothed value (median of its last runs) to the median of its peers: "
         "same model, same pool, same size or direction. ")

panels = [
    panel("table", "Worst GPUs: memory bandwidth vs peers", PEERS +
          "Good: every ratio above 0.96; alerts fire below 0.96 and 5 MADs.", "percentunit",
          [instant(f"bottomk(10, gpu:fleetcanary_gpu_memory_bandwidth_bytes_per_second:peer_ratio{{{GPU}}})")], w=8),
    panel("table", "Worst GPU pairs: P2P bandwidth vs peers", PEERS +
          "Good: every ratio above 0.9 (a pair well below is a degraded NVLink or PCIe path).", "percentunit",
          [instant(f"bottomk(10, gpu:fleetcanary_gpu_p2p_bandwidth_bytes_per_second:peer_ratio{{{GPU}}})")], w=8),
    panel("table", "Worst nodes: collective bus bandwidth vs peers", PEERS +
          "Good: every ratio above 0.9; a low node slows every job it joins.", "percentunit",
          [instant(f"bottomk(10, node:fleetcanary_collective_bus_bandwidth_bytes_per_second:peer_ratio{{{GPU}}})")],
          w=8),
    panel("table", "Worst GPUs: matmul throughput vs peers", PEERS +
          "Per GPU and dtype (bf16, fp16, tf32, fp8 where supported), from gpu_compute every 30 minutes. "
          "Good: every ratio above 0.9; a GPU well below with the same clocks is slow tensor cores or a "
          "throttled GPU (compare the sustained burn).", "percentunit",
          [instant(f"bottomk(10, gpu:fleetcanary_gpu_matmul_flops_per_second:peer_ratio{{{GPU}}})")], w=8),
    panel("table", "Worst GPUs: sustained over initial throughput (last burn)",
          "Throughput at the end of the daily sustained burn over its throughput at the start, per GPU: "
          "1 is no slowdown under load. Healthy GPUs that reach their power cap drop alike, so compare with "
          "the same model. Good: every GPU near its peers; one well below throttles (fan, thermal contact, "
          "power brake), FleetCanaryGPUSustainedThroughputBelowPeers.", "percentunit",
          [instant("bottomk(10, fleetcanary_gpu_sustained_throughput_ratio "
                   "* on(node, gpu) group_left(model) node_gpu:fleetcanary_gpu_model:info{model=~\"$model\"} "
                   "* on(node) group_left(pool) node:fleetcanary_pool:info{pool=~\"$pool\"})")], w=8),
    panel("table", "Most throttled GPUs: slowdown share of the burn",
          "Share of the last sustained burn each GPU spent in a thermal, power-brake or hardware slowdown "
          "(the power cap is left out). Good: 0 on every GPU; FleetCanaryGPUThrottlingUnlikePeers fires above 5% "
          "while the peer median stays under 1%.", "percentunit",
          [instant(f"topk(10, gpu:fleetcanary_gpu_sustained_slowdown_ratio:by_model{{{GPU}}})")], w=8),
    panel("table", "Wrong results: SDC canary verdicts and training-loss checks",
          "GPUs per silent-data-corruption verdict (match, mismatch = a wrong checksum against the golden "
          "its model's GPUs agreed on, no_consensus, unjudged), and training-step loss checks failing per dtype. "
          "Good: every GPU in match and 0 failing loss checks; any mismatch is critical "
          "(FleetCanaryGPUWrongResult): drain the GPU.", "none",
          [instant(f'sum by (status) ({in_pool("fleetcanary_gpu_sdc_status")})', ref="A"),
           instant(f'sum by (dtype) ({in_pool("1 - fleetcanary_train_step_loss_check_pass")})', ref="B")], w=8),
    panel("table", "Slowest GPUs: training step time vs peers", PEERS +
          "Higher is worse here: the canary transformer's step time over its peers' median. Good: every ratio "
          "below 1.1.", "percentunit",
          [instant(f"topk(10, gpu:fleetcanary_train_step_seconds:peer_ratio{{{GPU}}})")], w=8),
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
    panel("table", "Worst nodes: host memory bandwidth vs peers", PEERS +
          "Good: every ratio above 0.9 (peers share the CPU model).", "percentunit",
          [instant('bottomk(10, node:fleetcanary_host_memory_bandwidth_bytes_per_second:peer_ratio{pool=~"$pool"})')],
          w=6),
    panel("table", "Worst nodes: storage read vs peers", PEERS + "Good: every ratio above 0.9.", "percentunit",
          [instant('bottomk(10, node:fleetcanary_storage_read_bytes_per_second:peer_ratio{pool=~"$pool"})')], w=6),
    panel("table", "Slowest nodes: storage first byte vs peers", PEERS +
          "Higher is worse here. Good: every ratio below 1.1.", "percentunit",
          [instant('topk(10, node:fleetcanary_storage_first_byte_seconds:peer_ratio{pool=~"$pool"})')], w=6),
    panel("table", "Slowest canaries: TTFT vs peers", PEERS +
          "Higher is worse here. Good: every ratio below 1.1.", "percentunit",
          [instant('topk(10, node:fleetcanary_inference_ttft_seconds:peer_ratio{pool=~"$pool"})')], w=6),
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
    panel("table", "Firing fleetcanary alerts",
          "Alerts firing now, by name and severity, with the number of nodes or GPUs. "
          "Good: empty. Each alert's runbook is linked from its runbook_url.", "none",
          [instant('sum by (alertname, severity) (ALERTS{alertstate="firing", alertname=~"FleetCanary.*"})')],
          w=12, h=8),
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
    "The fleet against itself: the worst GPUs and nodes per probe family, probe health, alerts and skips.",
    panels, [pool_var(), model_var()])
