"""Runbook text per alert, rendered into docs/runbooks.md by alerts/build.py.

Each entry: what it means, first checks, likely causes. Peer-outlier, regression and
driver-change alerts share a text per family; hard failures have their own.
"""
from __future__ import annotations

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
    "inference_ttft": ("The canary's `/results` record for the target; the serving engine's queue and KV-cache "
                       "metrics; whether the slow node sits behind a different endpoint replica or network path.",
                       "An overloaded replica, a cold prefix cache, a network path with loss, a proxy in the path."),
}

HARD = {
    "FleetCanaryProbeFailing": ("A probe ended in failure, timeout or crash three or more times in an hour.",
                                "`curl NODE:9835/results` for the reason and detail; the exporter's log; `fleetcanary "
                                "once --probe NAME` on the node.",
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
    "FleetCanaryNVLinkDown": ("An NVLink of the GPU is inactive.", "`nvidia-smi nvlink -s` and `-e`; fabric manager "
                              "status (`systemctl status nvidia-fabricmanager`).",
                              "A failed link or NVSwitch port, fabric manager not running, a GPU needing a reset."),
    "FleetCanaryGPUCriticalXid": ("The GPU reported a critical XID during the probe's event watch.",
                                  "`dmesg | grep -i xid`; NVIDIA's XID catalogue for the code; drain if it repeats.",
                                  "Memory errors (48, 63, 64, 94, 95), a fallen-off GPU (79), NVLink errors (74), "
                                  "GSP firmware errors (119, 120)."),
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
    "FleetCanaryExporterDown": ("Prometheus cannot scrape fleetcanary on the node.",
                                "`kubectl -n fleetcanary get pods -o wide`; the pod's logs and events.",
                                "The pod crashed or was evicted, a network policy, the node is down."),
    "FleetCanaryConfigReloadFailed": ("A config reload failed; the previous config keeps running.",
                                      "`fleetcanary check-config FILE`; the exporter's log names the field.",
                                      "An invalid edit of the ConfigMap."),
}


def peer_text(family_title: str, key: str, lower: bool, k_mad: int = 7, history: bool = True) -> tuple[str, str, str]:
    checks, causes = FAMILY_CHECKS[key]
    worse = "slower than" if lower else "below"
    if not history:
        return (f"The smoothed {family_title} of this node or GPU (the median of its window) is 10% or more {worse} "
                f"its peers' median (same model or pool) and more than {k_mad:g} median absolute deviations of the "
                "peers' ratios, with 5 or more peer nodes.", checks, causes)
    return (f"Over its last 5 runs, the {family_title} of this node or GPU changed against its own baseline (its "
            f"median over about the previous 3 days) by more than its peers' changes (same GPU model, pool and "
            f"driver, same size or direction), {worse} them by at least the family's floor and by more than {k_mad:g} "
            "median absolute deviations of the peers' changes, with 5 or more peer nodes; in the 2 days after a "
            "driver upgrade, its change against the previous driver's baseline judged the same way against the "
            f"other upgraded nodes'; or it is 10% or more {worse} its peers' median outright (a member without a "
            "baseline, or a persistent outlier). Its newest runs confirm it: the best of them is also at least half "
            "the floor worse. Because each GPU is judged against itself, a GPU's persistent manufacturing offset "
            "does not count.", checks, causes)


def fast_text(family_title: str, key: str, lower: bool) -> tuple[str, str, str]:
    checks, causes = FAMILY_CHECKS[key]
    return (f"The {family_title} of this node or GPU was {'15% or more slower than' if lower else '15% or more below'} "
            "the median of its peers in each of its last three runs, which agree with each other (a confirmed new "
            "level, not scattered junk runs). The exporter runs the probe again a few minutes after a run whose "
            "figure jumped (fleetcanary_probe_confirmation_runs_total), so the three runs usually span about one "
            "probe interval: a large drop, reported about an interval after the first bad run instead of waiting "
            "for a 5-run median.", checks, causes)


def fast_history_text(family_title: str, key: str, lower: bool) -> tuple[str, str, str]:
    checks, causes = FAMILY_CHECKS[key]
    return (f"The {family_title} of this node or GPU was 15% or more {'above' if lower else 'below'} its own median "
            "over about the previous 3 days (on the driver it runs now) in each of its last three runs (the "
            "exporter's confirmation run among them), which agree with each other, and fewer than 5 peer nodes "
            "report in its group, so the peer fast path cannot judge it: a large drop in a small pool, reported "
            "about an interval after the first bad run. Every GPU of a small pool "
            "firing at once points at something they share (a firmware or BIOS change, cooling, power).",
            "Compare with the other members of the pool, and with its runs before the drop. " + checks, causes)


def drift_text(family_title: str, key: str, lower: bool) -> tuple[str, str, str]:
    checks, causes = FAMILY_CHECKS[key]
    return (f"The {family_title}'s median over the last day is 4% or more {'above' if lower else 'below'} its best "
            "day on the current driver in the last 14 days: a slow drift that the 3-day history and the peer "
            "comparison follow along and cannot see (a fan slowly failing, dust, a creeping thermal problem).",
            "Plot the daily medians of the series over two weeks; compare with its peers' daily medians. " + checks,
            causes)


def regression_text(family_title: str, key: str, lower: bool = False) -> tuple[str, str, str]:
    checks, causes = FAMILY_CHECKS[key]
    return (f"The {family_title} is {'above' if lower else 'below'} its own median over about the previous 3 days "
            "by its floor (10%; 5% for GPU memory bandwidth) or more, and the driver did not change in that time. "
            "This is the alert that still works in a pool too small for peer comparison.", checks, causes)


def driver_text(family_title: str, key: str, lower: bool = False) -> tuple[str, str, str]:
    checks, causes = FAMILY_CHECKS[key]
    return (f"The {family_title} {'rose' if lower else 'dropped'} by its floor (10%; 5% for GPU memory bandwidth) "
            "or more against its "
            "median from before a driver change on this node "
            "in the last day: the guide's before/after upgrade check.",
            "Compare with nodes still on the old driver (`fleetcanary_node_info` by driver_version); `fleetcanary "
            "compare` on the result histories before and after. " + checks,
            "A driver regression, changed default clocks or power management, a mismatched CUDA or NCCL stack. "
            + causes)
