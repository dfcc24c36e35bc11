"""Runbook text per alert, rendered into docs/runbooks.md (`python -m alerts.runbooks`, a step of scripts/generate)
from the rules alerts/build.py makes with the default settings.

Each entry: what it means, first checks, likely causes. Peer-outlier, regression and
driver-change alerts share a text per family; hard failures have their own.
"""
from __future__ import annotations

import json
import re

from fleetcanary.judge import figures as judged
from fleetcanary.judge import stats as judge_stats

FAMILY_CHECKS = {
    "gpu_memory_bandwidth": ("`fleetcanary once --probe gpu_bandwidth` on the node; "
                             "`nvidia-smi -q -d CLOCK,PERFORMANCE,POWER` for clocks, power cap and throttle reasons; "
                             "`dcgmi diag -r 2`.",
                             "HBM errors or retired pages, a lower power limit or clocks, thermal throttling, a PCIe "
                             "link trained below x16 (h2d/d2h), another tenant on the GPU."),
    "gpu_p2p_bandwidth": ("`nvidia-smi topo -m` and `nvidia-smi nvlink -s` on the node; "
                          "the `fleetcanary_gpu_p2p_link_info` series of the pair; "
                          "nvbandwidth's device_to_device tests.",
                          "An NVLink down or degraded (the pair falls back to PCIe), NVSwitch or fabric manager "
                          "trouble, ACS or IOMMU settings blocking peer access."),
    "collective_bus_bandwidth": ("The size at which it falls behind (small sizes: latency; large: bandwidth); the "
                                 "record's NCCL topology dump; `all_reduce_perf -b 8 -e 1G -f 2 -g N`.",
                                 "A degraded NVLink or PCIe path, a changed NCCL version or NCCL_* setting, GPUs in "
                                 "use by a job, a CPU affinity or NUMA change."),
    "host_memory_bandwidth": ("`fleetcanary once --probe host_memory_bandwidth`; `numactl -H`; DIMM errors in "
                              "`edac-util` or the BMC log; BIOS memory settings.",
                              "A failed or missing DIMM (fewer channels), a BIOS change (NUMA, memory speed), "
                              "noisy neighbours, CPU throttling."),
    "storage_read": ("The target's mount options and server; `fio` on the same path; the probe record's cold and "
                     "hot figures.",
                     "A degraded NVMe (SMART), a slow or overloaded NFS/PVC server, a network path problem, a full "
                     "or fragmented filesystem."),
    "storage_first_byte": ("As for storage read; first-byte latency alone points at the server or the network "
                           "rather than the disk's streaming speed.",
                           "NFS server latency, metadata server load, packet loss, DNS or connection setup delays."),
    "gpu_matmul_throughput": ("`fleetcanary once --probe gpu_compute` on the node; `nvidia-smi -q -d CLOCK,PERFORMANCE,"
                              "POWER` (clocks, power limit, throttle reasons); `dcgmi diag -r 3` (targeted stress); "
                              "the gpu_sustained figures of the same GPU.",
                              "A lower power limit or application clocks, thermal throttling, a GPU in a degraded "
                              "state after an XID, another tenant on the GPU, a changed cuBLAS or torch version."),
    "gpu_sustained_ratio": ("The burn trace in the gpu_sustained record (`/results`): clocks, power, temperature and "
                            "throttle reasons over the 20 s; the same GPU's peers on the node; `nvidia-smi -q -d "
                            "TEMPERATURE,POWER`; the BMC's fan and inlet-temperature readings.",
                            "A failing fan or blocked airflow, bad thermal contact (paste, cold plate), a power "
                            "brake asserted by the board or PSU, a lower power limit on this GPU."),
    "train_step_time": ("The train_step record (step times, loss check); `fleetcanary once --probe train_step`; the "
                        "gpu_compute figures of the same GPU; CPU load and frequency on the node (a small model's "
                        "steps are launch-bound).",
                        "A slow or throttled GPU, CPU contention or a lower CPU frequency (kernel launches), a changed "
                        "torch or driver, another tenant on the GPU."),
}

HARD = {
    "FleetCanaryProbeFailing": ("A probe ended in failure, timeout or crash three or more times in an hour.",
                                "`curl -s localhost:9835/results` for the reason and detail; the exporter's log; "
                                "`fleetcanary once --probe NAME` on the node.",
                                "A broken target (path, URL, endpoint), a driver problem that hangs NVML or CUDA, a "
                                "deadline too short for the node."),
    "FleetCanaryProbeStale": ("A probe that should run has not succeeded for three intervals and is not skipping.",
                              "`fleetcanary_probe_runs_total` by outcome for the probe; the exporter's log; whether "
                              "the exporter restarted.", "A failing probe (see FleetCanaryProbeFailing), a scheduler "
                              "stuck behind an exclusive GPU probe, a clock jump."),
    "FleetCanaryGPUsMissing": ("NVML sees fewer usable GPUs than the node should have.",
                               "`nvidia-smi -L`; `dmesg | grep -i -e xid -e nvrm`; `lspci | grep -i nvidia`.",
                               "A GPU that fell off the bus (XID 79), a failed driver load, a GPU held in reset."),
    "FleetCanaryGPULost": ("NVML enumerates the GPU but every query fails: it fell off the bus.",
                           "`nvidia-smi`; `dmesg` for XID 79 and PCIe AER errors; drain the node.",
                           "A hardware fault, power or thermal event, a PCIe riser or cable problem."),
    "FleetCanaryPCIeLinkWidthDegraded": ("The GPU's PCIe link trained narrower than its maximum (x8 instead of x16).",
                                         "`nvidia-smi -q -d PCIE`; `lspci -vv` LnkSta against LnkCap; reseat at the "
                                         "next maintenance.", "A badly seated card or riser, a damaged slot or cable."),
    "FleetCanaryPCIeLinkGenerationDegraded": ("A busy GPU's PCIe link runs below its maximum generation.",
                                              "`nvidia-smi -q -d PCIE` under load; BIOS PCIe settings; AER errors.",
                                              "Signal-integrity problems forcing a lower speed, a BIOS setting, a "
                                              "riser limiting the generation."),
    "FleetCanaryNVLinkDown": ("Fewer of the GPU's NVLink links are active than it has (the exporter publishes the "
                              "counts per GPU; the description says how many of how many).",
                              "`nvidia-smi nvlink -s` on the node for which link is inactive (or the gpu_health "
                              "record at `/results`, its `nvlinks` per GPU; per-link series with gpu_health's "
                              "`per_link: true`) and `-e` for its error counters; fabric manager status "
                              "(`systemctl status nvidia-fabricmanager`).",
                              "A failed link or NVSwitch port, fabric manager not running, a GPU needing a reset. "
                              "A GPU that answers no NVLink query at all (nvidia-smi: all links are inactive) "
                              "shows all its links down."),
    "FleetCanaryGPUFabricNotReady": ("The GPU has an NVLink fabric (NVSwitch: HGX with the fabric manager, GB200 NVL72 "
                                     "with NVLink management) and has not completed its registration with it for 5 "
                                     "minutes (fabric_state not_started or in_progress), completed it with an error "
                                     "status or an unhealthy health mask (unhealthy: degraded bandwidth, an unhealthy "
                                     "route, no partition assigned, a wrong configuration), or its state could not "
                                     "be read (unknown). On GB200 a GPU that is not registered cannot run CUDA work "
                                     "across the rack. The alert carries the NVLink domain; several nodes of one "
                                     "domain also fire FleetCanaryNVLinkDomainDegraded, in the same notification.",
                                     "`nvidia-smi -q | grep -A 8 -i fabric` (State, Status, CliqueId, ClusterUUID, "
                                     "Health) on the node, or the gpu_health record at `/results` (`fabric` per GPU, "
                                     "with the decoded health mask); the fabric manager (HGX: `systemctl status "
                                     "nvidia-fabricmanager`, its log /var/log/fabricmanager.log) or, on NVL72, "
                                     "the NVLink switch trays' NMX and the IMEX daemon (`systemctl status "
                                     "nvidia-imex`, `nvidia-imex-ctl -N`); `dmesg | grep -i -e nvrm -e sxid`. With "
                                     "per-fault node conditions the node carries FleetCanaryGPUFabricNotReady with "
                                     "the evidence.",
                                     "The fabric manager or NVLink management not running or not reaching the GPU, "
                                     "an NVSwitch or switch-tray fault, a GPU needing a reset, a partition not "
                                     "configured for the tray, mismatched GPU and switch firmware."),
    "FleetCanaryGPUFabricCliqueMismatch": ("The GPU registered in another NVLink domain (cluster UUID or clique) "
                                           "than most GPUs of its node: it left its clique and cannot reach its "
                                           "rack's partition over NVLink, while its node looks healthy otherwise. "
                                           "`gpu_domain` is the GPU's, `nvlink_domain` its node's.",
                                           "`nvidia-smi -q | grep -A 8 -i fabric` on the node for each GPU's "
                                           "CliqueId and ClusterUUID; the rack's NVLink partition configuration "
                                           "(NMX); whether the GPU was reset or re-registered alone.",
                                           "A partition change applied to part of a tray, a GPU reset that "
                                           "re-registered it elsewhere, a switch-tray fault on the GPU's links."),
    "FleetCanaryNVLinkDomainDegraded": ("At least `nvlink_domain_min_nodes` (2) nodes of one NVLink domain "
                                        "(GB200 NVL72: a rack's 18 compute trays sharing a cluster UUID and clique) "
                                        "have GPUs whose fabric is not ready or whose NVLinks are down. That is a "
                                        "fault of the domain, not of each node: one page, grouped by the Alertmanager "
                                        "example with the per-GPU alerts that name the nodes. The value is how many "
                                        "nodes.",
                                        "The rack's NVLink switch trays and NMX (NVLink management) status; on "
                                        "the compute trays `systemctl status nvidia-imex` and `nvidia-imex-ctl -N`; "
                                        "`nvidia-smi -q | grep -A 8 -i fabric` on two of the nodes; the rack's "
                                        "power and cooling events. Do not drain the nodes one by one for it.",
                                        "An NVLink switch tray down or rebooting, NVLink management (NMX) or the "
                                        "fabric manager stopped, a partition reconfiguration, rack power or a "
                                        "firmware update of the switch trays."),
    "FleetCanaryGPUCriticalXid": ("The GPU reported an XID that the XID catalogue (docs/xid-catalogue.md, from "
                                  "NVIDIA's XID documentation) classes as critical and hardware, memory, bus or "
                                  "nvlink; the alert's `class` label says which. Seen by the exporter's continuous "
                                  "XID watch (the kernel log or NVML's events, all the time) or by gpu_health's event "
                                  "wait. A `gpu` label `pci:<bus id>` is a GPU whose facts the exporter had not "
                                  "read yet.",
                                  "The code's first action in docs/xid-catalogue.md (the description links it); "
                                  "`dmesg | grep -i -e xid -e sxid` for the line (the exporter's log quotes it, with "
                                  "the process, the NVLink link, 154's recovery action); with per-fault node "
                                  "conditions the node carries FleetCanaryGPUHardwareXid with the evidence. "
                                  "`rate(fleetcanary_gpu_xid_watch_seconds_total[5m])` near 1 means the node was "
                                  "watched all the time (about 0.03: gpu_health's waits only).",
                                  "Memory errors (48, 94, 95, 140: class memory), a fallen-off GPU (79: bus), NVLink "
                                  "errors (74, 144-150: nvlink), GSP or micro-controller faults (61, 62, 119, 120: "
                                  "hardware). A site that knows a code to be benign here sets `xid.overrides`."),
    "FleetCanaryGPUXidWarning": ("The GPU reported an XID of class driver or thermal, or a warning-level code of "
                                 "another class (not application): worth a ticket, not a page.",
                                 "The code's first action in docs/xid-catalogue.md; `dmesg | grep -i xid`; whether it "
                                 "repeats on this GPU or across the pool (a driver version?).",
                                 "A driver or firmware problem (32, 38), a high corrected-error rate (92), a row "
                                 "remap waiting for a reset (63), a code the catalogue does not list (class "
                                 "unknown)."),
    "FleetCanaryGPUApplicationXidRepeated": ("An application-class XID (13, 31, 43, 109 ...: usually the job's "
                                             "own fault) came from several different processes on this one GPU "
                                             "within the window (xid.escalate_processes, default 3 in an hour): "
                                             "different jobs fail the same way on the same GPU, so the GPU is the "
                                             "common factor. One job failing repeatedly does not escalate.",
                                             "The exporter's log (each XID with its pid and process name); drain "
                                             "the node and run `dcgmi diag -r 3` on the GPU; reset it; compare "
                                             "the GPU's other series (ECC, row remapping, throttling).",
                                             "A marginal GPU (SM or memory) faulting under load, a driver bug hit "
                                             "by every job on this GPU."),
    "FleetCanaryGPUUncorrectableECC": ("The GPU counted uncorrectable ECC errors.",
                                       "`nvidia-smi -q -d ECC,ROW_REMAPPER`; drain and reset to apply remapping.",
                                       "Failing HBM; repeated errors mean an RMA."),
    "FleetCanaryGPURowRemapPending": ("A row remapping waits for a GPU reset.",
                                      "`nvidia-smi -q -d ROW_REMAPPER`; schedule a drain and GPU reset.",
                                      "A recent uncorrectable or repeated correctable memory error."),
    "FleetCanaryGPURowRemapFailed": ("The GPU could not remap a row: its spare rows are used up or remapping failed.",
                                     "`nvidia-smi -q -d ROW_REMAPPER`; drain the node; open an RMA.", "Failing HBM."),
    "FleetCanaryCollectiveWrongResult": ("A collective returned wrong data: silent data corruption on the node.",
                                         "Drain the node at once; the record names the collective, size and rank; run "
                                         "nccl-tests with `-c 1`; `dcgmi diag -r 3`.",
                                         "A faulty GPU, NVLink or PCIe path corrupting data; a broken NCCL build."),
    "FleetCanaryGPUWrongResult": ("The GPU's deterministic canary products differ bitwise from the golden that a "
                                  "majority of same-model GPUs on the same driver and software stack agreed on: "
                                  "silent data corruption.",
                                  "Drain the node at once; the gpu_compute record names the GPU, its checksum and the "
                                  "golden; rerun `fleetcanary once --probe gpu_compute`; `dcgmi diag -r 3`; "
                                  "`nvidia-smi -q -d ECC,ROW_REMAPPER`.",
                                  "A faulty SM or tensor core, marginal HBM or voltage; repeated mismatches mean "
                                  "an RMA."),
    "FleetCanaryGPUSDCNoConsensus": ("The SDC canary could not judge: the GPUs split with no strict majority, or all "
                                     "agree with each other against the stored golden.",
                                     "The gpu_compute record's `sdc.groups` (which GPUs produced which checksum); "
                                     "whether torch, CUDA or cuBLAS changed without the key noticing; rerun once.",
                                     "A software change that alters algorithm choice (delete the stale entry of "
                                     "state_dir/sdc_golden.json after checking), or several faulty GPUs."),
    "FleetCanaryGPUThrottlingUnlikePeers": ("The GPU spent more than 5% of its sustained burn in a thermal, "
                                            "power-brake or HW slowdown while the median of its peers is under 1%.",
                                            "The burn trace in the gpu_sustained record; `nvidia-smi -q -d "
                                            "PERFORMANCE,TEMPERATURE`; the BMC's fan and inlet readings.",
                                            "A failing fan, bad thermal contact, a power brake from the board or "
                                            "PSU, a blocked air path in this slot."),
    "FleetCanaryTrainStepLossWrong": ("The canary transformer's loss after K steps is outside its dtype's tolerance "
                                      "of the golden: the GPU or the stack computes training wrongly.",
                                      "The train_step record (loss, golden, deviation); rerun `fleetcanary once "
                                      "--probe train_step`; the gpu_compute SDC verdict of the same GPU.",
                                      "Silent data corruption, a broken torch/cuDNN/cuBLAS build, a changed "
                                      "default (TF32, autocast) in a new torch."),
    "FleetCanaryInferenceErrors": ("More than 10% of canary requests to the endpoint failed in 15 minutes.",
                                   "`fleetcanary_inference_requests_total` by outcome (429: overload; 5xx: server; "
                                   "connect_error/timeout: network); the serving engine's log.",
                                   "Overload, a crashed replica, an expired token (http_4xx), a network problem."),
    "FleetCanaryInferenceTTFTSLOBreach": ("p95 TTFT of canary requests is over its bound (2 s).",
                                          "The engine's queue length and batch size; the prefix-cache ratio; other "
                                          "nodes' view of the same target.", "Overload or a queue build-up, prefill "
                                          "contention, a cold cache after a restart."),
    "FleetCanaryInferenceTTFTSlowerThanPeers": (
        "The p95 time to first token of this node's canary requests to an endpoint is 10% or more above the median "
        "of the pool's nodes calling the same endpoint and model, with 5 or more of them: the endpoint serves the "
        "others well, so the cause is on this node's side.",
        "The node's network path to the endpoint (`curl -w '%{time_connect} %{time_starttransfer}'` from the pod); "
        "its DNS resolution; CPU throttling of the fleetcanary pod.",
        "A degraded NIC or route, DNS delays, a throttled or overloaded node."),
    "FleetCanaryInferenceITLSLOBreach": ("p95 inter-token latency is over its bound (200 ms).",
                                         "The engine's running batch size and KV-cache use; GPU clocks of the serving "
                                         "nodes.", "Decode batches too large for the GPU, KV-cache pressure and "
                                         "preemption, a throttled GPU."),
    "FleetCanaryInferenceQualityFailing": ("A golden prompt at temperature 0 got a wrong answer.",
                                           "The record's answer text for the check; the model, quantization and "
                                           "engine version deployed.", "A wrong model or adapter loaded, a broken "
                                           "quantization, a tokenizer or chat-template change."),
    "FleetCanaryInferenceOutputChanged": ("The greedy output differs from the first seen for this model.",
                                          "What changed in the deployment: engine version, kernels, quantization, "
                                          "batching settings.", "An intended upgrade (then ignore), or numerics "
                                          "changed by a kernel or quantization change."),
    "FleetCanaryCUDAProbesDriverTooOld": (
        "torch in the node's image needs a newer NVIDIA driver than the node runs, so every CUDA probe skips "
        "(reason driver_too_old): the node's GPUs go unmeasured. The exporter, its NVML readings and the hard-failure "
        "alerts still work.",
        "The alert's driver_version and cuda_driver_version (`nvidia-smi`: Driver Version, CUDA Version); the image "
        "the pod runs (`kubectl -n fleetcanary get pod -o wide`, its tag) and the skip's detail in "
        "`curl -s localhost:9835/results`, which names the CUDA torch needs; the driver and GPU matrix in "
        "docs/image.md.",
        "The cuda image (torch for CUDA 13.0, R580 or newer) on a node with an R535, R550 or R570 driver: run the "
        "cuda12 image there (tag <version>-cuda12, torch for CUDA 12.8, drivers from R525; a kustomize `images:` "
        "override for those nodes, docs/image.md), or upgrade the driver. A driver older than R525 runs neither "
        "image."),
    "FleetCanaryExporterDown": ("Prometheus cannot scrape fleetcanary on the node.",
                                "`kubectl -n fleetcanary get pods -o wide`; the pod's logs and events.",
                                "The pod crashed or was evicted, a network policy, the node is down."),
    "FleetCanaryConfigReloadFailed": ("A config reload failed; the previous config keeps running.",
                                      "`fleetcanary check-config FILE`; the exporter's log names the field.",
                                      "An invalid edit of the ConfigMap."),
}


WORSE = {False: "below", True: "slower than"}


def peer_text(title: str, key: str, lower: bool, k_mad: float, history: bool) -> tuple[str, str, str]:
    checks, causes = FAMILY_CHECKS[key]
    runs = judge_stats.median_words(judged.BY_KEY[key])
    change = (f"**path=change**: its change against its own baseline (the exporter's `fleetcanary_judge_change`: "
              f"its level, the median of its newest {runs} each taken hour for hour (over the node's own daily "
              "swing at its time of day), over its best day on its driver in the last 14 days; every node publishes "
              "the same statistic, so the peers' median carries no premium) is worse than its peers' median change "
              f"by the figure's floor and by more than {k_mad:g} median absolute deviations of the peers' change "
              "ratios; the peers share pool, model, driver and series, and at least 5 nodes report. With baseline="
              "previous_driver the same comparison runs, for two weeks after a driver change, against the nodes "
              "upgraded the same way (the driver's own effect cancels). Once firing it holds while its change stays "
              "worse than the peers' median change by half the floor, through a gap of up to 6 h in its figure (an "
              "exporter restart; across a driver change the old driver's figures stay published until the new one "
              "has a median), so a steady fault stays one episode; it resolves once the node has been back within "
              "half the floor of its peers for the span of its median's runs (7 probe intervals) of fresh runs: "
              "while the GPU is busy, and for that span after, it holds. " if history else "")
    return (f"The {title} of this GPU or node is {WORSE[lower]} its peers. {change}**path=level**: its median of "
            f"{runs} is 10% or more {WORSE[lower]} the peers' median figure and by more than 5 MADs (a new member "
            "without a baseline, or a GPU that was always slow); once firing it holds while the figure is still 5% "
            "under the peers'. The label `path` says which fired; the description "
            "gives the figure, its own change and the peers' median. Each GPU is judged against itself first, so "
            "a persistent manufacturing offset does not count on the change path." + quiet_text(key),
            "`curl -s localhost:9835/metrics | grep fleetcanary_judge` for the "
            "node's own statistics; " + checks, causes)


def quiet_text(key: str) -> str:
    fig = judged.BY_KEY[key]
    if not fig.quiet_noise:
        return ""
    return (f" A quiet series is one whose own run-to-run noise (measured by the exporter over its complete days "
            f"on this driver) is under {fig.quiet_noise:.1%}: its median moves on the third bad run of "
            f"{judge_stats.QUIET_MEDIAN_RUNS} (docs/alerting.md, \"Quiet series\").")


def fast_text(title: str, key: str, lower: bool) -> tuple[str, str, str]:
    checks, causes = FAMILY_CHECKS[key]
    runs = judge_stats.median_words(judged.BY_KEY[key])
    return (f"The best of the newest 3 runs of this GPU or node's {title} (`fleetcanary_judge_newest`) is 15% or "
            f"more {WORSE[lower]} the median figure of its peers and by more than 5 MADs: all three runs are that "
            "bad, which two junk runs in a row cannot make. Once firing the page holds while its median of "
            f"{runs} is still 7.5% {WORSE[lower]} the peers' (half the threshold), through a gap of up to 6 h in its "
            "figure, so one lucky run of a GPU that is still slow does not resolve it and a fault at the threshold "
            "pages once. After a run whose figure jumped the exporter runs the probe again minutes later, up to "
            "three times while each run confirms the jump, so the three runs usually come within minutes of the "
            "first.", checks, causes)


def fast_history_text(title: str, key: str, lower: bool) -> tuple[str, str, str]:
    checks, causes = FAMILY_CHECKS[key]
    return (f"The {title}'s level is 15% or more {'above' if lower else 'below'} its own best day on this "
            "driver, and fewer than 5 peer nodes report in its group, so the peer fast path cannot judge it (a small "
            "pool, or one whose members are mostly busy). Every GPU of a small pool firing at once points at "
            "something they share (a firmware or BIOS change, cooling, power).",
            "Compare with the other members of the pool, and with its runs before the drop. " + checks, causes)


def drift_text(title: str, key: str, lower: bool) -> tuple[str, str, str]:
    checks, causes = FAMILY_CHECKS[key]
    return (f"The median of the last day of runs of the {title} is 4% or more {'above' if lower else 'below'} its "
            "best day on the current driver in the last 14 days (`fleetcanary_judge_drift`; the runs taken hour for "
            f"hour, and only from a day of enough runs that its median's error is 0.5% or less): a slow "
            f"{'rise' if lower else 'decline'} (a fan slowly failing, dust, a creeping thermal problem). Once firing "
            "it holds while the drift is 2% or more.",
            "Plot `fleetcanary_judge_drift` and the raw figure over two weeks; compare with its peers. " + checks,
            causes)


def regression_text(title: str, key: str, lower: bool = False) -> tuple[str, str, str]:
    checks, causes = FAMILY_CHECKS[key]
    return (f"The {title}'s level is {'above' if lower else 'below'} its own best day on this driver in the "
            "last 14 days by its floor (10%; 5% for GPU memory bandwidth) or more. It needs no peers, and it keeps "
            "firing while the fault lasts: the best day does not absorb a fault the GPU keeps; once firing it holds "
            "until the change is back within half its floor.", checks, causes)


def driver_text(title: str, key: str, lower: bool = False) -> tuple[str, str, str]:
    checks, causes = FAMILY_CHECKS[key]
    return (f"The {title} {'rose' if lower else 'dropped'} by its floor (10%; 5% for GPU memory bandwidth) or more "
            "against its best day on the previous driver, in the two weeks after a driver change on this node: the "
            "guide's before/after upgrade check.",
            "Compare with nodes still on the old driver (`fleetcanary_judge_change{baseline=\"previous_driver\"}` "
            "of the other upgraded nodes); `fleetcanary compare` on the result histories before and after. " + checks,
            "A driver regression, changed default clocks or power management, a mismatched CUDA or NCCL stack. "
            + causes)


def _texts(name: str, labels: dict, figures: dict):
    from . import rules_coverage, rules_fabric, rules_nic

    if name in HARD:
        return HARD[name]
    if name in rules_nic.RUNBOOKS:
        return rules_nic.RUNBOOKS[name]
    if name in rules_fabric.RUNBOOKS:
        return rules_fabric.RUNBOOKS[name]
    if name in rules_coverage.RUNBOOKS:
        return rules_coverage.RUNBOOKS[name]
    f = figures[labels["figure"]]
    lower = not f.higher_is_better
    path = labels.get("path")
    if path == "fast":
        return fast_text(f.title, f.key, lower)
    if path == "own_fast":
        return fast_history_text(f.title, f.key, lower)
    if path == "drift":
        return drift_text(f.title, f.key, lower)
    if path == "driver_change":
        return driver_text(f.title, f.key, lower)
    if path == "regression":
        return regression_text(f.title, f.key, lower)
    return peer_text(f.title, f.key, lower, f.k_mad, f.history)


READING = [
    "## Reading a judged alert", "",
    "Every alert on a judged figure (the `figure` and `path` labels) says five things in its description: the "
    "figure and the series (node, GPU, series), the node's value (its median; for the fast path the best of its "
    "newest 3 runs), the peers' median (same pool, model, driver and series), its baseline (its change against "
    "its best day, on the driver named) and the path that fired. What the path means is in the alert's section "
    "below.", "",
    "`$value` (the percentage in the description) is always the path's **gap**: how far the node is worse than "
    "what the path compares it with (1 - ratio; ratio - 1 for a lower-is-better figure such as latency or step "
    "time). A path fires when the gap is past its floor and, for the peer paths, past k MADs of the peers' ratios "
    "too: `gap > max(floor, k * MAD)`. Once firing, it **holds** while the same gap stays past half the floor "
    "(the fast path: while its median's gap does, or while the GPU has had no fresh run the gap of the newest "
    "runs that paged, `fleetcanary_judge_newest_held`; its `$value` stays the newest runs' gap), and through a gap of "
    "up to `hold_gap` (6 h) in the figure it reads the value recorded while it fired "
    "(`node:fleetcanary_judge_<statistic>:held_<group>`): a steady fault at a threshold is one episode, not many. "
    "A warning's hold reads the worst value recorded over the span of its median's runs (7 probe intervals, at "
    "most 6 h), so it resolves once the gap has stayed under half the floor that long, not at the first lucky "
    "median, and it holds whatever that reads while its GPU has had no fresh run "
    "(`fleetcanary_judge_held_last_run_timestamp_seconds`: the statistics are frozen, not recovered; a day at most) "
    "and for that span after. "
    "The hold is the expression's last lines, after `# hold:`.", ""]
NAMESPACE, PORT, CONFIG = "fleetcanary", 9835, "/etc/fleetcanary/config.yaml"  # as deploy/ ships them
IN_POD = re.compile(r"`(fleetcanary once|nvidia-smi)([^`]*)`( on the node)?")
REACH = [
    "## Reaching a node's exporter", "",
    "The first checks below run against deploy/ as shipped (tests/test_runbooks.py checks each against the "
    "rendered manifests). NODE is the alert's `node` label; the exporter pod on it (its DaemonSet's label and "
    "the node: a claim pod of scheduled runs on the same node is labelled `app.kubernetes.io/name="
    "fleetcanary-claim` and is not found):", "",
    "```sh",
    f"POD=$(kubectl -n {NAMESPACE} get pod -l app.kubernetes.io/name=fleetcanary --field-selector "
    "spec.nodeName=NODE -o name)",
    f"kubectl -n {NAMESPACE} logs $POD                  # the exporter's log",
    f"kubectl -n {NAMESPACE} port-forward $POD {PORT} &   # then, from your machine:",
    f"curl -s localhost:{PORT}/results                    # each probe's last run record: reason, detail, figures",
    f"curl -s localhost:{PORT}/metrics | grep fleetcanary_judge   # the node's own statistics",
    "```", "",
    "A fresh run of a probe is asked of the exporter itself, through the port-forward: "
    f"`curl -s -X POST -d '{{\"probe\": \"gpu_bandwidth\"}}' localhost:{PORT}/confirm` answers an id, and "
    f"`curl -s localhost:{PORT}/confirm/ID` says `pending` until the run has ended, then its outcome and figures "
    "(add `-u USER` where the web config asks for basic auth). The run goes through the exporter's scheduler: it "
    "measures only the GPUs no pod holds, keeps to the GPU budget, and waits for the probe's exclusive class, "
    "so it never lands on a tenant's job. It needs `server.confirm_requests: true` (off by default: "
    "docs/remediation.md, \"Confirming runs\"). `fleetcanary once` in the exporter's container "
    f"(`kubectl -n {NAMESPACE} exec $POD -- fleetcanary once -c {CONFIG} --probe NAME`) runs a probe at once, "
    "outside both: only on a node drained of tenants (`kubectl drain NODE --ignore-daemonsets`).", "",
    "`nvidia-smi` runs in the exporter's container (the NVIDIA runtime mounts it); other tools (`dmesg`, "
    "`lspci`, `ibstat`, `dcgmi`, nccl-tests) run on the node itself, over ssh or `kubectl debug node/NODE -it "
    "--image=<an image with the tool>`; DCGM is not in fleetcanary's image (the GPU operator's nvidia-dcgm pod "
    "has `dcgmi`). `dcgmi diag -r 2` and `-r 3` stress every GPU of the node for minutes: drain the node first, "
    "and `kubectl uncordon NODE` after.", ""]
DIAG = re.compile(r"`dcgmi diag -r (\d)`")


def runnable(text: str) -> str:
    """A check as the operator runs it: a probe's fresh run asked of the exporter (its scheduler keeps off the
    tenants' GPUs and to the budget), nvidia-smi in the exporter's container, DCGM's stress levels after a drain."""
    def sub(m: re.Match) -> str:
        cmd, args = m.group(1), m.group(2)
        if cmd == "fleetcanary once":
            probe = re.search(r"--probe (\S+)", args)
            body = json.dumps({"probe": probe.group(1) if probe else "NAME"})
            return f"`curl -s -X POST -d '{body}' localhost:{PORT}/confirm` (a fresh run; see above)"
        return f"`kubectl -n {NAMESPACE} exec $POD -- {cmd}{args}`"

    def with_drain(t: str) -> str:
        out, at = [], 0
        for m in DIAG.finditer(t):
            said = "drain" in t[max(0, m.start() - 40):m.start()]  # "drain the node and run ..." already
            out += [t[at:m.end()], "" if m.group(1) == "1" or said else
                    " (drain the node first: `kubectl drain NODE --ignore-daemonsets`)"]
            at = m.end()
        return "".join(out) + t[at:]
    return with_drain(IN_POD.sub(sub, text))


def markdown(alerts: dict, figure_rules) -> str:
    """docs/runbooks.md: one section per alert name (the change and level paths of a peer alert share one).
    figure_rules: alerts/build.py's FIGURES."""
    figures = {f.key: f for f in figure_rules}
    out = ["# Runbooks", "", "Generated by alerts/runbooks.py from its text and the rules; do not edit. One section "
           "per alert: what it means, the first checks, the likely causes, and its expression(s).", "",
           *READING, *REACH]
    seen: dict[str, list[str]] = {}
    first: dict[str, dict] = {}
    for group in alerts["groups"]:
        for a in group["rules"]:
            if "alert" not in a:
                continue
            seen.setdefault(a["alert"], []).append(a["expr"])
            first.setdefault(a["alert"], a)
    for name, exprs in seen.items():
        a = first[name]
        meaning, checks, causes = _texts(name, a["labels"], figures)
        out += [f"## {name}", "", f"Severity: {a['labels']['severity']}. Fires after {a.get('for', '0m')}.", "",
                f"**What it means.** {meaning}", "", f"**First checks.** {runnable(checks)}", "",
                f"**Likely causes.** {causes}", ""]
        for expr in dict.fromkeys(exprs):
            out += ["```promql", expr.rstrip(), "```", ""]
    return "\n".join(out)


def main() -> int:
    """Write docs/runbooks.md beside this checkout's alerts/ from the default rules."""
    from pathlib import Path

    from fleetcanary.rules import build

    out = Path(__file__).resolve().parent.parent / "docs" / "runbooks.md"
    out.write_text(markdown(build.build()[1], build.FIGURES))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
