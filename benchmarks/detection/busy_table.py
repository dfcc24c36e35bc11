#!/usr/bin/env python3
"""Busy fleets: recall and time to detect as tenants hold more of the GPU time, with and without per-GPU
allocation (deploy/overlays/gpu-allocation: the kubelet's pod-resources API) and opportunistic runs.

For each share of GPU time held (25, 50, 80, 95%) the same fleet (tenants' jobs of 1, 2, 4 or 8 GPUs, 2-10 h
each, Poisson starts; Profile.busy_jobs) is replayed through the shipped rules three ways (run.py, one process
each):
- node-wide check: any GPU held skips every invasive run on the node (the base DaemonSet);
- per-GPU allocation: GPU memory bandwidth measures the free GPUs of a partly held node (the collective, a
  different series on fewer GPUs, still needs all 8 free);
- per-GPU + opportunistic: also, when a job ends, each due probe runs 2 s later.

    python benchmarks/detection/busy_table.py            # --quick fleets (60 nodes, 7 days): ~15 minutes
    python benchmarks/detection/busy_table.py --full     # the 195-node fleet: about an hour

Prints a markdown table and writes benchmarks/results/detection-busy-table[-full].json (each run's own JSON
beside it, as run.py writes them).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARES = (0.25, 0.50, 0.80, 0.95)
MODES = (("node-wide check", 0, 0), ("per-GPU allocation", 1, 0), ("per-GPU + opportunistic", 1, 1))
STEPS = ("step 5%", "step 7%", "step 10%", "step 20%")
MEMBW, COLL = "any GPU membw peer/fast/history/drift alert", "any collective peer/fast/history/drift alert"


def run(share: float, gate: int, opp: int, full: bool, out: Path) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.detection.run", "--busy-share", str(share), "--busy-jobs", "1",
           "--per-gpu-gate", str(gate), "--opportunistic", str(opp), "--out", str(out)]
    if not full:
        cmd.append("--quick")
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"busy_table: {' '.join(cmd[1:])} exited {r.returncode}: {r.stderr.strip()[-600:]}")
    return json.loads(out.read_text())


def row(share: float, mode: str, d: dict, interval_s: float = 900.0) -> dict:
    f = d["fleet"]
    u = {x["alert"]: x["recall"] for x in d["unions"]}
    bw = f["runs"]["gpu_bandwidth"]
    measured = (bw - f["skipped_runs"]["gpu_bandwidth"]) * 8 - f["gpu_measurements_left_out"]
    slots = f["gpus"] * f["days"] * 86400 / interval_s
    onset = [x for s in ("step 7%", "step 10%", "step 20%") for x in u[MEMBW].get(s, {}).get("ttd_onset_each_min", [])]
    coll = [u[COLL].get(s, {}) for s in ("step 7%", "step 10%", "step 20%")]
    judged = [r for r in d["rows"] if r["kind"] in ("peer", "fast", "history", "drift")]
    return {
        "gpu_busy": f["gpu_busy_share"], "mode": mode, "node_busy": f["busy_share"],
        "gpu_measured": round(measured / slots, 3),
        "opportunistic_runs": f["opportunistic_runs"],
        "membw_recall": {s: u[MEMBW].get(s, {}).get("recall") for s in STEPS},
        "membw_ttd_onset_median_min_ge7": round(statistics.median(onset)) if onset else None,
        "coll_recall_ge7": f"{sum(c.get('detected', 0) for c in coll)}/{sum(c.get('of', 0) for c in coll)}",
        "false_episodes": sum(r.get("false_episodes", 0) or 0 for r in judged),
        "gpu_days": f["gpu_days"], "share": share,
    }


def table(rows: list[dict]) -> str:
    out = ["| GPU time held | allocation | nodes with a GPU held | GPU runs measured (of idle) | GPU membw recall "
           "5% / 7% / 10% / 20% | TTD from onset >=7%, median | collective recall >=7% | false episodes |",
           "| ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        rec = " / ".join("-" if r["membw_recall"][s] is None else f"{r['membw_recall'][s]:.0%}" for s in STEPS)
        ttd = "-" if r["membw_ttd_onset_median_min_ge7"] is None else f"{r['membw_ttd_onset_median_min_ge7']} min"
        out.append(f"| {r['gpu_busy']:.0%} | {r['mode']} | {r['node_busy']:.0%} | {r['gpu_measured']:.0%} | {rec} | "
                   f"{ttd} | {r['coll_recall_ge7']} | {r['false_episodes']} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the 195-node fleet (default: --quick, 60 nodes)")
    ap.add_argument("--reuse", action="store_true", help="read a run's JSON where it exists instead of running it")
    ap.add_argument("--shares", default=",".join(str(s) for s in SHARES), help="GPU-time shares held, comma-separated")
    args = ap.parse_args()
    tag = "" if args.full else "-60"
    rows, t0 = [], time.monotonic()
    for share in (float(x) for x in args.shares.split(",")):
        for mode, gate, opp in MODES:
            name = f"detection-busy{round(share * 100)}{tag}" + ("-gpugate" if gate else "") + ("-opp" if opp else "")
            out = ROOT / "benchmarks/results" / f"{name}.json"
            d = json.loads(out.read_text()) if args.reuse and out.exists() else run(share, gate, opp, args.full, out)
            rows.append(row(share, mode, d))
            print(f"[{time.monotonic() - t0:5.0f}s] {share:.0%} {mode}: done", flush=True)
    text = table(rows)
    print(text)
    out = ROOT / "benchmarks/results" / f"detection-busy-table{'-full' if args.full else ''}.json"
    out.write_text(json.dumps({"rows": rows, "table": text}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
