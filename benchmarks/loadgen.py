#!/usr/bin/env python3
"""How far the load generator scales on this machine, and how true its figures stay.

Against `fleetcanary simulate-llm` (its own processes, loopback only) with an injected
TTFT and ITL and a batch so large that the capacity model never stretches them (so the
true TTFT is the injected one at every load), it runs closed-loop steps at concurrency
1, 64, 256 and 1024 with `loadtest --workers 1` and `--workers 2`, and the Locust mode
(master + 2 local workers, offline/locustfile.py). Per step:
- req/s as the generator reports it, and the simulator's own completions over the same
  step (GET /sim/stats before and after): the difference is how far the generator's
  count is from the truth;
- TTFT p50 and p99 minus the injected TTFT (what the client side adds under load);
- generator CPU per request (all its processes, from getrusage of waited children) and
  the simulator's CPU (its processes, /proc), to say which side saturated.
Targets: TTFT p50 error under 2 ms and req/s within 2% of the simulator's completions,
at every concurrency the simulator can serve. Writes benchmarks/results/loadgen.json.

    python -m benchmarks.loadgen [--ttft-ms 50] [--itl-ms 10] [--tokens 16] [--step-seconds 4]
                                 [--levels 1,64,256,1024] [--sim-processes 2] [--no-locust]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.common import get, write_result
from harness.poll import wait_http
from harness.ports import free_port

ROOT = Path(__file__).resolve().parent.parent


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def sim_cpu(pid: int) -> float:
    p = psutil.Process(pid)
    total = sum(p.cpu_times()[:2])
    for c in p.children(recursive=True):
        try:
            total += sum(c.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def stats(port: int) -> dict:
    return json.loads(get(f"http://127.0.0.1:{port}/sim/stats"))


def run_loadtest(port: int, level: int, workers: int, a) -> dict:
    cmd = [sys.executable, "-m", "fleetcanary", "loadtest", f"http://127.0.0.1:{port}/v1", "--mode", "concurrency",
           "--concurrency", str(level), "--workers", str(workers), "--step-seconds", str(a.step_seconds),
           "--drain-seconds", "15", "--input-len", "fixed:16", "--output-len", f"fixed:{a.tokens}", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=a.step_seconds + 120)
    if r.returncode != 0:
        raise SystemExit(f"loadgen: loadtest failed: {r.stderr.strip().splitlines()[-1:]}")
    st = json.loads(r.stdout)["steps"][0]
    return {"rps": st["throughput_rps"], "finished": st["finished"], "wall": st["wall_seconds"],
            "ttft_p50": st["ttft_p50"], "ttft_p99": st["ttft_p99"], "errors": st["error_rate"],
            "cpu": st["generator_cpu_seconds"]}


def run_locust(port: int, level: int, a) -> dict:
    locustfile = str(ROOT / "exporter/offline/locustfile.py")
    mport = free_port()
    # the same drain as loadtest's steps below (15 s): requests in flight at the stop are waited for
    env = {**os.environ, "FLEETCANARY_OUTPUT_TOKENS": str(a.tokens), "FLEETCANARY_INPUT_WORDS": "16",
           "FLEETCANARY_DRAIN_SECONDS": "15"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        env["FLEETCANARY_LOCUST_OUT"] = str(out)
        base = [sys.executable, "-m", "locust", "-f", locustfile, "--host", f"http://127.0.0.1:{port}/v1",
                "--loglevel", "WARNING"]
        master = subprocess.Popen(base + ["--master", "--headless", "--master-bind-host", "127.0.0.1",
                                          "--master-bind-port", str(mport), "--expect-workers", "2",
                                          "-u", str(level), "-r", str(max(level, 1)), "-t", f"{a.step_seconds:g}s",
                                          "--only-summary"],
                                  cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        workers = [subprocess.Popen(base + ["--worker", "--master-host", "127.0.0.1", "--master-port", str(mport)],
                                    cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for _ in range(2)]
        try:
            stdout, _ = master.communicate(timeout=a.step_seconds + 120)
            for w in workers:
                w.wait(timeout=60)
        finally:
            for p in (master, *workers):
                if p.poll() is None:
                    p.terminate()
                    p.wait(timeout=30)
        if not out.exists() or master.returncode != 0:
            raise SystemExit(f"loadgen: the locust master failed (exit {master.returncode}): "
                             f"{stdout.strip().splitlines()[-1:]}")
        d = json.loads(out.read_text())
    errors = sum(v for k, v in d["outcomes"].items() if k != "success") / max(sum(d["outcomes"].values()), 1)
    return {"rps": d["throughput_rps"], "finished": d["finished"], "wall": d["wall_seconds"],
            "ttft_p50": d["ttft_p50"], "ttft_p99": d["ttft_p99"], "errors": errors, "cpu": None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ttft-ms", type=float, default=50)
    ap.add_argument("--itl-ms", type=float, default=10)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--step-seconds", type=float, default=4)
    ap.add_argument("--levels", default="1,64,256,1024")
    ap.add_argument("--sim-processes", type=int, default=2)
    ap.add_argument("--no-locust", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/loadgen.json"))
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    port = free_port()
    sim = subprocess.Popen([sys.executable, "-m", "fleetcanary", "simulate-llm", "--listen", f"127.0.0.1:{port}",
                            "--processes", str(a.sim_processes), "--ttft-ms", str(a.ttft_ms), "--itl-ms",
                            str(a.itl_ms), "--batch-size", "1000000"], cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_http(f"http://127.0.0.1:{port}/sim/stats")
        modes = [("loadtest", 1), ("loadtest", 2)] + ([] if a.no_locust else [("locust", 2)])
        for mode, workers in modes:
            for level in levels:
                if level < workers:
                    continue  # each process needs at least one user
                load0 = os.getloadavg()[0]
                s0, c0, g0, t0 = stats(port), sim_cpu(sim.pid), children_cpu(), time.monotonic()
                r = run_loadtest(port, level, workers, a) if mode == "loadtest" else run_locust(port, level, a)
                s1, c1, g1 = stats(port), sim_cpu(sim.pid), children_cpu()
                done = s1["completions"] - s0["completions"]
                sim_rps = done / r["wall"] if r["wall"] else 0.0
                row = {"mode": mode, "workers": workers, "concurrency": level, "rps": r["rps"], "sim_rps": sim_rps,
                       "finished": r["finished"], "sim_completions": done, "wall_seconds": r["wall"],
                       "count_error_pct": 100 * (r["finished"] - done) / done if done else None,
                       "ttft_p50_error_ms": None if r["ttft_p50"] is None else r["ttft_p50"] * 1e3 - a.ttft_ms,
                       "ttft_p99_error_ms": None if r["ttft_p99"] is None else r["ttft_p99"] * 1e3 - a.ttft_ms,
                       # loadtest: its processes' CPU during the step; locust: every process, startup included
                       "gen_cpu_ms_per_request": 1e3 * (r["cpu"] if r["cpu"] is not None else g1 - g0)
                       / max(r["finished"], 1),
                       "gen_cpu_share": (g1 - g0) / (time.monotonic() - t0),
                       "sim_cpu_share": (c1 - c0) / r["wall"] if r["wall"] else None,
                       "error_rate": r["errors"], "load_before": load0, "load_after": os.getloadavg()[0],
                       "ideal_rps": level / ((a.ttft_ms + (a.tokens - 1) * a.itl_ms) / 1e3)}
                rows.append(row)
                print(f"{mode:8} w={workers} c={level:5d}: {row['rps']:8.1f} req/s (ideal {row['ideal_rps']:8.1f}, "
                      f"sim {sim_rps:8.1f}), TTFT err p50 {row['ttft_p50_error_ms']:+.2f} ms p99 "
                      f"{row['ttft_p99_error_ms']:+.2f} ms, gen CPU {row['gen_cpu_ms_per_request']:.2f} ms/req, "
                      f"sim CPU {row['sim_cpu_share']:.2f} cores, err {row['error_rate']:.3f}, load "
                      f"{row['load_before']:.1f}->{row['load_after']:.1f}", flush=True)
    finally:
        sim.terminate()
        sim.wait(timeout=30)
    print()
    print("| generator | procs | conc. | req/s | ideal req/s | sim completions/s | count err % | TTFT p50 err ms "
          "| TTFT p99 err ms | gen CPU ms/req | sim CPU cores | load avg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['mode']} | {r['workers']} | {r['concurrency']} | {r['rps']:.1f} | {r['ideal_rps']:.1f} | "
              f"{r['sim_rps']:.1f} | {r['count_error_pct']:+.2f} | {r['ttft_p50_error_ms']:+.2f} | "
              f"{r['ttft_p99_error_ms']:+.2f} | {r['gen_cpu_ms_per_request']:.2f} | {r['sim_cpu_share']:.2f} | "
              f"{r['load_before']:.1f} |")
    write_result(a.out, {"settings": vars(a), "cpus": os.cpu_count(), "python": sys.version.split()[0],
                         "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
