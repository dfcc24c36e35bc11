"""Node detail: one node's GPUs, links, collectives, storage and probes against its pool, and the statistics it
judges itself by."""
from dashboards.common import (
    CG,
    FIGURES,
    G,
    S,
    columns,
    dashboard,
    instant,
    node_var,
    panel,
    pct,
    pool_var,
    query_var,
    rules,
    sel,
    spread,
)

N = 'node="$node"'
ECC = f'fleetcanary_gpu_ecc_errors_total{{{N}, type="uncorrected", counter="volatile"}}'
F = 'figure=~"$figure"'
BW = "fleetcanary_gpu_memory_bandwidth_bytes_per_second"
# The GPU model and pool of this node's GPUs (the sustained burn's live pool median).
MINE = ('and on(model, pool) (node:fleetcanary_gpu_model:info{node="$node"} '
        '* on(node) group_left(pool) node:fleetcanary_pool:info)')


def peer_median(figure: str, series: str = "") -> str:
    """The peers' median level of the peer groups this node's series of `figure` belong to: each judged series
    carries its group's labels (pool, model, driver version, figure, series)."""
    fm = f'figure="{figure}"'
    return (f"pool:fleetcanary_judge_median:peer_median{sel(fm, series)} "
            f"and on({G}) fleetcanary_judge_median{sel(N, fm, series)}")


def bound(figure: str, series: str = "") -> str:
    """The level path's alert bound: the peers' median less (more, for a lower-is-better figure) the larger of
    the level floor and 5 MADs of the peers' ratios."""
    fm = f'figure="{figure}"'
    m = sel(fm, series)
    sign = "-" if FIGURES[figure].higher_is_better else "+"
    return (f"(pool:fleetcanary_judge_median:peer_median{m} * (1 {sign} clamp_min({S.level_k_mad:g} "
            f"* {spread('pool:fleetcanary_judge_median:peer_mad' + m)}, {S.level_floor:g}))) "
            f"and on({G}) fleetcanary_judge_median{sel(N, fm, series)}")


def runs(figure: str, raw: str = "", series: str = "") -> str:
    """A judged figure of this node in its own metric's labels: each run's gauge while the judge has no median
    of the series, else the judge's median, which stands in for it (its
    `series` label split back into the labels it joins). `raw` and `series`: matchers on either side."""
    fig = FIGURES[figure]
    fm = f'figure="{figure}"'
    median = f"fleetcanary_judge_median{sel(N, fm, series)}"
    pattern = "/".join("([^/]*)" for _ in fig.series)
    for i, label in enumerate(fig.series):
        median = f'label_replace({median}, "{label}", "${i + 1}", "series", "{pattern}")'
    keep = ", ".join(("node", *((fig.gpu,) if fig.gpu else ()), *fig.series))
    return f"{fig.metric}{sel(N, raw)} or on({keep}) {median}"


def band(direction: str) -> list:
    series = f'series=~"{direction}"'
    return [(runs("gpu_memory_bandwidth", f'direction=~"{direction}"', series), "GPU {{gpu}} {{direction}}"),
            (peer_median("gpu_memory_bandwidth", series), "pool median {{series}}"),
            (bound("gpu_memory_bandwidth", series), "level alert bound {{series}}")]


def named(stat: str, *m: str) -> str:
    """A judged statistic without its metric name, so that a merged table joins it with the ratios."""
    return f"max without () (fleetcanary_judge_{stat}{sel(N, F, *m)})"


def onto(stat: str, record: str, group: str) -> str:
    """A peer group's recorded statistic (`record`, as it is read: a spread record through ``spread``), carried onto
    each of this node's series in the group."""
    return f"fleetcanary_judge_{stat}{sel(N, F)} * 0 + on({group}) group_left {record}"


LEVEL = [
    instant(f"fleetcanary_judge_median{sel(N, F)} / on({G}) group_left pool:fleetcanary_judge_median:peer_median"
            f"{sel(F)}", ref="A"),
    instant(f"fleetcanary_judge_newest{sel(N, F)} / on({G}) group_left pool:fleetcanary_judge_median:peer_median"
            f"{sel(F)}", ref="B"),
    instant(named("drift"), ref="C"),
    instant(onto("median", spread("pool:fleetcanary_judge_median:peer_mad" + sel(F)), G), ref="D"),
    instant(onto("median", spread("pool:fleetcanary_judge_median:peer_nodes" + sel(F)), G), ref="E"),
]
CHANGE = [
    instant(named("change"), ref="A"),
    instant(onto("change", "pool:fleetcanary_judge_change:peer_median" + sel(F), CG), ref="B"),
    instant(f"fleetcanary_judge_change{sel(N, F)} / on({CG}) group_left pool:fleetcanary_judge_change:peer_median"
            f"{sel(F)}", ref="C"),
    instant(onto("change", spread("pool:fleetcanary_judge_change:peer_mad" + sel(F)), CG), ref="D"),
    instant(onto("change", spread("pool:fleetcanary_judge_change:peer_nodes" + sel(F)), CG), ref="E"),
]
HIDE = ("Time", "job", "instance", "node", "pool", "model")
NODES_COL = [{"matcher": {"id": "byName", "options": "peer nodes"}, "properties": [{"id": "unit", "value": "none"}]}]


GBPS = "* 8 / 1000000000"  # bytes/s to Gb/s (no 1e9: the dashboard name check would read "e9" as a name)
# The matrix's cells with pairs: true; by default each source GPU's slowest link, its last run's gauge while the
# judge has no median of it, else the median, which stands in for it (one column, dst_gpu empty).
P2P_RUNS = (f"max by (src_gpu, dst_gpu) (fleetcanary_gpu_p2p_bandwidth_bytes_per_second{{{N}}} or on(node, src_gpu) "
            f'label_replace(fleetcanary_judge_median{{{N}, figure="gpu_p2p_bandwidth"}}, "src_gpu", "$1", "gpu", '
            '"(.*)"))')
MATRIX = [{"id": "groupingToMatrix", "options": {"columnField": "dst_gpu", "rowField": "src_gpu",
                                                 "valueField": "Value"}}]

panels = [
    panel("table", "Judged series against the peers' level",
          "Per judged series of this node (fleetcanary_judge_*: figure, series, GPU): its median of the newest 7 "
          "runs over the median of its peers' medians (the level path), the best of its newest 3 runs over the "
          "same (the fast path), its drift (the last 24 h's median over its best day), the peers' MAD of their "
          "level ratios and the nodes reporting. Peers: same pool, GPU (or CPU) model, driver version, figure "
          f"and series. Good: ratios near 1, within {pct(S.level_floor)} (latencies and step times: above 1 is "
          f"worse); the fast path pages beyond {pct(S.fast_floor)}; drift within {pct(S.drift_floor)}; "
          f"{S.min_peers}+ peer nodes (fewer: no peer verdict for that series).", "percentunit",
          LEVEL, w=24, h=10, overrides=NODES_COL,
          transformations=[{"id": "merge", "options": {}},
                           columns({"Value #A": "median of 7 / peers", "Value #B": "best of newest 3 / peers",
                                    "Value #C": "drift", "Value #D": "peers' MAD", "Value #E": "peer nodes"},
                                   HIDE)]),
    panel("table", "Judged series: change against its own best day and the peers' change",
          "Per judged series: its change (the confirmed figure, better of the median of 7 and the best of the "
          "newest 3, over its best day on the driver named by baseline_driver in the last 14 days), the median "
          "change of its peers with the same baseline, the change over the peers' median change (the change "
          "path), the peers' MAD of those ratios and their node count. baseline=previous_driver appears for two "
          "weeks after a driver upgrade and compares the node with the nodes upgraded the same way. Good: "
          "change near 1 and near the peers' (a GPU's own offset cancels); the change path fires beyond "
          "the figure's floor (2.5% for GPU memory bandwidth) and 7 MADs, the regression alert when the change "
          "itself is 10% (5%) off. No row: no baseline yet (a complete day on this driver is needed).",
          "percentunit", CHANGE, w=24, h=10, overrides=NODES_COL,
          transformations=[{"id": "merge", "options": {}},
                           columns({"Value #A": "own change", "Value #B": "peers' median change",
                                    "Value #C": "change / peers' change", "Value #D": "peers' MAD",
                                    "Value #E": "peer nodes"}, HIDE)]),
    panel("timeseries", "Change against the peers' change over time",
          "Each judged series' change against its own best day over its peers' median change (the quantity the "
          "change path judges), per figure, series, GPU and baseline. The statistics move once per run and "
          "stay a day after the newest run, so a flat line can be a GPU that has been busy since. Good: flat "
          "lines near 1; a step down that stays is a fault (above 1 for latencies and step times).",
          "percentunit",
          [(f"fleetcanary_judge_change{sel(N, F)} / on({CG}) group_left pool:fleetcanary_judge_change:peer_median"
            f"{sel(F)}", "{{figure}} {{series}} GPU {{gpu}} {{baseline}}")], w=12),
    panel("table", "Judged series by state",
          "This node's judged series by figure and state: warming (fewer than 5 runs on this driver), smoothed "
          "(a median, no baseline yet), baselined (a change against its own best day), stale (no run for a day: "
          "nothing published). After a reimage: warming for 5 runs, smoothed until a complete day of 3+ runs "
          "over 6 h; a driver upgrade starts both again. Good: baselined.", "none",
          [instant(f"sum by (figure, state) (fleetcanary_judge_series{sel(N, F)})")], w=12,
          transformations=[columns({"Value": "series"})]),
    panel("timeseries", "GPU memory bandwidth (device to device) against the pool",
          "Each GPU's HBM copy bandwidth (bytes read + written; each run until the judge has the median of 7, then "
          "that median), with the median of its peers' medians "
          "of 7 runs (same pool, GPU model and driver) and the level path's alert bound (the median less the "
          f"larger of {pct(S.level_floor)} and {S.level_k_mad:g} MADs). Good: every GPU inside the band, close to "
          "the median; a smaller step against the GPU's own history shows in the change tables above. An H100 "
          "SXM copies ~3 TB/s, an H200 ~4.2 TB/s.", "Bps", band("d2d"), w=12),
    panel("timeseries", "Host to device and device to host bandwidth against the pool",
          "Pinned-memory copies over PCIe per GPU, with the peers' median and the level path's bound. Good: "
          "every GPU near the pool median (~50-55 GB/s on PCIe Gen5 x16); one GPU at half is a x8 link or a "
          "wrong NUMA placement.", "Bps", band("h2d|d2h"), w=12),
    panel("table", "P2P bandwidth matrix (source rows, destination columns)",
          "Unidirectional peer copy bandwidth for every ordered GPU pair, last run, with gpu_p2p's pairs: true; "
          "by default one column, each source GPU's slowest link, its median of 7 runs once the judge has one "
          "(the run record at /results has the matrix). "
          "Good: a uniform matrix (NVSwitch: every pair alike); one low row or column is one GPU's links, one "
          "low cell one path.", "Bps",
          [instant(P2P_RUNS)], w=12, h=9, transformations=MATRIX),
    panel("timeseries", "P2P: each GPU's slowest link against the peers",
          "The judged P2P figure is each source GPU's slowest link (one bad link moves it): its median of 7 runs "
          "over the median of its peers' GPUs (every GPU of the nodes of the same pool, model and driver). "
          "Good: every GPU near "
          f"1; the level path fires {pct(S.level_floor)} and {S.level_k_mad:g} MADs below. The matrix beside it "
          "names the link.", "percentunit",
          [(f'fleetcanary_judge_median{{{N}, figure="gpu_p2p_bandwidth"}} / on({G}) group_left '
            'pool:fleetcanary_judge_median:peer_median{figure="gpu_p2p_bandwidth"}', "GPU {{gpu}}")], w=12, h=9),
    panel("table", "PCIe links",
          "Current and maximum PCIe generation and width per GPU. Good: width equal to its maximum; the current "
          "generation drops at idle by design, so only a width below maximum on a busy GPU is a downtrained link.",
          "none",
          [instant(f"fleetcanary_gpu_pcie_link_generation{{{N}}}", ref="A"),
           instant(f"fleetcanary_gpu_pcie_link_generation_max{{{N}}}", ref="B"),
           instant(f"fleetcanary_gpu_pcie_link_width{{{N}}}", ref="C"),
           instant(f"fleetcanary_gpu_pcie_link_width_max{{{N}}}", ref="D")],
          w=12, transformations=[{"id": "merge", "options": {}}]),
    panel("timeseries", "NVLink links up per GPU",
          "Active NVLink links per GPU, and the links it has that are not active (no series while none is "
          "down). Good: 18 up on every H100/H200 SXM GPU and no down line.", "none",
          [(f"fleetcanary_gpu_nvlink_links_up{{{N}}}", "GPU {{gpu}} up"),
           (f"fleetcanary_gpu_nvlink_links_down{{{N}}}", "GPU {{gpu}} down")], w=12),
    panel("timeseries", "NVLink error counters (per hour)",
          "Increase of NVLink CRC, replay, recovery and ECC counters per GPU. Good: zero; replays that keep "
          "climbing come before a link goes down.", "none",
          [(f"sum by (gpu, counter) (increase(fleetcanary_gpu_nvlink_errors_total{{{N}}}[1h]))",
            "GPU {{gpu}} {{counter}}")], w=12),
    panel("timeseries", "GPU errors: XIDs, uncorrectable ECC, pending row remaps",
          "Critical XIDs seen in the last day, uncorrectable volatile ECC errors in the last day, and pending "
          "row remaps. Good: all zero; a pending remap needs a GPU reset, an XID 79 means the GPU fell off the bus.",
          "none",
          [(f"sum by (gpu, xid) ({rules.counted_value(f'fleetcanary_gpu_xid_errors_total{{{N}}}', '1d')})",
            "GPU {{gpu}} XID {{xid}}"),
           (f"sum by (gpu) ({rules.counted_value(ECC, '1d')})", "GPU {{gpu}} uncorrectable ECC"),
           (f"fleetcanary_gpu_remapped_rows_pending{{{N}}}", "GPU {{gpu}} remap pending")], w=12),
    panel("table", "RDMA ports: state, rate against expected, errors in the last hour",
          "Per InfiniBand/RoCE port (nic_health, every minute): up (ACTIVE and LinkUp), the rate it trained at "
          "and the rate configured for it in Gb/s, its lanes, and the sum of its error counters over the last "
          "hour. Good: up 1 on every cabled port, rate equal to expected (NDR 4X: 400), 4 lanes, errors 0 or a "
          "few; 2 lanes or a lower speed is a downtrained link.", "none",
          [instant(f"max by (device, port) (fleetcanary_rdma_port_up{{{N}}})", ref="A"),
           instant(f"max by (device, port) (fleetcanary_rdma_port_rate_bytes_per_second{{{N}}}) {GBPS}", ref="B"),
           instant(f"max by (device, port) (fleetcanary_rdma_port_expected_rate_bytes_per_second{{{N}}}) {GBPS}",
                   ref="C"),
           instant(f"count by (device, port, link_width) (fleetcanary_rdma_port_info{{{N}}})", ref="D"),
           instant(f"sum by (device, port) (increase(fleetcanary_rdma_port_errors_total{{{N}}}[1h]))", ref="E")],
          w=12, transformations=[{"id": "merge", "options": {}},  # lanes: the info series' link_width label
                                 {"id": "organize", "options": {"excludeByName": {"Value #D": True}}}]),
    panel("timeseries", "RDMA port error and hardware counters (per hour)",
          "Increase over the last hour of each port's IBTA error counters (symbol errors, link downed, receive "
          "errors, ...) and its driver hardware counters (out_of_buffer, retries, CNPs; only with nic_health's "
          "hw_counters: true). Good: error counters "
          "flat at 0 (alerts fire above 10 an hour, any link_downed); congestion counters follow the load.", "none",
          [(f"sum by (device, port, counter) (increase(fleetcanary_rdma_port_errors_total{{{N}}}[1h]))",
            "{{device}}/{{port}} {{counter}}"),
           (f"sum by (device, port, counter) (increase(fleetcanary_rdma_port_hw_events_total{{{N}}}[1h]))",
            "{{device}}/{{port}} hw {{counter}}")], w=12),
    panel("timeseries", "Network interfaces: carrier changes, errors and drops (per hour)",
          "Per watched Ethernet interface: carrier changes (a down and up is 2), receive and transmit errors and "
          "drops over the last hour, and whether it is up. Good: up 1, no carrier changes, no errors; a few "
          "receive drops are normal (unknown protocols count as drops).", "none",
          [(f"fleetcanary_net_interface_up{{{N}}}", "{{interface}} up"),
           (f"increase(fleetcanary_net_interface_carrier_changes_total{{{N}}}[1h])", "{{interface}} carrier changes"),
           (f"increase(fleetcanary_net_interface_errors_total{{{N}}}[1h])", "{{interface}} {{direction}} errors"),
           (f"increase(fleetcanary_net_interface_dropped_total{{{N}}}[1h])", "{{interface}} {{direction}} drops")],
          w=12),
    panel("barchart", "Collective bus bandwidth against message size",
          "nccl-tests bus bandwidth at each message size, per collective (the last run until the judge has the "
          "median of 7, then that median). Good: rising with "
          "size and levelling off near the link bandwidth (NVLink 4: ~360-450 GB/s all_reduce on 8 GPUs); "
          "a low plateau is a slow link or a bad topology choice.", "Bps",
          [instant(f"max by (collective, size_bytes) ({runs('collective_bus_bandwidth')})")],
          w=12, xTickLabelRotation=-45, transformations=[
              {"id": "groupingToMatrix", "options": {"columnField": "collective", "rowField": "size_bytes",
                                                     "valueField": "Value"}},
              {"id": "convertFieldType", "options": {"conversions": [
                  {"targetField": "size_bytes\\collective", "destinationType": "number"}]}},
              {"id": "sortBy", "options": {"sort": [{"field": "size_bytes\\collective"}]}}]),
    panel("timeseries", "Collective bus bandwidth over time",
          "Bus bandwidth per collective and message size (each run until the judge has the median of 7, then that "
          "median). Good: flat lines; a step down after a "
          "driver or NCCL change is what the DropAfterDriverChange alerts catch.", "Bps",
          [(runs("collective_bus_bandwidth"), "{{collective}} {{size_bytes}} B")],
          w=12),
    panel("timeseries", "Host memory bandwidth against the pool",
          "STREAM copy and triad on all cores, with the median of nodes with the same CPU model in the pool. "
          "Good: within 10% of the pool median.", "Bps",
          [(runs("host_memory_bandwidth"), "{{op}}"),
           (peer_median("host_memory_bandwidth"), "pool median {{series}}")], w=12),
    panel("timeseries", "Storage first byte",
          "Time to the first bytes of a file, cold (page cache dropped) and hot, per target. Good: local NVMe "
          "well under 1 ms cold; network file systems a few ms; a climb is the storage, not the node.", "s",
          [(runs("storage_first_byte"), "{{target}} {{cache}}")], w=12),
    panel("timeseries", "Storage throughput",
          "Sequential read (cold and hot) and write bandwidth per target. Good: cold reads near the device's "
          "rating (a few GB/s per NVMe drive); hot reads are the page cache.", "Bps",
          [(runs("storage_read"), "read {{target}} {{cache}}"),
           (f"fleetcanary_storage_write_bytes_per_second{{{N}}}", "write {{target}}")], w=12),
    panel("timeseries", "Matmul throughput per GPU and dtype against the pool",
          "Each GPU's matrix-multiply FLOP/s per dtype (gpu_compute, every 30 minutes), with the median of its "
          "peers (same GPU model and pool) per dtype. Good: every GPU within 10% of its dtype's median; the "
          "bf16 8192^3 product runs at about 770-800 TFLOP/s on an H200.", "flops",
          [(runs("gpu_matmul_throughput"), "GPU {{gpu}} {{dtype}}"),
           (peer_median("gpu_matmul_throughput"), "pool median {{series}}")],
          w=12),
    panel("table", "Correctness: SDC canary verdict and training-loss check per GPU",
          "The silent-data-corruption verdict of each GPU's last gpu_compute run (1 on its current status) and "
          "whether the training-step canary's loss after K steps was within tolerance of its golden (1 = pass). "
          "Good: match and 1 on every GPU; mismatch means wrong bits: drain the GPU.", "none",
          [instant(f"fleetcanary_gpu_sdc_status{{{N}}} == 1", ref="A"),
           instant(f"fleetcanary_train_step_loss_check_pass{{{N}}}", ref="B")], w=12),
    panel("timeseries", "Sustained burn: throughput at the end over the start",
          "Per GPU, the last daily burn's sustained throughput over its initial throughput, with the pool "
          "median of the same burn. Good: every GPU close to the median; all GPUs drop a little when they "
          "reach the power cap, one lower alone throttles.", "percentunit",
          [(f"fleetcanary_gpu_sustained_throughput_ratio{{{N}}}", "GPU {{gpu}}"),
           # The last burn's pool median: the recorded peer median needs 5 daily burns in its window.
           ("(quantile by (model, pool) (0.5, fleetcanary_gpu_sustained_throughput_ratio "
            "* on(node) group_left(model) node:fleetcanary_gpu_model:info "
            f"* on(node) group_left(pool) node:fleetcanary_pool:info)) {MINE}", "pool median")], w=12),
    panel("timeseries", "Sustained burn: clocks over its last quarter",
          "Median SM and memory clock per GPU over the last quarter of the burn (NVML every 100 ms), with "
          "gpu_sustained's detail: true (else in the run record at /results). Good: SM clocks alike on every "
          "GPU of the node; one GPU hundreds of MHz lower is throttling.",
          "hertz", [(f"fleetcanary_gpu_sustained_clock_hertz{{{N}}}", "GPU {{gpu}} {{clock}}")], w=12),
    panel("timeseries", "Sustained burn: hottest temperature",
          "The hottest GPU temperature seen during the burn, with gpu_sustained's detail: true (else in the run "
          "record at /results). Good: every GPU within a few degrees of the "
          "others and well below its slowdown temperature; one far hotter has a cooling fault.", "celsius",
          [(f"fleetcanary_gpu_sustained_temperature_celsius{{{N}}}", "GPU {{gpu}}")], w=8),
    panel("timeseries", "Sustained burn: board power",
          "Median board power over the burn's last quarter, with gpu_sustained's detail: true (else in the run "
          "record at /results). Good: every GPU near its power limit and near "
          "the others; one far lower at lower clocks is power-braked.", "watt",
          [(f"fleetcanary_gpu_sustained_power_watts{{{N}}}", "GPU {{gpu}}")], w=8),
    panel("timeseries", "Sustained burn: seconds in each throttle reason",
          "Seconds of the burn each NVML clocks-event reason was active (reasons overlap), with gpu_sustained's "
          "detail: true (else in the run record at /results; the slowdown share above is published either way). "
          "Good: only sw_power_cap, alike on every GPU; thermal, power-brake or hw_slowdown seconds are a fault.",
          "s",
          [(f"fleetcanary_gpu_sustained_throttle_seconds{{{N}}}", "GPU {{gpu}} {{reason}}")], w=8),
    panel("timeseries", "Training step time against the pool",
          "Step time (forward, backward, optimizer) of the canary transformer per GPU and dtype, with the "
          "median of its peers (same GPU model and pool). Good: within 10% of the median.", "s",
          [(runs("train_step_time"), "GPU {{gpu}} {{dtype}}"),
           (peer_median("train_step_time"), "pool median {{series}}")], w=12),
    panel("timeseries", "Training loss against its golden",
          "Relative deviation of the canary's loss after K steps from the shipped golden, per GPU and dtype. "
          "Good: within the dtype's tolerance (the check passes); a step time never counts without it.",
          "percentunit",
          [(f"fleetcanary_train_step_loss_deviation_ratio{{{N}}}", "GPU {{gpu}} {{dtype}}")], w=12),
    panel("timeseries", "Fabric pair history: send/recv bandwidth per slot",
          "This node's pair bandwidth with the slot's partner (the partner changes every slot; the legend of "
          "the partner table below names them), against the pool's reference. Good: every slot near the "
          "reference; low in most slots is this node, low in one slot is that pair's link.", "Bps",
          [(f"fleetcanary_fabric_sendrecv_bandwidth_bytes_per_second{{{N}}}", "pair bandwidth"),
           ('pool:fleetcanary_fabric_pair_bandwidth:reference * on(pool) group_left() '
            'node:fleetcanary_pool:info{node="$node"}', "pool reference")], w=12),
    panel("table", "Fabric partners in the last hour (1 = slow pair)",
          "Every partner this node met in the last hour, and whether the pair was slow (below 70% of the "
          "pool reference) in most of their meetings. Good: all 0; one 1 is one link, most 1s is this node.",
          "none", [instant(f"max_over_time(node_partner:fleetcanary_fabric_pair_slow:bool{{{N}}}[1h])")], w=12),
    panel("timeseries", "Probe durations",
          "Wall time of each probe's last run, worker start to end. Good: steady and well under each probe's "
          "deadline; a rising duration comes before timeouts.", "s",
          [(f"fleetcanary_probe_duration_seconds{{{N}}}", "{{probe}}")], w=12),
    panel("table", "Coverage: time since each GPU was last measured, per probe",
          "For each GPU (rows) and invasive probe (columns), how long ago a successful run last measured it "
          "(time() - fleetcanary_gpu_last_measured_timestamp_seconds; train_step and fabric per node, no GPU). A "
          "GPU held by a pod, busy or out of GPU-time budget is skipped, and its judged statistics age out. "
          "Good: every cell under about 1.5 of the probe's interval (15 min bandwidth, 30 min P2P, collectives "
          "and compute, 1 h training step, 1 day sustained burn); a very large value is never measured.", "s",
          [instant(f"time() - fleetcanary_gpu_last_measured_timestamp_seconds{{{N}}}")], w=12,
          transformations=[{"id": "groupingToMatrix", "options": {"columnField": "probe", "rowField": "gpu",
                                                                  "valueField": "Value"}}]),
    panel("timeseries", "GPU duty cycle of the invasive probes",
          "Share of each GPU's time the invasive probes (bandwidth, P2P, collectives, compute, sustained burn, "
          "training step) used over the last hour; the daily burn shows as a spike. "
          "Good: below the configured budget (0.5% by default) except in the hour after the daily burn, which the "
          "budget holds to 0.5% of a day; the canary must never be the load.",
          "percentunit", [(f"sum by (gpu) (rate(fleetcanary_gpu_probe_seconds_total{{{N}}}[1h]))", "GPU {{gpu}}")],
          w=12),
]

dashboard = dashboard(
    "fleetcanary / Node detail", "fleetcanary-node",
    "One node against its pool: the statistics it judges itself by (against its peers and its own best day), "
    "GPU bandwidth, P2P, links, errors, compute, sustained load, training step, collectives, storage, probe cost.",
    panels, [pool_var(), node_var(),
             query_var("figure", "Figure", 'label_values(fleetcanary_judge_series{node=~"$node"}, figure)')])
