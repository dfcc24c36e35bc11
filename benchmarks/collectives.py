#!/usr/bin/env python3
"""The collectives sweep as a table: size, latency, algbw and busbw per collective,
plus the sweep's total wall time and GPU time. Runs the probe through `fleetcanary
once` (a real worker, real ranks): NCCL with one rank per GPU where GPUs exist, gloo
with CPU ranks elsewhere. Writes benchmarks/results/collectives.json.

    python -m benchmarks.collectives [--backend auto|gloo|nccl] [--ranks 4] [--min-gpus 1]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def human_bw(v: float) -> str:
    return f"{v / 1e9:8.3f} GB/s" if v >= 1e8 else f"{v / 1e6:8.3f} MB/s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    ap.add_argument("--ranks", type=int, default=2, help="gloo CPU ranks")
    ap.add_argument("--min-gpus", type=int, default=2, help="NCCL needs at least this many GPUs (1 to test the path)")
    ap.add_argument("--sizes", default="", help="comma-separated bytes; default: the probe's default sweep")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--broadcast", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/collectives.json"))
    args = ap.parse_args()

    params: dict = {"backend": args.backend, "cpu_ranks": args.ranks, "min_gpus": args.min_gpus,
                    "iterations": args.iterations}
    if args.sizes:
        params["sizes_bytes"] = [int(x) for x in args.sizes.split(",")]
    if args.broadcast:
        params["collectives"] = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
    with tempfile.TemporaryDirectory(prefix="fc-bench-coll-") as state:
        cfg = Path(state) / "c.yaml"
        cfg.write_text(yaml.safe_dump({"state_dir": state, "history": {"enabled": False},
                                       "probes": {"collectives": {"params": params, "timeout_seconds": 600,
                                                                  "interval_seconds": 3600}}}))
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "fleetcanary", "once", "--config", str(cfg), "--json",
                            "--probe", "collectives"], capture_output=True, text=True, cwd=ROOT, timeout=900)
        wall = time.monotonic() - t0
    if r.returncode not in (0, 1):
        print(r.stderr[-2000:], file=sys.stderr)
        return 1
    run = json.loads(r.stdout)["runs"][0]
    if run["outcome"] != "success":
        print(f"collectives: {run['outcome']} ({run['reason']}): {run['detail']}")
        return 1
    rec = run["result"]
    p = rec["parameters"]
    print(f"collectives sweep: backend {p['backend']}, {p['world']} ranks, {p['iterations']} timed iterations "
          f"after {p['warmup']} warm-up per size; time = slowest rank, median over iterations")
    print(f"{'collective':15} {'size':>10} {'latency':>12} {'algbw':>14} {'busbw':>14} {'CV':>6}")
    rows = []
    for e in rec["extra"]["sweep"]:
        ts = sorted(e["time_seconds"])
        med = ts[len(ts) // 2] if len(ts) % 2 else (ts[len(ts) // 2 - 1] + ts[len(ts) // 2]) / 2
        mean = sum(ts) / len(ts)
        cv = (sum((t - mean) ** 2 for t in ts) / max(len(ts) - 1, 1)) ** 0.5 / mean
        alg = e["bytes"] / med
        bus = alg * e["bus_factor"]
        rows.append({"collective": e["collective"], "size_bytes": e["size_bytes"], "bytes": e["bytes"],
                     "latency_seconds": med, "algbw": alg, "busbw": bus, "cv": cv})
        print(f"{e['collective']:15} {e['size_bytes']:>10} {med * 1e6:>9.1f} us {human_bw(alg):>14} "
              f"{human_bw(bus):>14} {cv * 100:>5.1f}%")
    gpu_s = sum(rec.get("gpu_seconds", {}).values())
    timed = sum(sum(e["time_seconds"]) for e in rec["extra"]["sweep"])
    print(f"sweep wall time {run['duration_seconds']:.2f} s (worker start to end, rank start-up included); "
          f"timed collective time {timed:.3f} s; GPU time {gpu_s:.3f} s"
          + (" (gloo: no GPU)" if p["backend"] == "gloo" else ""))
    if rec["extra"].get("nccl_version"):
        topo = rec["extra"].get("topology_xml")
        print(f"NCCL {rec['extra']['nccl_version']}, torch {rec['extra']['torch']}; topology dump "
              f"{f'kept ({len(topo)} bytes)' if topo else 'not available'}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"backend": p["backend"], "ranks": p["world"], "rows": rows,
                                          "wall_seconds": run["wall_seconds"], "gpu_seconds": gpu_s,
                                          "timed_seconds": timed, "cli_wall_seconds": wall,
                                          "nccl_version": rec["extra"].get("nccl_version")}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
