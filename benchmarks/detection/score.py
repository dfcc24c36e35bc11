"""Score replayed alert episodes against the fleet's ground truth.

An episode (an alert firing on one series, from `for` met to resolved) is true when it is on the
thing a relevant fault hit (same node; same GPU where both have one) and began after the fault
began. Relevant faults per kind of alert:

* peer, fast path: steps, the ramp, the intermittent fault of the alert's family (a driver change
  is NOT one: a rolling upgrade must not fire peer alerts);
* history, drift: those and the driver change (a real drop of that GPU against its own past);
* driver change: the driver change, and any drop that coincides with it;
* hard failures: GPU lost (per GPU, or per node for a count), PCIe downtrain, exporter outage
  (and the restarts of the upgrade); the probe alerts have none: every firing is false.

Every other episode is false, and is attributed to the first scenario that overlaps it on its
node: the rolling upgrade (node upgraded in the 3 days before, or its pool mid-upgrade), an
outage or restart, a busy period, a junk run of that GPU (node for a node-level family), a pool
below the 5-node minimum, the node's diurnal trough, else noise. "Overlaps" means in the
CAUSE_WINDOW before the episode began (3 h: about the smoothing windows).

Recall per fault kind and size: the share of faults that an episode of the alert detected.
Time to detect: from the first degraded run (the ramp: the first run past 5%; hard failures: the
fault itself) to the evaluation at which the alert fired.
"""
from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict

from benchmarks.detection.fleet import DAY, HOUR, Fleet

CAUSE_WINDOW = 3 * HOUR
CAUSES = ("rolling upgrade", "outage/restart", "busy period", "junk run", "small pool", "diurnal", "noise")
RELEVANT = {
    "peer": {"step", "ramp", "intermittent"},
    "fast": {"step", "ramp", "intermittent"},
    "other": {"step", "ramp", "intermittent"},
    "history": {"step", "ramp", "intermittent", "driver"},
    "drift": {"step", "ramp", "intermittent", "driver"},
    "driver": {"step", "ramp", "intermittent", "driver"},
}
HARD_EVENTS = {"gpu_lost": ("gpu_lost", {"lost"}), "pcie": ("pcie", {"downtrain"}),
               "exporter": ("exporter", {"outage", "restart"}), "probe": ("", set())}


def relevant(alert, e) -> bool:
    if alert.kind == "hard":
        fam, kinds = HARD_EVENTS[alert.family]
        return e.family == fam and e.kind in kinds
    return e.family == alert.family and e.kind in RELEVANT[alert.kind]


def matches(ep_labels: dict, e) -> bool:
    if ep_labels.get("node") != e.node:
        return False
    g = ep_labels.get("gpu")
    return e.gpu is None or g is None or g == e.gpu


def cause(fleet: Fleet, alert, ep) -> tuple[str, list[str]]:
    n = fleet.by_name.get(ep["labels"].get("node"))
    s = ep["start"]
    if n is None:
        return "noise", []
    found = []
    up_pool = [m.upgrade_at for m in fleet.nodes if m.pool == n.pool and m.upgrade_at]
    if (n.upgrade_at and n.upgrade_at - CAUSE_WINDOW <= s <= n.upgrade_at + 3 * DAY) or \
            (up_pool and min(up_pool) <= s <= max(up_pool) + 1 * DAY):
        found.append("rolling upgrade")
    if any(a - CAUSE_WINDOW <= s and b >= s - 2 * CAUSE_WINDOW for a, b in n.outages):
        found.append("outage/restart")
    if any(a <= s and b >= s - CAUSE_WINDOW for a, b in n.busy):
        found.append("busy period")
    key = ep["labels"].get("gpu") if alert.family == "gpu_memory_bandwidth" else "node"
    if any(s - CAUSE_WINDOW <= j <= s for j in n.junk.get(key or "node", [])):
        found.append("junk run")
    if fleet.pool_size[n.pool] < 5:
        found.append("small pool")
    if n.amp >= 0.01 and math.sin(2 * math.pi * s / DAY + n.phase) < -0.5:
        found.append("diurnal")
    return (found[0] if found else "noise"), found


def score(fleet: Fleet, alert, episodes: list[dict]) -> dict:
    events = [e for e in fleet.events if relevant(alert, e)]
    by_node = defaultdict(list)
    for e in events:
        by_node[e.node].append(e)
    tp, false, detected = 0, [], {}
    for ep in episodes:
        hit = None
        for e in by_node.get(ep["labels"].get("node"), []):
            end = e.end if e.end is not None else fleet.end
            if matches(ep["labels"], e) and e.start <= ep["start"] <= end + 1 * DAY:
                hit = e
                if id(e) not in detected or ep["start"] < detected[id(e)]:
                    detected[id(e)] = ep["start"]
        if hit is not None:
            tp += 1
        else:
            primary, all_ = cause(fleet, alert, ep)
            false.append({"node": ep["labels"].get("node"), "gpu": ep["labels"].get("gpu"),
                          "start": ep["start"], "end": ep["end"], "cause": primary, "overlaps": all_,
                          "day": round((ep["start"] - fleet.start) / DAY, 2)})
    recall, ttd = {}, defaultdict(list)
    groups = defaultdict(list)
    for e in events:
        groups[e.label].append(e)
    for label, es in groups.items():
        hit = [e for e in es if id(e) in detected]
        recall[label] = {"detected": len(hit), "of": len(es), "recall": round(len(hit) / len(es), 3)}
        for e in hit:
            if e.detect_from is not None:
                ttd[label].append((detected[id(e)] - e.detect_from) / 60)
        if ttd[label]:
            recall[label]["ttd_median_min"] = round(statistics.median(ttd[label]), 1)
            recall[label]["ttd_max_min"] = round(max(ttd[label]), 1)
        # faults the alert could not see: which pools, to tell "silenced by design" from "missed"
        miss = [e for e in es if id(e) not in detected]
        if miss:
            recall[label]["missed_in_small_pools"] = sum(
                1 for e in miss if fleet.pool_size[fleet.by_name[e.node].pool] < 5)
            recall[label]["missed"] = [missed_fact(fleet, e) for e in miss]
    causes = Counter(f["cause"] for f in false)
    n = tp + len(false)
    return {"alert": alert.name, "kind": alert.kind, "family": alert.family, "for_s": alert.for_s,
            "keep_s": alert.keep_s, "hold_s": alert.hold_s, "parts": alert.parts,
            "episodes": n, "true_episodes": tp, "false_episodes": len(false),
            "precision": round(tp / n, 3) if n else None,
            "false_per_1000_gpu_days": round(len(false) / fleet.gpu_days() * 1000, 2),
            "false_causes": dict(causes), "recall": recall, "false_examples": false[:25]}


def union(fleet: Fleet, name: str, family: str, rows_eps: list[tuple], kinds=("step", "ramp", "intermittent")) -> dict:
    """Recall and time to detect of several alerts together (the first of them to fire)."""
    events = [e for e in fleet.events if e.family == family and e.kind in kinds]
    first = {}
    for alert, eps in rows_eps:
        for ep in eps:
            for e in events:
                end = e.end if e.end is not None else fleet.end
                if (relevant(alert, e) and matches(ep["labels"], e) and e.start <= ep["start"] <= end + DAY
                        and (id(e) not in first or ep["start"] < first[id(e)])):
                    first[id(e)] = ep["start"]
    recall = {}
    groups = defaultdict(list)
    for e in events:
        groups[e.label].append(e)
    for label, es in groups.items():
        hit = [e for e in es if id(e) in first]
        t = [(first[id(e)] - e.detect_from) / 60 for e in hit if e.detect_from is not None]
        recall[label] = {"detected": len(hit), "of": len(es), "recall": round(len(hit) / len(es), 3)}
        miss = [e for e in es if id(e) not in first]
        if miss:
            recall[label]["missed"] = [missed_fact(fleet, e) for e in miss]
        if t:
            recall[label]["ttd_median_min"] = round(statistics.median(t), 1)
            recall[label]["ttd_max_min"] = round(max(t), 1)
            # each detected fault: minutes, and whether its first degraded run came within a smoothing
            # window of a busy period's end (a window that must first fill with MIN_RUNS fresh runs)
            recall[label]["ttd_each"] = sorted(
                [round((first[id(e)] - e.detect_from) / 60), after_busy(fleet, e)] for e in hit
                if e.detect_from is not None)
    return {"alert": name, "kind": "union", "family": family, "recall": recall}


def after_busy(fleet: Fleet, e) -> bool:
    """The fault's first degraded run came less than 5 probe intervals after a busy period ended (or
    the fault started inside one): its windows were refilling."""
    n = fleet.by_name[e.node]
    iv = 15 * 60 if e.family == "gpu_memory_bandwidth" else 30 * 60
    return any(a <= e.detect_from and b >= e.detect_from - 5 * iv for a, b in n.busy)


def missed_fact(fleet: Fleet, e) -> dict:
    """What was around a fault no alert caught: its pool and size, the node's driver upgrade relative to
    the fault (hours; negative: before it), how much of the next 6 hours the node was busy."""
    n = fleet.by_name[e.node]
    t0 = e.detect_from if e.detect_from is not None else e.start
    busy = sum(max(0.0, min(b, t0 + 6 * HOUR) - max(a, t0)) for a, b in n.busy) / (6 * HOUR)
    return {"node": e.node, "gpu": e.gpu, "pool": n.pool, "pool_nodes": fleet.pool_size[n.pool],
            "day": round((e.start - fleet.start) / DAY, 2),
            "upgrade_h": round((n.upgrade_at - t0) / HOUR, 1) if n.upgrade_at else None,
            "busy_next_6h": round(busy, 2), "no_degraded_run": e.detect_from is None}
