"""Issue 38: the peers' gates beside the run noise they are meant to stand above, per pool and series.

* The gates as the shipped rules compute them: for every peer and fast-path alert, the right-hand side of
  `VALUE > FLOOR > on(...) group_left() (K * MAD)` (replay.condition_parts), substituted as the alert reads
  it and read from the replayed Prometheus at the alert group's evaluations (hourly), per peer group
  (pool, model, driver, figure, series; the change path also per baseline). The gate that binds is the
  larger of the floor and K * MAD.
* The peers' median change (`pool:fleetcanary_judge_change:peer_median`, the current-driver baseline):
  mechanism (i) of the issue, a median change above 1 is the premium of the best of the newest runs.
* The run noise of each series from the fleet's own runs: the robust sigma of successive runs' log
  ratio (1.4826 x its MAD over sqrt 2; junk runs and the diurnal swing barely move it), the median over
  the pool's series.
"""
from __future__ import annotations

import math
import statistics

import numpy as np

from benchmarks.detection import replay as rp
from benchmarks.detection.fleet import Fleet

STEP_S = 3600
CHANGE_MEDIAN = "pool:fleetcanary_judge_change:peer_median"


def _q(v: list[float], q: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]


def run_noise(fleet: Fleet) -> dict[tuple[str, str, str], dict]:
    """(figure, series, pool) -> the median (and p90) over the pool's series of each one's robust run noise."""
    per: dict[tuple[str, str, str], list[float]] = {}
    for n in fleet.nodes:
        for probe, fig in (("gpu_bandwidth", "gpu_memory_bandwidth"), ("collectives", "collective_bus_bandwidth")):
            vals = n.runs[probe]["vals"]
            for c in range(vals.shape[1]):
                v = vals[:, c]
                v = v[~np.isnan(v)]
                if len(v) < 20:
                    continue
                d = np.diff(np.log(v))
                sigma = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / math.sqrt(2)
                series = "d2d" if probe == "gpu_bandwidth" else \
                    f"all_reduce/{1073741824 if c == 0 else fleet.p.coll_small_bytes}/8/nccl"
                per.setdefault((fig, series, n.pool), []).append(sigma)
    return {k: {"series_n": len(v), "noise_median": round(statistics.median(v), 5), "noise_p90": round(_q(v, 0.9), 5)}
            for k, v in per.items()}


def peer_gates(prom, alerts, fleet: Fleet, start: int, end: int) -> dict:
    """Per peer/fast alert and peer group, the gate K * MAD over the evaluated span (median, p10, p90, max),
    the floor, and how often K * MAD was above the floor; and per peer group the peers' median change."""
    recs = rp.recording_rules()
    out: dict = {"alerts": {}, "peer_median_change": {}}
    for a in alerts:
        if a.kind not in ("peer", "fast"):
            continue
        parts = rp.condition_parts(a)
        if not parts or not parts.get("gate"):
            continue
        floor = float(parts["floor"])
        first = rp.grid(start, a.interval, a.offset)
        expr = rp.substitute(parts["gate"], recs, a.group, a.interval, a.offset)
        rows = []
        for key, vals in rp.query_values(prom, expr, first, end, STEP_S).items():
            d = dict(key)
            v = list(vals.values())
            if not v:
                continue
            rows.append({"pool": d.get("pool"), "model": d.get("model"), "driver": d.get("driver_version"),
                         "series": d.get("series"), "baseline": d.get("baseline", ""),
                         "gate_median": round(statistics.median(v), 5), "gate_p10": round(_q(v, 0.1), 5),
                         "gate_p90": round(_q(v, 0.9), 5), "gate_max": round(max(v), 5),
                         "over_floor_share": round(sum(x > floor for x in v) / len(v), 3), "samples": len(v)})
        out["alerts"][a.display] = {"family": a.family, "path": a.path, "floor": floor,
                                    "gate_expr": rp.clean(parts["gate"]),
                                    "groups": sorted(rows, key=lambda r: (r["series"] or "", r["pool"] or "",
                                                                          r["driver"] or "", r["baseline"]))}
        if a.kind == "peer" and a.path == "change":
            med = rp.substitute(f'{CHANGE_MEDIAN}{{figure="{a.family}", baseline="current_driver"}}', recs,
                                a.group, a.interval, a.offset)
            for key, vals in rp.query_values(prom, med, first, end, STEP_S).items():
                d = dict(key)
                v = list(vals.values())
                if v:
                    out["peer_median_change"].setdefault(a.family, []).append(
                        {"pool": d.get("pool"), "model": d.get("model"), "driver": d.get("driver_version"),
                         "series": d.get("series"), "median": round(statistics.median(v), 4),
                         "p10": round(_q(v, 0.1), 4), "p90": round(_q(v, 0.9), 4), "min": round(min(v), 4),
                         "max": round(max(v), 4), "samples": len(v)})
    return out


def table(g: dict, noise: dict, driver: str) -> str:
    """Per figure, series and pool (the old driver; the change path's current-driver baseline): the run
    noise, the peers' median change, and each path's gate K * MAD (median [p90]) with its floor."""
    paths = (("change", "change path"), ("level", "level path"), ("fast", "fast path"))
    head = ("| series | pool | nodes | run noise (p90) | peers' median change (p10-p90) | "
            + " | ".join(f"{w}: K*MAD med [p90] / floor" for _, w in paths) + " |")
    out = [head, "|" + " --- |" * (head.count("|") - 1)]
    pmc = {(r["series"], r["pool"]): r for rs in g["peer_median_change"].values() for r in rs
           if r["driver"] == driver}
    for fig, series, pool in sorted(noise):
        cells, any_gate = [], False
        for path, _ in paths:
            a = next((a for a in g["alerts"].values() if a["family"] == fig and a["path"] == path), None)
            r = a and next((r for r in a["groups"] if r["series"] == series and r["pool"] == pool
                            and r["driver"] == driver and r["baseline"] in ("", "current_driver")), None)
            if r:
                any_gate = True
                cells.append(f"{r['gate_median']:.1%} [{r['gate_p90']:.1%}] / {a['floor']:.1%}")
            else:
                cells.append("-")
        if not any_gate:
            continue
        nz = noise[(fig, series, pool)]
        m = pmc.get((series, pool))
        ms = f"{m['median']:.3f} ({m['p10']:.3f}-{m['p90']:.3f})" if m else "-"
        short = "GPU d2d" if fig == "gpu_memory_bandwidth" else "coll " + series.split("/")[1]
        nodes = nz["series_n"] if fig != "gpu_memory_bandwidth" else nz["series_n"] // 8
        out.append(f"| {short} | {pool} | {nodes} | {nz['noise_median']:.2%} ({nz['noise_p90']:.2%}) | {ms} | "
                   + " | ".join(cells) + " |")
    return "\n".join(out)


def false_context(prom, alerts, rows: list[dict]) -> dict:
    """Mechanism (i): at the start of each false episode of a change path (up to 25 per alert), what the
    node's own series read (its change against its own best day, its drift: the day's median over the best
    day) against the peers' median change, as the replayed Prometheus has them at that instant."""
    recs = rp.recording_rules()
    by = {a.display: a for a in alerts}
    out = {}
    for r in rows:
        a = by.get(r["alert"])
        if a is None or a.kind != "peer" or a.path != "change" or not r.get("false_examples"):
            continue
        got = []
        for f in r["false_examples"]:
            m = [f'node="{f["node"]}"', f'figure="{a.family}"']
            if f.get("series"):
                m.append(f'series="{f["series"]}"')
            if f.get("gpu"):
                m.append(f'gpu="{f["gpu"]}"')
            sel = "{" + ", ".join(m) + "}"
            t = f["start"]

            def one(expr: str, t: int = t) -> float | None:
                res = prom.query(expr, t)
                return float(res[0]["value"][1]) if res else None

            change = one(f'fleetcanary_judge_change{{{", ".join(m)}, baseline="current_driver"}}')
            drift = one(f"fleetcanary_judge_drift{sel}")
            pool = prom.query(f"fleetcanary_judge_median{sel}", t)
            peer = None
            if pool:
                lab = pool[0]["metric"]
                pm = (f'{CHANGE_MEDIAN}{{figure="{a.family}", series="{lab.get("series")}", '
                      f'pool="{lab.get("pool")}", driver_version="{lab.get("driver_version")}", '
                      f'baseline="current_driver"}}')
                peer = one(rp.substitute(pm, recs, a.group, a.interval, a.offset))
            got.append({"node": f["node"], "gpu": f.get("gpu"), "series": f.get("series"), "day": f["day"],
                        "minutes": round((f["end"] - f["start"]) / 60), "cause": f["cause"],
                        "own_change": change, "own_drift": drift, "peers_median_change": peer,
                        "own_over_peers": round(change / peer, 4) if change and peer else None})
        out[r["alert"]] = got
    return out
