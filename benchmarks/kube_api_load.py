#!/usr/bin/env python3
"""API server load of a fleet of exporters (issue 41): N nodes' Kubernetes clients (fleetcanary.daemon.kube, the
real kubernetes client) against the API stand-in (tests/support/kube_api.py, plain HTTP on 127.0.0.1), started
together as a fresh install starts them.

Time is scaled: the pods' period is --refresh (10 s) instead of the default 60 s and the Node's --node-refresh
instead of 300 s, so a minute here is six minutes of a fleet; the rates are given per node at the defaults
(measured rate x the scale). Reported: requests per second by operation at 500 nodes, the share of pod lists
served from the watch cache (resourceVersion=0; the rest are quorum reads of etcd), and how evenly they come: the
busiest second against the mean, over the run after the first (start-up) period.

    python -m benchmarks.kube_api_load [--nodes 500] [--duration 60] [--out FILE]

Run it at two commits to compare; `--label` names the row.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path

from fleetcanary.core import config as configmod
from fleetcanary.daemon.kube import Kube
from harness.kube_api import KubeAPI, node, pod

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_REFRESH, DEFAULT_NODE_REFRESH = 60.0, 300.0


class Timed(list):
    """The stand-in's request log with the time of each request."""

    def append(self, item) -> None:
        super().append((time.monotonic(), *item))


def kube_cfg(refresh: float, node_refresh: float):
    fields = configmod.KubernetesConfig.model_fields
    over = {"refresh_seconds": refresh}
    if "node_refresh_seconds" in fields:  # an older commit has none: it read the Node at every sync
        over["node_refresh_seconds"] = node_refresh
    return configmod.KubernetesConfig(**over)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--refresh", type=float, default=10.0)
    ap.add_argument("--node-refresh", type=float, default=50.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/kube-api-load.json"))
    args = ap.parse_args()
    scale = DEFAULT_REFRESH / args.refresh
    with tempfile.TemporaryDirectory(prefix="fleetcanary-kube-load-") as tmp:
        api = KubeAPI(Path(tmp), plain_http=True)
        api.requests = Timed()
        names = [f"gpu-{i:04d}" for i in range(args.nodes)]
        for n in names:
            api.nodes[n] = node(n, {"nvidia.com/gpu.product": "NVIDIA-H200"}, 8)
            api.pods += [pod("team", f"{n}-job", n, gpus=4), pod("kube-system", f"{n}-agent", n)]
        cfg = kube_cfg(args.refresh, args.node_refresh)
        url = f"http://127.0.0.1:{api.port}"
        kubes = [Kube.at(cfg, n, url) for n in names]
        t0 = time.monotonic()
        starters = [threading.Thread(target=k.start) for k in kubes]  # a fresh install: every pod at once
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        time.sleep(max(0.0, args.duration - (time.monotonic() - t0)))  # the run itself: a fixed span of time
        for k in kubes:
            k._stop.set()
            k._wake.set()
        for k in kubes:
            k.stop()
        end = time.monotonic()
        reqs = list(api.requests)
        api.close()
    steady = [r for r in reqs if r[0] >= t0 + args.refresh]
    span = end - (t0 + args.refresh)
    ops: Counter[str] = Counter()
    from_cache = lists = 0
    for _, method, path, _ in steady:
        u = urllib.parse.urlsplit(path)
        op = "list_pods" if u.path == "/api/v1/pods" else "get_node" if u.path.startswith("/api/v1/nodes/") else \
            f"{method} {u.path}"
        ops[op] += 1
        if op == "list_pods":
            lists += 1
            from_cache += urllib.parse.parse_qs(u.query).get("resourceVersion") == ["0"]
    per_second = Counter(int(r[0] - t0) for r in steady)
    seconds = [per_second.get(s, 0) for s in range(int(args.refresh), int(end - t0))]
    mean = statistics.fmean(seconds) if seconds else 0.0
    row = {"label": args.label, "nodes": args.nodes, "refresh_s": args.refresh, "node_refresh_s": args.node_refresh,
           "scale": scale, "duration_s": round(end - t0, 1), "requests": len(reqs),
           "per_s_at_defaults": {op: round(n / span / scale, 2) for op, n in sorted(ops.items())},
           "per_node_per_hour_at_defaults": {op: round(n / span / scale / args.nodes * 3600, 1)
                                             for op, n in sorted(ops.items())},
           "lists_from_watch_cache": round(from_cache / lists, 3) if lists else None,
           "busiest_second_over_mean": round(max(seconds) / mean, 2) if mean else None,
           "startup_requests_in_first_second": sum(1 for r in reqs if r[0] < t0 + 1)}
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {"benchmark": "kube_api_load", "runs": []}
    data["machine"] = {"cpus": __import__("os").cpu_count(), "python": platform.python_version()}
    data["note"] = __doc__.split("\n\n")[1].replace("\n", " ")
    data["runs"] = [r for r in data["runs"] if r.get("label") != args.label] + [row]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{'run':<12} {'nodes':>5}  {'req/s at defaults, by op':<44} {'cache':>6} {'peak/mean':>9}")
    for r in data["runs"]:
        rates = ", ".join(f"{k} {v}" for k, v in r["per_s_at_defaults"].items())
        print(f"{r['label'] or '-':<12} {r['nodes']:>5}  {rates:<44} {r['lists_from_watch_cache']!s:>6} "
              f"{r['busiest_second_over_mean']!s:>9}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
