"""Hard failures and the inventory: what is broken on a node or a GPU (a GPU lost, GPUs missing, an NVLink or the
NVLink fabric down, PCIe downtraining, XIDs, uncorrectable ECC, row remaps, wrong results, probes failing or
stale, the exporter down) and the per-node facts other rules join (model, pool, NVLink domain, the daily burn's
slowdown peers). They read raw series and fire on their first observation where that is right; those that must
outlive the fault hold through a longer window.
"""
from __future__ import annotations

from fleetcanary.core.rulesettings import RuleSettings
from fleetcanary.rules.common import Group, Shard, alert, counted, record

# The daily burn's slowdown share with its GPU model and pool (joined where read: no per-GPU record)
SLOWDOWN = ("fleetcanary_gpu_sustained_slowdown_ratio * on(node) group_left(model) node:fleetcanary_gpu_model:info "
            "* on(node) group_left(pool) node:fleetcanary_pool:info")


# The canary's own health: an hour of every probe's run counters at each evaluation (a third of the hard failures'
# seconds at 1,000 nodes), for warnings that wait 10-15 minutes anyway: evaluated at the judged groups' interval.
PROBE_HEALTH = ("FleetCanaryProbeFailing", "FleetCanaryProbeStale")


def groups(s: RuleSettings, shards: list[Shard]) -> list[Group]:
    rules = alerts(s)
    return [Group("rules", "fleetcanary-inventory", "hard_interval", inventory()),
            Group("alerts", "fleetcanary-hard-failures", "hard_interval",
                  [r for r in rules if r["alert"] not in PROBE_HEALTH]),
            Group("alerts", "fleetcanary-probe-health", "interval", [r for r in rules if r["alert"] in PROBE_HEALTH])]


XID_PAGING = "hardware|memory|bus|nvlink"   # the XID classes whose critical codes page on first sight
FABRIC_NOT_READY = "not_started|in_progress|unhealthy|unknown"   # fleetcanary_gpu_info's fabric_state, not ready
NODE_DOMAIN = "node:fleetcanary_nvlink_domain:info"


def in_domain(expr: str) -> str:
    """`expr` (per node and GPU) with the node's NVLink domain as its nvlink_domain label where the node has one
    (NODE_DOMAIN: its GPUs' domain, held for a day after they lose it, so a rack whose fabric went down still
    groups as one); as it is elsewhere."""
    return f"(({expr}) * on(node) group_left(nvlink_domain) ({NODE_DOMAIN} > bool 0)) or on(node, gpu) ({expr})"


def alerts(s: RuleSettings) -> list[dict]:
    """Hard failures fire on their first observation. Those that hold after the fault clears (an XID, an
    uncorrectable ECC error, a wrong result) do so through a longer window, not keep_firing_for."""
    def a(name, expr, for_, sev, summary, desc):
        return alert(name, " ".join(expr.split()), for_, {"severity": sev}, summary, desc)

    return [
        a("FleetCanaryProbeFailing",
          'sum by (node, probe) (increase(fleetcanary_probe_runs_total{outcome=~"failure|timeout|crash"}[1h])) >= 3',
          "10m", "warning", "A probe keeps failing",
          "Probe {{ $labels.probe }} on {{ $labels.node }} failed, timed out or crashed {{ $value | humanize }} "
          "times in the last hour."),
        a("FleetCanaryProbeStale",
          "((time() - fleetcanary_probe_last_success_timestamp_seconds) > 3 * fleetcanary_probe_interval_seconds) "
          'unless on(node, probe) (increase(fleetcanary_probe_runs_total{outcome="skipped"}[1h]) > 0)',
          "15m", "warning", "A probe has not succeeded for 3 intervals",
          "Probe {{ $labels.probe }} on {{ $labels.node }} last succeeded {{ $value | humanizeDuration }} ago and "
          "did not skip; its runs fail or do not happen."),
        a("FleetCanaryGPUsMissing", "fleetcanary_gpus_healthy < fleetcanary_gpus_expected", "0m", "critical",
          "Fewer GPUs than expected", "{{ $labels.node }} has {{ $value }} usable GPUs, fewer than it should."),
        a("FleetCanaryGPULost", "fleetcanary_gpu_lost == 1", "0m", "critical", "A GPU fell off the bus",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} is enumerated but cannot be queried (XID 79 class)."),
        a("FleetCanaryPCIeLinkWidthDegraded", "fleetcanary_gpu_pcie_link_width < fleetcanary_gpu_pcie_link_width_max",
          "0m", "warning", "A GPU's PCIe link is narrower than its maximum",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} runs its PCIe link at x{{ $value }}, below its maximum width."),
        a("FleetCanaryPCIeLinkGenerationDegraded",
          "(fleetcanary_gpu_pcie_link_generation < fleetcanary_gpu_pcie_link_generation_max) "
          'unless on(node, gpu) (fleetcanary_gpu_clock_throttle_active{reason="gpu_idle"} == 1)',
          "30m", "warning", "A busy GPU's PCIe link runs below its maximum generation",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} is at PCIe Gen{{ $value }} while not idle (idle GPUs "
          "lower the generation to save power; those are left out)."),
        # per GPU: links present but not active (per link only with gpu_health's per_link); a link NVML cannot read
        # is down. In a multi-node NVLink domain the alert carries the domain, so a rack's are one notification.
        a("FleetCanaryNVLinkDown", in_domain("fleetcanary_gpu_nvlink_links_down > 0"), "0m", "critical",
          "An NVLink is down",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} has {{ $value }} NVLink links down and "
          """{{ with query (printf "fleetcanary_gpu_nvlink_links_up{node='%s', gpu='%s'}" """
          """$labels.node $labels.gpu) }}"""
          "{{ . | first | value }}{{ else }}?{{ end }} active; `nvidia-smi nvlink -s` names the inactive ones."),
        # The NVLink fabric of NVSwitch systems (gpu_health: nvmlDeviceGetGpuFabricInfoV, labels of
        # fleetcanary_gpu_info). Registration takes a minute or two after a boot, a driver load or a fabric
        # manager restart: 5 minutes. Each alert carries the NVLink domain (the GPU's own, else its node's last),
        # and the Alertmanager example groups by it: a rack-wide fault is one page that lists its nodes.
        a("FleetCanaryGPUFabricNotReady",
          in_domain("max by (node, gpu, fabric_state) "
                    f'(fleetcanary_gpu_info{{fabric_state=~"{FABRIC_NOT_READY}"}})'),
          "5m", "critical", "A GPU's NVLink fabric is not ready",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} has NVLink fabric state {{ $labels.fabric_state }} "
          "(unhealthy: registered with an error status or an unhealthy health mask) in NVLink domain "
          "{{ $labels.nvlink_domain }}; its multi-node NVLink traffic fails or is slowed. The gpu_health record "
          "(/results) has the status and health mask."),
        a("FleetCanaryGPUFabricCliqueMismatch",
          # the GPUs whose own domain (gpu_domain) is not their node's (only once the node's is recorded)
          '(max by (node, gpu, gpu_domain) (label_replace(fleetcanary_gpu_info{nvlink_domain!=""}, '
          '"gpu_domain", "$1", "nvlink_domain", "(.+)")) unless on(node, gpu) '
          f"(fleetcanary_gpu_info * on(node, nvlink_domain) group_left() {NODE_DOMAIN})) "
          f"* on(node) group_left(nvlink_domain) ({NODE_DOMAIN} > bool 0)",
          "5m", "critical", "A GPU left its NVLink clique",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} is registered in NVLink domain {{ $labels.gpu_domain }} "
          "(cluster UUID/clique), not in its node's {{ $labels.nvlink_domain }}: it cannot reach its rack's "
          "partition over NVLink. fleetcanary_gpu_info of the node shows each GPU's domain."),
        # A fault across an NVLink domain (a rack's NVLink switch trays, its fabric manager or NMX): one alert for
        # the domain, which the Alertmanager example groups with the per-GPU alerts that name its nodes.
        a("FleetCanaryNVLinkDomainDegraded",
          "count by (nvlink_domain) (max by (node, nvlink_domain) (("
          f'max by (node) (fleetcanary_gpu_info{{fabric_state=~"{FABRIC_NOT_READY}"}}) '
          "or max by (node) (fleetcanary_gpu_nvlink_links_down > 0)) "
          f"* on(node) group_left(nvlink_domain) {NODE_DOMAIN})) >= {s.nvlink_domain_min_nodes}",
          "5m", "critical", "NVLink fabric faults across an NVLink domain",
          "{{ $value }} nodes of NVLink domain {{ $labels.nvlink_domain }} have GPUs whose NVLink fabric is not "
          "ready or whose NVLinks are down: a fault of the domain (its switch trays, fabric manager or NVLink "
          "management), not of each node. The per-GPU alerts in the same notification name the nodes."),
        # XIDs by the catalogue's class (probes/lib/xid_catalogue.yaml, docs/xid-catalogue.md): a critical code of a
        # hardware-side class pages on first sight; driver, thermal and the lesser codes are a warning; an
        # application-class code (13, 31, 43 ...) only through its escalation (one GPU, several processes).
        a("FleetCanaryGPUCriticalXid",
          counted(f'fleetcanary_gpu_xid_errors_total{{class=~"{XID_PAGING}", severity="critical"}}', "75m"),
          "0m", "critical", "A GPU reported a hardware-class XID",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} reported XID {{ $labels.xid }} (class {{ $labels.class }}) "
          "in the last 75 minutes; its meaning and first action: docs/xid-catalogue.md#xid-{{ $labels.xid }}."),
        a("FleetCanaryGPUXidWarning",
          counted('fleetcanary_gpu_xid_errors_total{class!="application", severity="warning"}', "75m")
          + " or "
          + counted(f'fleetcanary_gpu_xid_errors_total{{class!~"{XID_PAGING}|application", severity="critical"}}',
                    "75m"),
          "0m", "warning", "A GPU reported a driver, thermal or lesser XID",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} reported XID {{ $labels.xid }} (class {{ $labels.class }}, "
          "severity {{ $labels.severity }}) in the last 75 minutes; its meaning and first action: "
          "docs/xid-catalogue.md#xid-{{ $labels.xid }}."),
        a("FleetCanaryGPUApplicationXidRepeated", counted("fleetcanary_gpu_xid_escalations_total", "75m"), "0m",
          "critical", "An application-class XID repeats on one GPU across processes",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} logged XID {{ $labels.xid }} from several different "
          "processes within the escalation window (xid.escalate_processes, default 3 in 1 h): the GPU, not a job, "
          "is the common factor; first action: docs/xid-catalogue.md#xid-{{ $labels.xid }}."),
        a("FleetCanaryGPUUncorrectableECC",
          counted('fleetcanary_gpu_ecc_errors_total{type="uncorrected", counter="volatile"}', "2h"), "0m",
          "critical", "Uncorrectable ECC errors on a GPU",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} had {{ $value }} uncorrectable ECC errors in the last 2 hours."),
        a("FleetCanaryGPURowRemapPending", "fleetcanary_gpu_remapped_rows_pending == 1", "5m", "warning",
          "A GPU has a pending row remap", "GPU {{ $labels.gpu }} on {{ $labels.node }} needs a reset to apply a "
          "row remapping."),
        a("FleetCanaryGPURowRemapFailed", "fleetcanary_gpu_remapped_rows_failed == 1", "0m", "critical",
          "A GPU failed a row remap", "GPU {{ $labels.gpu }} on {{ $labels.node }} could not remap a row; it needs "
          "service."),
        a("FleetCanaryCollectiveWrongResult",
          'increase(fleetcanary_probe_failures_total{probe="collectives", reason="wrong_result"}[4h]) > 0', "0m",
          "critical", "A collective returned wrong data",
          "The collectives probe on {{ $labels.node }} found wrong elements in a collective's output in the last "
          "4 hours."),
        a("FleetCanaryGPUWrongResult",
          'max by (node, gpu) (max_over_time(fleetcanary_gpu_sdc_status{status="mismatch"}[2h])) == 1',
          "0m", "critical", "A GPU computed a wrong result (silent data corruption)",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} produced a checksum for the deterministic canary products that "
          "differs from the golden its model's GPUs agreed on (in the last 2 hours)."),
        a("FleetCanaryGPUSDCNoConsensus",
          'max by (node, gpu) (max_over_time(fleetcanary_gpu_sdc_status{status="no_consensus"}[1h])) == 1', "0m",
          "warning", "The SDC canary found no majority",
          "The GPUs of {{ $labels.node }} disagree on the canary checksum with no strict majority (or all disagree "
          "with the stored golden); GPU {{ $labels.gpu }} is one of them. Not judged; a person must."),
        a("FleetCanaryGPUThrottlingUnlikePeers",
          f"(({SLOWDOWN}) > 0.05) "
          f"and on(model, pool) (pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_median < 0.01) "
          f"and on(model, pool) (pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_count >= {s.min_peers})",
          "10m", "critical", "A GPU throttles under load where its peers do not",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} spent {{ $value | humanizePercentage }} of its sustained burn "
          "in a thermal, power-brake or HW slowdown; the median of its peers (same model and pool) is under 1%."),
        a("FleetCanaryTrainStepLossWrong", "min_over_time(fleetcanary_train_step_loss_check_pass[1h]) == 0", "0m",
          "critical", "The training-step canary's loss is off its golden",
          "The canary transformer trained on GPU {{ $labels.gpu }} of {{ $labels.node }} ({{ $labels.dtype }}) ended "
          "with a loss outside its tolerance of the golden value (in the last hour)."),
        # torch's CUDA needs a newer driver than the node's (the cuda image: CUDA 13.0, R580+): every CUDA probe
        # skips driver_too_old. Any probe's skip counts, a series born counting too (counted()): no zero per probe.
        a("FleetCanaryCUDAProbesDriverTooOld",
          "max by (node) ("
          + counted('fleetcanary_probe_skips_total{reason="driver_too_old"}', "2h")
          + ") * on(node) group_left(driver_version, cuda_driver_version) "
          "max by (node, driver_version, cuda_driver_version) (fleetcanary_node_info)",
          "0m", "warning", "The GPU probes cannot run: the driver is older than the image's CUDA",
          "The CUDA probes on {{ $labels.node }} skip (driver_too_old): its driver {{ $labels.driver_version }} runs "
          "CUDA {{ $labels.cuda_driver_version }}, older than the torch of its image needs. Run the cuda12 image "
          "(tag <version>-cuda12: drivers from R525) on this node, or upgrade the driver to R580 or newer for the "
          "cuda image (docs/image.md)."),
        a("FleetCanaryExporterDown", "up{" + (s.selector or 'job="fleetcanary"') + "} == 0",
          "5m", "warning", "fleetcanary is not scraped",
          "Prometheus cannot scrape fleetcanary on {{ $labels.node }}."),
        a("FleetCanaryConfigReloadFailed", "fleetcanary_config_last_reload_successful == 0", "5m", "warning",
          "fleetcanary kept its old config", "The config reload on {{ $labels.node }} failed; the previous config "
          "keeps running."),
    ]


def inventory() -> list[dict]:
    def rec(name, expr):
        return record(name, " ".join(expr.split()))

    return [
        # one per node (a node's GPUs share a model; a mixed node reports each model): 8 fewer series per node
        rec("node:fleetcanary_gpu_model:info", "max by (node, model) (fleetcanary_gpu_info)"),
        rec("node:fleetcanary_pool:info", "max by (node, pool) (fleetcanary_node_info)"),
        # The node's NVLink domain (<cluster UUID>/<clique>: GB200 NVL72, a rack's partition): the one most of its
        # GPUs registered in (value: how many), kept for a day after none has (a fabric down, a driver reload), so
        # the alerts of a rack-wide fault still carry it. Nodes without a multi-node NVLink fabric have none.
        # One series per node whatever happened within the day (two domains held: the larger), so the alerts'
        # group_left never meets two.
        rec(NODE_DOMAIN, 'topk by (node) (1, count by (node, nvlink_domain) (fleetcanary_gpu_info{nvlink_domain!=""}) '
                         f"or on(node) last_over_time({NODE_DOMAIN}[1d]))"),
        # the daily burn's slowdown share per pool and model (joined inline: no per-GPU recorded series)
        rec("pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_median",
            f"quantile by (model, pool) (0.5, {SLOWDOWN})"),
        rec("pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_count",
            f"count by (model, pool) (count by (model, pool, node) ({SLOWDOWN}))"),
    ]
