"""What the exporter's judge publishes on the detection fleet, family by family: the mean number of series of each
fleetcanary_judge_* family a node has at a scrape over the fleet's last days (every series baselined by then), on
the nodes with no fault, no driver upgrade and no outage, and on every node. The judge is the exporter's own
(judge.py drives its FigureStore and exposition through each node's runs and scrapes, as the detection benchmark
does), so the share of series whose newest runs or drift it publishes (fleetcanary.judge.publish) is measured on
runs with the fleet's noise, junk runs and busy GPUs, not assumed. benchmarks/rule_scale's node model takes those
two shares from this result.

    python -m benchmarks.detection.published [--profile h200] [--busy-share 0.5] [--every 8] [--out FILE]
        [the fleet's knobs, as benchmarks.detection.run takes them]

Prints a table and writes benchmarks/results/judge-published[-h200].json.
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.common import write_result
from benchmarks.detection.fleet import DAY, Fleet, Profile
from benchmarks.detection.judge import judge_node

ROOT = Path(__file__).resolve().parents[2]


def measure(p: Profile, every: int, last_days: float) -> dict:
    start = (int(time.time()) - int(p.days * DAY)) // int(DAY) * int(DAY) + 10 * 3600
    fleet = Fleet(p, start)
    fleet.prepare_scrapes()
    troubled = {e.node for e in fleet.events}
    work = Path(tempfile.mkdtemp(prefix="fc-published-"))
    sums = {"healthy": Counter(), "all": Counter()}
    scrapes = {"healthy": 0, "all": 0}
    judged = []
    try:
        for i in range(0, len(fleet.nodes), every):
            n = fleet.nodes[i]
            _, t, up, *_ = fleet._per_node[i]
            nj = judge_node(fleet, n, t, up, work / n.name)
            window = np.flatnonzero((np.asarray(t) >= fleet.end - last_days * DAY) & np.asarray(up, dtype=bool))
            lo, hi = (int(window[0]), int(window[-1])) if len(window) else (0, -1)
            kinds = ("all", "healthy") if n.name not in troubled else ("all",)
            for kind in kinds:
                scrapes[kind] += len(window)
                for col, fam, idx in zip(nj.cols, nj.family, nj.idx, strict=True):
                    k = fam + ("{current}" if fam == "fleetcanary_judge_change" and 'baseline="current_driver"' in col
                               else "{previous}" if fam == "fleetcanary_judge_change" else "")
                    sums[kind][k] += int(np.count_nonzero((idx >= lo) & (idx <= hi)))
            judged.append(n.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out: dict = {"profile": p.name, "busy_share": p.busy_share, "nodes_judged": len(judged),
                 "healthy_nodes": sum(1 for x in judged if x not in troubled), "last_days": last_days}
    for kind in ("healthy", "all"):
        per = {k: round(v / scrapes[kind], 2) for k, v in sorted(sums[kind].items())} if scrapes[kind] else {}
        median = per.get("fleetcanary_judge_median", 0.0)
        current = per.get("fleetcanary_judge_change{current}", 0.0)
        out[kind] = {"series_per_node": per,
                     "newest_share": round(per.get("fleetcanary_judge_newest", 0.0) / median, 4) if median else None,
                     "drift_share": round(per.get("fleetcanary_judge_drift", 0.0) / current, 4) if current else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", choices=("default", "h200"), default="default")
    for f in dataclasses.fields(Profile):  # the fleet's knobs, as benchmarks.detection.run takes them
        if f.name != "name" and not isinstance(f.default, tuple):
            ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None,
                            help=f"(default {f.default})")
    ap.add_argument("--every", type=int, default=8, help="judge every n-th node of the fleet")
    ap.add_argument("--last-days", type=float, default=2.0, help="count over the fleet's last days")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(Profile)
          if f.name != "name" and getattr(args, f.name, None) is not None}
    p = Profile.h200(**kw) if args.profile == "h200" else Profile(**kw)
    t0 = time.monotonic()
    result = measure(p, args.every, args.last_days)
    result["wall_seconds"] = round(time.monotonic() - t0, 1)
    for kind in ("healthy", "all"):
        r = result[kind]
        print(f"{kind} nodes ({result['healthy_nodes'] if kind == 'healthy' else result['nodes_judged']}): "
              f"newest share {r['newest_share']}, drift share {r['drift_share']}")
        for fam, n in r["series_per_node"].items():
            print(f"  {fam:<45} {n:8.2f}")
    suffix = "" if args.profile == "default" else f"-{args.profile}"
    out = args.out or ROOT / f"benchmarks/results/judge-published{suffix}.json"
    write_result(str(out), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
