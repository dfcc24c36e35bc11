#!/usr/bin/env python3
"""Detection quality of the SHIPPED alert rules on a synthetic GPU fleet with a known ground truth.

1. fleet.py builds the fleet (default 195 nodes x 8 GPUs, 7 days, 3 GPU models, pools of 3-60
   nodes, Student-t run noise, +-2% per-GPU offsets, a diurnal swing per node, junk runs, failed
   runs, confirmation runs, busy periods that make invasive probes skip, exporter outages of 1-3 h,
   a rolling driver upgrade across one pool over 1.5 days, steps of 3-20%, a 1%/day ramp, an
   intermittent fault, a lost GPU, a PCIe x8 downtrain).
2. judge.py drives every node's exporter judge (the exporter's own FigureStore and exposition) with
   the node's runs, and emulates the scrapes (every 240 s): at each, the fleetcanary_judge_*
   statistics the exporter publishes then (held a day after a series' newest run; nothing while
   the exporter is down; the store survives a restart), beside the series the hard failures read.
3. replay.py backfills that into a real Prometheus (promtool, raw series only) and replays the
   shipped groups fleetcanary-peers (recording rules, then alerts, every 5 minutes),
   fleetcanary-own-history (5 minutes), fleetcanary-hard-failures (1 minute) and
   fleetcanary-probe-health (5 minutes), each at its own
   offset, every evaluation with query_range (recorded series substituted by their rules; no rule
   output backfilled, so no evaluation is lost), through the alert state machine (pending, `for`).
4. score.py scores them: precision, false episodes per 1,000 GPU-days with their causes, recall
   per fault kind and size, time to detect; and the issue's defects (restarts, episodes per
   steady fault, week-long faults, lost evaluations).

    python benchmarks/detection/run.py                   # the default fleet (Student-t noise)
    python benchmarks/detection/run.py --profile h200    # the same fleet with H200-like noise (normal 0.6%)
    python benchmarks/detection/run.py --quick           # 60 nodes, fewer faults: a few minutes
    python benchmarks/detection/run.py --busy-share 0.5  # GPUs busy half the time
    python benchmarks/detection/run.py --quick --days 9.75 --week-faults 12   # 5% faults that last a week

Loopback only; needs prometheus and promtool (Debian: apt-get install prometheus). Prints the
per-alert table and writes benchmarks/results/detection[-PROFILE].json.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import write_result
from benchmarks.detection import gates as gt
from benchmarks.detection import replay as rp
from benchmarks.detection.fleet import DAY, DRIVER_OLD, Fleet, Profile
from benchmarks.detection.judge import STAT_FAMILIES
from benchmarks.detection.score import (
    INTERVAL_MIN,
    Why,
    episodes_per_fault,
    pooled_ttd,
    relevant,
    score,
    union,
    week_coverage,
)

ROOT = Path(__file__).resolve().parents[2]

EMITTED = {"up", "fleetcanary_gpus_healthy", "fleetcanary_gpus_expected", "fleetcanary_gpu_lost",
           "fleetcanary_gpu_pcie_link_width", "fleetcanary_gpu_pcie_link_width_max", "fleetcanary_probe_runs_total",
           "fleetcanary_probe_last_success_timestamp_seconds", "fleetcanary_probe_interval_seconds",
           *STAT_FAMILIES}  # and what the exporter's judge publishes (judge.py)
FAMILIES = {"gpu_memory_bandwidth", "collective_bus_bandwidth"}
START_UTC_S = 10 * 3600  # the fleet's first second, in its UTC day
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
    ap.add_argument("--jobs", type=int, default=2, help="nodes judged and blocks written side by side")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (TSDB and logs)")
    ap.add_argument("--workdir", default=None,
                    help="work here and keep it; a second run with the same fleet replays only")
    ap.add_argument("--cache", default="/tmp/fleetcanary-detection-cache",
                    help="keep the backfill per fleet and judge here and reuse it (a rerun on changed rules only "
                         "replays); '' to disable")
    ap.add_argument("--alerts", default=None,
                    help="replay this alert rule file instead of the shipped alerts/fleetcanary.alerts.yml (say, one "
                         "`python alerts/build.py --settings FILE --out DIR` wrote)")
    ap.add_argument("--judge-set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                    help="override a constant of the exporter's judge for this run (stats.MEDIAN_RUNS=7, "
                         "freshness.HOLD_SECONDS=43200): an experiment, recorded in the JSON")
    ap.add_argument("--judge-variant", default="", choices=("", "confirm-median3"),
                    help="an experimental change to the judge's statistics (experiments.py): confirm-median3 "
                         "takes the median of the newest 3 runs, not their best, for the change's figure")
    ap.add_argument("--promtool-gap", action="store_true",
                    help="also backfill one peers-group recording rule with promtool's rule backfill and list the "
                         "evaluations it did not write")
    ap.add_argument("--out", default=None, help="result JSON (default benchmarks/results/detection[-h200].json)")
    ap.add_argument("--episodes", default=None, metavar="FILE",
                    help="also write every replayed episode, the fleet's faults and its pools to FILE (JSON): what "
                         "benchmarks/remediation_replay.py plays a quarantine policy over")
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


def judge_overrides(sets: list[str]) -> dict:
    """Apply --judge-set overrides to the exporter's judge modules (before any node is judged)."""
    import importlib

    done = {}
    for item in sets:
        name, _, value = item.partition("=")
        mod, _, attr = name.partition(".")
        if mod == "figures" and "." in attr:  # one figure's field: figures.collective_bus_bandwidth.median_runs=5
            done[name] = figure_override(*attr.split(".", 1), value)
            continue
        m = importlib.import_module(f"fleetcanary.judge.{mod}")
        if not hasattr(m, attr):
            raise SystemExit(f"detection: fleetcanary.judge.{mod} has no {attr}")
        old = getattr(m, attr)
        setattr(m, attr, type(old)(float(value)) if isinstance(old, (int, float)) else value)
        done[name] = {"was": old, "now": getattr(m, attr)}
    return done


def figure_override(key: str, attr: str, value: str) -> dict:
    """Replace one judged figure's field (a frozen dataclass) everywhere the judge looks it up."""
    import dataclasses

    from fleetcanary.judge import figures as figmod

    fig = figmod.BY_KEY.get(key)
    if fig is None or attr not in {f.name for f in dataclasses.fields(fig)}:
        raise SystemExit(f"detection: no judged figure field {key}.{attr}")
    old = getattr(fig, attr)
    new = dataclasses.replace(fig, **{attr: type(old)(float(value)) if isinstance(old, (int, float)) else value})
    figmod.BY_KEY[key] = new
    figmod.BY_PROBE[fig.probe] = tuple(new if f.key == key else f for f in figmod.BY_PROBE[fig.probe])
    return {"was": old, "now": getattr(new, attr)}


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
    if any("week 5%" in r["recall"] for r in rows):
        cols.append("week 5%")
    cols += sorted({k for r in rows for k in r["recall"] if k.startswith("held ")})  # issue 38's held faults
    head = ("| alert | kind | prec | false | /1k GPU-d | false causes | " + " | ".join(
        c.replace("step ", "") for c in cols) + " | TTD >=7% med (max) | >=7% pooled, intervals | TTD 20% | ramp TTD "
        "| other |")
    out = [head, "|" + " --- |" * (head.count("|") - 1)]
    big = ("step 7%", "step 10%", "step 20%")
    for r in rows:
        rec = r["recall"]
        causes = ", ".join(f"{k} {v}" for k, v in sorted(r.get("false_causes", {}).items(), key=lambda x: -x[1]))
        other = ", ".join(f"{k} {pct(v)} ({v.get('ttd_median_min', '-')}/{v.get('ttd_max_min', '-')} min)"
                          for k, v in rec.items() if k not in cols)
        prec = "-" if r.get("precision") is None else f"{r['precision']:.2f}"
        med = "-"
        allv = [rec[c]["ttd_median_min"] for c in big if rec.get(c, {}).get("ttd_median_min") is not None]
        if allv:
            worst = max(rec[c].get("ttd_max_min", 0) for c in big if c in rec)
            med = f"{statistics.median(allv):.0f} ({worst:.0f})"
        pool = pooled_ttd(rec, r["family"]) if r["family"] in INTERVAL_MIN else None
        pooled = f"{pool['median_intervals']:.1f} ({pool['over_4_intervals']} > 4)" if pool else "-"
        t20 = rec.get("step 20%", {})
        t20s = (f"{t20['ttd_median_min']:.0f} ({t20['ttd_max_min']:.0f})" if t20.get("ttd_median_min") is not None
                else "-")
        rmp = rec.get("ramp", {})
        rmps = f"{rmp['ttd_median_min'] / 60:.1f} h ({rmp['ttd_max_min'] / 60:.1f})" if rmp.get("ttd_median_min") \
            is not None else "-"
        fam = SHORT.get(r["family"], r["family"])
        out.append(f"| {r['alert']} | {r['kind']} {fam} | {prec} | {r.get('false_episodes', '-')} | "
                   f"{r.get('false_per_1000_gpu_days', '-')} | {causes or '-'} | " +
                   " | ".join(pct(rec.get(c)) for c in cols) + f" | {med} | {pooled} | {t20s} | {rmps} | "
                   f"{other or '-'} |")
    return "\n".join(out)


def default_out(p: Profile) -> Path:
    name = "detection-judge" + ("" if p.nodes == 195 else f"-{p.nodes}") + ("" if p.name == "default" else f"-{p.name}")
    if p.busy_share:
        name += f"-busy{round(p.busy_share * 100)}"
    if p.busy_jobs:
        name += "-jobs" + ("-gpugate" if p.per_gpu_gate else "") + ("-opp" if p.opportunistic else "")
    if p.week_faults:
        name += "-week"
    return ROOT / "benchmarks/results" / f"{name}.json"


def defects(fleet: Fleet, alerts, eps_by: dict, rows: list[dict], judge_checks: dict, evaluations: list,
            gap: dict | None, whys: dict) -> dict:
    """The issue's four defects, checked."""
    non_upgraded = {n.name for n in fleet.nodes if n.upgrade_at is None}
    restart = {
        "judge": judge_checks,
        "driver_change_alerts_on_never_upgraded_nodes": {
            a.display: sum(1 for ep in eps if ep["labels"].get("node") in non_upgraded)
            for a, eps in eps_by.values() if a.kind == "driver"},
        "false_episodes_attributed_to_outage_or_restart": {
            r["alert"]: r["false_causes"].get("outage/restart", 0) for r in rows
            if r["false_causes"].get("outage/restart")},
    }
    restart["ok"] = (judge_checks.get("previous_driver_without_upgrade", 0) == 0
                     and judge_checks.get("series_changed_by_restart", 0) == 0
                     and judge_checks.get("nodes_never_upgraded_with_another_driver_label", 0) == 0
                     and not any(restart["driver_change_alerts_on_never_upgraded_nodes"].values()))
    per_fault = {a.display: episodes_per_fault(fleet, a, eps, why=whys.get(a.display)) for a, eps in eps_by.values()
                 if a.kind not in ("hard", "driver")}
    members = [(a, e) for a, e in eps_by.values() if a.family == "gpu_memory_bandwidth" and a.kind != "driver"]
    week = week_coverage(fleet, members, whys=whys)
    lost = {"alerts": {a: {"evaluations": r["evaluations"], "off_grid_points": r["off_grid_points"]}
                       for a, r in ((r["alert"], r) for r in rows)},
            "recording_rules": evaluations, "promtool_rule_backfill": gap,
            # would promtool's rule backfill drop an evaluation before every 2-hour block boundary, per replayed
            # group, given the rule file as the old replay named it and as deployed?
            "promtool_would_lose": {a.group: {f: rp.promtool_loses(a.group, f, a.interval)
                                              for f in ("fleetcanary.rules.yml",
                                                        rp.RULE_PATHS.get(rp.ALERTS.name, rp.ALERTS.name))}
                                    for a in alerts}}
    lost["ok"] = all(r["off_grid_points"] == 0 for r in rows) and all(
        e["with_output"] == e["evaluations"] for e in evaluations)
    return {"restart_is_not_a_driver_change": restart, "episodes_per_steady_fault": per_fault,
            "week_long_faults": week, "lost_evaluations": lost}


def write_episodes(path: Path, fleet: Fleet, eps_by: dict) -> None:
    """Every replayed episode (alert, its labels, start and end, severity and path), the fleet's faults and each
    node's pool: the input of a policy replay (which nodes a quarantine policy would act on, and when)."""
    episodes = [{"alert": a.name, "display": display, "severity": a.labels.get("severity", ""),
                 "path": a.labels.get("path", ""), "figure": a.family,
                 "labels": {k: v for k, v in ep["labels"].items()
                            if k in ("node", "gpu", "series", "baseline", "driver_version")},
                 "start": ep["start"], "end": ep["end"]}
                for display, (a, eps) in eps_by.items() for ep in eps]
    faults = [{"kind": e.kind, "family": e.family, "node": e.node, "gpu": e.gpu, "start": e.start, "end": e.end,
               "size": e.size, "label": e.label} for e in fleet.events]
    path.write_text(json.dumps({"start": fleet.start, "eval_start": fleet.eval_start, "end": fleet.end,
                                "pools": {n.name: n.pool for n in fleet.nodes}, "faults": faults,
                                "episodes": episodes}))


def main() -> int:
    args = parse()
    # SIGTERM (and SIGINT, which a shell's background job ignores) end the run through its finally blocks: the
    # replay's Prometheus stopped, the work directory removed (a plain SIGTERM left both behind).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = profile_from(args)
    overrides = judge_overrides(args.judge_set)
    if args.judge_variant:
        from benchmarks.detection.experiments import VARIANTS
        VARIANTS[args.judge_variant]()
        overrides["variant"] = {"was": "", "now": args.judge_variant}
    if args.alerts:
        rp.ALERTS = Path(args.alerts).resolve()
    for b in ("prometheus", "promtool"):
        if not shutil.which(b):
            raise SystemExit(f"detection: {b} is not installed (apt-get install prometheus)")
    out = Path(args.out) if args.out else default_out(p)
    t_all = time.monotonic()
    timings = {}

    def say(m: str) -> None:
        print(f"[{time.monotonic() - t_all:6.0f}s] {m}", flush=True)

    now = int(time.time())
    # The fleet starts at 10:00 UTC whatever the hour of the run: the judge's days are UTC days, so the start's
    # time of day decides when each series gets its first baseline (two hours later moved 6% of the samples).
    start = (now - int(p.days * DAY) - 4 * 3600 - START_UTC_S) // int(DAY) * int(DAY) + START_UTC_S
    sources = b"".join(f.read_bytes() for f in [Path(__file__).with_name("fleet.py"), Path(__file__).with_name(
        "judge.py"), ROOT / "exporter/daemon/confirm.py", *sorted((ROOT / "exporter/judge").glob("*.py"))])
    fleet_id = [dataclasses.asdict(p), args.judge_set] + ([args.judge_variant] if args.judge_variant else [])
    key = hashlib.sha256(json.dumps(fleet_id, sort_keys=True).encode()
                         + sources).hexdigest()[:16]
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
    say(f"replaying {len(alerts)} alert rules: {', '.join(a.display for a in alerts)}")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fc-detection-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.workdir:
        args.keep = True
    data = work / "data"
    done_file = work / "backfilled.json"
    prev = json.loads(done_file.read_text()) if done_file.exists() else {}
    reuse = prev.get("fleet") == key and prev.get("start") == start and data.exists()
    if not reuse and data.exists():
        shutil.rmtree(data)
    gap = None
    try:
        t = time.monotonic()
        if reuse:
            judge_checks = prev["judge"]
            say(f"replaying on the backfill kept in {work}")
        elif cached and (cached / "meta.json").exists():
            shutil.copytree(cached / "data", data)
            judge_checks = json.loads((cached / "meta.json").read_text())["judge"]
            say(f"backfill reused from {cached}")
        else:
            judge_checks = rp.judge_fleet(fleet, work, say, jobs=args.jobs)
            timings["judge_s"] = round(time.monotonic() - t, 1)
            say(f"judge done ({timings['judge_s']:.0f}s): {judge_checks['series_published']} series, "
                f"{judge_checks['samples']:,} samples")
            size = rp.backfill_raw(fleet, data, work, say, jobs=args.jobs)
            say(f"raw backfill done: {size / 2**20:.0f} MiB of OpenMetrics")
            if cached:
                shutil.rmtree(cached, ignore_errors=True)
                shutil.copytree(data, cached / "data")
                (cached / "meta.json").write_text(json.dumps({"start": start, "judge": judge_checks}))
        done_file.write_text(json.dumps({"fleet": key, "start": start, "judge": judge_checks}))
        timings["backfill_raw_s"] = round(time.monotonic() - t, 1) - timings.get("judge_s", 0)
        prom = rp.BackfilledPrometheus(data, work / "prometheus.log", "5m")
        rows, eps_by, evaluations, whys = [], {}, [], {}
        t = time.monotonic()
        try:
            for a in alerts:
                eps, info = rp.replay_alert(prom, a, fleet.eval_start, end)
                eps_by[a.display] = (a, eps)
                why = None
                if a.kind != "hard":  # what held it off on each faulted series, evaluation by evaluation
                    t1 = time.monotonic()
                    nodes = sorted({e.node for e in fleet.events if relevant(a, e) and e.kind != "driver"})
                    why = whys[a.display] = Why(fleet, a, rp.condition_parts(a),
                                                rp.diagnose(prom, a, nodes, fleet.eval_start, end))
                    info["diagnose_s"] = round(time.monotonic() - t1, 1)
                row = score(fleet, a, eps, why) | info
                rows.append(row)
                diag_s = f", diagnosis {info['diagnose_s']}s" if "diagnose_s" in info else ""
                say(f"{a.display}: {len(eps)} episodes, {row['false_episodes']} false ({info['query_s']}s{diag_s})")
            for r in rp.peer_records():
                evaluations.append(rp.count_evaluations(prom, r, fleet.eval_start, end))
            say("recording rules: " + ", ".join(f"{e['rule']} {e['with_output']}/{e['evaluations']}"
                                                 for e in evaluations))
            t1 = time.monotonic()
            gate_info = gt.peer_gates(prom, alerts, fleet, fleet.eval_start, end)
            gate_info["false_change_path"] = gt.false_context(prom, alerts, rows)
            timings["gates_s"] = round(time.monotonic() - t1, 1)
        finally:
            prom.stop()
        timings["replay_s"] = round(time.monotonic() - t, 1)
        if args.promtool_gap:
            t = time.monotonic()
            rec = next(r for r in rp.peer_records() if r.name == "pool:fleetcanary_judge_median:peer_nodes")
            big = max(fleet.pool_size, key=lambda k: (k != p.upgrade_pool, fleet.pool_size[k]))
            model = next(n.model for n in fleet.nodes if n.pool == big)
            sel = (f'{{pool="{big}", model="{model}", driver_version="{DRIVER_OLD}", '
                   f'figure="gpu_memory_bandwidth", series="d2d"}}')
            gap = rp.promtool_gap(data, work, rec, fleet.eval_start, end, sel, say)
            timings["promtool_gap_s"] = round(time.monotonic() - t, 1)
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
            for rec in unions[-1]["recall"].values():  # why each member alert missed it
                for m in rec.get("missed", []):
                    e = next(x for x in fleet.events if x.node == m["node"] and x.gpu == m["gpu"] and x.family == fam
                             and x.kind != "driver")
                    t0 = e.detect_from if e.detect_from is not None else e.start
                    m["why"] = {a.display: whys[a.display].summary(e.node, e.gpu, t0, e.end or end)["main"]
                                for a, _ in members if a.display in whys}
    found = defects(fleet, alerts, eps_by, rows, judge_checks, evaluations, gap, whys)
    timings["total_s"] = round(time.monotonic() - t_all, 1)
    print()
    print(f"Detection, profile {p.name}: {summ['nodes']} nodes x 8 GPUs, {p.days:g} days ({summ['gpu_days']:,.0f} "
          f"GPU-days), busy {summ['busy_share']:.0%}, scrape every {p.scrape_s} s, 5-min lookback, each group at its "
          f"interval; noise {p.noise} {p.bw_noise:.1%} (GPU) / {p.coll_noise:.1%} (collective)")
    print(table(rows, fleet))
    print()
    print(table(unions, fleet))
    print()
    r = found["restart_is_not_a_driver_change"]
    print(f"restart is not a driver change: {'ok' if r['ok'] else 'FAILED'} ({json.dumps(r['judge'])}; driver-change "
          f"alerts on never-upgraded nodes {r['driver_change_alerts_on_never_upgraded_nodes']})")
    for name, d in found["episodes_per_steady_fault"].items():
        if d["faults"]:
            print(f"spells per steady fault, {name}: {d['by_spells']} (extra spells: {d['extra_spell_causes']})")
    for w in found["week_long_faults"]:
        print(f"week-long fault {w['node']}/{w['gpu']} pool {w['pool']}: " + (
            f"detected after {w['detected_after_min']} min, covered {w['covered']:.1%} of {w['days_to_end']} days, "
            f"gaps {w['gaps']}" if w["detected"] else "NOT detected"))
    noise = gt.run_noise(fleet)
    print(f"\nGates per pool beside the run noise (issue 38; driver {DRIVER_OLD}, hourly over the evaluated span):")
    print(gt.table(gate_info, noise, DRIVER_OLD))
    print("\nEpisodes (firing spells) per detected steady fault, per alert: median / max (faults)")
    spf = {name: d["spells_per_fault"] for name, d in found["episodes_per_steady_fault"].items()
           if d.get("spells_per_fault")}
    for name, d in spf.items():
        print(f"  {name}: " + ", ".join(f"{k} {v['median']:g} / {v['max']} ({v['n']})" for k, v in d.items()))
    fbs = {r["alert"]: r["false_by_series"] for r in rows if r.get("false_episodes") and r["family"] ==
           "collective_bus_bandwidth"}
    if fbs:
        print("false collective episodes by series: " + json.dumps(fbs))
    for name, fc in gate_info["false_change_path"].items():
        print(f"false episodes of {name}: own change / peers' median change (own drift), minutes:")
        for x in fc:
            def f3(v):
                return "-" if v is None else f"{v:.3f}"
            print(f"  day {x['day']} {x['node']} {x['gpu'] or ''} {x['series']}: {f3(x['own_change'])} / "
                  f"{f3(x['peers_median_change'])} = {f3(x['own_over_peers'])} (drift {f3(x['own_drift'])}), "
                  f"{x['minutes']} min, {x['cause']}")
    lo = found["lost_evaluations"]
    print(f"lost evaluations: {'none' if lo['ok'] else 'SOME'}; promtool rule backfill: {json.dumps(gap)}")
    if skipped:
        print("\nnot replayed: " + "; ".join(f"{s['alert']} ({s['why']})" for s in skipped))
    print("timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    if args.episodes:
        write_episodes(Path(args.episodes), fleet, eps_by)
    write_result(out, {"profile": dataclasses.asdict(p), "fleet": summ, "rules": rules_id,
                       "alerts_file": str(rp.ALERTS), "judge_overrides": overrides,
                       "start": start, "eval_start": fleet.eval_start, "end": end, "scrape_s": p.scrape_s,
                       "lookback": "5m", "groups": {a.group: {"interval_s": a.interval, "offset_s": a.offset}
                                                    for a in alerts},
                       "rows": rows, "unions": unions, "defects": found, "not_replayed": skipped,
                       "issue38": {"gates": gate_info, "spells_per_fault": spf,
                                   "run_noise": [{"figure": f, "series": s_, "pool": pl} | v
                                                 for (f, s_, pl), v in sorted(noise.items())]},
                       "timings": timings})
    return 0


if __name__ == "__main__":
    sys.exit(main())
