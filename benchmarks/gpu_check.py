#!/usr/bin/env python3
"""GPU probes beside a reference copy measurement, in one run (scripts/gpu-check calls this).

1. Reference: a torch copy of a 4 GiB buffer on GPU 0, timed with CUDA events,
   3 warm-ups then 20 timed copies, bytes read + written counted (as nvbandwidth and
   the probe count D2D). Taken before and after the probes, to bracket drift.
2. `fleetcanary once --json` for gpu_health, gpu_bandwidth and gpu_p2p (real workers).
3. Prints a table: the probe's D2D median against the reference, the ratio (target
   within 10%), H2D/D2H, the GPU time per gpu_bandwidth run, and the health facts.
   Writes OUT/gpu_check.json.

`--compute` (issue 19; a separate call so each part has its own deadline):
1. Reference: a plain PyTorch 8192^3 bf16 matmul on GPU 0 in a child process, 5 warm-ups then
   20 timed products with CUDA events, 2 n^3 FLOP each.
2. `fleetcanary once --json` for gpu_compute, gpu_sustained (the default 20 s burn with its
   NVML trace), train_step, then gpu_compute again: the SDC checksums of the two
   gpu_compute runs must be bitwise equal (reproducible after other work ran on the GPU).
3. Prints bf16 probe / reference (target within 10%), the burn's clocks, power, temperature
   and throttle seconds, the SDC verdict and checksum, and the train-step figures with
   the loss check. Writes OUT/gpu_compute_check.json and OUT/once_compute.json.
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


MM_N = 8192


def reference_matmul(torch) -> dict:
    dev = torch.device("cuda", 0)
    g = torch.Generator(device="cpu").manual_seed(0)
    a = (torch.rand(MM_N, MM_N, generator=g) * 2 - 1).to(dev, torch.bfloat16)
    b = (torch.rand(MM_N, MM_N, generator=g) * 2 - 1).to(dev, torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    rates = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(a, b)
        e.record()
        e.synchronize()
        rates.append(2 * MM_N ** 3 / (s.elapsed_time(e) / 1e3))
    return {"median_flops_per_second": statistics.median(rates), "min": min(rates), "max": max(rates), "n": MM_N,
            "dtype": "bf16", "env": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                     "cuda_runtime": torch.version.cuda}}


def compute_main(out: Path) -> int:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--reference-matmul-only"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"gpu-check: reference matmul failed: {r.stderr[-2000:]}")
    ref = json.loads(r.stdout)
    state = tempfile.mkdtemp(prefix="fc-gpu-compute-")
    cfg = Path(state) / "config.yaml"
    # every dtype the probe knows (its default times bf16 and fp8 only): the validation records them all
    cfg.write_text(f"state_dir: {state}\nprobes:\n  gpu_compute:\n    params:\n      dtypes: [bf16, fp16, tf32, fp8]\n")
    runs = []
    for probes in (("gpu_compute", "gpu_sustained", "train_step"), ("gpu_compute",)):
        cmd = [sys.executable, "-m", "fleetcanary", "once", "--config", str(cfg), "--json"]
        for p in probes:
            cmd += ["--probe", p]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=200)
        if r.returncode not in (0, 1):
            print(r.stderr[-3000:], file=sys.stderr)
            return 1
        runs.append(json.loads(r.stdout)["runs"])
    (out / "once_compute.json").write_text(json.dumps(runs, indent=1))
    first = {run["probe"]: run for run in runs[0]}
    second = runs[1][0]
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "reference": ref,
              "outcomes": {p: (x["outcome"], x["reason"]) for p, x in first.items()},
              "second_gpu_compute": (second["outcome"], second["reason"])}
    env = first["gpu_compute"].get("environment", {})
    print(f"gpu-check --compute {result['date']}: {ref['env']['gpu']}, driver {env.get('driver_version')}, CUDA driver "
          f"{env.get('cuda_driver_version')}, torch {ref['env']['torch']} (CUDA {ref['env']['cuda_runtime']})")
    for p, x in first.items():
        reason = f" ({x['reason']})" if x["reason"] else ""
        print(f"  {p:14} {x['outcome']}{reason}  {x['duration_seconds']:.2f} s")
    gc = (first["gpu_compute"].get("result") or {})
    figs = {(f["labels"].get("gpu"), f["name"]): f for f in gc.get("figures", [])}
    ok = True
    bf = figs.get(("0", "bf16"))
    if bf:
        ratio = bf["median"] / ref["median_flops_per_second"]
        ok &= abs(ratio - 1) <= 0.10
        result["bf16"] = {"probe": bf["median"], "reference": ref["median_flops_per_second"], "ratio": ratio,
                          "cv": bf["dispersion"]["cv"]}
        print(f"  bf16 {bf['median'] / 1e12:.1f} TFLOP/s (CV {100 * bf['dispersion']['cv']:.1f}%) vs reference "
              f"{ref['median_flops_per_second'] / 1e12:.1f}: {ratio:.3f} "
              f"({'PASS' if abs(ratio - 1) <= 0.1 else 'FAIL'})")
    else:
        ok = False
    for (g, name), f in sorted(figs.items()):
        print(f"  gpu_compute GPU {g} {name}: {f['median'] / 1e12:.1f} TFLOP/s")
    sdc1 = (gc.get("extra") or {}).get("sdc", {})
    sums1 = {g: v.get("sdc_checksums") for g, v in (gc.get("extra") or {}).get("per_gpu", {}).items()}
    second_extra = (second.get("result") or {}).get("extra") or {}
    sums2 = {g: v.get("sdc_checksums") for g, v in second_extra.get("per_gpu", {}).items()}
    result["sdc"] = {"first": sdc1, "checksums_first": sums1, "checksums_second": sums2,
                     "bitwise_equal_after_other_work": bool(sums1) and sums1 == sums2}
    print(f"  SDC: {sdc1.get('status')} golden {sdc1.get('golden_source')}; checksums {sums1}; second run equal: "
          f"{result['sdc']['bitwise_equal_after_other_work']}")
    ok &= result["sdc"]["bitwise_equal_after_other_work"]
    su = (first.get("gpu_sustained", {}).get("result") or {})
    for g, rec in (su.get("extra") or {}).get("per_gpu", {}).items():
        acc = rec.get("accounting") or {}
        ratio = next((f["median"] for f in su["figures"]
                      if f["name"] == "sustained_ratio" and f["labels"]["gpu"] == g), None)
        result.setdefault("sustained", {})[g] = {"ratio": ratio, "accounting": acc, "trace": rec.get("trace"),
                                                 "chunks": rec.get("chunks")}
        print(f"  sustained GPU {g}: ratio {ratio}, SM {acc.get('sm_mhz_tail')} MHz, "
              f"mem {acc.get('mem_mhz_tail')} MHz, power {acc.get('power_w_tail')} W, "
              f"max {acc.get('temp_c_max')} C, throttle "
              f"{ {k: round(v, 2) for k, v in (acc.get('throttle_seconds') or {}).items() if v} }")
    ts = (first.get("train_step", {}).get("result") or {})
    if ts:
        result["train_step"] = {"figures": ts.get("figures"), "loss": (ts.get("extra") or {}).get("loss")}
        for f in ts.get("figures", []):
            print(f"  train_step {f['name']}: {f['median']:.6g} {f['unit']}")
        print(f"  train_step loss: {result['train_step']['loss']}")
    result["total_wall_seconds"] = time.monotonic() - t0
    (out / "gpu_compute_check.json").write_text(json.dumps(result, indent=1, default=str))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/fleetcanary-gpu-check")
    ap.add_argument("--reference-only", action="store_true")
    ap.add_argument("--reference-matmul-only", action="store_true")
    ap.add_argument("--compute", action="store_true", help="the compute, burn, SDC and train-step check (issue 19)")
    args = ap.parse_args()
    if args.reference_only:
        return reference_main()
    if args.reference_matmul_only:
        import torch

        print(json.dumps(reference_matmul(torch)))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.compute:
        return compute_main(out)
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
    print(f"gpu-check {env_info['date']}: {env_info['gpu']} x{env_info['gpus']}, "
          f"driver {result['environment']['driver']}, CUDA driver {result['environment']['cuda_driver']}, "
          f"torch {env_info['torch']} (CUDA {env_info['cuda_runtime']})")
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
                print(f"{'gpu_bandwidth ' + name:34} {f['median'] / div:>9.3f} {unit} "
                      f"{f['dispersion']['cv'] * 100:>5.1f}%")
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
