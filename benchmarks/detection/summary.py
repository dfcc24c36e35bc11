#!/usr/bin/env python3
"""The issue's targets and defects from detection result JSONs (run.py writes them), side by side.

    python benchmarks/detection/summary.py benchmarks/results/detection-judge.json \\
        benchmarks/results/detection-judge-h200.json ...

Prints one markdown table of the targets (a column per JSON), one of the defects, and, with
--tables, each JSON's per-alert tables as run.py printed them.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

FAMS = (("gpu_memory_bandwidth", "GPU"), ("collective_bus_bandwidth", "collective"))
IV = {"gpu_memory_bandwidth": 15, "collective_bus_bandwidth": 30}
SIZES = ("step 3%", "step 5%", "step 7%", "step 10%", "step 20%")


def name(d: dict, path: str) -> str:
    p = d["profile"]
    out = p["name"]
    if p.get("busy_share"):
        out += f", busy {d['fleet']['busy_share']:.0%}"
    if p.get("week_faults"):
        out += f", {p['nodes']} nodes, {p['days']:g} days"
    for k in d.get("judge_overrides") or {}:
        out += f", {k}={d['judge_overrides'][k]['now']}"
    if d.get("alerts_file") and not d["alerts_file"].endswith("alerts/fleetcanary.alerts.yml"):
        out += f", rules {Path(d['alerts_file']).parent.name}"
    return out


def frac(r: dict | None) -> str:
    if not r:
        return "-"
    return f"{r['detected']}/{r['of']}"


def union(d: dict, fam: str) -> dict:
    return next((u for u in d["unions"] if u["family"] == fam), {"recall": {}})


def targets(ds: list[dict]) -> list[list[str]]:
    rows = []
    false = []
    for d in ds:
        bad = [(r["alert"], r["false_episodes"], r["false_causes"]) for r in d["rows"] if r["false_episodes"]]
        total = sum(b[1] for b in bad)
        false.append(f"{total}" + (": " + "; ".join(
            f"{a.replace('FleetCanary', '')} {n} ({', '.join(f'{k} {v}' for k, v in c.items())})" for a, n, c in bad)
            if bad else ""))
    rows.append(["false episodes, every alert (target 0)", *false])
    for fam, short in FAMS:
        for size in SIZES:
            rows.append([f"recall {short} {size.split()[1]} (any {short} alert)",
                         *[frac(union(d, fam)["recall"].get(size)) for d in ds]])
    for fam, short in FAMS:
        cells = []
        for d in ds:
            each = [x for s in ("step 7%", "step 10%", "step 20%")
                    for x in union(d, fam)["recall"].get(s, {}).get("ttd_each_min", [])]
            if each:
                med = statistics.median(each)
                cells.append(f"{med:.0f} min = {med / IV[fam]:.1f} intervals ({sum(x > 4 * IV[fam] for x in each)} "
                             f"of {len(each)} > 4)")
            else:
                cells.append("-")
        rows.append([f"median TTD {short} >= 7%, any alert (target <= 4 intervals)", *cells])
    for fam, short in FAMS:
        cells = []
        for d in ds:
            fast = next((r for r in d["rows"] if r["family"] == fam and r["kind"] == "fast"
                         and "OwnHistory" not in r["alert"]), None)
            each = (fast or {}).get("recall", {}).get("step 20%", {}).get("ttd_each_min", [])
            u = union(d, fam)["recall"].get("step 20%", {}).get("ttd_each_min", [])
            if each:
                med = statistics.median(each)
                cells.append(f"fast path {len(each)}/{fast['recall']['step 20%']['of']}, median {med:.0f} min = "
                             f"{med / IV[fam]:.1f} intervals, {sum(x <= 2 * IV[fam] for x in each)} within 2; "
                             f"any alert {sum(x <= 2 * IV[fam] for x in u)}/{len(u)} within 2")
            else:
                cells.append("-")
        rows.append([f"20% steps {short}, fast path (target <= 2 intervals)", *cells])
    cells = []
    for d in ds:
        r = union(d, "gpu_memory_bandwidth")["recall"].get("ramp")
        if not r:
            cells.append("-")
            continue
        each = [x[0] for x in r.get("ttd_each", [])]
        within = sum(1 for x in each if x <= 24 * 60)
        cells.append(f"{within}/{r['of']} within a day of crossing 5% (latest {max(each) / 60:.1f} h)" if each else
                     f"0/{r['of']}")
    rows.append(["ramp caught within a day of crossing 5%", *cells])
    return rows


def defects(ds: list[dict]) -> list[list[str]]:
    rows = []
    cells = []
    for d in ds:
        r = d["defects"]["restart_is_not_a_driver_change"]
        j = r["judge"]
        cells.append(f"{'ok' if r['ok'] else 'FAILED'}: {j['restarts']} restarts "
                     f"({j['restarts_with_unknown_env']} with an unknown driver), "
                     f"{j['series_changed_by_restart']} of {j['series_at_restart']} published "
                     f"series changed by a restart, {j['previous_driver_without_upgrade']} previous-driver samples "
                     f"and {j['nodes_never_upgraded_with_another_driver_label']} other-driver labels on never-upgraded "
                     f"nodes, {sum(r['driver_change_alerts_on_never_upgraded_nodes'].values())} driver-change alerts "
                     "there")
    rows.append(["an exporter restart is never a driver change", *cells])
    for alert in ("GPUMemoryBandwidthBelowPeers (change)", "GPUMemoryBandwidthBelowPeers (level)",
                  "GPUMemoryBandwidthFarBelowPeers", "GPUMemoryBandwidthRegression", "GPUMemoryBandwidthDrift",
                  "CollectiveBandwidthBelowPeers (change)", "CollectiveBandwidthRegression"):
        cells = []
        for d in ds:
            x = d["defects"]["episodes_per_steady_fault"].get("FleetCanary" + alert)
            if not x or not x["faults"]:
                cells.append("-")
                continue
            one = x["by_spells"].get("1", 0)
            sizes = ", ".join(f"{k.split()[1]} {v.get('1', 0)}/{sum(v.values())}" for k, v in
                              sorted(x["by_size"].items(), key=lambda kv: float(kv[0].split()[1][:-1]))
                              if k.startswith("step"))
            causes = ", ".join(f"{k} {v}" for k, v in list(x["extra_spell_causes"].items())[:3])
            cells.append(f"{one}/{x['faults']} one spell ({sizes}); extra spells: {causes or '-'}")
        rows.append([f"steady fault, one spell: {alert}", *cells])
    cells = []
    for d in ds:
        w = d["defects"]["week_long_faults"]
        if not w:
            cells.append("-")
            continue
        det = [x for x in w if x["detected"]]
        cov = [x["covered"] for x in det]
        gaps = Counter(g2 for x in det for g in x["gaps"] for g2 in [
            Counter(g["why"].values()).most_common(1)[0][0] if g["why"] else "?"])
        cells.append(f"{len(det)}/{len(w)} detected, covered from detection to the end: median "
                     f"{statistics.median(cov):.1%}, min {min(cov):.1%}; {sum(1 for c in cov if c >= 0.999)} without a "
                     f"gap; gaps {sum(len(x['gaps']) for x in det)} ({', '.join(f'{k} {v}' for k, v in gaps.items())})"
                     if det else f"0/{len(w)}")
    rows.append(["a 5% fault for a week alerts to the end of the week", *cells])
    cells = []
    for d in ds:
        lo = d["defects"]["lost_evaluations"]
        ev = lo["recording_rules"]
        gap = lo.get("promtool_rule_backfill")
        cell = (f"{'none lost' if lo['ok'] else 'SOME LOST'}: every alert answered on its group's grid, each recording "
                f"rule with output at {min(e['with_output'] for e in ev)}/{ev[0]['evaluations']} evaluations")
        if gap:
            cell += (f"; promtool's rule backfill of the same 5-min rule: {gap['written']} written, {gap['missing']} "
                     "missing")
        cells.append(cell)
    rows.append(["the replay loses no evaluation", *cells])
    return rows


def md(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--tables", action="store_true", help="also each JSON's per-alert tables")
    args = ap.parse_args()
    try:
        ds = [json.loads(Path(p).read_text()) for p in args.results]
    except (OSError, ValueError) as e:
        raise SystemExit(f"summary: cannot read a result: {e}") from None
    head = ["target", *[name(d, p) for d, p in zip(ds, args.results, strict=True)]]
    print(md(head, targets(ds)))
    print()
    print(md(["defect", *head[1:]], defects(ds)))
    if args.tables:
        from benchmarks.detection.run import table
        for d, p in zip(ds, args.results, strict=True):
            print(f"\n{p}: {name(d, p)}, wall {d['timings']['total_s'] / 60:.1f} min\n")
            print(table(d["rows"], None))
            print()
            print(table(d["unions"], None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
