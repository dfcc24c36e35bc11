"""The tables: per rule group, and before (v2) against after (v3), from one result or those on disk."""
from __future__ import annotations

import json
import statistics

from .model import RESULTS, V2_JSON


# --------------------------------------------------------------------------- tables
def _gib(b: float) -> str:
    return f"{b / 2**30:.1f}"


def v2_summary() -> dict:
    """The v2 rules at 200 nodes (benchmarks/results/rule_scale-200.json), per 1,000 nodes linearly."""
    d = json.loads(V2_JSON.read_text())
    lv, k = d["live"], 1000 / d["nodes"]
    per_min = sum(g["median_seconds"] * 60 / g["interval_seconds"] for g in lv["groups"].values()
                  if g["median_seconds"] is not None)
    return {"label": f"v2, {d['nodes']} nodes x 5", "nodes": d["nodes"], "per_minute_per_1000": per_min * k,
            "per_minute": per_min,
            "hourly_group_per_1000": sum(g.get("instant_query_seconds") or 0 for g in lv["groups"].values()
                                         if g["interval_seconds"] == 3600) * k,
            "head_series_per_1000": lv["head_series"] * k, "rss_per_1000": lv["prometheus_rss_bytes"] * k,
            "rss": lv["prometheus_rss_bytes"],
            "scraped_per_node": lv["node0_raw_series"],
            # the 1-minute groups' records, measured; the hourly group's 936 a node, counted from its rules
            "recorded_per_node": lv["recorded_series_total"] / d["nodes"] + 936,
            "missed": "peers group 192 s, then 746 s per evaluation at 1,000 nodes (docs/alerting-scale.md)",
            "cpu": lv["prometheus_cpu_seconds_per_second"]}


def summary(r: dict) -> dict:
    lv, n = r["live"], r["nodes"]
    per_min = sum(g["seconds_per_minute"] for g in lv["groups"].values() if g["seconds_per_minute"] is not None)
    missed = sum(g["iterations_missed_total"] for g in lv["groups"].values())
    late = [g for g, x in lv["groups"].items()
            if x["max_seconds"] is not None and x["max_seconds"] > x["interval_seconds"]]
    label = f"v3 {r['state']}, {n:,} nodes"
    if r.get("pools_sharded"):
        label += f", {r['pools_sharded']} pools sharded"
    return {"label": label, "nodes": n, "per_minute": per_min, "per_minute_per_1000": per_min * 1000 / n,
            "head_series_per_1000": lv["head_series"] * 1000 / n,
            "rss_per_1000": lv["prometheus_peak_rss_bytes"] * 1000 / n, "rss": lv["prometheus_peak_rss_bytes"],
            "scraped_per_node": lv["scraped_series_per_node"], "recorded_per_node": lv["recorded_series_total"] / n,
            "missed": f"{missed} missed" + (f"; over interval: {', '.join(late)}" if late else ", every group in time"),
            "cpu": lv["prometheus_cpu_seconds_per_second"]}


def compare_table(results: list[dict]) -> str:
    """Before (v2) and after (each v3 result) side by side, per 1,000 nodes."""
    cols = [v2_summary()] + [summary(r) for r in results]
    rows = [("rule evaluation, s per minute per 1,000 nodes", lambda c: f"{c['per_minute_per_1000']:.1f}"),
            ("rule evaluation, s per minute (this fleet)", lambda c: f"{c['per_minute']:.1f}"),
            ("Prometheus CPU, cores (while measured)", lambda c: f"{c['cpu']:.2f}" if c["cpu"] is not None else "-"),
            ("missed iterations", lambda c: c["missed"]),
            ("head series per 1,000 nodes (M)", lambda c: f"{c['head_series_per_1000'] / 1e6:.2f}"),
            ("Prometheus RSS per 1,000 nodes (GiB)", lambda c: _gib(c["rss_per_1000"])),
            ("Prometheus peak RSS, this fleet (GiB)", lambda c: _gib(c["rss"])),
            ("scraped series per node", lambda c: f"{c['scraped_per_node']:,.0f}"),
            ("recorded series per node", lambda c: f"{c['recorded_per_node']:,.1f}")]
    out = ["| | " + " | ".join(c["label"] for c in cols) + " |", "| --- |" + " --- |" * len(cols)]
    out += [f"| {name} | " + " | ".join(f(c) for c in cols) + " |" for name, f in rows]
    return "\n".join(out)


def group_table(r: dict) -> str:
    lv, n = r["live"], r["nodes"]
    out = ["| group | rules | every | evaluations | median s (max) | s per minute | per minute per 1,000 nodes | "
           "missed | failures |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for g, x in sorted(lv["groups"].items(), key=lambda kv: -(kv[1]["seconds_per_minute"] or 0)):
        if x["median_seconds"] is None:
            out.append(f"| {g} | {x['rules']} | {x['interval_seconds'] / 60:.0f}m | 0 | - | - | - | "
                       f"{x['iterations_missed_total']} | {x['evaluation_failures']} |")
            continue
        out.append(f"| {g} | {x['rules']} | {x['interval_seconds'] / 60:.0f}m | {x['measured']} | "
                   f"{x['median_seconds']:.3f} ({x['max_seconds']:.3f}) | {x['seconds_per_minute']:.3f} | "
                   f"{x['seconds_per_minute'] * 1000 / n:.3f} | {x['iterations_missed_total']} | "
                   f"{x['evaluation_failures']} |")
    return "\n".join(out)


def pool_cost(r: dict) -> dict | None:
    """With --pools-sharded: one pool's peer and own-history groups, the median over the sharded pools."""
    pools = r.get("sharded_pools") or []
    if not pools:
        return None
    lv, out = r["live"], {"pools": len(pools), "nodes_per_pool": r["pool_nodes"]}
    for kind in ("peers", "own-history"):
        med = [lv["groups"][f"fleetcanary-{kind}-{p}"]["median_seconds"] for p in pools
               if lv["groups"].get(f"fleetcanary-{kind}-{p}", {}).get("median_seconds") is not None]
        mx = [lv["groups"][f"fleetcanary-{kind}-{p}"]["max_seconds"] for p in pools
              if lv["groups"].get(f"fleetcanary-{kind}-{p}", {}).get("max_seconds") is not None]
        out[kind] = {"median_seconds": statistics.median(med) if med else None, "max_seconds": max(mx) if mx else None,
                     "sum_of_medians_seconds": sum(med), "groups": len(med)}
    return out


def on_disk() -> list[dict]:
    out = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("rule_scale-v3-*.json"))]
    return sorted(out, key=lambda r: (bool(r.get("pools_sharded")), r["nodes"], r["state"] != "fresh"))


def print_tables(results: list[dict]) -> None:
    for r in results:
        print(f"\n{summary(r)['label']} ({r['nodes'] // r['pool_nodes']} pools of {r['pool_nodes']}; "
              f"{r['machine']['cpus']} CPUs, load average {r['machine']['load_average_at_start'][0]:.1f} at start):")
        print(group_table(r))
        pc = pool_cost(r)
        if pc:
            for kind in ("peers", "own-history"):
                k = pc[kind]
                if k["median_seconds"] is not None:
                    print(f"one pool's {kind} group ({pc['nodes_per_pool']} nodes): median {k['median_seconds']:.3f} s "
                          f"(max {k['max_seconds']:.3f} s) an evaluation; all {k['groups']} pools "
                          f"{k['sum_of_medians_seconds']:.2f} s")
    print("\nbefore (v2) and after (v3):")
    print(compare_table(results))
