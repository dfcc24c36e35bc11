#!/usr/bin/env python3
"""What the shipped rules cost at fleet scale: rule evaluation time per group, recorded series,
and series per node, on a real Prometheus evaluating the shipped rule files live.

1. Series per node of a full exposition: `fleetcanary run` with the fake NVML of an 8-GPU H100
   node (tests/fixtures/nvml/h100_8gpu_healthy.json) and every probe that can run here (GPU
   probes on device "cpu", storage on a temporary directory, the inference canary against
   `fleetcanary simulate-llm`); its /metrics counted by family. (--skip-exposition leaves it out.)
2. A synthetic fleet (default 1,000 nodes x 8 GPUs, pools of 50 nodes, two GPU models) with a
   node's full exposition modelled from the probes' declared metric specs: every label value
   an 8-GPU node has (18 NVLinks per GPU, 56 P2P pairs, 4 collectives x 6 sizes, ...).
3. History: every series the rules read through a range window is backfilled (promtool tsdb
   create-blocks-from openmetrics, alerts/backfill.py) over the longest window + offset the rules
   use for it (the 3-day history windows offset by 1 day: 4 days and some), one sample per probe
   run at the probe's default interval (--history-step sets a fixed step instead), ending now.
4. Live: a real Prometheus over that TSDB scrapes the fleet's current expositions (one target
   per node, served from 127.0.0.1, scrape every 30 s as deploy/prometheus-scrape.example.yml)
   and evaluates alerts/fleetcanary.rules.yml and alerts/fleetcanary.alerts.yml unchanged
   (evaluation_interval 1m as shipped; each group at its own interval). Once every target is
   up, it reads prometheus_rule_group_last_duration_seconds at each group's iterations until
   every group has run --cycles times (the 15-minute history group --history-cycles times: up
   to 15 minutes of waiting for its first), then the recorded series and series per node.

Loopback only. Prints a table and writes benchmarks/results/rule_scale.json.

    python benchmarks/rule_scale.py [--nodes 1000] [--pool-nodes 50] [--cycles 3] [--history-cycles 1]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run by path: the repo root, for the imports below
from alerts.backfill import binary, create_blocks
from benchmarks.common import free_port, get, proc_stats, wait_http, write_result

ROOT = Path(__file__).resolve().parent.parent

RULE_FILES = [ROOT / "alerts/fleetcanary.rules.yml", ROOT / "alerts/fleetcanary.alerts.yml"]
FAKE_NVML = ROOT / "tests/fixtures/nvml/h100_8gpu_healthy.json"
GPUS = 8
DRIVER = "570.124.06"  # every modelled node's driver (fleetcanary_node_info, and the per-driver series backfilled)
MODELS = {"H100": {"d2d": 3.0e12, "h2d": 5.3e10, "d2h": 5.3e10}, "H200": {"d2d": 4.2e12, "h2d": 5.4e10, "d2h": 5.4e10}}
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def seconds(d: str) -> float:
    return sum(int(n) * _UNITS[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w)", d))


# --------------------------------------------------------------------------- what a node exposes
def label_values(node: int, model: str) -> dict[str, list[str]]:
    """Every value a label takes on one 8-GPU node (bounded label sets, as the probes declare them)."""
    from fleetcanary.probes.lib import nvml

    gpus = [str(g) for g in range(GPUS)]
    return {
        "gpu": gpus, "direction": ["d2d", "h2d", "d2h"],
        "outcome": ["success", "failure", "timeout", "crash", "skipped"],
        "type": ["corrected", "uncorrected"], "counter": ["volatile", "aggregate"],
        "cause": ["correctable", "uncorrectable"],
        "link": [str(k) for k in range(18)], "reason": list(nvml.THROTTLE_REASONS.values()),
        "xid": ["79"], "dtype": ["bf16", "fp16", "tf32", "fp8"],
        "status": ["match", "mismatch", "no_consensus", "unjudged"],
        "clock": ["sm", "mem"], "collective": ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"],
        "size_bytes": ["8", "1024", "65536", "1048576", "16777216", "67108864"], "ranks": ["8"], "backend": ["nccl"],
        "op": ["copy", "scale", "add", "triad"], "cache": ["cold", "hot"], "phase": ["resolve", "connect", "tls",
                                                                                     "first_byte", "transfer"],
        "streams": ["1", "4"], "check": ["golden"], "result": ["success", "failure"],
    }


def _nic_fabric_combos(spec, node: int) -> list[dict]:
    """An HGX node's fabric: 8 InfiniBand ports (mlx5_0-7, port 1) and one Ethernet interface; the
    fabric probe's one last-partner series and its rejection reasons."""
    from fleetcanary.probes.lib import nic_sysfs
    from fleetcanary.probes.nic_health import PHYS_STATES, STATES

    ports = [{"device": f"mlx5_{i}", "port": "1"} for i in range(8)]
    extra = {"fleetcanary_rdma_port_info": {"link_layer": ["InfiniBand"]},
             "fleetcanary_rdma_port_state": {"state": list(STATES.values())},
             "fleetcanary_rdma_port_physical_state": {"state": list(PHYS_STATES.values())},
             "fleetcanary_rdma_port_errors_total": {"counter": list(nic_sysfs.ERROR_COUNTERS)},
             "fleetcanary_rdma_port_hw_events_total": {"counter": list(nic_sysfs.HW_COUNTERS)}}
    if spec.name == "fleetcanary_rdma_device_info":
        return [{"device": f"mlx5_{i}", "hca_type": "MT4129", "fw_ver": "28.39.1002", "board_id": "MT_0000000838"}
                for i in range(8)]
    if spec.name == "fleetcanary_fabric_last_partner_info":
        return [{"partner": f"node-{(node + 1) % 1000:04d}"}]
    if spec.name == "fleetcanary_fabric_rendezvous_rejected_total":
        return []  # only once a stray was refused
    if spec.name.startswith("fleetcanary_net_interface_"):
        return [{"interface": "eth0", **({"direction": d} if "direction" in spec.labels else {})}
                for d in (("rx", "tx") if "direction" in spec.labels else ("",))]
    if "device" not in spec.labels:
        return [{}]
    combos = ports
    for name, values in (extra.get(spec.name) or {}).items():
        combos = [{**c, name: v} for c in combos for v in values]
    return combos


def node_series(node: int, model: str, pool: str) -> list[tuple[str, str, dict]]:
    """(family, sample name, labels) of every series one node exposes, from the declared metric specs."""
    from fleetcanary.daemon.collector import EXPORTER_METRICS
    from fleetcanary.probes import PROBES

    lv = label_values(node, model)
    probes = sorted(PROBES)
    targets = {"storage": ["local-nvme", "shared-nfs"], "object_storage": ["model-bucket"],
               "inference": ["llama-70b-prod"]}
    out: list[tuple[str, str, dict]] = []

    def expand(names, fixed=None):
        combos = [dict(fixed or {})]
        for n in names:
            if n in (fixed or {}):
                continue
            combos = [{**c, n: v} for c in combos for v in lv[n]]
        return combos

    for spec in EXPORTER_METRICS:
        labels = spec.labels
        if spec.name == "fleetcanary_node_info":
            combos = [{"pool": pool, "cpu_model": "Xeon 8480", "gpu_model": model, "gpu_count": "8",
                       "driver_version": DRIVER, "node_name": f"node-{node:04d}"}]
        elif spec.name == "fleetcanary_build_info":
            combos = [{"version": "0.1.0", "commit": "abc1234", "python_version": "3.11.7"}]
        elif "probe" in labels:
            combos = []
            for p in probes:
                if spec.name.endswith("skips_total"):
                    combos += [{"probe": p, "reason": "gpu_busy"}] if PROBES[p].exclusive == "gpu" else []
                elif spec.name.endswith(("failures_total", "crashes_total")):
                    continue  # exported once a run failed or crashed; a healthy node has none
                else:
                    combos += expand(labels, {"probe": p})
        elif spec.name.startswith("fleetcanary_kubernetes_"):
            continue  # bare metal here
        else:
            combos = expand(labels)
        out += [(spec.name, spec.name, c) for c in combos]
    for name, cls in sorted(PROBES.items()):
        for spec in cls.metrics:
            if spec.name.endswith("_failures_total") or spec.name == "fleetcanary_gpu_lost":
                continue  # only after a failure / a lost GPU
            if spec.name == "fleetcanary_gpu_info":
                combos = [{"gpu": g, "uuid": f"GPU-{node:04d}-{g}", "model": model, "pci_bus_id": f"0000:{g}1:00.0",
                           "serial": f"S{node:04d}{g}", "vbios": "96.00.99.00.01"} for g in lv["gpu"]]
            elif spec.labels[:2] == ("src_gpu", "dst_gpu"):
                pairs = [{"src_gpu": a, "dst_gpu": b} for a in lv["gpu"] for b in lv["gpu"] if a != b]
                combos = [{**p, "link": "nvlink"} for p in pairs] if "link" in spec.labels else pairs
            elif spec.name == "fleetcanary_gpu_clock_throttle_active":
                combos = expand(spec.labels)
            elif spec.name == "fleetcanary_gpu_sustained_throttle_seconds":
                combos = [{"gpu": g, "reason": r} for g in lv["gpu"] for r in ("sw_power_cap", "sw_thermal_slowdown",
                                                                               "hw_thermal_slowdown")]
            elif spec.name == "fleetcanary_gpu_sustained_flops_per_second" or spec.name.startswith(
                    "fleetcanary_train_step_"):
                combos = [{"gpu": g, "dtype": "bf16"} for g in lv["gpu"]]
            elif spec.name == "fleetcanary_gpu_nvlink_errors_total":
                combos = [{"gpu": g, "link": k, "counter": c} for g in lv["gpu"] for k in lv["link"]
                          for c in ("replay", "recovery", "crc_flit", "crc_data")]
            elif spec.name.startswith(("fleetcanary_rdma_", "fleetcanary_net_interface_")) or spec.name in (
                    "fleetcanary_fabric_last_partner_info", "fleetcanary_fabric_rendezvous_rejected_total"):
                combos = _nic_fabric_combos(spec, node)
            elif spec.name == "fleetcanary_inference_requests_total":
                combos = [{"model": "meta-llama/Llama-3.1-70B-Instruct", "outcome": "success"}]
            elif "target" in spec.labels:
                rest = [n for n in spec.labels if n not in ("target", "model")]
                combos = expand(rest)
                if "model" in spec.labels:
                    combos = [{**c, "model": "meta-llama/Llama-3.1-70B-Instruct"} for c in combos]
            else:
                combos = expand(spec.labels)
            tgts = targets.get(name, [None])
            for c in combos:
                for t in tgts:
                    labels = {**c, **({"target": t} if t else {})}
                    if spec.type == "histogram":
                        for le in [*map(repr, spec.buckets), "+Inf"]:
                            out.append((spec.name, spec.name + "_bucket", {**labels, "le": le}))
                        out.append((spec.name, spec.name + "_sum", labels))
                        out.append((spec.name, spec.name + "_count", labels))
                    else:
                        out.append((spec.name, spec.name, labels))
    return out


def metric_probe() -> tuple[dict[str, float], dict[str, str]]:
    """(default run interval, type) of every family; exporter metrics refresh with every scrape."""
    from fleetcanary.daemon.collector import EXPORTER_METRICS
    from fleetcanary.probes import PROBES

    interval, kind = {}, {}
    for m in EXPORTER_METRICS:
        interval[m.name], kind[m.name] = 0.0, m.type
    for cls in PROBES.values():
        for s in cls.metrics:
            interval[s.name], kind[s.name] = cls.default_interval_seconds, s.type
    return interval, kind


def windows_read() -> dict[str, float]:
    """Sample name -> the longest range + offset a shipped rule reads it with, seconds."""
    out: dict[str, float] = {}
    pat = re.compile(r"\b(fleetcanary_[a-z0-9_]+)(?:\{[^}]*\})?\[(\w+)\](?:\s*offset\s+(\w+))?")
    for f in RULE_FILES:
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                for name, rng, off in pat.findall(r["expr"]):
                    out[name] = max(out.get(name, 0), seconds(rng) + (seconds(off) if off else 0))
    return out


ERROR_COUNTERS = {"fleetcanary_gpu_xid_errors_total", "fleetcanary_gpu_ecc_errors_total",
                  "fleetcanary_gpu_nvlink_errors_total", "fleetcanary_gpu_remapped_rows_total",
                  "fleetcanary_probe_failures_total", "fleetcanary_probe_crashes_total",
                  "fleetcanary_probe_skips_total", "fleetcanary_probe_invalid_samples_total",
                  "fleetcanary_storage_failures_total", "fleetcanary_object_failures_total",
                  "fleetcanary_history_write_errors_total", "fleetcanary_clock_jumps_total",
                  "fleetcanary_rdma_port_errors_total", "fleetcanary_rdma_port_hw_events_total",
                  "fleetcanary_net_interface_errors_total", "fleetcanary_net_interface_dropped_total",
                  "fleetcanary_net_interface_carrier_changes_total", "fleetcanary_fabric_rendezvous_rejected_total"}
# A healthy fabric: every port present, expected, up and at its rate; no sysfs error.
NIC_VALUES = {"fleetcanary_rdma_port_present": 1.0, "fleetcanary_rdma_port_expected": 1.0,
              "fleetcanary_rdma_ports_present": 8.0, "fleetcanary_rdma_ports_up": 8.0,
              "fleetcanary_rdma_ports_expected": 8.0, "fleetcanary_rdma_port_rate_below_expected": 0.0,
              "fleetcanary_rdma_port_counters_saturated": 0.0, "fleetcanary_nic_sysfs_errors": 0.0,
              "fleetcanary_rdma_port_rate_bytes_per_second": 50e9,
              "fleetcanary_rdma_port_expected_rate_bytes_per_second": 50e9,
              "fleetcanary_rdma_port_link_width": 4.0, "fleetcanary_net_interface_present": 1.0,
              "fleetcanary_net_interface_speed_bytes_per_second": 12.5e9, "fleetcanary_net_interface_mtu_bytes": 9000.0}


def value(family: str, labels: dict, model: str, rng: random.Random, t: float) -> float:
    """A plausible, healthy value (the rules' cost does not depend on it, only on what is there)."""
    f = family
    if f in NIC_VALUES:
        return NIC_VALUES[f]
    if f in ("fleetcanary_rdma_port_state", "fleetcanary_rdma_port_physical_state"):
        return 1.0 if labels.get("state") in ("active", "link_up") else 0.0
    if f.endswith(("_info", "_pass", "_stable", "_success", "_up", "_enabled", "_access",
                   "_successful", "persistence_mode")):
        return 1.0
    if f == "fleetcanary_gpu_sdc_status":
        return 1.0 if labels.get("status") == "match" else 0.0
    if f.endswith(("_lost", "_pending", "_failed", "_throttle_active", "mig_mode", "slowdown_ratio")):
        return 0.0
    if f.endswith(("link_width", "link_width_max")):
        return 16.0
    if "link_generation" in f:
        return 5.0
    if f in ("fleetcanary_gpus_visible", "fleetcanary_gpus_healthy", "fleetcanary_gpus_expected"):
        return 8.0
    if f in ERROR_COUNTERS or (f == "fleetcanary_probe_runs_total" and labels.get("outcome") not in
                               ("success", "skipped")):
        return 0.0  # a healthy fleet: no errors, so no error alert fires on it
    if f.endswith(("_total", "_bucket", "_count", "_sum")):
        return float(int(t / 60) % 100000)  # grows a little every minute
    if f.endswith("_timestamp_seconds") or f == "fleetcanary_start_time_seconds":
        return float(int(t))
    if f.endswith("interval_seconds"):
        return 900.0
    if f == "fleetcanary_gpu_memory_bandwidth_bytes_per_second":
        return MODELS[model][labels["direction"]] * rng.gauss(1.0, 0.005)
    if f == "fleetcanary_gpu_sustained_throughput_ratio":
        return 0.886 * rng.gauss(1.0, 0.003)
    return 1.0e9 * rng.gauss(1.0, 0.01)


def fleet(nodes: int, pool_nodes: int):
    for i in range(nodes):
        model = "H100" if i < nodes * 0.6 else "H200"
        yield i, f"node-{i:04d}", model, f"{model.lower()}-pool-{i // pool_nodes:02d}"


def fmt_labels(labels: dict) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


# The hourly group's outputs that rules read back over days, with how far back: a live Prometheus has them
# after days of running; a fleet built from raw samples alone would leave the baselines, and with them the
# change path of the 1-minute group, empty. Written hourly (the group's interval) with the raw figure's value.
DAILY_READ_BACK = {"median1d": 3 * 86400 + 2 * 3600, "median1d_same_driver": 2 * 86400 + 3 * 3600,
                   "baseline": 4 * 86400, "baseline_before_1d": 2 * 3600}


def daily_outputs(raw_rows: dict[str, list]) -> dict[str, tuple[str, list]]:
    """Recorded name -> (its raw metric, rows as write_history keeps them): one series per raw series, with the
    node's driver_version where the rule joins it (the per-driver medians and the baselines built on them)."""
    out = {}
    for g in yaml.safe_load(RULE_FILES[0].read_text())["groups"]:
        for r in g["rules"]:
            rec = r.get("record", "")
            parts = rec.split(":")
            if len(parts) != 3 or parts[2] not in DAILY_READ_BACK or parts[1] not in raw_rows:
                continue
            per_driver = parts[2] == "median1d_same_driver" or "median1d_same_driver" in r["expr"]
            extra = f',driver_version="{DRIVER}"' if per_driver else ""
            driver = {"driver_version": DRIVER} if per_driver else {}
            out[rec] = (parts[1], [(rec, lab + extra, model, {**labels, **driver})
                                   for _, lab, model, labels in raw_rows[parts[1]]])
    return out


BLOCK = 7200  # promtool's block: it parses its whole input once per 2-hour block, so each gets its own file


def write_history(work: Path, nodes: int, pool_nodes: int, end: int, history_step: int, scrape_interval: int) -> dict:
    """OpenMetrics of every series a rule reads through a range window, over that window, ending at `end`:
    one file per 2-hour block (promtool 2.42 has no --max-block-duration and would otherwise parse
    gigabytes of text once for each of ~50 blocks)."""
    interval, kind = metric_probe()
    need = windows_read()
    import numpy as np

    rng = random.Random(1)
    nprng = np.random.default_rng(1)
    by_family: dict[str, list] = defaultdict(list)
    for i, node, model, pool in fleet(nodes, pool_nodes):
        for fam, sample, labels in node_series(i, model, pool):
            if sample in need:
                lab = fmt_labels({"job": "fleetcanary", "instance": node, "node": node, **labels})
                by_family[fam].append((sample, lab, model, labels))
    value_of = {}  # a recorded family -> the raw metric whose value it carries
    per_family = {f: [r for r in rows if r[0] == f] for f, rows in by_family.items()}
    for rec, (metric, rows) in daily_outputs(per_family).items():
        by_family[rec] = rows
        value_of[rec] = metric
        need[rec] = DAILY_READ_BACK[rec.split(":")[2]]
        interval[rec] = 3600
    plan, families = {}, {}
    for fam, rows in by_family.items():
        run = interval.get(fam) or scrape_interval
        if fam == "fleetcanary_node_info":
            run = 900  # constant; a sparse step is enough for max_over_time
        step = history_step or int(run)
        span = max(need[s] for s, *_ in rows) + 2 * step
        start = end - int(span) // step * step
        plan[fam] = (start, step)
        families[fam] = {"series_per_node": len(rows) // nodes, "step_seconds": step,
                         "samples_per_series": len(range(start, end + 1, step)), "window_seconds": end - start}
    first = min(s for s, _ in plan.values()) // BLOCK * BLOCK
    files, samples, series = [], 0, sum(len(r) for r in by_family.values())
    for w in range(first, end + 1, BLOCK):
        path = work / f"history-{w}.om"
        with open(path, "w", buffering=1 << 22) as f:
            for fam, rows in by_family.items():
                start, step = plan[fam]
                t0 = max(start, start + -(-(w - start) // step) * step)
                times = list(range(t0, min(w + BLOCK, end + 1), step))
                if not times:
                    continue
                k = {"info": "gauge"}.get(kind.get(fam, "gauge"), kind.get(fam, "gauge"))
                f.write(f"# TYPE {fam.removesuffix('_total') if k == 'counter' else fam} {k}\n")
                for sample, lab, model, labels in rows:
                    name = sample if k == "histogram" else value_of.get(fam, fam)
                    pre = f"{sample}{{{lab}}} "
                    shape = value(name, labels, model, level(name, lab), times[0])
                    if name.endswith(("_total", "_bucket", "_count", "_sum", "_timestamp_seconds")):
                        f.write("".join(f"{pre}{value(name, labels, model, rng, t):.6g} {t}\n" for t in times))
                    elif shape in (0.0, 1.0, 5.0, 8.0, 16.0, 900.0):  # a constant
                        f.write("".join(f"{pre}{shape:.6g} {t}\n" for t in times))
                    else:  # a measured figure: the run's value with its noise
                        noise = nprng.normal(1.0, 0.005, len(times)).tolist()
                        f.write("".join(f"{pre}{shape * n:.6g} {t}\n" for n, t in zip(noise, times, strict=True)))
                samples += len(rows) * len(times)
            f.write("# EOF\n")
        files.append(path)
    return {"samples": samples, "series": series, "files": files, "families": dict(sorted(families.items()))}


def backfill(files: list[Path], data: Path) -> None:
    """promtool per file, two at a time; each file is removed once it is a block."""
    from concurrent.futures import ThreadPoolExecutor

    def one(p: Path) -> None:
        create_blocks(p, data)
        p.unlink()

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, files))


def level(name: str, lab: str) -> random.Random:
    """The random source of one measured series' level, seeded by its identity (the labels as backfilled,
    without the driver a per-driver median adds): its history, its live figure and the baselines backfilled
    for it share one level, as on a steady fleet."""
    return random.Random(f"{name}|{lab.split(',driver_version=', maxsplit=1)[0]}")


def render_node(i: int, node: str, model: str, pool: str, t: float) -> bytes:
    """The node's current exposition (text format 0.0.4)."""
    _, kind = metric_probe()
    lines, typed = [], set()
    for fam, sample, labels in node_series(i, model, pool):
        if fam not in typed:
            k = kind.get(fam, "gauge")
            lines.append(f"# TYPE {fam.removesuffix('_total') if k == 'counter' else fam} "
                         f"{'gauge' if k == 'info' else k}")
            typed.add(fam)
        name = sample if kind.get(fam) == "histogram" else fam
        rng = level(name, fmt_labels({"job": "fleetcanary", "instance": node, "node": node, **labels}))
        lines.append(f"{sample}{{{fmt_labels(labels)}}} {value(name, labels, model, rng, t):.6g}")
    return ("\n".join(lines) + "\n").encode()


class FleetServer:
    """Every node's exposition at /metrics/<node> on 127.0.0.1, rendered once."""

    def __init__(self, bodies: dict[str, bytes]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = bodies.get(self.path.rsplit("/", 1)[-1])
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                try:
                    self.wfile.write(body or b"")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # Prometheus gave up on a slow scrape (its timeout); it counts it itself

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --------------------------------------------------------------------------- live evaluation
def prom_metrics(url: str) -> dict[tuple[str, tuple], float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    # A long timeout: a Prometheus starved of CPU by its own rule groups answers /metrics late.
    with urllib.request.urlopen(url + "/metrics", timeout=300) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(("prometheus_rule_group", "prometheus_tsdb_head_series",
                                  "prometheus_rule_evaluation_failures_total")):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def query(url: str, expr: str) -> list[dict]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=300) as r:
        body = json.loads(r.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def live(work: Path, data: Path, args, bodies_server: FleetServer, node_names: list[str]) -> dict:
    cfg = {"global": {"scrape_interval": f"{args.scrape_interval}s", "evaluation_interval": "1m"},
           "rule_files": [str(f) for f in RULE_FILES],
           "scrape_configs": [{"job_name": "fleetcanary", "static_configs": [
               {"targets": [bodies_server.address], "labels": {"__metrics_path__": f"/metrics/{n}", "node": n}}
               for n in node_names],
               "relabel_configs": [{"source_labels": ["node"], "target_label": "instance"}]}]}
    (work / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(work / "prometheus.log", "wb") as log:  # Prometheus keeps its own descriptor
        proc = subprocess.Popen([binary("prometheus"), f"--config.file={work / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
                                 "--storage.tsdb.retention.time=30d", "--log.level=warn",
                                 # No leveled compaction of the ~50 backfilled 2-hour blocks while measuring: it
                                 # would take the CPU the rules are timed on (queries then read 2-hour blocks).
                                 "--storage.tsdb.max-block-duration=2h"],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        wait_http(url + "/-/ready", timeout=600)
        ready_s = time.monotonic() - t0
        deadline = time.monotonic() + args.max_wait
        while time.monotonic() < deadline:
            up = query(url, 'count(up{job="fleetcanary"} == 1)')
            if up and int(float(up[0]["value"][1])) == len(node_names):
                break
            time.sleep(2)
        else:
            raise SystemExit("rule_scale: not every target came up")
        all_up = time.monotonic()
        print(f"prometheus ready in {ready_s:.0f}s; all {len(node_names)} targets up after "
              f"{all_up - t0:.0f}s; waiting for rule group cycles", flush=True)
        first = prom_metrics(url)
        base_iter = {dict(k[1])["rule_group"]: v for k, v in first.items()
                     if k[0] == "prometheus_rule_group_last_evaluation_timestamp_seconds"}
        interval = {dict(k[1])["rule_group"]: v for k, v in first.items()
                    if k[0] == "prometheus_rule_group_interval_seconds"}
        durations: dict[str, list[float]] = defaultdict(list)
        seen: dict[str, float] = dict(base_iter)
        cpu0 = proc_stats(proc.pid)[0]
        m = first
        while time.monotonic() < deadline:
            m = prom_metrics(url)
            for (name, lab), v in m.items():
                g = dict(lab).get("rule_group")
                # The evaluation timestamp moves when an evaluation ends (iterations_total counts one
                # when it starts, before its duration is known).
                if name == "prometheus_rule_group_last_evaluation_timestamp_seconds" and v > seen.get(g, 0):
                    seen[g] = v
                    durations[g].append(m[("prometheus_rule_group_last_duration_seconds", lab)])
                    print(f"  {g.split(';')[1]}: {durations[g][-1]:.2f} s", flush=True)
            want = {g: (args.history_cycles if interval[g] > 60 else args.cycles) for g in interval}
            if all(len(durations[g]) >= want[g] for g in interval):
                break
            time.sleep(3)
        else:
            print("rule_scale: --max-wait passed before every group ran its cycles", flush=True)
        wall = time.monotonic() - all_up
        cpu, rss = proc_stats(proc.pid)
        groups = {}
        for (name, lab), v in m.items():
            if name == "prometheus_rule_group_rules":
                g = dict(lab)["rule_group"]
                d = durations.get(g, [])
                fails = sum(val for (n2, l2), val in m.items() if n2 == "prometheus_rule_evaluation_failures_total"
                            and dict(l2).get("rule_group") == g)
                groups[g.split(";", 1)[1]] = {"file": Path(g.split(";")[0]).name, "rules": int(v),
                                              "interval_seconds": interval.get(g), "cycles": len(d),
                                              "duration_seconds": d,
                                              "median_seconds": statistics.median(d) if d else None,
                                              "max_seconds": max(d) if d else None,
                                              "evaluation_failures": int(fails)}
        # A group that did not run its cycles (the hourly group with --history-cycles 0): each rule's
        # expression once as an instant query, summed, the same work one evaluation does (an upper bound,
        # since a query also encodes its answer as JSON).
        rule_groups = {grp["name"]: grp["rules"] for grp in yaml.safe_load(RULE_FILES[0].read_text())["groups"]}
        for gname, g in groups.items():
            if g["cycles"] == 0:
                spent = 0.0
                for r in rule_groups.get(gname, []):
                    t = time.monotonic()
                    query(url, r["expr"])
                    spent += time.monotonic() - t
                g["instant_query_seconds"] = round(spent, 3) if spent else None
        recorded = {r["metric"]["__name__"]: int(float(r["value"][1]))
                    for r in query(url, 'count by (__name__) ({__name__=~".+:.+"})')}
        node0 = node_names[0]
        per_node = query(url, f'count by (__name__) ({{node="{node0}"}})')
        per_node_raw = {r["metric"]["__name__"]: int(float(r["value"][1])) for r in per_node
                        if ":" not in r["metric"]["__name__"]}
        per_node_rec = {r["metric"]["__name__"]: int(float(r["value"][1])) for r in per_node
                        if ":" in r["metric"]["__name__"]}
        alerts = query(url, 'count by (alertname, alertstate) (ALERTS)')
        return {"prometheus_ready_seconds": ready_s, "groups": groups,
                "head_series": int(m.get(("prometheus_tsdb_head_series", ()), 0)),
                "recorded_series": recorded, "recorded_series_total": sum(recorded.values()),
                "node0_raw_series": sum(per_node_raw.values()), "node0_raw_by_metric": per_node_raw,
                "node0_recorded_series": sum(per_node_rec.values()), "node0_recorded_by_metric": per_node_rec,
                "alerts": {f'{a["metric"]["alertname"]}/{a["metric"]["alertstate"]}': int(float(a["value"][1]))
                           for a in alerts},
                "prometheus_cpu_seconds_per_second": (cpu - cpu0) / wall if wall else None,
                "prometheus_rss_bytes": rss, "measured_seconds": wall}
    finally:
        _terminate(proc, 120)


def _terminate(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- a real node's exposition
def real_exposition(work: Path, timeout: float) -> dict:
    """The real exporter, fake NVML of an 8-GPU node, every probe that can run on this machine."""
    llm_port, port = free_port(), free_port()
    storage = work / "storage"
    storage.mkdir()
    env = {**os.environ, "FLEETCANARY_FAKE_NVML": str(FAKE_NVML)}
    cpu = {"device": "cpu"}
    # Long intervals: each probe runs once, and the exclusive "gpu" class (probes run one after another)
    # never drops a run on a slow CPU.
    fast = {"interval_seconds": 1800, "timeout_seconds": 600}
    cfg = {"node_name": "bench-node", "pool": "bench", "state_dir": str(work / "state"),
           "server": {"listen_address": f"127.0.0.1:{port}"}, "gpu": {"budget_ratio": 1.0, "expected_count": 8},
           "probes": {
               "host_memory_bandwidth": {**fast, "params": {"array_bytes": 4 << 20, "repeats": 2}},
               "gpu_health": {"interval_seconds": 60, "timeout_seconds": 30, "params": {"xid_wait_seconds": 0.5}},
               "gpu_bandwidth": {**fast, "params": {**cpu, "d2d_bytes": 1 << 20, "host_bytes": 1 << 20, "repeats": 2,
                                                    "warmup": 1}},
               "gpu_p2p": {**fast, "params": {**cpu, "bytes": 1 << 20, "repeats": 2, "warmup": 1}},
               "gpu_compute": {**fast, "params": {**cpu, "cpu_gpus": 8, "size": 128, "repeats": 2, "warmup": 1,
                                                  "sdc_size": 64, "sdc_products": 1, "dtypes": ["bf16", "fp16"]}},
               "gpu_sustained": {**fast, "params": {**cpu, "burn_seconds": 2.0, "size": 128, "initial_seconds": 0.5}},
               "train_step": {**fast, "params": {**cpu, "dtype": "fp32"}},
               "collectives": {**fast, "params": {"backend": "gloo", "cpu_ranks": 2,
                                                  "sizes_bytes": [8, 1024, 65536, 1048576],
                                                  "iterations": 2, "warmup_iterations": 1}},
               "storage": {**fast, "params": {"targets": [{"name": "local", "path": str(storage),
                                                           "file_bytes": 4 << 20, "checkpoint_bytes": 1 << 20}]}},
               "inference": {"interval_seconds": 60, "timeout_seconds": 50, "params": {"targets": [
                   {"name": "sim", "base_url": f"http://127.0.0.1:{llm_port}/v1", "model": "sim"}]}},
           }}
    (work / "node.yaml").write_text(yaml.safe_dump(cfg))
    procs = []
    try:
        with open(work / "node.log", "wb") as logs:  # the processes keep their own descriptors
            procs.append(subprocess.Popen([sys.executable, "-m", "fleetcanary", "simulate-llm", "--listen",
                                           f"127.0.0.1:{llm_port}", "--ttft-ms", "5", "--itl-ms", "1"],
                                          stdout=logs, stderr=subprocess.STDOUT, env=env))
            procs.append(subprocess.Popen([sys.executable, "-m", "fleetcanary", "run",
                                           "--config", str(work / "node.yaml")],
                                          stdout=logs, stderr=subprocess.STDOUT, env=env))
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/readyz", timeout=120)
        from prometheus_client.parser import text_string_to_metric_families

        enabled = set(cfg["probes"])
        deadline = time.monotonic() + timeout
        while True:
            text = get(url + "/metrics").decode()
            ran = {s.labels["probe"]: s.labels["outcome"] for fam in text_string_to_metric_families(text)
                   for s in fam.samples if s.name == "fleetcanary_probe_runs_total" and s.value > 0}
            if set(ran) >= enabled or time.monotonic() > deadline:
                break
            time.sleep(3)
        fams = Counter()
        for fam in text_string_to_metric_families(text):
            fams[fam.name] += len(fam.samples)
        outcomes = defaultdict(dict)
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "fleetcanary_probe_runs_total" and s.value > 0:
                    outcomes[s.labels["probe"]][s.labels["outcome"]] = int(s.value)
        return {"series": sum(fams.values()), "by_family": dict(sorted(fams.items())), "probe_outcomes": outcomes,
                "probes_not_run": sorted(enabled - set(outcomes))}
    finally:
        for p in reversed(procs):
            _terminate(p, 60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pool-nodes", type=int, default=50, help="nodes per pool (a pool has one GPU model)")
    ap.add_argument("--scrape-interval", type=int, default=30, help="seconds")
    ap.add_argument("--history-step", type=int, default=0,
                    help="seconds between backfilled samples; 0: one per probe run at its default interval")
    ap.add_argument("--cycles", type=int, default=3, help="evaluations of each 1-minute group to measure")
    ap.add_argument("--history-cycles", type=int, default=1, help="evaluations of the 15-minute group to measure")
    ap.add_argument("--max-wait", type=float, default=2400, help="seconds to wait for the cycles")
    ap.add_argument("--skip-exposition", action="store_true", help="leave out the real exporter's exposition count")
    ap.add_argument("--exposition-timeout", type=float, default=900)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/rule_scale.json"))
    args = ap.parse_args()
    for b in ("prometheus", "promtool"):
        if not shutil.which(b):
            raise SystemExit(f"rule_scale: {b} is not installed (apt-get install prometheus)")
    work = Path(tempfile.mkdtemp(prefix="fc-rule-scale-"))
    result = {"nodes": args.nodes, "gpus_per_node": GPUS, "pool_nodes": args.pool_nodes,
              "scrape_interval_seconds": args.scrape_interval, "history_step_seconds": args.history_step,
              "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(),
                          "platform": platform.platform()}}
    t_all = time.monotonic()
    timings = {}
    server = None
    try:
        if not args.skip_exposition:
            t = time.monotonic()
            (work / "node").mkdir()
            result["real_exposition"] = real_exposition(work / "node", args.exposition_timeout)
            timings["real_exposition_s"] = time.monotonic() - t
            r = result["real_exposition"]
            print(f"real exporter (fake NVML 8 x H100, CPU probes): {r['series']} series; probes not run: "
                  f"{r['probes_not_run'] or 'none'}", flush=True)
        model_series = node_series(0, "H100", "p")
        result["model_series_per_node"] = len(model_series)
        result["model_by_family"] = dict(sorted(Counter(f for f, _, _ in model_series).items()))
        end = int(time.time()) // 60 * 60
        t = time.monotonic()
        hist = write_history(work, args.nodes, args.pool_nodes, end, args.history_step, args.scrape_interval)
        timings["generate_s"] = time.monotonic() - t
        size = sum(p.stat().st_size for p in hist["files"])
        print(f"history: {hist['series']:,} series, {hist['samples']:,} samples in {len(hist['files'])} files "
              f"({size / 2**20:.0f} MiB of OpenMetrics)", flush=True)
        t = time.monotonic()
        data = work / "data"
        backfill(hist.pop("files"), data)
        result["history"] = hist
        timings["backfill_s"] = time.monotonic() - t
        print(f"backfilled in {timings['backfill_s']:.0f}s", flush=True)
        t = time.monotonic()
        nodes = list(fleet(args.nodes, args.pool_nodes))
        now = time.time()
        bodies = {node: render_node(i, node, model, pool, now) for i, node, model, pool in nodes}
        timings["render_s"] = time.monotonic() - t
        server = FleetServer(bodies)
        t = time.monotonic()
        result["live"] = live(work, data, args, server, [n for _, n, _, _ in nodes])
        timings["live_s"] = time.monotonic() - t
    finally:
        if server:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    timings["total_s"] = time.monotonic() - t_all
    result["timings"] = timings
    result["machine"]["load_average_at_end"] = os.getloadavg()
    lv = result["live"]
    per_k = 1000 / args.nodes
    print()
    print(f"rule evaluation on {args.nodes} nodes x {GPUS} GPUs ({args.nodes // args.pool_nodes} pools), "
          f"{os.cpu_count()} CPUs, load average {result['machine']['load_average_at_start'][0]:.1f} at start")
    print(f"{'group':28} {'file':24} {'rules':>5} {'every':>6} {'cycles':>6} {'median s':>9} {'max s':>7} "
          f"{'fails':>5}")
    for g, r in lv["groups"].items():
        med = f"{r['median_seconds']:.3f}" if r["median_seconds"] is not None else "-"
        mx = f"{r['max_seconds']:.3f}" if r["max_seconds"] is not None else "-"
        if r.get("instant_query_seconds") is not None:
            med = f"~{r['instant_query_seconds']:.3f}q"  # its rules as instant queries, once
        print(f"{g:28} {r['file']:24} {r['rules']:>5} {r['interval_seconds'] or 0:>5.0f}s {r['cycles']:>6} {med:>9} "
              f"{mx:>7} {r['evaluation_failures']:>5}")
    print(f"series per node: {lv['node0_raw_series']} scraped (model: {result['model_series_per_node']}"
          + (f", real exporter here: {result['real_exposition']['series']}" if "real_exposition" in result else "")
          + f"), {lv['node0_recorded_series']} recorded with its node label")
    print(f"recorded series: {lv['recorded_series_total']:,} "
          f"({lv['recorded_series_total'] * per_k:,.0f} per 1,000 nodes); "
          f"head series {lv['head_series']:,}; Prometheus RSS {lv['prometheus_rss_bytes'] / 2**30:.1f} GiB, "
          f"{lv['prometheus_cpu_seconds_per_second']:.2f} CPU s/s while measured")
    print(f"alerts at the end (a healthy fleet): {lv['alerts'] or 'none'}")
    print("timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
