#!/usr/bin/env python3
"""GPU probes beside a reference copy measurement, in one run (scripts/gpu-check calls this).

1. Reference: a torch copy of a 4 GiB buffer on GPU 0, timed with CUDA events,
   3 warm-ups then 20 timed copies, bytes read + written counted (as nvbandwidth and
   the probe count D2D). Taken before and after the probes, to bracket drift.
2. `fleetcanary once --json` for gpu_health, gpu_bandwidth and gpu_p2p (real workers).
3. Prints a table: the probe's D2D median against the reference, the ratio (target
   within 10%), H2D/D2H, the GPU time per gpu_bandwidth run, and the health facts.
   Writes OUT/gpu_check.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REF_BYTES = 4 << 30


def reference_copy(torch) -> dict:
    dev = torch.device("cuda", 0)
    src = torch.empty(REF_BYTES, dtype=torch.uint8, device=dev).random_(0, 256)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    assert torch.equal(src[:: 1 << 20], dst[:: 1 << 20])
    del src, dst
    torch.cuda.empty_cache()
    bws = [2 * REF_BYTES / t for t in times]
    return {"median_bytes_per_second": statistics.median(bws), "min": min(bws), "max": max(bws),
            "repeats": bws, "bytes": REF_BYTES, "counting": "read + written (2 x 4 GiB)"}


def reference_in_child() -> dict:
    """The reference copy in a process of its own: a CUDA context held here would make the
    probes' GPU gate see a compute process on the GPU and skip (gpu_busy), as it should."""
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--reference-only"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"gpu-check: reference copy failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def reference_main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: torch sees no CUDA device", file=sys.stderr)
        return 2
    res = reference_copy(torch)
    res["env"] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
                  "nccl": ".".join(map(str, torch.cuda.nccl.version())), "gpus": torch.cuda.device_count()}
    print(json.dumps(res))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/fleetcanary-gpu-check")
    ap.add_argument("--reference-only", action="store_true")
    args = ap.parse_args()
    if args.reference_only:
        return reference_main()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    ref_before = reference_in_child()
    env_info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **ref_before.pop("env")}
    state = tempfile.mkdtemp(prefix="fc-gpu-")
    cfg = Path(state) / "config.yaml"
    cfg.write_text(f"state_dir: {state}\nprobes:\n  gpu_health:\n    params:\n      xid_wait_seconds: 1\n")
    cmd = [sys.executable, "-m", "fleetcanary", "once", "--config", str(cfg), "--json",
           "--probe", "gpu_health", "--probe", "gpu_bandwidth", "--probe", "gpu_p2p"]
    t1 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=200)
    once_wall = time.monotonic() - t1
    ref_after = reference_in_child()
    ref_after.pop("env", None)
    if r.returncode not in (0, 1):
        print(r.stderr[-3000:], file=sys.stderr)
        return 1
    data = json.loads(r.stdout)
    runs = {run["probe"]: run for run in data["runs"]}
    (out / "once.json").write_text(json.dumps(data, indent=1))

    bw = runs["gpu_bandwidth"]
    figs = {f["name"]: f for f in (bw.get("result") or {}).get("figures", [])}
    ref = statistics.median([ref_before["median_bytes_per_second"], ref_after["median_bytes_per_second"]])
    result = {"environment": {**env_info, "driver": bw.get("environment", {}).get("driver_version"),
                              "cuda_driver": bw.get("environment", {}).get("cuda_driver_version")},
              "reference_before": {k: v for k, v in ref_before.items() if k != "repeats"},
              "reference_after": {k: v for k, v in ref_after.items() if k != "repeats"},
              "outcomes": {p: (run["outcome"], run["reason"]) for p, run in runs.items()},
              "once_wall_seconds": once_wall, "total_wall_seconds": time.monotonic() - t0}

    print()
    print(f"gpu-check {env_info['date']}: {env_info['gpu']} x{env_info['gpus']}, driver {result['environment']['driver']}, "
          f"CUDA driver {result['environment']['cuda_driver']}, torch {env_info['torch']} (CUDA {env_info['cuda_runtime']})")
    print(f"{'probe':14} {'outcome':22} {'wall s':>7}")
    for p, run in runs.items():
        print(f"{p:14} {run['outcome'] + (' (' + run['reason'] + ')' if run['reason'] else ''):22} "
              f"{run['duration_seconds']:>7.2f}")
    if "d2d" in figs:
        d2d = figs["d2d"]["median"]
        ratio = d2d / ref
        result["d2d"] = {"probe_median": d2d, "reference_median": ref, "ratio": ratio,
                         "probe_cv": figs["d2d"]["dispersion"]["cv"]}
        print()
        print(f"{'figure':34} {'median':>12} {'CV':>6}  note")
        print(f"{'reference 4 GiB copy (before)':34} {ref_before['median_bytes_per_second'] / 1e12:>9.3f} TB/s")
        print(f"{'reference 4 GiB copy (after)':34} {ref_after['median_bytes_per_second'] / 1e12:>9.3f} TB/s")
        for name in ("d2d", "h2d", "d2h"):
            f = figs.get(name)
            if f:
                unit, div = ("TB/s", 1e12) if name == "d2d" else ("GB/s", 1e9)
                print(f"{'gpu_bandwidth ' + name:34} {f['median'] / div:>9.3f} {unit} {f['dispersion']['cv'] * 100:>5.1f}%")
        verdict = "PASS" if abs(ratio - 1) <= 0.10 else "FAIL"
        print(f"D2D probe / reference = {ratio:.3f}  ({verdict}: target within 10%)")
        gpu_s = (bw.get("result") or {}).get("gpu_seconds", {})
        result["gpu_seconds_per_run"] = gpu_s
        params = bw["result"]["parameters"]
        print(f"GPU time per gpu_bandwidth run: {', '.join(f'GPU {g}: {s:.3f} s' for g, s in gpu_s.items())} "
              f"(warm-up {params['warmup']} + {params['repeats']} repeats per direction; "
              f"D2D buffer {bw['result']['extra']['per_gpu']['0']['d2d_bytes'] / 2**30:.2f} GiB, "
              f"host buffer {bw['result']['extra']['per_gpu']['0']['host_bytes'] / 2**20:.0f} MiB)")
    health = runs.get("gpu_health", {})
    if health.get("outcome") == "success":
        g0 = health["result"]["extra"]["gpus"][0]
        links = g0.get("nvlinks", [])
        result["health"] = {"pcie": g0.get("pcie"), "throttle": g0.get("throttle_reasons"), "ecc": g0.get("ecc"),
                            "remapped_rows": g0.get("remapped_rows"), "nvlinks_up": sum(x["up"] for x in links),
                            "nvlinks": len(links), "xid_watch_seconds": health["result"]["extra"]["xid_watch_seconds"]}
        print(f"gpu_health: PCIe {g0['pcie']}, throttle {g0['throttle_reasons']}, NVLinks up "
              f"{result['health']['nvlinks_up']}/{len(links)}, remapped {g0['remapped_rows']}")
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
    ok = result.get("d2d", {}).get("ratio") is not None and abs(result["d2d"]["ratio"] - 1) <= 0.10
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
