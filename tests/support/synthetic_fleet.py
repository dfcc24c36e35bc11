"""A small synthetic GPU fleet as OpenMetrics, for queries no CPU-only machine can feed live.

6 HGX-H100-like nodes x 8 GPUs, one pool, 8 hours at a 5-minute step: GPU identity and
node info, memory bandwidth per direction, the P2P matrix, PCIe and NVLink state and
errors, XIDs, ECC, row remaps, GPU probe time, NCCL collective sweeps, the compute
canaries (matmul FLOP/s per dtype, the SDC verdict, the last sustained burn, the training
step) and a firing ALERTS series. One GPU is 8% slow, one NVLink is down, one GPU computes
10% slower matmuls, one gives a wrong SDC checksum, one throttles in the burn and one trains
5% slower, so worst-N panels have a worst. Coverage: node 4's GPUs 0-2 are held by a pod after the
first hour. nic_health's RDMA ports and interface (nic()): node 2 has a downtrained port and one
counting symbol errors, and its state disk filled for an hour (the exporter's error counters).

The compute figures are placeholders, not measurements: matmul 7.8e14 FLOP/s (the bf16
figure issue #19 reports for the H200 lent to the project, used for every dtype), the burn's
clocks, power, temperature and throttle times from the constructed trace
probes/testing/nvml_facts/h100_8gpu_sustained_trace.json (a healthy GPU at the 700 W cap from a
quarter of the burn, SM 1755 MHz; the hot one in thermal slowdown for 60% of it, SM 1410 MHz,
92 C), its throughput ratio taken as the SM clock over the 1980 MHz it starts at, and the
training step of the promtool tests (4 ms) with a passing loss check (deviation 0, a placeholder).
"""
from __future__ import annotations

import math
import random
from pathlib import Path

NODES = [f"gpu-node-{i:02d}" for i in range(6)]
GPUS = range(8)
STEP = 300
HOURS = 8
D2D, H2D = 3.0e12, 5.3e10
SIZES = (1024, 1048576, 67108864)
MATMUL = 7.8e14
SM_START, SM_TAIL, SM_HOT, MEM = 1980e6, 1755e6, 1410e6, 2619e6
STEP_SECONDS = 0.004
SDC_STATUSES = ("match", "mismatch", "no_consensus", "unjudged")


def nic(add, node: str, n: int, steps: int) -> None:
    """nic_health's series: four NDR ports per node (node 2's mlx5_2 trained at 2X, 200 Gb/s, and its
    mlx5_1 counting symbol errors), one RoCE storage interface."""
    for d in range(4):
        pl = {"node": node, "device": f"mlx5_{d}", "port": "1"}
        slow = (n, d) == (2, 2)
        add("fleetcanary_rdma_port_up", "gauge", pl, [1] * steps)
        add("fleetcanary_rdma_port_rate_bytes_per_second", "gauge", pl, [(200e9 if slow else 400e9) / 8] * steps)
        add("fleetcanary_rdma_port_expected_rate_bytes_per_second", "gauge", pl, [400e9 / 8] * steps)
        width = "2" if slow else "4"
        add("fleetcanary_rdma_port_info", "gauge", {**pl, "link_layer": "InfiniBand", "link_width": width},
            [1] * steps)
        add("fleetcanary_rdma_port_rate_below_expected", "gauge", pl, [1 if slow else 0] * steps)
        for counter in ("symbol_error", "link_downed"):
            rising = (n, d, counter) == (2, 1, "symbol_error")
            add("fleetcanary_rdma_port_errors_total", "counter", {**pl, "counter": counter},
                [3 * k if rising else 0 for k in range(steps)])
        add("fleetcanary_rdma_port_hw_events_total", "counter", {**pl, "counter": "out_of_buffer"},
            list(range(steps)))
    il = {"node": node, "interface": "ens1f0np0"}
    add("fleetcanary_net_interface_up", "gauge", il, [1] * steps)
    add("fleetcanary_net_interface_carrier_changes_total", "counter", il, [2] * steps)
    for direction in ("rx", "tx"):
        add("fleetcanary_net_interface_errors_total", "counter", {**il, "direction": direction}, [0] * steps)
        add("fleetcanary_net_interface_dropped_total", "counter", {**il, "direction": direction},
            [5 * k if direction == "rx" else 0 for k in range(steps)])


def write(path: Path, end: int) -> tuple[int, int]:
    """Write the fleet ending at unix time `end`; returns (start, end)."""
    rng = random.Random(7)
    steps = HOURS * 3600 // STEP
    start = end - (steps - 1) * STEP
    ts = [start + k * STEP for k in range(steps)]
    fams: dict[str, tuple[str, list[str]]] = {}

    def add(name: str, kind: str, labels: dict, values, digits: int = 6) -> None:
        lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
        fams.setdefault(name, (kind, []))[1].extend(  # NaN: no sample
            f"{name}{{{lab}}} {v:.{digits}g} {t}" for t, v in zip(ts, values, strict=True) if not math.isnan(v))

    def const(v):
        return [v] * steps

    def noisy(v, sigma=0.004):
        return [v * (1 + rng.gauss(0, sigma)) for _ in ts]

    for n, node in enumerate(NODES):
        add("fleetcanary_node_info", "gauge", {"node": node, "pool": "train-a", "cpu_model": "Xeon 8480",
                                               "driver_version": "570.124.06", "gpu_model": "H100"}, const(1))
        add("fleetcanary_build_info", "gauge", {"node": node, "job": "fleetcanary", "version": "0.1.0"}, const(1))
        # coverage: gpu_bandwidth every 15 minutes on every GPU but node 4's GPUs 0-2 (held by a pod since the
        # fleet's first hour), train_step per node every hour
        if n == 2:
            # the exporter's own error counters, published once above 0: node 2's state disk filled for its
            # fourth hour (history appends and figure store writes failing), and its config was reloaded twice,
            # the first time with a typo
            full = [max(0, min(k, 36) - 24) for k in range(steps)]
            add("fleetcanary_history_write_errors_total", "counter", {"node": node}, [f or math.nan for f in full])
            add("fleetcanary_judge_store_errors_total", "counter", {"node": node, "kind": "write_failed"},
                [f or math.nan for f in full])
            add("fleetcanary_config_reloads_total", "counter", {"node": node, "result": "failure"},
                [math.nan] * 40 + [1] * (steps - 40))
            add("fleetcanary_config_reloads_total", "counter", {"node": node, "result": "success"},
                [math.nan] * 44 + [1] * (steps - 44))
        for probe, interval in (("gpu_bandwidth", 900), ("train_step", 3600)):
            add("fleetcanary_probe_interval_seconds", "gauge", {"node": node, "probe": probe}, const(interval))
        add("fleetcanary_gpu_last_measured_timestamp_seconds", "gauge",
            {"node": node, "gpu": "", "probe": "train_step"}, [t - t % 3600 for t in ts], digits=12)
        for g in GPUS:
            held = n == 4 and g < 3
            add("fleetcanary_gpu_last_measured_timestamp_seconds", "gauge",
                {"node": node, "gpu": str(g), "probe": "gpu_bandwidth"},
                [min(t, ts[11]) - min(t, ts[11]) % 900 if held else t - t % 900 for t in ts], digits=12)
        for g in GPUS:
            gl = {"node": node, "gpu": str(g)}
            slow = 0.92 if (n, g) == (3, 5) else 1.0
            add("fleetcanary_gpu_info", "gauge", {**gl, "model": "H100", "uuid": f"GPU-{n}-{g}"}, const(1))
            add("fleetcanary_gpu_memory_bandwidth_bytes_per_second", "gauge", {**gl, "direction": "d2d"},
                noisy(D2D * slow))
            for d in ("h2d", "d2h"):
                add("fleetcanary_gpu_memory_bandwidth_bytes_per_second", "gauge", {**gl, "direction": d}, noisy(H2D))
            for key, v in (("generation", 5), ("generation_max", 5), ("width", 16), ("width_max", 16)):
                add(f"fleetcanary_gpu_pcie_link_{key}", "gauge", gl, const(v))
            add("fleetcanary_gpu_nvlink_links_up", "gauge", gl, const(17 if (n, g) == (2, 1) else 18))
            if (n, g) == (2, 1):
                add("fleetcanary_gpu_nvlink_links_down", "gauge", gl, const(1))
            add("fleetcanary_gpu_nvlink_errors_total", "counter", {**gl, "link": "0", "counter": "replay"},
                [k // 12 for k in range(steps)])
            add("fleetcanary_gpu_xid_errors_total", "counter", {**gl, "xid": "79"}, const(0))
            add("fleetcanary_gpu_ecc_errors_total", "counter", {**gl, "type": "uncorrected", "counter": "volatile"},
                const(0))
            add("fleetcanary_gpu_remapped_rows_pending", "gauge", gl, const(0))
            add("fleetcanary_gpu_probe_seconds_total", "counter", gl, [0.12 * k for k in range(steps)])
            for dtype in ("bf16", "fp16"):
                add("fleetcanary_gpu_matmul_flops_per_second", "gauge", {**gl, "dtype": dtype},
                    noisy(MATMUL * (0.9 if (n, g) == (1, 3) else 1.0)))
            status = "mismatch" if (n, g) == (4, 6) else "match"
            for st in SDC_STATUSES:
                add("fleetcanary_gpu_sdc_status", "gauge", {**gl, "status": st}, const(1 if st == status else 0))
            hot = (n, g) == (5, 2)
            add("fleetcanary_gpu_sustained_throughput_ratio", "gauge", gl,
                const((SM_HOT if hot else SM_TAIL) / SM_START))
            add("fleetcanary_gpu_sustained_flops_per_second", "gauge", {**gl, "dtype": "bf16"},
                const(MATMUL * (SM_HOT if hot else SM_TAIL) / SM_START))
            add("fleetcanary_gpu_sustained_clock_hertz", "gauge", {**gl, "clock": "sm"},
                const(SM_HOT if hot else SM_TAIL))
            add("fleetcanary_gpu_sustained_clock_hertz", "gauge", {**gl, "clock": "mem"}, const(MEM))
            add("fleetcanary_gpu_sustained_power_watts", "gauge", gl, const(700.0))
            add("fleetcanary_gpu_sustained_temperature_celsius", "gauge", gl, const(92.0 if hot else 70.0))
            add("fleetcanary_gpu_sustained_slowdown_ratio", "gauge", gl, const(0.6 if hot else 0.0))
            add("fleetcanary_gpu_sustained_burn_seconds", "gauge", gl, const(20.0))
            for reason, secs in (("sw_power_cap", 15.0), ("sw_thermal_slowdown", 12.0 if hot else 0.0),
                                 ("hw_thermal_slowdown", 12.0 if hot else 0.0)):
                add("fleetcanary_gpu_sustained_throttle_seconds", "gauge", {**gl, "reason": reason}, const(secs))
            for dtype in ("bf16",):
                tl = {**gl, "dtype": dtype}
                add("fleetcanary_train_step_seconds", "gauge", tl,
                    noisy(STEP_SECONDS * (1.05 if (n, g) == (0, 4) else 1.0)))
                add("fleetcanary_train_step_loss_check_pass", "gauge", tl, const(1))
                add("fleetcanary_train_step_loss_deviation_ratio", "gauge", tl, const(0.0))
            for h in GPUS:
                if h != g:
                    add("fleetcanary_gpu_p2p_bandwidth_bytes_per_second", "gauge",
                        {"node": node, "src_gpu": str(g), "dst_gpu": str(h)}, noisy(3.6e11))
        nic(add, node, n, steps)
        for size in SIZES:
            for coll in ("all_reduce", "all_gather"):
                bus = 3.6e11 * size / (size + 2e6)
                add("fleetcanary_collective_bus_bandwidth_bytes_per_second", "gauge",
                    {"node": node, "collective": coll, "size_bytes": str(size), "ranks": "8", "backend": "nccl"},
                    noisy(bus))
    _fabric(add, ts, steps)
    nvlink = {"alertname": "FleetCanaryNVLinkDown", "severity": "critical", "node": NODES[2], "gpu": "1"}
    slow = {"alertname": "FleetCanaryGPUMemoryBandwidthBelowPeers", "severity": "warning", "path": "change",
            "node": NODES[3], "gpu": "5", "figure": "gpu_memory_bandwidth", "series": "d2d"}
    for alert in (nvlink, slow):
        add("ALERTS", "gauge", {**alert, "alertstate": "firing"}, const(1))
        add("ALERTS_FOR_STATE", "gauge", alert, const(ts[2]), digits=12)  # active since the fleet's third step
    with open(path, "w") as f:
        for name, (kind, lines) in fams.items():
            base = name[:-len("_total")] if kind == "counter" else name
            f.write(f"# TYPE {base} {kind}\n")
            f.write("\n".join(lines) + "\n")
        f.write("# EOF\n")
    return start, end


def _fabric(add, ts, steps) -> None:
    """The fabric probe over the same nodes: one slot per step, partners from the probe's own
    round robin; node 5 is slow with every partner (its pairs at 30%)."""
    from fleetcanary.probes.fabric import schedule

    slow = NODES[5]
    partners: dict[tuple[str, str], list[float]] = {}
    for node in NODES:
        bw, slot_ts = [], []
        for k, t in enumerate(ts):
            m = schedule.meeting(NODES, node, float(t), STEP)
            bw.append(1.2e10 * (0.3 if slow in (node, m.partner) else 1.0))
            slot_ts.append(float(t))
            partners.setdefault((node, m.partner), [math.nan] * steps)[k] = 1.0
        add("fleetcanary_fabric_sendrecv_bandwidth_bytes_per_second", "gauge",
            {"node": node, "size_bytes": "16777216", "backend": "nccl"}, bw)
        add("fleetcanary_fabric_pair_slot_timestamp_seconds", "gauge", {"node": node}, slot_ts, digits=12)  # unix s
        add("fleetcanary_fabric_slot_seconds", "gauge", {"node": node}, [float(STEP)] * steps)
    for (node, partner), vals in sorted(partners.items()):
        add("fleetcanary_fabric_last_partner_info", "gauge", {"node": node, "partner": partner}, vals)
