#!/usr/bin/env python3
"""What the shipped rules cost at fleet scale: rule evaluation time per group, missed iterations,
head series and memory, on a real Prometheus evaluating the shipped rule files live.

1. A node's exposition, modelled (v3: the node judges itself, the fleet compares peers):
   - the raw families at the counts benchmarks/series_budget.py measured on an 8-GPU node with
     8 InfiniBand ports at the default config (benchmarks/results/series_budget.json, its
     `by_family`; label values from the probes' declared metric specs, fitted to each count),
     plus the families of targets a deployment configures (--targets: two storage targets, one
     inference endpoint), which the default config leaves out;
   - the judge's per-series statistics (fleetcanary_judge_median / _newest / _change / _drift,
     labels figure, series, gpu, pool, model, driver_version), one series per judged figure the
     exporter's own fleetcanary.judge.figures.extract finds in that raw exposition (the training
     step on each of the 8 GPUs), at model levels: median at the GPU model's level with a per-GPU
     offset, change and drift 0.995 +- 1% (cut at 3%, so a healthy fleet fires no alert), and on
     the nodes that upgraded their driver in the last two weeks (--upgraded) the change against
     the previous driver's best day too.
2. A fleet (default 1,000 nodes x 8 GPUs, pools of 50, 60% H100 and 40% H200).
3. State of the TSDB:
   - fresh: none; Prometheus starts empty, its windows hold the minutes since it started;
   - steady: every series a rule reads through a range window is backfilled (promtool tsdb
     create-blocks-from openmetrics) at the scrape interval over that window, ending now: the NIC
     group's [1d] windows hold a day of samples, the hard-failure group's [1h]-[4h] windows are
     full, as in a Prometheus that has run for a day. Instant selectors read the head only (no
     block overlaps their 5-minute lookback), so the rest is not backfilled; the head's chunks
     fill while the benchmark runs (--warmup leaves more time before measuring).
4. Live: a real Prometheus scrapes every node's exposition (one target per node on 127.0.0.1,
   every 30 s) and evaluates alerts/fleetcanary.rules.yml and alerts/fleetcanary.alerts.yml
   unchanged (or, with --pools-sharded N, the same rules rendered by alerts/build.py with the
   first N pools in groups of their own). It records every group's evaluations
   (prometheus_rule_group_last_duration_seconds at each new evaluation timestamp) until the
   slowest group has run --cycles times after --warmup, then iterations missed, series and
   memory.

Loopback only. Prints a per-group table and the before (v2: benchmarks/results/rule_scale-200.json)
and after table, writes benchmarks/results/rule_scale-v3-<nodes>-<state>[-sharded<N>].json.

    python benchmarks/rule_scale.py --nodes 100 --state fresh --cycles 1   # a few minutes
    python benchmarks/rule_scale.py --nodes 1000 --state steady             # ~40 min
    python benchmarks/rule_scale.py --table                                 # the tables from the JSON on disk
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
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run by path: the repo root, for the imports below
from alerts.backfill import binary, create_blocks
from benchmarks.common import free_port, proc_stats, wait_http, write_result

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks/results"
RULE_FILES = [ROOT / "alerts/fleetcanary.rules.yml", ROOT / "alerts/fleetcanary.alerts.yml"]
BUDGET_JSON = RESULTS / "series_budget.json"
V2_JSON = RESULTS / "rule_scale-200.json"   # the v2 rules at 200 nodes (docs/alerting-scale.md)
JUDGE_PREFIX = "fleetcanary_judge_"
GPUS = 8
DRIVER, NEW_DRIVER = "570.124.06", "575.57.08"   # the fleet's driver; the upgraded nodes' new one
CPU_MODEL = "Xeon 8480"
MODELS = {"H100": {"d2d": 3.0e12, "h2d": 5.3e10, "d2h": 5.3e10}, "H200": {"d2d": 4.2e12, "h2d": 5.4e10, "d2h": 5.4e10}}
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
TARGETS = {"storage": ["local-nvme", "shared-nfs"], "object_storage": ["model-bucket"],
           "inference": ["llama-70b-prod"]}


def seconds(d: str) -> float:
    return sum(int(n) * _UNITS[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w)", d))


# --------------------------------------------------------------------------- the raw exposition: every label value
def label_values() -> dict[str, list[str]]:
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
        "op": ["copy", "triad"], "cache": ["cold", "hot"], "phase": ["resolve", "connect", "tls",
                                                                                     "first_byte", "transfer"],
        "streams": ["1", "4"], "check": ["golden"], "result": ["success", "failure"],
    }


def _nic_fabric_combos(spec, node: int) -> list[dict]:
    """An HGX node's fabric: 8 InfiniBand ports (mlx5_0-7, port 1) and one Ethernet interface."""
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
        return []
    if spec.name.startswith("fleetcanary_net_interface_"):
        return [{"interface": "eth0", **({"direction": d} if "direction" in spec.labels else {})}
                for d in (("rx", "tx") if "direction" in spec.labels else ("",))]
    if "device" not in spec.labels:
        return [{}]
    combos = ports
    for name, values in (extra.get(spec.name) or {}).items():
        combos = [{**c, name: v} for c in combos for v in values]
    return combos


def spec_series(node: int, model: str, pool: str, driver: str) -> dict[str, list[tuple[str, dict]]]:
    """family -> (sample name, labels) of every series an 8-GPU node could expose, from the declared metric
    specs: every label value (18 NVLinks per GPU, 56 P2P pairs, ...), every probe's target families."""
    from fleetcanary.daemon.collector import EXPORTER_METRICS
    from fleetcanary.judge.figures import confirm_metrics
    from fleetcanary.probes import PROBES

    lv = label_values()
    probes = sorted(PROBES)
    out: dict[str, list[tuple[str, dict]]] = defaultdict(list)

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
            combos = [{"pool": pool, "cpu_model": CPU_MODEL, "gpu_model": model, "gpu_count": "8",
                       "driver_version": driver, "node_name": f"node-{node:04d}"}]
        elif spec.name == "fleetcanary_build_info":
            combos = [{"version": "0.2.0", "commit": "abc1234", "python_version": "3.11.7"}]
        elif "probe" in labels:
            combos = []
            for p in probes:
                if spec.name.endswith(("failures_total", "crashes_total", "skips_total")):
                    continue  # a reason appears once counted (the budget says which start at 0)
                if spec.name == "fleetcanary_probe_confirmation_runs_total" and not confirm_metrics(p):
                    continue  # only probes with fast-path figures
                combos += expand(labels, {"probe": p})
        elif spec.name.startswith(("fleetcanary_kubernetes_", JUDGE_PREFIX)):
            continue  # bare metal; the judge's families are modelled apart (judge_series)
        else:
            combos = expand(labels)
        out[spec.name] += [(spec.name, c) for c in combos]
    for name, cls in sorted(PROBES.items()):
        for spec in cls.metrics:
            if spec.name.endswith("_failures_total"):
                continue
            if spec.name == "fleetcanary_gpu_info":
                combos = [{"gpu": g, "uuid": f"GPU-{node:04d}-{g}", "model": model, "pci_bus_id": f"0000:{g}1:00.0",
                           "serial": f"S{node:04d}{g}", "vbios": "96.00.99.00.01"} for g in lv["gpu"]]
            elif spec.labels[:2] == ("src_gpu", "dst_gpu"):
                pairs = [{"src_gpu": a, "dst_gpu": b} for a in lv["gpu"] for b in lv["gpu"] if a != b]
                combos = [{**p, "link": "nvlink"} for p in pairs] if "link" in spec.labels else pairs
            elif spec.name in ("fleetcanary_gpu_clock_throttle_active", "fleetcanary_gpu_sustained_throttle_seconds"):
                combos = expand(spec.labels)
            elif spec.name == "fleetcanary_gpu_nvlink_errors_total":
                combos = [{"gpu": g, "link": k, "counter": c} for g in lv["gpu"] for k in lv["link"]
                          for c in ("replay", "recovery", "crc_flit", "crc_data")]
            elif spec.name == "fleetcanary_gpu_sustained_flops_per_second":
                combos = [{"gpu": g, "dtype": "bf16"} for g in lv["gpu"]]
            elif spec.name.startswith("fleetcanary_train_step_"):
                combos = [{"gpu": "0", "dtype": "bf16"}]  # one GPU a run (the first idle one)
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
            tgts = TARGETS.get(name, [None])
            for c in combos:
                for t in tgts:
                    labels = {**c, **({"target": t} if t else {})}
                    if spec.type == "histogram":
                        for le in [*map(repr, spec.buckets), "+Inf"]:
                            out[spec.name].append((spec.name + "_bucket", {**labels, "le": le}))
                        out[spec.name].append((spec.name + "_sum", labels))
                        out[spec.name].append((spec.name + "_count", labels))
                    else:
                        out[spec.name].append((spec.name, labels))
    return out


# Families the spec model does not have (exported at 0 from the start, per the series budget) and their labels.
MISSING = {"fleetcanary_gpu_lost": lambda: [{"gpu": str(g)} for g in range(GPUS)],
           "fleetcanary_probe_failures_total": lambda: [{"probe": "collectives", "reason": "wrong_result"}],
           "fleetcanary_probe_skips_total": lambda: [{"probe": p, "reason": r} for p, r in (
               ("storage", "not_configured"), ("object_storage", "not_configured"), ("inference", "not_configured"),
               ("fabric", "peer_unavailable"))]}


def fit(family: str, entries: list[tuple[str, dict]], n: int) -> list[tuple[str, dict]]:
    """`n` series of `family`: the model's own when it has n; with more, those left when one folded label
    is dropped (NVLink errors per GPU, not per link) if that gives n, else the first n; with fewer, the
    budget's own reason labels (MISSING) or an index label."""
    if len(entries) == n:
        return entries
    if len(entries) > n:
        for drop in reversed(list(entries[0][1])):
            seen: dict[tuple, tuple[str, dict]] = {}
            for sample, lab in entries:
                rest = {k: v for k, v in lab.items() if k != drop}
                seen.setdefault((sample, tuple(rest.items())), (sample, rest))
            if len(seen) == n:
                return list(seen.values())
        return entries[:n]
    if family in MISSING and len(MISSING[family]()) == n:
        return [(family, lab) for lab in MISSING[family]()]
    if n == 1 and not entries:
        return [(family, {})]
    extra = [(family, {"i": str(k)}) for k in range(n - len(entries))]
    return entries + extra


def budget() -> dict:
    """The series budget's per-family counts of one 8-GPU node (benchmarks/series_budget.py's result)."""
    if not BUDGET_JSON.exists():
        raise SystemExit(f"rule_scale: {BUDGET_JSON.relative_to(ROOT)} is missing; run "
                         "python benchmarks/series_budget.py first")
    data = json.loads(BUDGET_JSON.read_text())
    return {"file": str(BUDGET_JSON.relative_to(ROOT)), "series_without_judge": data["series_without_judge"],
            "judge_series_on_the_cpu_run": data.get("judge_series"),
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(BUDGET_JSON.stat().st_mtime)),
            "by_family": {f: n for f, n in data["by_family"].items() if not f.startswith(JUDGE_PREFIX)}}


# The harness's node, made the GPU node: what a CPU run of the default probes labels differently (the training step
# on device "cpu" in fp32, collectives on gloo with 2 ranks); the GPU node runs bf16 on GPU 0, NCCL on 8 ranks.
GPU_NODE_LABELS = {"gpu": {"cpu": "0"}, "dtype": {"fp32": "bf16"}, "backend": {"gloo": "nccl"}, "ranks": {"2": "8"}}
TEMPLATE_CODE = """
import json, sys
from pathlib import Path
from harness import series_budget as sb
text, ran = sb.in_process_exposition(Path(sys.argv[1]))
node, why = sb.node_series(sb.families(text))
json.dump({"node": node, "ran": ran, "why": why}, open(sys.argv[2], "w"))
"""


def node_template(work: Path, counts: dict[str, int]) -> tuple[dict[str, list[tuple[str, dict]]], dict]:
    """family -> (sample, labels) of every raw series of the 8-GPU node at the default config: the exporter's own
    exposition from harness/series_budget.py (every default probe run once in a subprocess, on the fake NVML and
    InfiniBand tree, the families the CPU cannot show counted as the GPU node has them), its CPU labels made the
    GPU node's. A family whose count differs from the series budget's (a probe that failed here) is taken from
    the declared metric specs, fitted to the budget's count."""
    from harness.series_budget import FAKE_NVML

    (work / "template").mkdir()
    out_json = work / "template.json"
    proc = subprocess.run([sys.executable, "-c", TEMPLATE_CODE, str(work / "template"), str(out_json)], cwd=ROOT,
                          env={**os.environ, "FLEETCANARY_FAKE_NVML": str(FAKE_NVML)}, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"rule_scale: the node's exposition failed: {proc.stderr[-3000:]}")
    data = json.loads(out_json.read_text())
    spec = spec_series(0, "H100", "p", DRIVER)
    tmpl, fitted = {}, {}
    for family, n in counts.items():
        labs = [{k: GPU_NODE_LABELS.get(k, {}).get(v, v) for k, v in lab.items()}
                for lab in data["node"].get(family, [])]
        if len(labs) == n:
            tmpl[family] = [(family, lab) for lab in labs]
        else:
            tmpl[family] = fit(family, spec.get(family, []), n)
            fitted[family] = {"exposed_here": len(labs), "budget": n}
    return tmpl, {"probe_outcomes": data["ran"], "gpu_node_gaps": data["why"], "fitted_from_specs": fitted}


def raw_series(tmpl: dict[str, list[tuple[str, dict]]], node: int, model: str, pool: str, driver: str,
               targets: tuple[str, ...]) -> list[tuple[str, str, dict]]:
    """(family, sample name, labels) of every raw series one node exposes: the template with the node's own
    identity (node_info, gpu_info), plus the families of the configured target probes (--targets)."""
    from fleetcanary.probes import PROBES

    out = []
    for family, entries in tmpl.items():
        own = entries
        if family == "fleetcanary_node_info":
            own = [(s, {**lab, "pool": pool, "node_name": f"node-{node:04d}", "driver_version": driver,
                        "gpu_model": model, "cpu_model": CPU_MODEL}) for s, lab in entries]
        elif family == "fleetcanary_gpu_info":
            own = [(s, {**lab, "model": model, "uuid": f"GPU-{node:04d}-{lab.get('uuid', '')[-12:]}",
                        "serial": f"{node:04d}{lab.get('serial', '')}"}) for s, lab in entries]
        out += [(family, s, lab) for s, lab in own]
    if targets:
        spec = spec_series(node, model, pool, driver)
        for probe in targets:
            for m in PROBES[probe].metrics:
                if m.name not in tmpl:
                    out += [(m.name, s, lab) for s, lab in spec.get(m.name, [])]
    return out


# --------------------------------------------------------------------------- the judge's statistics
MATMUL = {"bf16": 7.5e14, "fp16": 7.5e14, "tf32": 3.7e14, "fp8": 1.4e15}
COLLECTIVE = {"8": 4.0e5, "1024": 5.0e7, "65536": 3.0e9, "1048576": 4.0e10, "16777216": 1.8e11, "67108864": 3.5e11}
HOST = {"copy": 1.5e11, "triad": 1.6e11}
STORAGE_READ = {"local-nvme/cold": 3.0e9, "local-nvme/hot": 1.2e10, "shared-nfs/cold": 1.0e9, "shared-nfs/hot": 8.0e9}
FIRST_BYTE = {"local-nvme/cold": 1.0e-4, "local-nvme/hot": 2.0e-5, "shared-nfs/cold": 2.0e-3, "shared-nfs/hot": 5.0e-5}


def level(figure: str, series: str, gpu_model: str) -> float:
    """A judged figure's level on a healthy node of `gpu_model`, in the figure's unit."""
    fast = 1.05 if gpu_model == "H200" else 1.0
    return {"gpu_memory_bandwidth": lambda: MODELS[gpu_model][series],
            "gpu_matmul_throughput": lambda: MATMUL[series] * fast,
            "gpu_p2p_bandwidth": lambda: 3.6e11,
            "collective_bus_bandwidth": lambda: COLLECTIVE[series.split("/")[1]] * fast,
            "host_memory_bandwidth": lambda: HOST.get(series, 1.5e11),
            "storage_read": lambda: STORAGE_READ.get(series, 2.0e9),
            "storage_first_byte": lambda: FIRST_BYTE.get(series, 1.0e-3),
            "gpu_sustained_ratio": lambda: 0.886,
            "train_step_time": lambda: 0.12 / fast}[figure]()


def _near(rng: random.Random, mean: float, sd: float, cut: float = 3.0) -> float:
    """A normal draw cut at `cut` standard deviations."""
    return mean + sd * max(-cut, min(cut, rng.gauss(0.0, 1.0)))


def judge_series(node: int, model: str, pool: str, driver: str, previous: str,
                 raw: list[tuple[str, str, dict]]) -> list[tuple[str, dict, float]]:
    """(family, labels, value) of the judge's statistics on one node: a series per judged figure that
    fleetcanary.judge.figures.extract finds in the node's raw exposition (the training step on each GPU),
    labelled as fleetcanary.judge.exposition labels them."""
    from fleetcanary.judge import figures as figmod

    by_metric = defaultdict(list)
    for fam, _, lab in raw:
        by_metric[fam].append({"metric": fam, "labels": lab, "value": 1.0})
    keys: set[tuple[str, str, str]] = set()
    for probe in figmod.BY_PROBE:
        metrics = {f.metric for f in figmod.BY_PROBE[probe]}
        keys |= set(figmod.extract(probe, [s for m in metrics for s in by_metric.get(m, [])]))
    keys |= {("train_step_time", s, str(g)) for f, s, _ in list(keys) if f == "train_step_time" for g in range(GPUS)}
    out, states = [], Counter()
    for figure, series, gpu in sorted(keys):
        fig = figmod.BY_KEY[figure]
        mlabel = {"gpu_model": model, "cpu_model": CPU_MODEL}.get(fig.model_field, "")
        rng = random.Random(f"{node}|{figure}|{series}|{gpu}")
        lab = {"figure": figure, "series": series, "gpu": gpu, "pool": pool, "model": mlabel, "driver_version": driver}
        sign = 1.0 if fig.higher_is_better else -1.0
        median = level(figure, series, model) * _near(rng, 1.0, 0.005) * _near(rng, 1.0, 0.002)
        out.append(("fleetcanary_judge_median", lab, median))
        if fig.fast:
            out.append(("fleetcanary_judge_newest", lab, median * (1 + sign * abs(_near(rng, 0.0, 0.003)))))
        if fig.history:
            out.append(("fleetcanary_judge_change", {**lab, "baseline": "current_driver", "baseline_driver": driver},
                        _near(rng, 1 - sign * 0.005, 0.01)))
            if previous:
                out.append(("fleetcanary_judge_change", {**lab, "baseline": "previous_driver",
                                                         "baseline_driver": previous}, _near(rng, 1.0, 0.01)))
            out.append(("fleetcanary_judge_drift", lab, _near(rng, 1 - sign * 0.005, 0.01)))
        states[(figure, "baselined" if fig.history else "smoothed")] += 1
    out += [("fleetcanary_judge_series", {"pool": pool, "figure": f, "state": s}, float(n))
            for (f, s), n in sorted(states.items())]
    out.append(("fleetcanary_judge_store_bytes", {}, 3.1e6))
    out += [("fleetcanary_judge_store_errors_total", {"kind": k}, 0.0) for k in ("unreadable_line", "write_failed")]
    return out


# --------------------------------------------------------------------------- the fleet and its values
def fleet(nodes: int, pool_nodes: int, upgraded: float):
    """(index, node, GPU model, pool, driver, previous driver): 60% H100, pools of `pool_nodes`; in each pool
    the last `upgraded` share of nodes run the new driver, upgraded less than two weeks ago."""
    for i in range(nodes):
        model = "H100" if i < nodes * 0.6 else "H200"
        k = i % pool_nodes
        size = min(pool_nodes, nodes - i // pool_nodes * pool_nodes)
        new = k >= size - round(upgraded * size)
        # Underscores: alerts/build.py's pool_shards writes re.escape()d names into a PromQL string, where the
        # backslash re.escape puts before "-" is an invalid escape (Prometheus refuses the file).
        yield (i, f"node-{i:04d}", model, f"{model.lower()}_pool_{i // pool_nodes:02d}",
               NEW_DRIVER if new else DRIVER, DRIVER if new else "")


def metric_kinds() -> tuple[dict[str, float], dict[str, str]]:
    """(default run interval, type) of every family; exporter metrics refresh with every scrape."""
    from fleetcanary.daemon.collector import EXPORTER_METRICS
    from fleetcanary.probes import PROBES

    interval, kind = {}, {}
    for m in EXPORTER_METRICS:
        interval[m.name], kind[m.name] = 0.0, m.type
    for cls in PROBES.values():
        for s in cls.metrics:
            interval[s.name], kind[s.name] = cls.default_interval_seconds, s.type
    for name in ("fleetcanary_judge_change", "fleetcanary_judge_median", "fleetcanary_judge_newest",
                 "fleetcanary_judge_drift", "fleetcanary_judge_series", "fleetcanary_judge_store_bytes"):
        kind[name] = "gauge"
    kind["fleetcanary_judge_store_errors_total"] = "counter"
    return interval, kind


ERROR_COUNTERS = {"fleetcanary_gpu_xid_errors_total", "fleetcanary_gpu_ecc_errors_total",
                  "fleetcanary_gpu_nvlink_errors_total", "fleetcanary_gpu_remapped_rows_total",
                  "fleetcanary_probe_failures_total", "fleetcanary_probe_crashes_total",
                  "fleetcanary_probe_skips_total", "fleetcanary_probe_invalid_samples_total",
                  "fleetcanary_storage_failures_total", "fleetcanary_object_failures_total",
                  "fleetcanary_history_write_errors_total", "fleetcanary_clock_jumps_total",
                  "fleetcanary_rdma_port_errors_total", "fleetcanary_rdma_port_hw_events_total",
                  "fleetcanary_net_interface_errors_total", "fleetcanary_net_interface_dropped_total",
                  "fleetcanary_net_interface_carrier_changes_total", "fleetcanary_fabric_rendezvous_rejected_total",
                  "fleetcanary_judge_store_errors_total"}
# A healthy node: every port present, expected, up and at its rate; every GPU and NVLink up; no error.
CONSTANTS = {"fleetcanary_rdma_port_present": 1.0, "fleetcanary_rdma_port_expected": 1.0,
             "fleetcanary_rdma_port_up": 1.0, "fleetcanary_rdma_ports_present": 8.0, "fleetcanary_rdma_ports_up": 8.0,
             "fleetcanary_rdma_ports_expected": 8.0, "fleetcanary_rdma_port_rate_below_expected": 0.0,
             "fleetcanary_rdma_port_counters_saturated": 0.0, "fleetcanary_nic_sysfs_errors": 0.0,
             "fleetcanary_rdma_port_rate_bytes_per_second": 50e9,
             "fleetcanary_rdma_port_expected_rate_bytes_per_second": 50e9,
             "fleetcanary_rdma_port_link_width": 4.0, "fleetcanary_net_interface_present": 1.0,
             "fleetcanary_net_interface_up": 1.0, "fleetcanary_gpu_nvlink_up": 1.0,
             "fleetcanary_gpu_nvlink_links_up": 18.0,
             "fleetcanary_net_interface_speed_bytes_per_second": 12.5e9, "fleetcanary_net_interface_mtu_bytes": 9000.0,
             "fleetcanary_config_last_reload_successful": 1.0,
             "fleetcanary_probe_success": 1.0, "fleetcanary_train_step_loss_check_pass": 1.0,
             "fleetcanary_inference_quality_pass": 1.0, "fleetcanary_inference_output_stable": 1.0,
             "fleetcanary_gpu_persistence_mode": 1.0}


def value(family: str, labels: dict, model: str, rng: random.Random, t: float) -> float:
    """A plausible, healthy value of a raw series (no alert fires on it)."""
    f = family
    if f in CONSTANTS:
        return CONSTANTS[f]
    if f in ("fleetcanary_rdma_port_state", "fleetcanary_rdma_port_physical_state"):
        return 1.0 if labels.get("state") in ("active", "link_up") else 0.0
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
    if f in ERROR_COUNTERS or (f == "fleetcanary_probe_runs_total" and labels.get("outcome") != "success"):
        return 0.0
    if f.endswith(("_total", "_bucket", "_count", "_sum")):
        return float(int(t / 60) % 100000)  # grows a little every minute
    if f.endswith("_timestamp_seconds"):
        return float(int(t))
    if f.endswith("interval_seconds"):
        from fleetcanary.probes import PROBES

        probe = PROBES.get(labels.get("probe", ""))
        return probe.default_interval_seconds if probe else 900.0
    if f == "fleetcanary_gpu_memory_bandwidth_bytes_per_second":
        return MODELS[model][labels["direction"]] * rng.gauss(1.0, 0.005)
    if f == "fleetcanary_gpu_sustained_throughput_ratio":
        return 0.886 * rng.gauss(1.0, 0.003)
    return 1.0e9 * rng.gauss(1.0, 0.01)


def fmt_labels(labels: dict) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items() if v != "")


def series_rng(name: str, lab: str) -> random.Random:
    """One measured series' random source, seeded by its identity: history and live share its level."""
    return random.Random(f"{name}|{lab}")


class Node:
    """One node's raw and judge series."""

    def __init__(self, i, node, model, pool, driver, previous, tmpl, targets):
        self.i, self.node, self.model, self.pool = i, node, model, pool
        self.raw = raw_series(tmpl, i, model, pool, driver, targets)
        self.judge = judge_series(i, model, pool, driver, previous, self.raw)

    def body(self, t: float, kind: dict[str, str]) -> bytes:
        """The node's exposition (text format 0.0.4), with NOW and MINUTE where a value moves with the clock (a
        probe's last-run and last-success times, the growing counters): FleetServer fills them in at each scrape,
        so no probe looks stale however long the run."""
        lines, typed = [], set()

        def type_line(fam):
            if fam not in typed:
                k = kind.get(fam, "counter" if fam.endswith("_total") else "gauge")
                lines.append(f"# TYPE {fam.removesuffix('_total') if k == 'counter' else fam} "
                             f"{'gauge' if k == 'info' else k}")
                typed.add(fam)

        for fam, sample, labels in self.raw:
            type_line(fam)
            name = sample if kind.get(fam) == "histogram" else fam
            lab = fmt_labels(labels)
            v = value(name, labels, self.model, series_rng(name, self.node + lab), t)
            later = value(name, labels, self.model, series_rng(name, self.node + lab), t + 3600)
            moves = ("NOW" if later - v == 3600 and name.startswith("fleetcanary_probe_last_") else
                     "MINUTE" if later - v != 3600 and later != v else f"{v:.10g}")
            lines.append(f"{sample}{{{lab}}} {moves}")
        for fam, labels, v in self.judge:
            type_line(fam)
            lines.append(f"{fam}{{{fmt_labels(labels)}}} {v:.10g}")
        return ("\n".join(lines) + "\n").encode()


# --------------------------------------------------------------------------- the steady state's history
def windows_read(rule_files: list[Path]) -> dict[str, float]:
    """Sample name -> the longest range (+ offset) a rule reads it with, seconds."""
    out: dict[str, float] = {}
    pat = re.compile(r"\b(fleetcanary_[a-z0-9_]+)(?:\{[^}]*\})?\[(\w+)(?::\w+)?\](?:\s*offset\s+(\w+))?")
    for f in rule_files:
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                for name, rng, off in pat.findall(r["expr"]):
                    out[name] = max(out.get(name, 0), seconds(rng) + (seconds(off) if off else 0))
    return out


BLOCK = 7200  # promtool's block: it parses its whole input once per 2-hour block, so each gets its own file


def write_history(work: Path, nodes: list[Node], need: dict[str, float], end: int, step: int) -> dict:
    """OpenMetrics of every series a rule reads through a range window, at `step` over that window (and two
    steps more), ending at `end`: one file per 2-hour block."""
    _, kind = metric_kinds()
    by_family: dict[str, list] = defaultdict(list)
    for n in nodes:
        for fam, sample, labels in n.raw:
            if sample in need:
                lab = fmt_labels(labels)
                full = fmt_labels({"job": "fleetcanary", "instance": n.node, "node": n.node, **labels})
                by_family[fam].append((sample, full, n.model, labels, n.node + lab))
    plan, families = {}, {}
    for fam, rows in by_family.items():
        span = max(need[s] for s, *_ in rows) + 2 * step
        start = end - int(span) // step * step
        plan[fam] = start
        families[fam] = {"series_per_node": len(rows) // len(nodes), "step_seconds": step,
                         "samples_per_series": len(range(start, end + 1, step)), "window_seconds": end - start}
    first = min(plan.values()) // BLOCK * BLOCK
    files, samples, series = [], 0, sum(len(r) for r in by_family.values())
    for w in range(first, end + 1, BLOCK):
        path = work / f"history-{w}.om"
        with open(path, "w", buffering=1 << 22) as f:
            for fam, rows in by_family.items():
                start = plan[fam]
                t0 = max(start, start + -(-(w - start) // step) * step)
                times = list(range(t0, min(w + BLOCK, end + 1), step))
                if not times:
                    continue
                k = {"info": "gauge"}.get(kind.get(fam, "gauge"), kind.get(fam, "gauge"))
                f.write(f"# TYPE {fam.removesuffix('_total') if k == 'counter' else fam} {k}\n")
                for sample, lab, model, labels, ident in rows:
                    name = sample if k == "histogram" else fam
                    pre = f"{sample}{{{lab}}} "
                    shape = value(name, labels, model, series_rng(name, ident), times[0])
                    if name.endswith(("_total", "_bucket", "_count", "_sum", "_timestamp_seconds")):
                        f.write("".join(f"{pre}{value(name, labels, model, None, t):.10g} {t}\n" for t in times))
                    else:  # a gauge the rules read through a window: its constant healthy value
                        f.write("".join(f"{pre}{shape:.10g} {t}\n" for t in times))
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


# --------------------------------------------------------------------------- serving the fleet
class FleetServer:
    """Every node's exposition at /metrics/<node> on 127.0.0.1, rendered once; the clock's values (Node.body)
    filled in at each scrape, as value() gives them."""

    def __init__(self, bodies: dict[str, bytes]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = bodies.get(self.path.rsplit("/", 1)[-1])
                if body:
                    now = time.time()
                    body = body.replace(b" NOW\n", f" {int(now)}\n".encode()).replace(
                        b" MINUTE\n", f" {int(now / 60) % 100000}\n".encode())
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
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    # A long timeout: a Prometheus starved of CPU by its own rule groups answers /metrics late.
    with urllib.request.urlopen(url + "/metrics", timeout=300) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(("prometheus_rule_group", "prometheus_tsdb_head_series",
                                  "prometheus_rule_evaluation_failures_total", "process_resident_memory_bytes")):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def query(url: str, expr: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=600) as r:
        body = json.loads(r.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def by_group(m: dict, name: str) -> dict[str, float]:
    return {dict(k[1])["rule_group"]: v for k, v in m.items() if k[0] == name}


def live(work: Path, data: Path, args, server: FleetServer, node_names: list[str], rule_files: list[Path]) -> dict:
    cfg = {"global": {"scrape_interval": f"{args.scrape_interval}s", "evaluation_interval": "1m"},
           "rule_files": [str(f) for f in rule_files],
           "scrape_configs": [{"job_name": "fleetcanary", "static_configs": [
               {"targets": [server.address], "labels": {"__metrics_path__": f"/metrics/{n}", "node": n}}
               for n in node_names],
               "relabel_configs": [{"source_labels": ["node"], "target_label": "instance"}]}]}
    (work / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(work / "prometheus.log", "wb") as log:  # Prometheus keeps its own descriptor
        proc = subprocess.Popen([binary("prometheus"), f"--config.file={work / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
                                 "--storage.tsdb.retention.time=30d", "--log.level=warn",
                                 # No leveled compaction of the backfilled 2-hour blocks while measuring.
                                 "--storage.tsdb.max-block-duration=2h"],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"rule_scale: prometheus exited {proc.returncode}: "
                                 f"{(work / 'prometheus.log').read_text()[-3000:]}")
            try:
                wait_http(url + "/-/ready", timeout=5)
                break
            except SystemExit:
                if time.monotonic() - t0 > 900:
                    raise
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
        print(f"prometheus ready in {ready_s:.0f}s; all {len(node_names)} targets up after {all_up - t0:.0f}s; "
              f"measuring after a warm-up of {args.warmup:.0f}s", flush=True)
        first = prom_metrics(url)
        interval = by_group(first, "prometheus_rule_group_interval_seconds")
        seen = by_group(first, "prometheus_rule_group_last_evaluation_timestamp_seconds")
        evals: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (seconds after all up, duration)
        missed0, cpu0, m = None, None, first
        slowest = max(interval.values())
        while time.monotonic() < deadline:
            m = prom_metrics(url)
            now = time.monotonic() - all_up
            if missed0 is None and now >= args.warmup:
                missed0 = by_group(m, "prometheus_rule_group_iterations_missed_total")
                cpu0, t_cpu0 = proc_stats(proc.pid)[0], time.monotonic()
            last = by_group(m, "prometheus_rule_group_last_evaluation_timestamp_seconds")
            dur = by_group(m, "prometheus_rule_group_last_duration_seconds")
            for g, ts in last.items():
                if ts > seen.get(g, 0):
                    seen[g] = ts
                    evals[g].append((round(now, 1), dur[g]))
                    print(f"  {now:6.0f}s {g.split(';')[1]}: {dur[g]:.2f} s", flush=True)
            measured = {g: [d for t, d in evals[g] if t >= args.warmup] for g in interval}
            if missed0 is not None and all(len(measured[g]) >= args.cycles * slowest / interval[g] for g in interval):
                break
            time.sleep(3)
        else:
            print("rule_scale: --max-wait passed before every group ran its cycles", flush=True)
        wall = time.monotonic() - all_up
        cpu = proc_stats(proc.pid)[0]
        rss, hwm = proc_stats(proc.pid)[1], peak_rss(proc.pid)
        missed = by_group(m, "prometheus_rule_group_iterations_missed_total")
        iterations = by_group(m, "prometheus_rule_group_iterations_total")
        rules = by_group(m, "prometheus_rule_group_rules")
        fails = defaultdict(float)
        for (name, lab), v in m.items():
            if name == "prometheus_rule_evaluation_failures_total":
                fails[dict(lab)["rule_group"]] += v
        groups = {}
        for g in interval:
            d = [x for t, x in evals[g] if t >= args.warmup]
            early = [x for t, x in evals[g] if t < args.warmup]
            med = statistics.median(d) if d else None
            groups[g.split(";", 1)[1]] = {
                "file": Path(g.split(";")[0]).name, "rules": int(rules.get(g, 0)), "interval_seconds": interval[g],
                "evaluations": [[t, round(x, 4)] for t, x in evals[g]], "measured": len(d),
                "median_seconds": med, "max_seconds": max(d) if d else None,
                "warmup_median_seconds": statistics.median(early) if early else None,
                "seconds_per_minute": med * 60 / interval[g] if med is not None else None,
                "iterations_total": int(iterations.get(g, 0)), "iterations_missed_total": int(missed.get(g, 0)),
                "iterations_missed_measured": int(missed.get(g, 0) - (missed0 or {}).get(g, 0)),
                "evaluation_failures": int(fails.get(g, 0))}
        recorded = {r["metric"]["__name__"]: int(float(r["value"][1]))
                    for r in query(url, 'count by (__name__) ({__name__=~".+:.+"})')}
        node0 = node_names[0]
        per_node = {r["metric"]["__name__"]: int(float(r["value"][1]))
                    for r in query(url, f'count by (__name__) ({{node="{node0}"}})')}
        scraped = query(url, 'avg(scrape_samples_scraped{job="fleetcanary"})')
        alerts = query(url, "count by (alertname, alertstate) (ALERTS)")
        return {"prometheus_ready_seconds": ready_s, "all_up_seconds": all_up - t0, "groups": groups,
                "head_series": int(m.get(("prometheus_tsdb_head_series", ()), 0)),
                "scraped_series_per_node": float(scraped[0]["value"][1]) if scraped else None,
                "recorded_series": recorded, "recorded_series_total": sum(recorded.values()),
                "node0_series": sum(n for k, n in per_node.items() if ":" not in k),
                "node0_recorded_series": sum(n for k, n in per_node.items() if ":" in k),
                "node0_recorded_by_metric": {k: n for k, n in per_node.items() if ":" in k},
                "alerts": {f'{a["metric"]["alertname"]}/{a["metric"]["alertstate"]}': int(float(a["value"][1]))
                           for a in alerts},
                "prometheus_cpu_seconds_per_second": ((cpu - cpu0) / (time.monotonic() - t_cpu0)
                                                      if cpu0 is not None else None),
                "prometheus_rss_bytes": rss, "prometheus_peak_rss_bytes": hwm, "measured_seconds": wall,
                "warmup_seconds": args.warmup}
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


def sharded_rules(work: Path, pools: list[str]) -> list[Path]:
    """The shipped rules rendered by alerts/build.py with `pools` in peer and own-history groups of their own."""
    from dataclasses import replace

    from alerts.build import SETTINGS, render
    out = work / "rules"
    out.mkdir()
    for name, text in render(settings=replace(SETTINGS, pools=tuple(pools))).items():
        (out / name).write_text(text)
    return [out / "fleetcanary.rules.yml", out / "fleetcanary.alerts.yml"]


# --------------------------------------------------------------------------- tables
def _gib(b: float) -> str:
    return f"{b / 2**30:.1f}"


def v2_summary() -> dict:
    """The v2 rules at 200 nodes (benchmarks/results/rule_scale-200.json), per 1,000 nodes linearly."""
    d = json.loads(V2_JSON.read_text())
    lv, k = d["live"], 1000 / d["nodes"]
    per_min = sum(g["median_seconds"] * 60 / g["interval_seconds"] for g in lv["groups"].values()
                  if g["median_seconds"] is not None)
    return {"label": f"v2, {d['nodes']} nodes x 5", "nodes": d["nodes"], "per_minute_per_1000": per_min * k,
            "per_minute": per_min,
            "hourly_group_per_1000": sum(g.get("instant_query_seconds") or 0 for g in lv["groups"].values()
                                         if g["interval_seconds"] == 3600) * k,
            "head_series_per_1000": lv["head_series"] * k, "rss_per_1000": lv["prometheus_rss_bytes"] * k,
            "rss": lv["prometheus_rss_bytes"],
            "scraped_per_node": lv["node0_raw_series"],
            # the 1-minute groups' records, measured; the hourly group's 936 a node, counted from its rules
            "recorded_per_node": lv["recorded_series_total"] / d["nodes"] + 936,
            "missed": "peers group 192 s, then 746 s per evaluation at 1,000 nodes (docs/alerting-scale.md)",
            "cpu": lv["prometheus_cpu_seconds_per_second"]}


def summary(r: dict) -> dict:
    lv, n = r["live"], r["nodes"]
    per_min = sum(g["seconds_per_minute"] for g in lv["groups"].values() if g["seconds_per_minute"] is not None)
    missed = sum(g["iterations_missed_total"] for g in lv["groups"].values())
    late = [g for g, x in lv["groups"].items()
            if x["max_seconds"] is not None and x["max_seconds"] > x["interval_seconds"]]
    label = f"v3 {r['state']}, {n:,} nodes"
    if r.get("pools_sharded"):
        label += f", {r['pools_sharded']} pools sharded"
    return {"label": label, "nodes": n, "per_minute": per_min, "per_minute_per_1000": per_min * 1000 / n,
            "head_series_per_1000": lv["head_series"] * 1000 / n,
            "rss_per_1000": lv["prometheus_peak_rss_bytes"] * 1000 / n, "rss": lv["prometheus_peak_rss_bytes"],
            "scraped_per_node": lv["scraped_series_per_node"], "recorded_per_node": lv["recorded_series_total"] / n,
            "missed": f"{missed} missed" + (f"; over interval: {', '.join(late)}" if late else ", every group in time"),
            "cpu": lv["prometheus_cpu_seconds_per_second"]}


def compare_table(results: list[dict]) -> str:
    """Before (v2) and after (each v3 result) side by side, per 1,000 nodes."""
    cols = [v2_summary()] + [summary(r) for r in results]
    rows = [("rule evaluation, s per minute per 1,000 nodes", lambda c: f"{c['per_minute_per_1000']:.1f}"),
            ("rule evaluation, s per minute (this fleet)", lambda c: f"{c['per_minute']:.1f}"),
            ("Prometheus CPU, cores (while measured)", lambda c: f"{c['cpu']:.2f}" if c["cpu"] is not None else "-"),
            ("missed iterations", lambda c: c["missed"]),
            ("head series per 1,000 nodes (M)", lambda c: f"{c['head_series_per_1000'] / 1e6:.2f}"),
            ("Prometheus RSS per 1,000 nodes (GiB)", lambda c: _gib(c["rss_per_1000"])),
            ("Prometheus peak RSS, this fleet (GiB)", lambda c: _gib(c["rss"])),
            ("scraped series per node", lambda c: f"{c['scraped_per_node']:,.0f}"),
            ("recorded series per node", lambda c: f"{c['recorded_per_node']:,.1f}")]
    out = ["| | " + " | ".join(c["label"] for c in cols) + " |", "| --- |" + " --- |" * len(cols)]
    out += [f"| {name} | " + " | ".join(f(c) for c in cols) + " |" for name, f in rows]
    return "\n".join(out)


def group_table(r: dict) -> str:
    lv, n = r["live"], r["nodes"]
    out = ["| group | rules | every | evaluations | median s (max) | s per minute | per minute per 1,000 nodes | "
           "missed | failures |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for g, x in sorted(lv["groups"].items(), key=lambda kv: -(kv[1]["seconds_per_minute"] or 0)):
        if x["median_seconds"] is None:
            out.append(f"| {g} | {x['rules']} | {x['interval_seconds'] / 60:.0f}m | 0 | - | - | - | "
                       f"{x['iterations_missed_total']} | {x['evaluation_failures']} |")
            continue
        out.append(f"| {g} | {x['rules']} | {x['interval_seconds'] / 60:.0f}m | {x['measured']} | "
                   f"{x['median_seconds']:.3f} ({x['max_seconds']:.3f}) | {x['seconds_per_minute']:.3f} | "
                   f"{x['seconds_per_minute'] * 1000 / n:.3f} | {x['iterations_missed_total']} | "
                   f"{x['evaluation_failures']} |")
    return "\n".join(out)


def pool_cost(r: dict) -> dict | None:
    """With --pools-sharded: one pool's peer and own-history groups, the median over the sharded pools."""
    pools = r.get("sharded_pools") or []
    if not pools:
        return None
    lv, out = r["live"], {"pools": len(pools), "nodes_per_pool": r["pool_nodes"]}
    for kind in ("peers", "own-history"):
        med = [lv["groups"][f"fleetcanary-{kind}-{p}"]["median_seconds"] for p in pools
               if lv["groups"].get(f"fleetcanary-{kind}-{p}", {}).get("median_seconds") is not None]
        mx = [lv["groups"][f"fleetcanary-{kind}-{p}"]["max_seconds"] for p in pools
              if lv["groups"].get(f"fleetcanary-{kind}-{p}", {}).get("max_seconds") is not None]
        out[kind] = {"median_seconds": statistics.median(med) if med else None, "max_seconds": max(mx) if mx else None,
                     "sum_of_medians_seconds": sum(med), "groups": len(med)}
    return out


def on_disk() -> list[dict]:
    out = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("rule_scale-v3-*.json"))]
    return sorted(out, key=lambda r: (bool(r.get("pools_sharded")), r["nodes"], r["state"] != "fresh"))


def print_tables(results: list[dict]) -> None:
    for r in results:
        print(f"\n{summary(r)['label']} ({r['nodes'] // r['pool_nodes']} pools of {r['pool_nodes']}; "
              f"{r['machine']['cpus']} CPUs, load average {r['machine']['load_average_at_start'][0]:.1f} at start):")
        print(group_table(r))
        pc = pool_cost(r)
        if pc:
            for kind in ("peers", "own-history"):
                k = pc[kind]
                if k["median_seconds"] is not None:
                    print(f"one pool's {kind} group ({pc['nodes_per_pool']} nodes): median {k['median_seconds']:.3f} s "
                          f"(max {k['max_seconds']:.3f} s) an evaluation; all {k['groups']} pools "
                          f"{k['sum_of_medians_seconds']:.2f} s")
    print("\nbefore (v2) and after (v3):")
    print(compare_table(results))


# --------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pool-nodes", type=int, default=50, help="nodes per pool (a pool has one GPU model)")
    ap.add_argument("--state", choices=("fresh", "steady"), default="fresh",
                    help="fresh: an empty TSDB; steady: every range window backfilled at the scrape interval")
    ap.add_argument("--pools-sharded", type=int, default=0,
                    help="render the rules with the first N pools in groups of their own (alerts/build.py pools)")
    ap.add_argument("--upgraded", type=float, default=0.1,
                    help="share of each pool's nodes on a new driver (with a previous-driver change series)")
    ap.add_argument("--targets", default="storage,inference",
                    help="probes with targets configured (their families beside the budget's default config)")
    ap.add_argument("--scrape-interval", type=int, default=30, help="seconds")
    ap.add_argument("--cycles", type=int, default=3, help="evaluations of the slowest group to measure")
    ap.add_argument("--warmup", type=float, default=0, help="seconds of evaluation after all targets are up "
                    "before measuring (the head's chunks fill)")
    ap.add_argument("--max-wait", type=float, default=3600, help="seconds to wait for the cycles")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", help="default: benchmarks/results/rule_scale-v3-<nodes>-<state>[-sharded<N>].json")
    ap.add_argument("--table", action="store_true", help="print the tables from the results on disk and exit")
    args = ap.parse_args()
    # SIGTERM (and SIGINT, which a shell's background job ignores) end the run through its finally blocks:
    # Prometheus stopped, the work directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.table:
        print_tables(on_disk())
        return 0
    for b in ("prometheus", "promtool"):
        if not shutil.which(b):
            raise SystemExit(f"rule_scale: {b} is not installed (apt-get install prometheus)")
    out = args.out or str(RESULTS / f"rule_scale-v3-{args.nodes}-{args.state}"
                                    f"{f'-sharded{args.pools_sharded}' if args.pools_sharded else ''}.json")
    work = Path(tempfile.mkdtemp(prefix="fc-rule-scale-"))
    targets = tuple(t for t in args.targets.split(",") if t)
    b = budget()
    result = {"rules": "v3", "nodes": args.nodes, "gpus_per_node": GPUS, "pool_nodes": args.pool_nodes,
              "state": args.state, "pools_sharded": args.pools_sharded, "upgraded": args.upgraded,
              "targets": targets, "scrape_interval_seconds": args.scrape_interval, "cycles": args.cycles,
              "budget": {k: v for k, v in b.items() if k != "by_family"},
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True).stdout.strip(),
              "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(),
                          "platform": platform.platform()}}
    version = subprocess.run([binary("prometheus"), "--version"], capture_output=True, text=True).stdout
    result["machine"]["prometheus"] = version.split("\n")[0]
    t_all = time.monotonic()
    timings = {}
    server = None
    try:
        t = time.monotonic()
        fl = list(fleet(args.nodes, args.pool_nodes, args.upgraded))
        tmpl, result["template"] = node_template(work, b["by_family"])
        timings["template_s"] = time.monotonic() - t
        print(f"the node's exposition in {timings['template_s']:.0f}s: {sum(map(len, tmpl.values()))} raw series; "
              f"from the specs (a probe that failed here): {result['template']['fitted_from_specs'] or 'none'}",
              flush=True)
        t = time.monotonic()
        nodes = [Node(*row, tmpl, targets) for row in fl]
        n0 = next(n for n in nodes if n.node == fl[0][1])
        result["model"] = {"raw_series_per_node": len(n0.raw), "judge_series_per_node": len(n0.judge),
                           "raw_by_family": dict(sorted(Counter(f for f, _, _ in n0.raw).items())),
                           "judge_by_family": dict(sorted(Counter(f for f, _, _ in n0.judge).items())),
                           "judged_series_by_figure": dict(sorted(Counter(
                               lab["figure"] for f, lab, _ in n0.judge if f == "fleetcanary_judge_median").items())),
                           "upgraded_nodes": sum(1 for r in fl if r[5])}
        print(f"model: {len(n0.raw)} raw + {len(n0.judge)} judge series per node "
              f"(budget's default config {b['series_without_judge']} raw, {b['written']}; targets {targets})",
              flush=True)
        rule_files = RULE_FILES
        if args.pools_sharded:
            pools = sorted({r[3] for r in fl})[:args.pools_sharded]
            rule_files = sharded_rules(work, pools)
            result["sharded_pools"] = pools
        data = work / "data"
        data.mkdir()
        if args.state == "steady":
            end = int(time.time()) // args.scrape_interval * args.scrape_interval
            need = windows_read(rule_files)
            hist = write_history(work, nodes, need, end, args.scrape_interval)
            timings["generate_s"] = time.monotonic() - t
            size = sum(p.stat().st_size for p in hist["files"])
            print(f"history: {hist['series']:,} series, {hist['samples']:,} samples in {len(hist['files'])} files "
                  f"({size / 2**20:.0f} MiB of OpenMetrics) in {timings['generate_s']:.0f}s", flush=True)
            t = time.monotonic()
            backfill(hist.pop("files"), data)
            result["history"] = hist
            timings["backfill_s"] = time.monotonic() - t
            print(f"backfilled in {timings['backfill_s']:.0f}s", flush=True)
        t = time.monotonic()
        _, kind = metric_kinds()
        now = time.time()
        bodies = {n.node: n.body(now, kind) for n in nodes}
        del nodes
        timings["render_s"] = time.monotonic() - t
        result["exposition_bytes_per_node"] = len(bodies[fl[0][1]])
        server = FleetServer(bodies)
        t = time.monotonic()
        result["live"] = live(work, data, args, server, [r[1] for r in fl], rule_files)
        timings["live_s"] = time.monotonic() - t
    finally:
        if server:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    timings["total_s"] = time.monotonic() - t_all
    result["timings"] = timings
    result["machine"]["load_average_at_end"] = os.getloadavg()
    write_result(out, result)
    lv = result["live"]
    print_tables([result])
    print(f"alerts at the end (a healthy fleet): {lv['alerts'] or 'none'}")
    print("timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
