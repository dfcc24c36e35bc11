"""A node of the fleet, modelled: its raw exposition (the series budget's node, else the declared metric
specs), the judge's statistics on it, the fleet of such nodes, and a healthy value for every series."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks/results"
RULE_FILES = [ROOT / "alerts/fleetcanary.rules.yml", ROOT / "alerts/fleetcanary.alerts.yml"]
BUDGET_JSON = RESULTS / "series_budget.json"
V2_JSON = RESULTS / "rule_scale-200.json"   # the v2 rules at 200 nodes (docs/alerting-scale.md)
JUDGE_PREFIX = "fleetcanary_judge_"
GPUS = 8
DRIVER, NEW_DRIVER = "570.124.06", "575.57.08"   # the fleet's driver; the upgraded nodes' new one
CPU_MODEL = "Xeon 8480"
MODELS = {"H100": {"d2d": 3.0e12, "h2d": 5.3e10, "d2h": 5.3e10}, "H200": {"d2d": 4.2e12, "h2d": 5.4e10, "d2h": 5.4e10}}
TARGETS = {"storage": ["local-nvme", "shared-nfs"], "object_storage": ["model-bucket"],
           "inference": ["llama-70b-prod"]}


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
        "xid": ["79"], "class": ["bus"], "severity": ["critical"], "fabricmanager": ["unknown"], "imex": ["unknown"],
        "dtype": ["bf16", "fp16", "tf32", "fp8"],
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
        elif spec.name == "fleetcanary_state_errors_total":
            continue  # a file and kind appear once counted
        elif spec.name == "fleetcanary_gpu_health_state":
            combos = [{"gpu": g, "state": "healthy", "reason": ""} for g in lv["gpu"]]  # one series per GPU
        elif spec.name == "fleetcanary_node_health_state":
            combos = [{"state": "healthy", "reason": ""}]
        elif spec.name.startswith(("fleetcanary_kubernetes_", JUDGE_PREFIX)):
            continue  # bare metal; the judge's families are modelled apart (judge_series)
        else:
            combos = expand(labels)
        out[spec.name] += [(spec.name, c) for c in combos]
    for name, cls in sorted(PROBES.items()):
        for spec in cls.metrics:
            if spec.name.endswith("_failures_total"):
                continue
            if "appears once it happened" in spec.help and any(n not in lv for n in spec.labels):
                continue  # its series are born when it happens (an SXid, a state file set aside): none at steady state
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
           "fleetcanary_probe_failures_total": lambda: [{"probe": "collectives", "reason": "wrong_result"}]}


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
                         "python -m benchmarks.series_budget first")
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
               targets: tuple[str, ...], idle: tuple[str, ...] = ()) -> list[tuple[str, str, dict]]:
    """(family, sample name, labels) of every raw series one node exposes: the template with the node's own
    identity (node_info, gpu_info), plus the families of the configured target probes (--targets) and their
    runs; `idle`: target probes configured whose targets other nodes probe (runs skipped not_assigned)."""
    from fleetcanary.daemon.collector import RUNS_FROM_ZERO
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
                if m.name not in tmpl and not m.opt_in:
                    out += [(m.name, s, lab) for s, lab in spec.get(m.name, [])]
    # the daemon's series of each configured target probe (at the budget's default config it has no target and
    # publishes none)
    for probe in (*targets, *idle):
        out += [(f, f, {"probe": probe}) for f in ("fleetcanary_probe_interval_seconds",
                                                    *(RUN_FAMILIES if probe in targets else ()))]
        out += [("fleetcanary_probe_runs_total", "fleetcanary_probe_runs_total", {"probe": probe, "outcome": o})
                for o in RUNS_FROM_ZERO]
        if probe in idle:
            out.append(("fleetcanary_probe_skips_total", "fleetcanary_probe_skips_total",
                        {"probe": probe, "reason": "not_assigned"}))
    return out


# the daemon's series of a probe that has run
RUN_FAMILIES = ("fleetcanary_probe_success", "fleetcanary_probe_duration_seconds",
                "fleetcanary_probe_last_success_timestamp_seconds")


def probers(names: list[str], k: int) -> set[str]:
    """The nodes that probe the inference target: its k probers by rendezvous hashing over the fleet (the
    probe's probers_per_target, members from the DaemonSet's pods), every node with k = 0."""
    from fleetcanary.probes.lib import fanout

    return set(fanout.choose(TARGETS["inference"][0], names, k))


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


PUBLISHED_JSON = RESULTS / "judge-published.json"


def published_shares() -> dict:
    """The share of a baselined series' newest runs and drifts the judge publishes at steady state, measured on the
    detection fleet's nodes with no fault (benchmarks/detection/published.py; fleetcanary.judge.publish decides)."""
    if not PUBLISHED_JSON.exists():
        raise SystemExit(f"rule_scale: {PUBLISHED_JSON.relative_to(ROOT)} is missing; run "
                         "python -m benchmarks.detection.published first")
    data = json.loads(PUBLISHED_JSON.read_text())
    return {"file": str(PUBLISHED_JSON.relative_to(ROOT)), "profile": data["profile"],
            "newest": data["healthy"]["newest_share"], "drift": data["healthy"]["drift_share"]}


def stood_in(raw: list[tuple[str, str, dict]]) -> list[tuple[str, str, dict]]:
    """The raw series left once the judge has a median of every judged series (the model's steady node): a judged
    figure's gauge gives way to the median (fleetcanary.judge.figures.STANDS_IN)."""
    from fleetcanary.judge import figures as figmod

    return [(f, s, lab) for f, s, lab in raw if figmod.stood_in_key(f, lab) is None]


def judge_series(node: int, model: str, pool: str, driver: str, previous: str,
                 raw: list[tuple[str, str, dict]], shares: dict) -> list[tuple[str, dict, float]]:
    """(family, labels, value) of the judge's statistics on one node: a series per judged figure that
    fleetcanary.judge.figures.extract finds in the node's raw exposition (the training step on each GPU),
    labelled as fleetcanary.judge.exposition labels them; the newest runs and the drift of a share of them
    (`shares`, from published_shares()). shares["held"] (0 on the model's steady node) of the series are held, as a
    busy GPU's: they carry the held gauge, and their newest runs (where published) as fleetcanary_judge_newest_held."""
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
        held = shares.get("held", 0.0) > 0 and rng.random() < shares["held"]
        if held:
            out.append(("fleetcanary_judge_held_last_run_timestamp_seconds", lab, 1.7e9))
        if fig.fast and rng.random() < shares["newest"]:  # published where no better than the median
            out.append(("fleetcanary_judge_newest_held" if held else "fleetcanary_judge_newest", lab,
                        median * (1 - sign * abs(_near(rng, 0.0, 0.003)))))
        if fig.history:
            out.append(("fleetcanary_judge_change", {**lab, "baseline": "current_driver", "baseline_driver": driver},
                        _near(rng, 1 - sign * 0.005, 0.01)))
            if previous:
                out.append(("fleetcanary_judge_change", {**lab, "baseline": "previous_driver",
                                                         "baseline_driver": previous}, _near(rng, 1.0, 0.01)))
            if rng.random() < shares["drift"]:
                out.append(("fleetcanary_judge_drift", lab, _near(rng, 1 - sign * 0.005, 0.01)))
        states[(figure, "baselined" if fig.history else "smoothed")] += 1
    out += [("fleetcanary_judge_series", {"pool": pool, "figure": f, "state": s}, float(n))
            for (f, s), n in sorted(states.items())]
    out.append(("fleetcanary_judge_store_bytes", {}, 3.1e6))
    return out  # fleetcanary_judge_store_errors_total: none on a healthy node (a kind once it happened)


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
                 "fleetcanary_judge_newest_held", "fleetcanary_judge_held_last_run_timestamp_seconds",
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

    def __init__(self, i, node, model, pool, driver, previous, tmpl, targets, shares, idle=()):
        self.i, self.node, self.model, self.pool = i, node, model, pool
        raw = raw_series(tmpl, i, model, pool, driver, targets, idle)
        self.judge = judge_series(i, model, pool, driver, previous, raw, shares)
        self.raw = stood_in(raw)

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
