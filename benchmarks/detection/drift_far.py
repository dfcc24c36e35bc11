#!/usr/bin/env python3
"""Issue 38, seventh pass: how far past the drift floor a short day reads, on healthy series and on faults near it.

A day too short for the drift's 0.5% error stands for a drift from NOISE_MIN_RUNS runs where its drift is past the
rules' floor by DRIFT_FAR_ERRORS standard errors. This script measures that margin on the detection fleets' own
runs, with no rules and no Prometheus: every node's runs go through the exporter's judge (FigureStore, fed as
judge.py feeds it: ``node_runs``, ``run_record``), and after each run from the fleet's evaluation day on, each
series the run updated whose trailing day has the runs but not the error (``Series.drift_evidence``) gives

    z_day = (gap - floor) / the day's standard error          (the rule before the seventh pass, at 4)
    z     = (gap - floor) / the drift's standard error         (the day's and its best day's together, at 2)

Per fleet and kind of series (GPU memory bandwidth; the 1 GiB and the small all-reduce), the worst of each over the
healthy series (no fault of any kind on the series), and for each step at most 7.5% (and the held and week-long
faults of that size) the best of each after its onset: what a rule at each margin would have stood for.

    python -m benchmarks.detection.drift_far                       # six fleets -> benchmarks/results/drift-far.json
    python -m benchmarks.detection.drift_far --fleets default-50   # one
"""
from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from alerts.build import SETTINGS
from benchmarks.detection.fleet import Fleet, Profile
from benchmarks.detection.judge import node_runs, run_record
from benchmarks.detection.run import START_UTC_S
from fleetcanary.judge import stats as statsmod
from fleetcanary.judge.store import FigureStore

DAY = 86400
ROOT = Path(__file__).resolve().parents[2]
# the issue-38 fleets (docs/detection.md): a small all-reduce at 3%, held collective and GPU faults at the floors
ISSUE38 = {"coll_small_bytes": 1048576, "coll_small_noise": 0.03, "coll_fast_steps": 6, "level_steps": 10}
FLEETS = {f"{prof}-{busy}": (prof, busy / 100) for prof in ("default", "h200") for busy in (0, 50, 80)}
OLD_ERRORS = 4.0   # DRIFT_FAR_ERRORS before the seventh pass, of the day's error alone
NEAR = 0.075       # faults this size or smaller are the ones near the floor


def profile(name: str, busy: float) -> Profile:
    kw = dict(ISSUE38, busy_share=busy)
    return Profile.h200(coll_noise_kind="t", **kw) if name == "h200" else Profile(**kw)


_WORKER: dict[str, Fleet] = {}   # each worker process's fleet, built once (it is deterministic)


def _init(name: str, busy: float, start: int) -> None:
    _WORKER["fleet"] = Fleet(profile(name, busy), start)


def kind_of(series: str) -> str:
    if "/" not in series:
        return "gpu"
    return "coll 1 GiB" if "/1073741824/" in series else "coll small"


def node_margins(i: int) -> tuple[str, dict]:
    """One node's runs through its judge: series -> [(time, gap, day error, drift error, runs)]."""
    f = _WORKER["fleet"]
    n = f.nodes[i]
    store = FigureStore(None)
    eval_from = f.start + f.p.eval_from_day * DAY
    out: dict[str, list] = {}
    for fin, probe, outcome, row in node_runs(n):
        if outcome != 0:  # a success: failed and skipped runs keep nothing
            continue
        store.observe(run_record(f.p, n, fin, probe, "success", row))
        if fin < eval_from:
            continue
        for (_, series, gpu), s in store.series.items():
            if abs(s.last - fin) > 1.0 or len(s.recent) < statsmod.NOISE_MIN_RUNS:
                continue
            ev = s.drift_evidence()
            if ev is None or ev.day_error <= statsmod.DRIFT_MAX_ERROR:
                continue
            out.setdefault(f"{series}|{gpu}", []).append((fin, ev.gap, ev.day_error, ev.error, ev.runs))
    return n.name, out


def faults_on(fleet: Fleet, node: str, key: str) -> list:
    series, gpu = key.split("|")
    coll = kind_of(series) != "gpu"
    out = []
    for e in fleet.events:
        if e.node != node or e.kind == "outage":
            continue
        on_gpu = e.family != "collective_bus_bandwidth" and (e.gpu is None or str(e.gpu) == gpu)
        if (e.family == "collective_bus_bandwidth") if coll else on_gpu:
            out.append(e)
    return out


def measure(fleet_name: str, name: str, busy: float, floor: float, jobs: int) -> dict:
    start = (int(time.time()) // DAY - 30) * DAY + START_UTC_S   # any whole day: the fleet is the same
    _init(name, busy, start)
    fleet = _WORKER["fleet"]
    with ProcessPoolExecutor(jobs, initializer=_init, initargs=(name, busy, start)) as ex:
        per_node = dict(ex.map(node_margins, range(len(fleet.nodes)), chunksize=4))
    healthy: dict[str, dict] = {}
    faults = []
    for node, series in per_node.items():
        for key, pts in series.items():
            kind = kind_of(key.split("|")[0])
            evs = faults_on(fleet, node, key)
            if not evs:
                h = healthy.setdefault(kind, {"series": 0, "days": 0, "z_day": None, "z": None})
                h["series"] += 1
                h["days"] += len(pts)
                for _, gap, day_err, err, runs in pts:
                    for col, e in (("z_day", day_err), ("z", err)):
                        z = (gap - floor) / e
                        if h[col] is None or z > h[col]["z"]:
                            h[col] = {"z": round(z, 2), "node": node, "series": key, "gap": round(gap, 4),
                                      "day_error": round(day_err, 4), "error": round(err, 4), "runs": runs}
                continue
            for e in evs:
                if e.kind not in ("step", "held", "week") or not floor < e.size <= NEAR:
                    continue
                after = [p for p in pts if p[0] >= e.start]
                rec = {"node": node, "series": key, "kind": kind, "fault": e.label,
                       "onset_day": round((e.start - fleet.start) / DAY, 2), "short_days": len(after)}
                if after:
                    rec["z_day"] = round(max((p[1] - floor) / p[2] for p in after), 2)
                    rec["z"] = round(max((p[1] - floor) / p[3] for p in after), 2)
                    rec["gap"] = round(max(p[1] for p in after), 4)
                faults.append(rec)
    return {"fleet": fleet_name, "busy_share": busy, "healthy": healthy, "faults": faults}


def _worst(h: dict | None, col: str) -> str:
    if not h or not h[col]:
        return "-"
    w = h[col]
    return f"{w['z']:.2f} ({w['node']}, gap {w['gap']:.1%}, {w['runs']} runs)"


def table(results: list[dict], far: float) -> str:
    rows = ["| fleet | series | healthy series with a short day | worst healthy z_day (old rule: 4) | "
            f"worst healthy z (rule: {far:g}) | faults near the floor: stand at z_day >= 4 / z >= {far:g} |",
            "| --- | --- | ---: | --- | --- | --- |"]
    for r in results:
        for kind in ("gpu", "coll 1 GiB", "coll small"):
            h = r["healthy"].get(kind)
            fs = [f for f in r["faults"] if f["kind"] == kind]
            old = sum(1 for f in fs if f.get("z_day", -99) >= OLD_ERRORS)
            new = sum(1 for f in fs if f.get("z", -99) >= far)

            rows.append(f"| {r['fleet']} | {kind} | {h['series'] if h else 0} | {_worst(h, 'z_day')} | "
                        f"{_worst(h, 'z')} | "
                        f"{old} / {new} of {len(fs)} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleets", default=",".join(FLEETS), help=f"comma-separated, of {', '.join(FLEETS)}")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/drift-far.json"))
    args = ap.parse_args()
    floor = float(SETTINGS.drift_floor)   # the shipped rules' (the judge is given the same)
    results = []
    t0 = time.monotonic()
    for name in args.fleets.split(","):
        if name not in FLEETS:
            raise SystemExit(f"drift_far: no fleet {name!r} (one of {', '.join(FLEETS)})")
        results.append(measure(name, *FLEETS[name], floor, args.jobs))
        print(f"[{time.monotonic() - t0:5.0f}s] {name}", flush=True)
    print(table(results, statsmod.DRIFT_FAR_ERRORS))
    for r in results:
        for f in r["faults"]:
            if f.get("z", -99) >= statsmod.DRIFT_FAR_ERRORS and f.get("z_day", -99) < OLD_ERRORS:
                print(f"  newly standing: {r['fleet']} {f['node']} {f['series']} {f['fault']} from day "
                      f"{f['onset_day']}: z {f['z']}, z_day {f['z_day']}, gap {f['gap']:.1%}")
    Path(args.out).write_text(json.dumps({"floor": floor, "far_errors": statsmod.DRIFT_FAR_ERRORS,
                                          "old_far_errors": OLD_ERRORS, "issue38_flags": ISSUE38,
                                          "fleets": results}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
