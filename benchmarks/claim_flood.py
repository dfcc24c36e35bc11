#!/usr/bin/env python3
"""A claim flood: how long the daemon takes to take N records with GPU seconds from the claim inbox.

Two ways, on a real daemon (no probes run, no Kubernetes) with a real state directory:
- per_record: one Daemon.ingest call per record, as the claim inbox did before issue 37: the GPU budget's
  state file (every charge of the last day) is rewritten after each record, so N records cost O(N^2);
- batch: the records as files in the inbox, taken by Claimer.ingest (each checked, then all charged at once
  and the budget file written once), so N records cost O(N).
Each record charges 8 GPUs. Prints a table and writes benchmarks/results/claim_flood.json.

    python -m benchmarks.claim_flood [--sizes 500,1000,2000,4000] [--modes per_record,batch]
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.common import write_result
from fleetcanary.core import config as configmod
from fleetcanary.core.record import RunRecord
from harness.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
NODE = "bench-node"
GPUS = 8


def make_daemon(work: Path):
    from fleetcanary.daemon.service import Daemon

    cfg = {"node_name": NODE, "state_dir": str(work / "state"),
           "server": {"listen_address": f"127.0.0.1:{free_port()}"}, "gpu": {"xid_watch": "off"},
           "kubernetes": {"mode": "off", "claim": {"enabled": True, "image": "x", "gpus": GPUS}},
           "probes": {"gpu_bandwidth": {"timeout_seconds": 120}}}
    p = work / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    d = Daemon(configmod.load(p, env={}), config_path=str(p))
    d.server.stop()
    return d


def records(n: int, now: float) -> list[RunRecord]:
    return [RunRecord("gpu_bandwidth", "success", node=NODE, started_at=now - 600 + i * 0.01, wall_seconds=2.0,
                      result={"gpu_seconds": {str(g): 1.0 for g in range(GPUS)}, "figures": []}, trigger="claim")
            for i in range(n)]


def run(mode: str, n: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="fc-flood-") as tmp:
        work = Path(tmp)
        d = make_daemon(work)
        now = time.time()
        recs = records(n, now)
        if mode == "per_record":
            t0 = time.perf_counter()
            for rec in recs:
                d.ingest(rec)
            seconds = time.perf_counter() - t0
        else:
            from fleetcanary.daemon.claim import Claimer

            c = Claimer(d, None, "bench")
            c.asked["gpu_bandwidth"] = now - 900
            c.inbox.mkdir(parents=True, exist_ok=True)
            for i, rec in enumerate(recs):
                (c.inbox / f"{i:08d}-gpu_bandwidth.json").write_text(json.dumps(rec.to_json(with_samples=True)))
            t0 = time.perf_counter()
            taken = c.ingest()
            seconds = time.perf_counter() - t0
            assert taken == n, (taken, n)
        charges = len(json.loads((work / "state" / "gpu-budget.json").read_text()))
        assert charges == n * GPUS, (charges, n * GPUS)
        return {"mode": mode, "records": n, "seconds": round(seconds, 3),
                "records_per_second": round(n / seconds, 1) if seconds else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="500,1000,2000,4000")
    ap.add_argument("--modes", default="per_record,batch")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/claim_flood.json"))
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    rows = [run(mode, int(n)) for mode in args.modes.split(",") for n in args.sizes.split(",")]
    print(f"{'mode':<12}{'records':>9}{'seconds':>10}{'records/s':>11}")
    for r in rows:
        print(f"{r['mode']:<12}{r['records']:>9}{r['seconds']:>10.2f}{r['records_per_second']:>11}")
    write_result(args.out, {"benchmark": "claim_flood", "gpus_per_record": GPUS, "python": platform.python_version(),
                            "machine": platform.machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
