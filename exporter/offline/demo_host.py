"""`fleetcanary demo --this-host`: the exporter, the reference LLM server and a local Prometheus, on loopback.

Everything a dashboard shows on a machine without GPUs: host memory bandwidth, storage on a
scratch directory, collectives on gloo CPU ranks, the inference canary against the built-in
reference server, and the GPU probes' skip reasons. Prometheus (when installed) loads the
shipped recording and alert rules. Ends on SIGINT/SIGTERM or after --duration, and stops
everything it started; the work directory goes too unless --keep.
"""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from fleetcanary.core import resources
from fleetcanary.offline import local_services as svc
from fleetcanary.offline.simulate_llm import SimSettings, start_in_thread
from fleetcanary.probes.lib.spawn import module_command


def demo_config(workdir: Path, listen: str, llm_base_url: str, fast: bool) -> dict:
    """The exporter config the demo runs: every CPU-capable probe, short schedules."""
    def every(normal: float, quick: float) -> float:
        return quick if fast else normal

    scratch = workdir / "storage"
    scratch.mkdir(parents=True, exist_ok=True)
    return {
        "state_dir": str(workdir / "state"),
        "pool": "demo",
        "server": {"listen_address": listen},
        "probes": {
            # No GPU here: these skip (no_gpu), which the dashboards' skip panels show.
            "gpu_health": {"interval_seconds": every(60, 10), "timeout_seconds": every(30, 8)},
            "host_memory_bandwidth": {"interval_seconds": every(120, 10), "timeout_seconds": every(60, 8),
                                      "params": {"array_bytes": 32 << 20, "repeats": 5}},
            "storage": {"interval_seconds": every(300, 20), "timeout_seconds": every(120, 18), "params": {
                "repeats": 3,
                "targets": [{"name": "demo-scratch", "path": str(scratch), "file_bytes": 32 << 20,
                             "checkpoint_bytes": 16 << 20, "small_files": 50, "random_reads": 64,
                             "min_free_bytes": 256 << 20}]}},
            # Fast mode still gives the deadline room for two gloo ranks to import torch on a
            # busy 2-core machine (48 s seen at a load average of 10).
            "collectives": {"interval_seconds": every(300, 60), "timeout_seconds": every(120, 55), "params": {
                "backend": "gloo", "cpu_ranks": 2, "sizes_bytes": [1024, 65536, 1048576],
                "warmup_iterations": 2, "iterations": 5}},
            "inference": {"interval_seconds": every(30, 10), "timeout_seconds": every(25, 8), "params": {
                "targets": [{"name": "demo-llm", "base_url": llm_base_url, "model": "fleetcanary-reference",
                             "stream_max_tokens": 32, "prefix_words": 256}]}},
        },
    }


def prometheus_config(exporter: str, node: str, fast: bool, rule_files: list[Path]) -> dict:
    interval = svc.FAST_INTERVAL if fast else "15s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(f) for f in rule_files],
        "scrape_configs": [{"job_name": "fleetcanary", "static_configs": [{"targets": [exporter]}],
                            "relabel_configs": [{"target_label": "node", "replacement": node}]}],
    }


def main(args) -> int:
    with resources.rule_files() as rule_files, resources.dashboards_dir() as dashboards:
        return _run(args, rule_files, dashboards)


def _run(args, rule_files: list[Path], dashboards: Path) -> int:
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fleetcanary-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    exporter = prom = llm = None
    code = 0
    try:
        llm, _ = start_in_thread(SimSettings(ttft_ms=40, itl_ms=8, max_tokens_default=32))
        llm_url = f"http://127.0.0.1:{llm.server_address[1]}/v1"
        listen = svc.free_address(args.listen)
        cfg = workdir / "fleetcanary.yaml"
        cfg.write_text(yaml.safe_dump(demo_config(workdir, listen, llm_url, args.fast), sort_keys=False))
        with open(workdir / "exporter.log", "ab") as exporter_log:  # the child keeps its own descriptor
            exporter = subprocess.Popen([*module_command("fleetcanary"), "run", "--config", str(cfg)],
                                        stdout=exporter_log, stderr=subprocess.STDOUT)
        if not svc.ready(f"http://{listen}/healthz", time.monotonic() + 60, exporter):
            print(f"fleetcanary demo: the exporter did not start; see {workdir / 'exporter.log'}", file=sys.stderr)
            return 1
        print(f"exporter:    http://{listen}/metrics  (config {cfg})")
        print(f"LLM server:  {llm_url}  (the reference server the inference canary probes)")
        binary = shutil.which("prometheus")
        if binary and not args.no_prometheus:
            plisten = svc.free_address(args.prometheus_listen)
            pcfg = workdir / "prometheus.yml"
            if args.fast:
                rule_files = svc.fast_rule_files(rule_files, workdir / "rules")
            pcfg.write_text(yaml.safe_dump(prometheus_config(listen, socket.gethostname() or "demo", args.fast,
                                                             rule_files)))
            with open(workdir / "prometheus.log", "ab") as prom_log:
                prom = subprocess.Popen([binary, f"--config.file={pcfg}",
                                         f"--storage.tsdb.path={workdir / 'prometheus'}",
                                         f"--web.listen-address={plisten}", "--log.level=warn"],
                                        stdout=prom_log, stderr=subprocess.STDOUT)
            if not svc.ready(f"http://{plisten}/-/ready", time.monotonic() + 60, prom):
                print(f"fleetcanary demo: Prometheus did not start; see {workdir / 'prometheus.log'}", file=sys.stderr)
                return 1
            groups = svc.rule_groups(plisten)
            if not groups:
                print(f"fleetcanary demo: Prometheus loaded no rule group from {', '.join(map(str, rule_files))}; "
                      f"see {workdir / 'prometheus.log'}", file=sys.stderr)
                return 1
            print(f"Prometheus:  http://{plisten}  ({len(groups)} rule groups loaded: {', '.join(groups)})")
            print(f"Grafana:     add a Prometheus data source with URL http://{plisten}, then import "
                  f"{dashboards}/*.json")
        else:
            print("Prometheus:  not started (" + ("--no-prometheus" if binary else
                  "not installed: apt-get install prometheus") + ")")
            print(f"Grafana:     point a Prometheus that scrapes http://{listen}/metrics at the dashboards in "
                  f"{dashboards}")
        print("Ctrl-C stops everything.", flush=True)
        deadline = time.monotonic() + args.duration if args.duration > 0 else None
        while not stop.is_set():
            if exporter.poll() is not None or (prom is not None and prom.poll() is not None):
                print(f"fleetcanary demo: a component exited; logs in {workdir}", file=sys.stderr)
                code = 1
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            stop.wait(0.5)
    finally:
        svc.stop(exporter)
        svc.stop(prom)
        if llm is not None:
            llm.shutdown()
            llm.server_close()
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return code
