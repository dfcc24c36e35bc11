#!/usr/bin/env python3
"""Issue 38's targets and mechanisms from detection result JSONs (run.py with the issue-38 flags), a column each.

    python benchmarks/detection/issue38.py benchmarks/results/detection-judge-v4-before-38*.json

Targets: zero false episodes on every alert; recall 100% from 5% and (H200 profile) at least 90% at
3%; median time to detect at most 3 probe intervals from 7% and at most 2 on the fast path; one episode
per fault per alert. Mechanisms: (i) the peers' median change above 1 and the false change-path
episodes on nodes whose own day was normal; (ii) the change path's gate against the series' run noise;
(iii) spells per fault where a held fault equals the fast path's threshold or the level path's floor.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

SIZES = ("step 3%", "step 5%", "step 7%", "step 10%", "step 20%")
FAMS = (("gpu_memory_bandwidth", "GPU"), ("collective_bus_bandwidth", "collective"))
IV = {"gpu_memory_bandwidth": 15, "collective_bus_bandwidth": 30}
OLD = "550.90.07"


def title(d: dict) -> str:
    p = d["profile"]
    out = f"{p['name']}, {p['nodes']} nodes"
    if p.get("coll_noise_kind"):
        out += f", collective noise {p['coll_noise_kind']}"
    if d["fleet"].get("busy_share", 0) > 0.3:
        out += f", busy {d['fleet']['busy_share']:.0%}"
    return out


def union(d: dict, fam: str) -> dict:
    return next(u for u in d["unions"] if u["family"] == fam)["recall"]


def rng(v: list[float], fmt: str) -> str:
    return "-" if not v else (fmt.format(min(v)) if min(v) == max(v) else f"{fmt.format(min(v))}-{fmt.format(max(v))}")


def column(d: dict) -> dict[str, str]:
    out = {}
    false = {r["alert"]: r for r in d["rows"] if r.get("false_episodes")}
    out["false episodes, every alert"] = str(sum(r["false_episodes"] for r in false.values()))
    for name, r in sorted(false.items()):
        extra = ""
        if r["family"] == "collective_bus_bandwidth" and r.get("false_by_series"):
            extra = " (" + ", ".join(f"{s.split('/')[1] if '/' in s else s}: {n}"
                                      for s, n in r["false_by_series"].items()) + ")"
        out[f"false: {name.replace('FleetCanary', '')}"] = f"{r['false_episodes']}{extra}"
    for fam, short in FAMS:
        rec = union(d, fam)
        out[f"recall {short} 3/5/7/10/20%"] = " / ".join(
            f"{rec[s]['detected']}/{rec[s]['of']}" if s in rec else "-" for s in SIZES)
        each = [x for s in SIZES[2:] for x in rec.get(s, {}).get("ttd_each_min", [])]
        if each:
            m = statistics.median(each) / IV[fam]
            out[f"median TTD >=7% {short}, intervals (target 3)"] = \
                f"{m:.1f} ({sum(x > 3 * IV[fam] for x in each)} of {len(each)} over 3)"
        for lab in sorted(k for k in rec if k.startswith("held")):
            out[f"recall {short} {lab}"] = f"{rec[lab]['detected']}/{rec[lab]['of']}"
    if d["profile"]["name"] == "h200":
        got = sum(union(d, f)["step 3%"]["detected"] for f, _ in FAMS)
        of = sum(union(d, f)["step 3%"]["of"] for f, _ in FAMS)
        out["H200 recall at 3% (target 90%)"] = f"{got}/{of} ({got / of:.0%})"
    for r in d["rows"]:
        if r["kind"] == "fast" and r["alert"].endswith("FarBelowPeers"):
            e = r["recall"].get("step 20%", {}).get("ttd_each_min", [])
            if e:
                short = dict(FAMS)[r["family"]]
                out[f"fast path TTD 20% {short}, intervals (target 2)"] = \
                    f"{statistics.median(e) / IV[r['family']]:.1f} ({sum(x > 2 * IV[r['family']] for x in e)} over 2)"
    # the cost of the confirmation runs: a share of the runs (runs counts them too)
    f = d["fleet"]
    out["confirmation runs, share of runs: GPU / collective"] = " / ".join(
        f"{f['confirmation_runs'][p] / f['runs'][p]:.1%}" for p in ("gpu_bandwidth", "collectives"))
    # one episode per fault per alert
    spf = d.get("issue38", {}).get("spells_per_fault")
    if spf is None:  # a run before issue 38's columns
        return out
    over = [(a, lab, v) for a, sizes in spf.items() for lab, v in sizes.items() if v["max"] > 1]
    n = sum(v["n"] for sizes in spf.values() for v in sizes.values())
    pairs = sum(len(s) for s in spf.values())
    out["(alert, fault size) with a fault in >1 spell"] = f"{len(over)} (of {pairs}; {n} detected faults)"
    for a, sizes in spf.items():
        for lab, v in sizes.items():
            if lab.startswith("held") or v["max"] >= 4:
                out[f"spells/fault {a.replace('FleetCanary', '')} {lab}: median / max"] = \
                    f"{v['median']:g} / {v['max']} ({v['n']})"
    # mechanisms (i), (ii): per-pool figures of the pools with peers, old driver
    g = d.get("issue38", {}).get("gates", {})
    noise = {(x["figure"], x["series"], x["pool"]): x["noise_median"]
             for x in d.get("issue38", {}).get("run_noise", [])}
    for rows in g.get("peer_median_change", {}).values():
        for series in sorted({r["series"] for r in rows}):
            med = [r["median"] for r in rows if r["series"] == series and r["driver"] == OLD]
            short = "GPU d2d" if series == "d2d" else "coll " + series.split("/")[1]
            out[f"(i) peers' median change {short}, pool medians"] = rng(med, "{:.3f}")
    for a in g.get("alerts", {}).values():
        if a["path"] != "change":
            continue
        for series in sorted({r["series"] for r in a["groups"]}):
            gs = [r for r in a["groups"] if r["series"] == series and r["driver"] == OLD
                  and r["baseline"] == "current_driver"]
            short = "GPU d2d" if series == "d2d" else "coll " + series.split("/")[1]
            nz = [noise.get((a["family"], series, r["pool"])) for r in gs]
            out[f"(ii) change gate K*MAD {short}, pool medians (floor {a['floor']:.1%})"] = \
                rng([r["gate_median"] * 100 for r in gs], "{:.1f}%") + " vs run noise " + \
                rng([x * 100 for x in nz if x is not None], "{:.1f}%")
    fc = g.get("false_change_path", {})
    for name, xs in fc.items():
        rat = [x["own_over_peers"] for x in xs if x["own_over_peers"]]
        dr = [x["own_drift"] for x in xs if x["own_drift"]]
        pm = [x["peers_median_change"] for x in xs if x["peers_median_change"]]
        if xs:
            out[f"(i) false {name.replace('FleetCanary', '')}: own/peers, peers' median, own drift"] = \
                f"{rng(rat, '{:.3f}')}, {rng(pm, '{:.3f}')}, {rng(dr, '{:.3f}')} ({len(xs)})"
    return out


def main(paths: list[str]) -> None:
    ds = [json.loads(Path(p).read_text()) for p in paths]
    cols = [column(d) for d in ds]
    keys: list[str] = []
    for c in cols:
        keys += [k for k in c if k not in keys]
    print("| | " + " | ".join(f"{title(d)} (`{Path(p).name}`)" for d, p in zip(ds, paths, strict=True)) + " |")
    print("| --- |" + " --- |" * len(ds))
    for k in keys:
        print(f"| {k} | " + " | ".join(c.get(k, "-") for c in cols) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
