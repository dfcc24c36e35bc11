#!/usr/bin/env python3
"""Scrape latency under load, fleetcanary beside node_exporter, in one run.

For each exporter in turn (never both at once, so they do not share the CPUs):
wrk with N connections for D seconds against /metrics, with Accept-Encoding: gzip as
Prometheus sends it; latency p50/p99 from wrk's distribution. Then fleetcanary's
per-series cost (bytes and render time per series) and its idle RSS and CPU over a
quiet window. Prints a table and writes benchmarks/results/scrape.json.

Loopback only; every loop is bounded by its duration.

    python -m benchmarks.scrape [--connections 50] [--duration 30] [--idle 30]
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import get, proc_stats, write_result
from harness.poll import wait_http
from harness.ports import free_port
from harness.wrk import wrk

ROOT = Path(__file__).resolve().parent.parent


def series_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--duration", type=int, default=30)
    ap.add_argument("--idle", type=int, default=30, help="seconds of the idle RSS/CPU window")
    ap.add_argument("--threads", type=int, default=2, help="wrk threads")
    ap.add_argument("--probes", action="store_true",
                    help="keep probes running during the load (host bandwidth every 10 s, storage every 20 s)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/scrape.json"))
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="fc-bench-"))
    procs = []
    results: dict = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                                 "python": platform.python_version()},
                     "load": {"connections": args.connections, "duration_seconds": args.duration,
                              "probes_running": args.probes}}
    try:
        fc_port = free_port()
        cfg = work / "config.yaml"
        probes = "probes:\n  host_memory_bandwidth:\n    jitter_seconds: 0\n"
        if args.probes:
            (work / "scratch").mkdir()
            probes = ("probes:\n  host_memory_bandwidth:\n    interval_seconds: 10\n    timeout_seconds: 9\n"
                      "    params: {array_bytes: 33554432, repeats: 3}\n"
                      "  storage:\n    interval_seconds: 20\n    timeout_seconds: 19\n    params:\n      targets:\n"
                      f"        - {{name: scratch, path: {work / 'scratch'}, file_bytes: 33554432, "
                      "checkpoint_bytes: 0, small_files: 20, min_free_bytes: 0}\n")
        # every wrk connection comes from one address: the connection caps are raised above them (docs/security.md)
        cfg.write_text(f"state_dir: {work / 'state'}\nserver:\n  listen_address: 127.0.0.1:{fc_port}\n"
                       f"  max_connections: {max(64, args.connections + 8)}\n"
                       f"  max_connections_per_client: {args.connections + 8}\n" + probes)
        with open(work / "fc.log", "wb") as log:  # the daemon keeps its own descriptor
            fc = subprocess.Popen([sys.executable, "-m", "fleetcanary", "run", "--config", str(cfg)], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=log)
        procs.append(fc)
        fc_url = f"http://127.0.0.1:{fc_port}/metrics"
        wait_http(fc_url)
        deadline = time.monotonic() + 120
        while b'fleetcanary_probe_success{probe="host_memory_bandwidth"} 1.0' not in get(fc_url):
            if time.monotonic() > deadline:
                raise SystemExit("benchmark: the first host bandwidth run did not finish")
            time.sleep(0.2)

        # Idle: no scrapes, no probe due (interval 600 s).
        cpu0, _ = proc_stats(fc.pid)
        t0 = time.monotonic()
        time.sleep(args.idle)
        cpu1, rss_idle = proc_stats(fc.pid)
        results["fleetcanary_idle"] = {"rss_bytes": rss_idle,
                                       "cpu_ratio": (cpu1 - cpu0) / (time.monotonic() - t0)}

        text = get(fc_url).decode()
        from fleetcanary.daemon.collector import render
        from fleetcanary.daemon.state import ResultStore
        from fleetcanary.probes import PROBES

        store = ResultStore(PROBES, list(PROBES))
        n_render = 200
        t = time.perf_counter()
        for _ in range(n_render):
            render(store)
        render_s = (time.perf_counter() - t) / n_render
        empty_series = series_count(render(store).decode())
        results["fleetcanary_series"] = {"series": series_count(text), "bytes": len(text.encode()),
                                         "bytes_per_series": len(text.encode()) / series_count(text),
                                         "render_seconds_per_series": render_s / max(empty_series, 1)}

        runs0 = get(fc_url).decode()
        fc_load = wrk(fc_url, args.connections, args.duration, args.threads)
        runs1 = get(fc_url).decode()

        def runs(text):
            return sum(float(m.group(1)) for m in re.finditer(
                r'^fleetcanary_probe_runs_total\{[^}]*outcome="success"[^}]*\} (\S+)$', text, re.MULTILINE))
        fc_load["probe_runs_during_load"] = runs(runs1) - runs(runs0)
        _, rss_busy = proc_stats(fc.pid)
        fc_load["rss_after_bytes"] = rss_busy
        results["fleetcanary"] = fc_load
        fc.terminate()
        fc.wait(timeout=30)

        ne = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
        if ne:
            ne_port = free_port()
            # --web.max-requests=0: by default node_exporter answers 503 beyond 40 concurrent
            # scrapes; unlimited, every request is a real scrape, as ours are.
            nep = subprocess.Popen([ne, f"--web.listen-address=127.0.0.1:{ne_port}", "--web.max-requests=0"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(nep)
            ne_url = f"http://127.0.0.1:{ne_port}/metrics"
            wait_http(ne_url)
            ne_text = get(ne_url).decode()
            ne_load = wrk(ne_url, args.connections, args.duration, args.threads)
            ne_load["series"] = series_count(ne_text)
            ne_load["bytes"] = len(ne_text.encode())
            results["node_exporter"] = ne_load
        else:
            results["node_exporter"] = None
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(work, ignore_errors=True)

    def ms(v):
        return f"{v * 1e3:.2f} ms" if v is not None else "-"

    fc, ne = results["fleetcanary"], results["node_exporter"]
    print(f"/metrics under {args.connections} concurrent clients for {args.duration} s (wrk, gzip), "
          f"{os.cpu_count()} cores")
    print(f"{'exporter':16} {'p50':>10} {'p90':>10} {'p99':>10} {'req/s':>10} {'errors':>7} {'series':>7} {'bytes':>8}")
    print(f"{'fleetcanary':16} {ms(fc['p50_seconds']):>10} {ms(fc['p90_seconds']):>10} {ms(fc['p99_seconds']):>10} "
          f"{fc['requests_per_second']:>10.0f} {fc['errors']:>7} {results['fleetcanary_series']['series']:>7} "
          f"{results['fleetcanary_series']['bytes']:>8}")
    if ne:
        print(f"{'node_exporter':16} {ms(ne['p50_seconds']):>10} {ms(ne['p90_seconds']):>10} "
              f"{ms(ne['p99_seconds']):>10} "
              f"{ne['requests_per_second']:>10.0f} {ne['errors']:>7} {ne['series']:>7} {ne['bytes']:>8}")
    s = results["fleetcanary_series"]
    print(f"fleetcanary per series: {s['bytes_per_series']:.0f} bytes, "
          f"render {s['render_seconds_per_series'] * 1e6:.1f} us "
          f"(rendered once per result update, not per scrape)")
    idle = results["fleetcanary_idle"]
    print(f"fleetcanary idle: RSS {idle['rss_bytes'] / 2**20:.1f} MiB, CPU {idle['cpu_ratio'] * 100:.2f}% of a core "
          f"over {args.idle} s; RSS after load {fc['rss_after_bytes'] / 2**20:.1f} MiB")
    if ne:
        verdict = "meets" if fc["p99_seconds"] <= ne["p99_seconds"] else "misses"
        print(f"target p99 <= node_exporter's: {verdict} ({ms(fc['p99_seconds'])} vs {ms(ne['p99_seconds'])})")
    print(f"target idle RSS < 80 MB: {'meets' if idle['rss_bytes'] < 80e6 else 'misses'}")
    for k in ("fleetcanary", "node_exporter"):
        if results.get(k):
            results[k].pop("raw", None)
    write_result(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
