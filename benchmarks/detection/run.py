#!/usr/bin/env python3
"""Detection quality of the shipped alert rules against a known ground truth.

1. A synthetic fleet (default 1000 nodes x 8 GPUs, two GPU models, four pools) over 7
   days at the gpu_bandwidth cadence (15 min): per-GPU manufacturing spread (0.5%),
   run-to-run noise (1%), junk runs (0.5% of runs at 30-70% of the value),
   degradations of 3, 5, 7, 10 and 20% injected on random GPUs at random runs, a
   driver change on every node on day 4.5 that costs every GPU of one model 8%, and
   one GPU that falls off the bus on day 3.
2. It is backfilled into a real Prometheus: `promtool tsdb create-blocks-from
   openmetrics`, then the recording rules from alerts/fleetcanary.rules.yml with
   `promtool tsdb create-blocks-from rules`, in dependency order (a rule backfill cannot
   read rules backfilled beside it).
3. The alert expressions from alerts/fleetcanary.alerts.yml are evaluated over the
   week (query_range, 15 min step) and replayed with their `for` and
   `keep_firing_for`; so is a static per-model threshold at 0.75 of the reference (the
   DCGM-diagnostics style), with the same `for`.
4. Scored: precision, recall per degradation size, false-alert episodes per 1,000
   GPU-days, median and maximum time to detect (from the first degraded run).

Loopback only. Prints the table and writes benchmarks/results/detection.json.

    python benchmarks/detection/run.py [--nodes 1000] [--days 7] [--seed 1]
"""
from __future__ import annotations

import argparse
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from alerts.backfill import BackfilledPrometheus, backfill_rules, create_blocks  # noqa: E402
from benchmarks.common import write_result  # noqa: E402

STEP = 900  # 15 min: the gpu_bandwidth cadence
EVAL = {"step": 900}
LOOKBACK = "16m"  # rule evaluation and replay step (--eval-step)
METRIC = "fleetcanary_gpu_memory_bandwidth_bytes_per_second"
MODELS = {"H100": 3.0e12, "H200": 4.2e12}
SIZES = (0.03, 0.05, 0.07, 0.10, 0.20)
PEER_ALERT = "FleetCanaryGPUMemoryBandwidthBelowPeers"
DRIVER_ALERT = "FleetCanaryGPUMemoryBandwidthDropAfterDriverChange"
REG_ALERT = "FleetCanaryGPUMemoryBandwidthRegression"


# --------------------------------------------------------------------------- the fleet
def make_fleet(nodes: int, days: float, seed: int, start: int, spread: float = 0.005):
    rng = random.Random(seed)
    steps = int(days * 86400 // STEP)
    fleet = []
    for i in range(nodes):
        model = "H100" if i < nodes * 0.6 else "H200"
        pool = "abcd"[i % 4]
        for g in range(8):
            fleet.append({"node": f"node-{i:04d}", "gpu": str(g), "model": model, "pool": pool,
                          "offset": rng.gauss(1.0, spread), "degrade": None})
    # degradations: 40 GPUs per size, at a random run between day 1 and day 5
    per_size = min(40, (len(fleet) - 1) // len(SIZES))
    picks = rng.sample(range(len(fleet)), per_size * len(SIZES) + 1)
    for k, size in enumerate(SIZES):
        for idx in picks[k * per_size:(k + 1) * per_size]:
            fleet[idx]["degrade"] = (size, rng.randrange(int(86400 / STEP), int(5 * 86400 / STEP)))
    lost = fleet[picks[-1]]
    lost["lost_at"] = int(3 * 86400 / STEP)
    driver_at = int(4.5 * 86400 / STEP)
    return fleet, steps, driver_at, lost, rng


NOISE = {"run": 0.006}


def value(g: dict, k: int, driver_at: int, rng: random.Random) -> float | None:
    if g.get("lost_at") is not None and k >= g["lost_at"]:
        return None
    v = MODELS[g["model"]] * g["offset"] * rng.gauss(1.0, NOISE["run"])
    if g["degrade"] and k >= g["degrade"][1]:
        v *= 1 - g["degrade"][0]
    if g["model"] == "H100" and k >= driver_at:
        v *= 0.92  # the fleet-wide regression of the new driver on one model
    if rng.random() < 0.005:
        v *= rng.uniform(0.3, 0.7)  # a junk run
    return v


def write_openmetrics(path: Path, fleet, steps, driver_at, start, seed) -> int:
    rng = random.Random(seed + 1)
    n = 0
    with open(path, "w", buffering=1 << 22) as f:
        f.write(f"# TYPE {METRIC} gauge\n")
        for g in fleet:
            lab = f'{METRIC}{{node="{g["node"]}",gpu="{g["gpu"]}",direction="d2d"}}'
            for k in range(steps):
                v = value(g, k, driver_at, rng)
                if v is not None:
                    f.write(f"{lab} {v:.6g} {start + k * STEP}\n")
                    n += 1
        f.write("# TYPE fleetcanary_gpu_info gauge\n")
        for g in fleet:
            lab = f'fleetcanary_gpu_info{{node="{g["node"]}",gpu="{g["gpu"]}",model="{g["model"]}"}}'
            end = g.get("lost_at") or steps
            f.writelines(f"{lab} 1 {start + k * STEP}\n" for k in range(end))
            n += end
        f.write("# TYPE fleetcanary_node_info gauge\n")
        for node in sorted({(g["node"], g["pool"]) for g in fleet}):
            for k in range(steps):
                drv = "550.90.07" if k < driver_at else "570.124.06"
                f.write(f'fleetcanary_node_info{{node="{node[0]}",pool="{node[1]}",driver_version="{drv}",'
                        f'cpu_model="Xeon"}} 1 {start + k * STEP}\n')
                n += 1
        f.write("# TYPE fleetcanary_gpu_lost gauge\n")
        lost = [g for g in fleet if g.get("lost_at") is not None]
        for g in lost:
            for k in range(steps):
                f.write(f'fleetcanary_gpu_lost{{node="{g["node"]}",gpu="{g["gpu"]}"}} '
                        f'{1 if k >= g["lost_at"] else 0} {start + k * STEP}\n')
                n += 1
        f.write("# EOF\n")
    return n


def alert_rule(name: str) -> dict:
    for g in yaml.safe_load((ROOT / "alerts/fleetcanary.alerts.yml").read_text())["groups"]:
        for r in g["rules"]:
            if r["alert"] == name:
                return r
    raise KeyError(name)


def minutes(d: str) -> int:
    return int(d.rstrip("m")) if d.endswith("m") else int(d.rstrip("h")) * 60


# --------------------------------------------------------------------------- replay and score
def replay(series: list[dict], for_s: int, keep_s: int, end: int) -> dict[tuple, list[tuple[int, int]]]:
    """Firing episodes per (node, gpu): an alert fires once its condition has held for `for`,
    and keeps firing until it has been false for `keep_firing_for`."""
    out: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for s in series:
        key = (s["metric"].get("node"), s["metric"].get("gpu"))
        times = sorted(int(float(t)) for t, _ in s["values"])
        true_since = None
        firing_since = None
        last_true = None
        for t in times:
            step = EVAL["step"]
            if last_true is not None and t - last_true > step:  # condition went false in between
                if firing_since is not None and t - last_true > keep_s + step:
                    out[key].append((firing_since, last_true + keep_s))
                    firing_since = None
                true_since = None
            if true_since is None:
                true_since = t
            if firing_since is None and t - true_since >= for_s:
                firing_since = t
            last_true = t
        if firing_since is not None:
            out[key].append((firing_since, min(last_true + keep_s, end)))
    return out


def score(episodes, fleet, start, steps, driver_at, label: str) -> dict:
    truth = {(g["node"], g["gpu"]): g for g in fleet}
    tp, fp = 0, 0
    detected: dict[tuple, int] = {}
    for key, eps in episodes.items():
        g = truth.get(key)
        for a, b in eps:
            if g and g["degrade"] and a >= start + g["degrade"][1] * STEP:
                tp += 1
                detected.setdefault(key, a - (start + g["degrade"][1] * STEP))
            else:
                fp += 1
    recall, ttd = {}, []
    for size in SIZES:
        gs = [(g["node"], g["gpu"]) for g in fleet if g["degrade"] and g["degrade"][0] == size]
        hit = [k for k in gs if k in detected]
        recall[f"{size:.0%}"] = len(hit) / len(gs)
        if size >= 0.05:
            ttd += [detected[k] / 60 for k in hit]
    gpu_days = len(fleet) * steps * STEP / 86400
    return {"rule": label, "precision": tp / (tp + fp) if tp + fp else 1.0, "recall": recall,
            "false_episodes": fp, "false_per_1000_gpu_days": fp / gpu_days * 1000,
            "ttd_median_minutes": statistics.median(ttd) if ttd else None, "ttd_max_minutes": max(ttd) if ttd else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--run-noise", type=float, default=0.006,
                    help="sigma of a run's published median (measured on an H200: ~0.2-0.3%%; default 2x that)")
    ap.add_argument("--gpu-spread", type=float, default=0.005, help="sigma of the per-GPU manufacturing spread")
    ap.add_argument("--eval-step", type=int, default=15, metavar="MINUTES",
                    help="rule evaluation and replay step; time to detect is quantized by it (live Prometheus: 1)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/detection.json"))
    args = ap.parse_args()
    for b in ("prometheus", "promtool"):
        if not shutil.which(b):
            raise SystemExit(f"detection: {b} is not installed (apt-get install prometheus)")
    work = Path(tempfile.mkdtemp(prefix="fc-detection-"))
    t_all = time.monotonic()
    now = int(time.time()) // STEP * STEP
    steps = int(args.days * 86400 // STEP)
    start = now - steps * STEP - 3600
    end = start + (steps - 1) * STEP
    NOISE["run"] = args.run_noise
    EVAL["step"] = args.eval_step * 60
    fleet, steps, driver_at, lost, _ = make_fleet(args.nodes, args.days, args.seed, start, args.gpu_spread)
    timings = {}
    try:
        om = work / "fleet.om"
        t = time.monotonic()
        n = write_openmetrics(om, fleet, steps, driver_at, start, args.seed)
        timings["generate_s"] = time.monotonic() - t
        print(f"fleet: {args.nodes} nodes x 8 GPUs, {args.days:g} days, {n:,} samples "
              f"({om.stat().st_size / 2**20:.0f} MiB of OpenMetrics)", flush=True)
        data = work / "data"
        t = time.monotonic()
        create_blocks(om, data)
        om.unlink()
        timings["backfill_raw_s"] = time.monotonic() - t
        wanted = [r for r in (alert_rule(PEER_ALERT)["expr"] + " " + alert_rule(DRIVER_ALERT)["expr"] + " " +
                              alert_rule(REG_ALERT)["expr"]).split() if ":" in r]
        names = set(re.findall(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", " ".join(wanted)))
        t = time.monotonic()
        # One synthetic sample per 15-min probe run stands for a gauge scraped every 30 s: a 16-min
        # lookback lets instant selectors see it between runs, as continuous scrapes would.
        backfill_rules(data, sorted(names), start, end, EVAL["step"], work, lookback=LOOKBACK,
                       progress=lambda m: print(m, flush=True))
        timings["backfill_rules_s"] = time.monotonic() - t
        prom = BackfilledPrometheus(data, work / "prometheus.log", LOOKBACK)
        try:
            t = time.monotonic()
            rows = []
            peer = alert_rule(PEER_ALERT)
            eps = replay(prom.query_range(peer["expr"], start, end, EVAL["step"]), minutes(peer["for"]) * 60,
                         minutes(peer["keep_firing_for"]) * 60, end)
            rows.append(score(eps, fleet, start, steps, driver_at, f"{PEER_ALERT} (shipped)"))
            static = " or ".join(
                f'({METRIC} * on(node, gpu) group_left() node_gpu:fleetcanary_gpu_model:info{{model="{m}"}} '
                f'< {0.75 * ref:g})' for m, ref in MODELS.items())
            eps_s = replay(prom.query_range(static, start, end, EVAL["step"]), minutes(peer["for"]) * 60,
                           minutes(peer["keep_firing_for"]) * 60, end)
            rows.append(score(eps_s, fleet, start, steps, driver_at, "static 0.75 x per-model reference"))
            drv = alert_rule(DRIVER_ALERT)
            eps_d = replay(prom.query_range(drv["expr"], start, end, EVAL["step"]), minutes(drv["for"]) * 60,
                           minutes(drv["keep_firing_for"]) * 60, end)
            h100 = {(g["node"], g["gpu"]) for g in fleet if g["model"] == "H100"}
            h200 = {(g["node"], g["gpu"]) for g in fleet if g["model"] == "H200" and not g["degrade"]}
            drv_hit = [k for k in h100 if any(a >= start + driver_at * STEP for a, _ in eps_d.get(k, []))]
            drv_false = [k for k in h200 if k in eps_d]
            drv_ttd = [min(a for a, _ in eps_d[k]) - (start + driver_at * STEP) for k in drv_hit]
            reg = alert_rule(REG_ALERT)
            eps_r = replay(prom.query_range(reg["expr"], start, end, EVAL["step"]), minutes(reg["for"]) * 60,
                           minutes(reg["keep_firing_for"]) * 60, end)
            lost_series = prom.query_range("fleetcanary_gpu_lost == 1", start, end, EVAL["step"])
            lost_ttd = (min(int(float(t)) for s in lost_series for t, _ in s["values"]) -
                        (start + lost["lost_at"] * STEP)) / 60 if lost_series else None
            timings["evaluate_s"] = time.monotonic() - t
        finally:
            prom.stop()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"detection on {args.nodes} nodes x 8 GPUs over {args.days:g} days ({len(fleet) * args.days:,.0f} GPU-days), "
          f"probe every 15 min, run noise {args.run_noise:.1%}, GPU spread {args.gpu_spread:.1%}, junk runs 0.5%; "
          f"40 GPUs per degradation size; times quantized to the {args.eval_step}-min evaluation step")
    head = f"{'rule':46} {'precision':>9} " + " ".join(f"{'rec ' + f'{s:.0%}':>7}" for s in SIZES) + \
        f" {'false/1k GPU-d':>14} {'TTD med/max min':>16}"
    print(head)
    for r in rows:
        rec = " ".join(f"{r['recall'][f'{s:.0%}'] * 100:>6.0f}%" for s in SIZES)
        ttd = f"{r['ttd_median_minutes']:.0f}/{r['ttd_max_minutes']:.0f}" if r["ttd_median_minutes"] is not None \
            else "-"
        print(f"{r['rule']:46} {r['precision']:>9.3f} {rec} {r['false_per_1000_gpu_days']:>14.3f} {ttd:>16}")
    print(f"driver change (all {len(h100)} H100 GPUs lose 8% on day 4.5): {DRIVER_ALERT} fired for "
          f"{len(drv_hit)}/{len(h100)} ({len(drv_hit) / len(h100):.1%}), median {statistics.median(drv_ttd) / 60 if drv_ttd else 0:.0f} "
          f"min after the change; on unaffected H200 GPUs: {len(drv_false)}")
    print(f"{PEER_ALERT} during the fleet-wide regression: no peer alert on H100 GPUs without an injected degradation: "
          f"{not any(k in h100 and not next(g for g in fleet if (g['node'], g['gpu']) == k)['degrade'] for k in eps)}")
    print(f"self-history {REG_ALERT}: fired on {len(eps_r)} GPUs (suppressed for 3 days after the driver change)")
    print(f"GPU lost on day 3: fleetcanary_gpu_lost seen {lost_ttd:.0f} min after it fell off" if lost_ttd is not None
          else "GPU lost: not seen")
    print("timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()) + f", total {time.monotonic() - t_all:.0f}s")
    result = {"nodes": args.nodes, "gpus": len(fleet), "days": args.days, "rows": rows, "eval_step_minutes": args.eval_step,
              "noise": {"run": args.run_noise, "gpu_spread": args.gpu_spread, "junk_runs": 0.005},
              "driver_change": {"h100_gpus": len(h100), "detected": len(drv_hit), "false_on_h200": len(drv_false),
                                "ttd_median_minutes": statistics.median(drv_ttd) / 60 if drv_ttd else None},
              "regression_alert_gpus": len(eps_r), "gpu_lost_ttd_minutes": lost_ttd, "timings": timings}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
