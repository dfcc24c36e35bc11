#!/usr/bin/env python3
"""Detection quality of the SHIPPED alert rules on a synthetic GPU fleet with a known ground truth.

1. fleet.py builds the fleet (default 195 nodes x 8 GPUs, 7 days, 3 GPU models, pools of 3-60
   nodes, Student-t run noise, +-2% per-GPU offsets, a diurnal swing per node, junk runs, failed
   runs, busy periods that make invasive probes skip, exporter outages of 1-3 h, a rolling driver
   upgrade across one pool over 1.5 days, steps of 3-20%, a 1%/day ramp, an intermittent fault, a
   lost GPU, a PCIe x8 downtrain) and emulates the exporter's scrapes (every 120 s; a run's figure
   exported until the next run or until 1.5 probe intervals old; nothing during an outage).
2. replay.py backfills it into a real Prometheus (promtool), with the recording rules the
   replayed alerts need, each in its shipped group at the group's interval, a 5-minute lookback,
   and replays every peer, fast-path, history, driver-change, drift and hard-failure alert the
   fleet can exercise at a 1-minute evaluation step with for / keep_firing_for (and the sparse-
   window hold, from alerts/build.py's alert_parts() when it has one).
3. score.py scores them: precision, false episodes per 1,000 GPU-days with their causes, recall
   per fault kind and size, time to detect.

    python benchmarks/detection/run.py                   # the default fleet (Student-t noise)
    python benchmarks/detection/run.py --profile h200    # the same fleet with H200-like noise (normal 0.6%)
    python benchmarks/detection/run.py --quick           # 60 nodes, fewer faults: a few minutes

Loopback only; needs prometheus and promtool (Debian: apt-get install prometheus). Prints the
per-alert table and writes benchmarks/results/detection[-PROFILE].json.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repo root, for the imports below
from benchmarks.common import write_result
from benchmarks.detection import replay as rp
from benchmarks.detection.fleet import BW, COLL, DAY, Fleet, Profile
from benchmarks.detection.score import score, union

ROOT = Path(__file__).resolve().parents[2]

EMITTED = {"up", BW, COLL, "fleetcanary_node_info", "fleetcanary_gpu_info", "fleetcanary_gpus_healthy",
           "fleetcanary_gpus_expected", "fleetcanary_gpu_lost", "fleetcanary_gpu_pcie_link_width",
           "fleetcanary_gpu_pcie_link_width_max", "fleetcanary_probe_runs_total",
           "fleetcanary_probe_last_success_timestamp_seconds", "fleetcanary_probe_interval_seconds",
           "fleetcanary_probe_enabled"}
FAMILIES = {"gpu_memory_bandwidth", "collective_bus_bandwidth"}
SHORT = {"gpu_memory_bandwidth": "GPU membw", "collective_bus_bandwidth": "collective"}


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", choices=("default", "h200"), default="default",
                    help="default: Student-t run noise (df 3); h200: normal run noise of 0.6%%, no heavy tails")
    ap.add_argument("--quick", action="store_true",
                    help="60 nodes (480 GPUs), 12 GPUs and 3 nodes per step size, 6 ramps, 6 intermittent, "
                         "6 outages: about a third of the default's cost")
    for f in dataclasses.fields(Profile):
        if f.name == "name" or isinstance(f.default, tuple):
            continue
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None,
                        help=f"(default {f.default})")
    ap.add_argument("--jobs", type=int, default=3, help="blocks written and promtool rule backfills run side by side")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (TSDB and logs)")
    ap.add_argument("--workdir", default=None,
                    help="work here and keep it; a second run with the same fleet and rules replays only")
    ap.add_argument("--cache", default="/tmp/fleetcanary-detection-cache",
                    help="keep the raw backfill per fleet here and reuse it (the rules are backfilled anew each run); "
                         "'' to disable")
    ap.add_argument("--out", default=None, help="result JSON (default benchmarks/results/detection[-h200].json)")
    return ap.parse_args()


def profile_from(args) -> Profile:
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(Profile)
          if getattr(args, f.name, None) is not None}
    if args.quick:
        kw = {"nodes": 60, "per_step": 12, "coll_per_step": 3, "ramps": 6, "intermittent": 6, "outages": 6} | kw
    return Profile.h200(**kw) if args.profile == "h200" else Profile(**kw)


def rules_identity() -> dict:
    out = {}
    for f in (rp.RULES, rp.ALERTS):
        out[f.name] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
    try:
        out["commit"] = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %s", "--", "alerts/"],
                                       capture_output=True, text=True, timeout=30).stdout.strip()[:120]
    except OSError:
        pass
    return out


def pct(r: dict | None) -> str:
    if not r:
        return "-"
    return f"{r['recall'] * 100:.0f}%" if r["of"] >= 10 else f"{r['detected']}/{r['of']}"


def ttd(rec: dict, labels) -> str:
    vals = [(rec[lab]["ttd_median_min"], rec[lab]["ttd_max_min"]) for lab in labels if rec.get(lab, {}).get(
        "ttd_median_min") is not None]
    if not vals:
        return "-"
    return "/".join(f"{v:.0f}" for v in (min(m for m, _ in vals), max(m for m, _ in vals))) + \
        f" ({max(x for _, x in vals):.0f})"


def table(rows: list[dict], fleet: Fleet) -> str:
    cols = ["step 3%", "step 5%", "step 7%", "step 10%", "step 20%", "ramp", "intermittent", "driver"]
    head = ("| alert | kind | prec | false | /1k GPU-d | false causes | " + " | ".join(
        c.replace("step ", "") for c in cols) + " | TTD >=7% med (max) | TTD 20% | ramp TTD | other |")
    out = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        rec = r["recall"]
        causes = ", ".join(f"{k} {v}" for k, v in sorted(r.get("false_causes", {}).items(), key=lambda x: -x[1]))
        other = ", ".join(f"{k} {pct(v)} ({v.get('ttd_median_min', '-')}/{v.get('ttd_max_min', '-')} min)"
                          for k, v in rec.items() if k not in cols)
        prec = "-" if r.get("precision") is None else f"{r['precision']:.2f}"
        big = ttd(rec, ["step 7%", "step 10%", "step 20%"])
        med = "-"
        if any(rec.get(c, {}).get("ttd_median_min") is not None for c in ("step 7%", "step 10%", "step 20%")):
            import statistics
            allv = [rec[c]["ttd_median_min"] for c in ("step 7%", "step 10%", "step 20%")
                    if rec.get(c, {}).get("ttd_median_min") is not None]
            worst = max(rec[c].get("ttd_max_min", 0) for c in ("step 7%", "step 10%", "step 20%") if c in rec)
            med = f"{statistics.median(allv):.0f} ({worst:.0f})"
        del big
        t20 = rec.get("step 20%", {})
        t20s = (f"{t20['ttd_median_min']:.0f} ({t20['ttd_max_min']:.0f})" if t20.get("ttd_median_min") is not None
                else "-")
        rmp = rec.get("ramp", {})
        rmps = f"{rmp['ttd_median_min'] / 60:.1f} h ({rmp['ttd_max_min'] / 60:.1f})" if rmp.get("ttd_median_min") \
            is not None else "-"
        fam = SHORT.get(r["family"], r["family"])
        out.append(f"| {r['alert']} | {r['kind']} {fam} | {prec} | {r.get('false_episodes', '-')} | "
                   f"{r.get('false_per_1000_gpu_days', '-')} | {causes or '-'} | " +
                   " | ".join(pct(rec.get(c)) for c in cols) + f" | {med} | {t20s} | {rmps} | {other or '-'} |")
    return "\n".join(out)


def main() -> int:
    args = parse()
    p = profile_from(args)
    for b in ("prometheus", "promtool"):
        if not shutil.which(b):
            raise SystemExit(f"detection: {b} is not installed (apt-get install prometheus)")
    out = Path(args.out) if args.out else ROOT / "benchmarks/results" / (
        "detection.json" if p.name == "default" else f"detection-{p.name}.json")
    t_all = time.monotonic()
    timings = {}

    def say(m: str) -> None:
        print(f"[{time.monotonic() - t_all:6.0f}s] {m}", flush=True)

    now = int(time.time())
    start = (now - int(p.days * DAY) - 4 * 3600) // 7200 * 7200
    key = hashlib.sha256(json.dumps(dataclasses.asdict(p), sort_keys=True).encode()
                         + Path(__file__).with_name("fleet.py").read_bytes()).hexdigest()[:16]
    cached = Path(args.cache) / key if args.cache else None
    if cached and (cached / "meta.json").exists():
        start = json.loads((cached / "meta.json").read_text())["start"]
    kept = Path(args.workdir) / "backfilled.json" if args.workdir else None
    if kept and kept.exists() and json.loads(kept.read_text()).get("fleet") == key:
        start = json.loads(kept.read_text())["start"]
    t = time.monotonic()
    fleet = Fleet(p, start)
    end = fleet.end
    timings["fleet_s"] = round(time.monotonic() - t, 1)
    summ = fleet.summary()
    say(f"fleet ({p.name}): {summ['nodes']} nodes x 8 GPUs, {p.days:g} days, pools {summ['pools']}, busy "
        f"{summ['busy_share']:.0%} of the time, runs {summ['runs']}, skipped {summ['skipped_runs']}")
    rules_id = rules_identity()  # before the run: the files may change under a long one
    alerts, skipped = rp.load_alerts(EMITTED, FAMILIES)
    say(f"replaying {len(alerts)} alerts: {', '.join(a.name for a in alerts)}")
    if any(a.parts for a in alerts):
        say("alerts/build.py has alert_parts(): the sparse-window hold is replayed from its parts")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fc-detection-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.workdir:
        args.keep = True
    data = work / "data"
    records = set().union(*(a.records for a in alerts))
    state = {"fleet": key, "rules": rules_id, "records": sorted(records)}
    done_file = work / "backfilled.json"
    prev = json.loads(done_file.read_text()) if done_file.exists() else {}
    reuse = {k: prev.get(k) for k in state} == state and prev.get("start") == start
    if not reuse and data.exists():
        shutil.rmtree(data)
    stages = prev.get("stages", []) if reuse else []
    try:
        t = time.monotonic()
        if reuse:
            say(f"replaying on the backfill kept in {work}")
        elif cached and (cached / "meta.json").exists():
            shutil.copytree(cached / "data", data)
            say(f"raw backfill reused from {cached}")
        else:
            size = rp.backfill_raw(fleet, data, work, say, jobs=args.jobs)
            say(f"raw backfill done: {size / 2**20:.0f} MiB of OpenMetrics")
            if cached:
                shutil.rmtree(cached, ignore_errors=True)
                shutil.copytree(data, cached / "data")
                (cached / "meta.json").write_text(json.dumps({"start": start}))
        timings["backfill_raw_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        if not reuse:
            early = rp.read_back(records, rp.recording_rules(), [a.cond for a in alerts] + [a.runs_ok for a in alerts])
            stages = rp.backfill_rules(records, data, work, fleet.eval_start, end, say, jobs=args.jobs, early=early,
                                       early_start=start)
            done_file.write_text(json.dumps(state | {"start": start, "stages": stages}))
        timings["backfill_rules_s"] = round(time.monotonic() - t, 1)
        prom = rp.BackfilledPrometheus(data, work / "prometheus.log", "5m")
        rows, eps_by = [], {}
        t = time.monotonic()
        try:
            for a in alerts:
                eps, info = rp.replay_alert(prom, a, fleet.eval_start, end)
                eps_by[a.name] = (a, eps)
                row = score(fleet, a, eps) | info
                rows.append(row)
                say(f"{a.name}: {len(eps)} episodes, {row['false_episodes']} false ({info['query_s']}s)")
        finally:
            prom.stop()
        timings["replay_s"] = round(time.monotonic() - t, 1)
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    unions = []
    for fam in sorted(FAMILIES):
        members = [(a, e) for a, e in eps_by.values() if a.family == fam and a.kind != "driver"]
        if members:
            unions.append(union(fleet, f"any {SHORT[fam]} peer/fast/history/drift alert", fam, members))
    timings["total_s"] = round(time.monotonic() - t_all, 1)
    print()
    print(f"Detection, profile {p.name}: {summ['nodes']} nodes x 8 GPUs, {p.days:g} days ({summ['gpu_days']:,.0f} "
          f"GPU-days), scrape every {p.scrape_s} s, 5-min lookback, alerts replayed every minute; "
          f"noise {p.noise} {p.bw_noise:.1%} (GPU) / {p.coll_noise:.1%} (collective)")
    print(table(rows, fleet))
    print()
    print(table(unions, fleet))
    if skipped:
        print("\nnot replayed: " + "; ".join(f"{s['alert']} ({s['why']})" for s in skipped))
    print("timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    write_result(out, {"profile": dataclasses.asdict(p), "fleet": summ, "rules": rules_id,
                       "start": start, "eval_start": fleet.eval_start, "end": end, "scrape_s": p.scrape_s,
                       "lookback": "5m", "eval_step_s": rp.EVAL_S,
                       "rows": rows, "unions": unions, "not_replayed": skipped, "rule_stages": stages,
                       "timings": timings})
    return 0


if __name__ == "__main__":
    sys.exit(main())
