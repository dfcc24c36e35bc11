#!/usr/bin/env python3
"""What fleetcanary costs a node: the daemon idle and busy, each probe's wall/CPU/GPU time, and
the duty cycle at the default schedule.

1. Daemon: `fleetcanary run` with the default probe set (no GPU here: GPU probes skip) -
   RSS and CPU over an idle window (no probe due, no scrapes), then over a busy window
   (every CPU probe due every few seconds and a scrape every second). The daemon's own
   process only: probe work happens in worker processes, counted per probe below.
2. Per probe: N isolated runs (the daemon's own worker path) with default parameters -
   wall time, CPU time of the worker and everything it started (RUSAGE_CHILDREN), GPU
   seconds from the record.
3. Duty cycle: per-run cost x runs per hour at each probe's default interval.
4. GPU budget: GPU seconds per hour per GPU of every invasive GPU probe at its default
   schedule, from each probe's configured ``expected_gpu_seconds`` (what the scheduler's
   budget check charges), summed and compared with the default budget (gpu.budget_ratio
   x 3600 s). A daily probe counts as its amortized share (22 s a day = 0.92 s an hour), as
   the daemon's budget does (daemon/scheduler.py GpuBudget: each probe is held to the ratio
   over a window as long as its interval, one hour to one day; at steady state every probe
   finds its charge in its window exactly when these shares sum to the hourly budget). Each
   probe's single run must also fit its own window (a 22 s burn cannot fit an 18 s hour).
   Exits 1 when either fails. `--gpu-budget-only` prints just this (no daemon, no runs).

Loopback only (the inference canary probes the built-in reference server, storage a temp
directory). Prints tables and writes benchmarks/results/overhead.json.

    python benchmarks/overhead.py [--runs 3] [--idle 30] [--busy 30] [--gpu-budget-only]
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run by path: the repo root, for the imports below

from benchmarks.common import free_port, get, proc_stats, write_result
from fleetcanary.core import config as configmod
from fleetcanary.daemon.scheduler import budget_window
from fleetcanary.offline.simulate_llm import SimSettings, start_in_thread
from fleetcanary.probes import PROBES
from fleetcanary.runner import job
from fleetcanary.runner.isolation import become_subreaper, run_isolated

ROOT = Path(__file__).resolve().parent.parent

CPU_PROBES = ("host_memory_bandwidth", "storage", "collectives", "inference")


def probe_config(work: Path, llm_url: str, fast: bool) -> dict:
    scratch = work / "scratch"
    scratch.mkdir(exist_ok=True)
    every = (lambda s: {"interval_seconds": s, "timeout_seconds": s - 1, "jitter_seconds": 0}) if fast else \
        (lambda s: {})
    return {
        "state_dir": str(work / "state"),
        "probes": {
            "host_memory_bandwidth": every(8),
            "storage": {**every(12), "params": {"targets": [{"name": "scratch", "path": str(scratch),
                                                             "min_free_bytes": 0}]}},
            "collectives": {**every(12), "params": {"backend": "gloo"}},
            "inference": {**every(6), "params": {"targets": [{"name": "reference", "base_url": llm_url,
                                                              "model": "fleetcanary-reference"}]}},
        },
    }


def daemon_windows(work: Path, llm_url: str, idle: float, busy: float) -> dict:
    import yaml

    out = {}
    for mode, seconds in (("idle", idle), ("busy", busy)):
        port = free_port()
        cfg = probe_config(work, llm_url, fast=(mode == "busy"))
        cfg["server"] = {"listen_address": f"127.0.0.1:{port}"}
        path = work / f"daemon-{mode}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        with open(work / f"daemon-{mode}.log", "wb") as log:  # the daemon keeps its own descriptor
            proc = subprocess.Popen([sys.executable, "-m", "fleetcanary", "run", "--config", str(path)], cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=log)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            deadline = time.monotonic() + 180
            # the first runs of every probe are done (each started within 10 s of start)
            while time.monotonic() < deadline:
                try:
                    text = get(url).decode()
                    if all(f'fleetcanary_probe_duration_seconds{{probe="{p}"}}' in text for p in CPU_PROBES):
                        break
                except OSError:
                    pass
                time.sleep(0.5)
            else:
                raise SystemExit(f"overhead: the {mode} daemon's first runs did not finish")
            time.sleep(2)
            c0, _ = proc_stats(proc.pid)
            t0 = time.monotonic()
            scrapes = 0
            while time.monotonic() - t0 < seconds:
                if mode == "busy":
                    get(url)
                    scrapes += 1
                time.sleep(1.0)
            c1, rss = proc_stats(proc.pid)
            out[mode] = {"seconds": time.monotonic() - t0, "cpu_ratio": (c1 - c0) / (time.monotonic() - t0),
                         "rss_bytes": rss, "scrapes": scrapes}
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return out


def _med(rows: list[dict], key: str) -> float:
    """The median (upper, for an even count) of one field over the runs."""
    return sorted(r[key] for r in rows)[len(rows) // 2]


def per_probe(work: Path, llm_url: str, runs: int) -> dict:
    become_subreaper(reap_everything=True)
    path = work / "probes.yaml"
    import yaml

    path.write_text(yaml.safe_dump(probe_config(work, llm_url, fast=False)))
    settings = configmod.load(path)
    out = {}
    for name in CPU_PROBES + ("gpu_health", "gpu_bandwidth", "gpu_p2p", "gpu_compute", "gpu_sustained", "train_step"):
        entry = settings.probe_entries()[name]
        rows = []
        for _ in range(runs):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            o = run_isolated(job.build(name, PROBES[name], entry.params.model_dump(mode="json"),
                                       job.probe_context(settings)), entry.timeout_seconds)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            rows.append({"outcome": o.outcome, "reason": o.reason, "wall_seconds": o.wall_seconds,
                         "cpu_seconds": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
                         "gpu_seconds": sum(o.gpu_seconds.values()),
                         "max_rss_bytes": r1.ru_maxrss * 1024})
        out[name] = {"runs": rows, "outcome": rows[-1]["outcome"], "reason": rows[-1]["reason"],
                     "wall_seconds": _med(rows, "wall_seconds"), "cpu_seconds": _med(rows, "cpu_seconds"),
                     "gpu_seconds": _med(rows, "gpu_seconds"), "interval_seconds": entry.interval_seconds}
    return out


def gpu_budget() -> dict:
    """GPU seconds per hour per GPU at the default schedule of every probe that charges the GPU budget."""
    settings = configmod.settings_model()()
    rows = {}
    for name, cls in PROBES.items():
        expected = cls.Config.model_fields.get("expected_gpu_seconds")
        if expected is None:
            continue
        entry = settings.probe_entries()[name]
        per_run = float(expected.default)
        window = budget_window(entry.interval_seconds)
        rows[name] = {"enabled": entry.enabled, "interval_seconds": entry.interval_seconds,
                      "expected_gpu_seconds": per_run,
                      "gpu_seconds_per_hour": per_run * 3600.0 / entry.interval_seconds,
                      "budget_window_seconds": window, "window_budget_seconds": settings.gpu.budget_ratio * window,
                      "fits_window": per_run <= settings.gpu.budget_ratio * window}
    total = sum(r["gpu_seconds_per_hour"] for r in rows.values() if r["enabled"])
    budget = settings.gpu.budget_ratio * 3600.0
    fits = all(r["fits_window"] for r in rows.values() if r["enabled"])
    return {"probes": rows, "gpu_seconds_per_hour": total, "budget_seconds_per_hour": budget,
            "budget_ratio": settings.gpu.budget_ratio, "every_run_fits_its_window": fits,
            "within_budget": total <= budget and fits}


def print_gpu_budget(b: dict) -> None:
    print(f"{'GPU probe':16} {'enabled':>8} {'interval':>10} {'GPU s/run':>10} {'GPU s/hour':>11} "
          f"{'window':>8} {'its budget':>11}")
    for name, r in b["probes"].items():
        print(f"{name:16} {r['enabled']!s:>8} {r['interval_seconds']:>9.0f}s {r['expected_gpu_seconds']:>10.2f} "
              f"{r['gpu_seconds_per_hour']:>11.2f} {r['budget_window_seconds']:>7.0f}s "
              f"{r['window_budget_seconds']:>10.1f}s{'' if r['fits_window'] else '  RUN OVER ITS WINDOW'}")
    print(f"{'all enabled':16} {'':>8} {'':>10} {'':>10} {b['gpu_seconds_per_hour']:>11.2f}  per GPU; budget "
          f"{b['budget_seconds_per_hour']:.1f} s/hour ({100 * b['budget_ratio']:.1f}%): "
          f"{'within' if b['within_budget'] else 'OVER'} "
          f"({100 * b['gpu_seconds_per_hour'] / b['budget_seconds_per_hour']:.0f}% of it)")
    print("(GPU s/hour: per-run charge x runs per hour, a daily probe amortized; window: the span each probe is "
          "held to the ratio over, its interval clamped to 1 h..1 day.)")
    print("(GPU s/run: each probe's expected_gpu_seconds default, what the budget check charges before a run; "
          "measured GPU seconds on an H200 are in docs/gpu-validation.md.)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="isolated runs per probe (median reported)")
    ap.add_argument("--idle", type=float, default=30.0)
    ap.add_argument("--busy", type=float, default=30.0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/overhead.json"))
    ap.add_argument("--gpu-budget-only", action="store_true", help="only the GPU-budget table (no runs)")
    args = ap.parse_args()
    budget = gpu_budget()
    if args.gpu_budget_only:
        print_gpu_budget(budget)
        return 0 if budget["within_budget"] else 1
    work = Path(tempfile.mkdtemp(prefix="fc-overhead-"))
    server, _ = start_in_thread(SimSettings(ttft_ms=40, itl_ms=8, max_tokens_default=64))
    llm_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        probes = per_probe(work, llm_url, args.runs)
        daemon = daemon_windows(work, llm_url, args.idle, args.busy)
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(work, ignore_errors=True)
    cores = os.cpu_count() or 1
    print(f"fleetcanary overhead on {platform.machine()}, {cores} cores, Python {platform.python_version()}")
    print()
    print(f"{'daemon':8} {'CPU (% of one core)':>20} {'RSS':>10} {'scrapes':>8}")
    for mode in ("idle", "busy"):
        d = daemon[mode]
        print(f"{mode:8} {100 * d['cpu_ratio']:>19.2f}% {d['rss_bytes'] / 2**20:>8.1f} MiB {d['scrapes']:>8}")
    print("(busy: every CPU probe due every 6-12 s and a scrape every second; probe work is in the workers)")
    print()
    print(f"{'probe':22} {'outcome':>16} {'wall s':>8} {'CPU s':>8} {'GPU s':>7} {'interval':>9} "
          f"{'wall duty':>10} {'CPU duty':>9} {'CPU s/hour':>11}")
    total_cpu_hour = 0.0
    for name, p in probes.items():
        runs_per_hour = 3600.0 / p["interval_seconds"]
        wall_duty = p["wall_seconds"] / p["interval_seconds"]
        cpu_duty = p["cpu_seconds"] / p["interval_seconds"]
        cpu_hour = p["cpu_seconds"] * runs_per_hour
        total_cpu_hour += cpu_hour
        p.update(wall_duty=wall_duty, cpu_duty=cpu_duty, cpu_seconds_per_hour=cpu_hour)
        label = p["outcome"] + (f" ({p['reason']})" if p["reason"] else "")
        print(f"{name:22} {label:>16} {p['wall_seconds']:>8.2f} {p['cpu_seconds']:>8.2f} {p['gpu_seconds']:>7.3f} "
              f"{p['interval_seconds']:>8.0f}s {100 * wall_duty:>9.2f}% {100 * cpu_duty:>8.3f}% {cpu_hour:>11.1f}")
    print(f"{'all CPU probes':22} {'':>16} {'':>8} {'':>8} {'':>7} {'':>9} {'':>10} "
          f"{100 * total_cpu_hour / 3600:>8.3f}% {total_cpu_hour:>11.1f}")
    print(f"(CPU duty is of one core; this node has {cores}. GPU probes skip here without a GPU: see "
          "docs/gpu-validation.md for their GPU seconds on an H200.)")
    print()
    print_gpu_budget(budget)
    result = {"machine": {"arch": platform.machine(), "cores": cores, "python": platform.python_version()},
              "daemon": daemon, "probes": probes, "cpu_seconds_per_hour_all_probes": total_cpu_hour,
              "gpu_budget": budget}
    write_result(args.out, result)
    return 0 if budget["within_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())
