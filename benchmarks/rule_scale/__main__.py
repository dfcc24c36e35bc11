"""`python -m benchmarks.rule_scale`: the command line (the package's docstring says what it measures)."""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks import rule_scale
from benchmarks.common import write_result
from harness.backfill import binary

from .backfill import Backfill, windows_read, write_history
from .live import FleetServer, live, sharded_rules
from .model import (
    GPUS,
    RESULTS,
    ROOT,
    RULE_FILES,
    Node,
    budget,
    fleet,
    metric_kinds,
    node_template,
    probers,
    published_shares,
)
from .tables import on_disk, print_tables


# --------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rule_scale", description=rule_scale.__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pool-nodes", type=int, default=50, help="nodes per pool (a pool has one GPU model)")
    ap.add_argument("--state", choices=("fresh", "steady"), default="fresh",
                    help="fresh: an empty TSDB; steady: every range window backfilled at the scrape interval")
    ap.add_argument("--pools-sharded", type=int, default=0,
                    help="render the rules with the first N pools in groups of their own (alerts/build.py pools)")
    ap.add_argument("--upgraded", type=float, default=0.1,
                    help="share of each pool's nodes on a new driver (with a previous-driver change series)")
    ap.add_argument("--targets", default="storage,inference",
                    help="probes with targets configured (their families beside the budget's default config)")
    ap.add_argument("--inference-probers", type=int, default=None,
                    help="nodes that probe the inference target (default: the probe's probers_per_target; 0: every "
                    "node, as the runs before 42f had it)")
    ap.add_argument("--scrape-interval", type=int, default=30, help="seconds")
    ap.add_argument("--cycles", type=int, default=3, help="evaluations to measure of the slowest group "
                    "up to 5 minutes (the judged groups); a slower one (the peers' spread) is measured once")
    ap.add_argument("--warmup", type=float, default=0, help="seconds of evaluation after all targets are up "
                    "before measuring (the head's chunks fill)")
    ap.add_argument("--max-wait", type=float, default=3600, help="seconds to wait for the cycles")
    ap.add_argument("--held-share", type=float, default=0.0,
                    help="share of the judged series held, as on a busy fleet (0: the steady node, every GPU free)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", help="default: benchmarks/results/rule_scale-v3-<nodes>-<state>[-sharded<N>].json")
    ap.add_argument("--table", action="store_true", help="print the tables from the results on disk and exit")
    args = ap.parse_args()
    # SIGTERM (and SIGINT, which a shell's background job ignores) end the run through its finally blocks:
    # Prometheus stopped, the work directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.table:
        print_tables(on_disk())
        return 0
    for b in ("prometheus", "promtool"):
        if not shutil.which(b):
            raise SystemExit(f"rule_scale: {b} is not installed (apt-get install prometheus)")
    out = args.out or str(RESULTS / f"rule_scale-v3-{args.nodes}-{args.state}"
                                    f"{f'-sharded{args.pools_sharded}' if args.pools_sharded else ''}.json")
    work = Path(tempfile.mkdtemp(prefix="fc-rule-scale-"))
    targets = tuple(t for t in args.targets.split(",") if t)
    b = budget()
    result = {"rules": "v3", "nodes": args.nodes, "gpus_per_node": GPUS, "pool_nodes": args.pool_nodes,
              "state": args.state, "pools_sharded": args.pools_sharded, "upgraded": args.upgraded,
              "targets": targets, "scrape_interval_seconds": args.scrape_interval, "cycles": args.cycles,
              "budget": {k: v for k, v in b.items() if k != "by_family"},
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True).stdout.strip(),
              "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(),
                          "platform": platform.platform()}}
    version = subprocess.run([binary("prometheus"), "--version"], capture_output=True, text=True).stdout
    result["machine"]["prometheus"] = version.split("\n")[0]
    t_all = time.monotonic()
    timings = {}
    server = None
    try:
        t = time.monotonic()
        fl = list(fleet(args.nodes, args.pool_nodes, args.upgraded))
        tmpl, result["template"] = node_template(work, b["by_family"])
        timings["template_s"] = time.monotonic() - t
        print(f"the node's exposition in {timings['template_s']:.0f}s: {sum(map(len, tmpl.values()))} raw series; "
              f"from the specs (a probe that failed here): {result['template']['fitted_from_specs'] or 'none'}",
              flush=True)
        t = time.monotonic()
        result["published_shares"] = shares = published_shares() | {"held": args.held_share}
        from fleetcanary.probes import PROBES

        k = args.inference_probers
        if k is None:
            k = PROBES["inference"].Config().probers_per_target
        chosen = probers([r[1] for r in fl], k) if "inference" in targets else set()
        others = tuple(t for t in targets if t != "inference")
        nodes = [Node(*row, tmpl, targets, shares) if row[1] in chosen or "inference" not in targets
                 else Node(*row, tmpl, others, shares, idle=("inference",)) for row in fl]
        n0 = next(n for n in nodes if n.node == fl[0][1])
        prober = next((n for n in nodes if n.node in chosen), n0)
        result["model"] = {"raw_series_per_node": len(n0.raw), "judge_series_per_node": len(n0.judge),
                           "raw_by_family": dict(sorted(Counter(f for f, _, _ in n0.raw).items())),
                           "judge_by_family": dict(sorted(Counter(f for f, _, _ in n0.judge).items())),
                           "judged_series_by_figure": dict(sorted(Counter(
                               lab["figure"] for f, lab, _ in n0.judge if f == "fleetcanary_judge_median").items())),
                           "upgraded_nodes": sum(1 for r in fl if r[5]),
                           "inference_probers": sorted(chosen),
                           "raw_series_per_prober": len(prober.raw),
                           "raw_series_mean": round(sum(len(n.raw) for n in nodes) / len(nodes), 2),
                           "judge_series_mean": round(sum(len(n.judge) for n in nodes) / len(nodes), 2)}
        print(f"model: {len(n0.raw)} raw + {len(n0.judge)} judge series per node ({len(chosen)} inference "
              f"probers: {len(prober.raw)} raw) "
              f"(budget's default config {b['series_without_judge']} raw, {b['written']}; targets {targets})",
              flush=True)
        rule_files = RULE_FILES
        if args.pools_sharded:
            pools = sorted({r[3] for r in fl})[:args.pools_sharded]
            rule_files = sharded_rules(work, pools)
            result["sharded_pools"] = pools
        data = work / "data"
        data.mkdir()
        if args.state == "steady":
            end = int(time.time()) // args.scrape_interval * args.scrape_interval
            need = windows_read(rule_files)
            sizes: list[int] = []
            blocks = Backfill(data)

            def written(path: Path) -> None:
                sizes.append(path.stat().st_size)
                blocks(path)

            hist = write_history(work, nodes, need, end, args.scrape_interval, written)
            timings["generate_s"] = time.monotonic() - t
            blocks.wait()
            timings["backfill_s"] = time.monotonic() - t - timings["generate_s"]
            print(f"history: {hist['series']:,} series, {hist['samples']:,} samples in {len(hist['files'])} files "
                  f"({sum(sizes) / 2**20:.0f} MiB of OpenMetrics) written in {timings['generate_s']:.0f}s, "
                  f"backfilled {timings['backfill_s']:.0f}s after", flush=True)
            hist.pop("files")
            result["history"] = hist
        t = time.monotonic()
        _, kind = metric_kinds()
        now = time.time()
        bodies = {n.node: n.body(now, kind) for n in nodes}
        del nodes
        timings["render_s"] = time.monotonic() - t
        result["exposition_bytes_per_node"] = len(bodies[fl[0][1]])
        server = FleetServer(bodies)
        t = time.monotonic()
        result["live"] = live(work, data, args, server, [r[1] for r in fl], rule_files)
        timings["live_s"] = time.monotonic() - t
    finally:
        if server:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    timings["total_s"] = time.monotonic() - t_all
    result["timings"] = timings
    result["machine"]["load_average_at_end"] = os.getloadavg()
    write_result(out, result)
    lv = result["live"]
    print_tables([result])
    print(f"alerts at the end (a healthy fleet): {lv['alerts'] or 'none'}")
    print("timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
