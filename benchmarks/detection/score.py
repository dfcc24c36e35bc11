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

import itertools
import math
import statistics
from collections import Counter, defaultdict

from benchmarks.detection.fleet import DAY, HOUR, Fleet

CAUSE_WINDOW = 3 * HOUR
CAUSES = ("rolling upgrade", "outage/restart", "busy period", "junk run", "small pool", "diurnal", "noise")
RELEVANT = {
    "peer": {"step", "ramp", "intermittent", "week", "held"},
    "fast": {"step", "ramp", "intermittent", "week", "held"},
    "other": {"step", "ramp", "intermittent", "week", "held"},
    "history": {"step", "ramp", "intermittent", "driver", "week", "held"},
    "drift": {"step", "ramp", "intermittent", "driver", "week", "held"},
    "driver": {"step", "ramp", "intermittent", "driver", "week", "held"},
}
INTERVAL_MIN = {"gpu_memory_bandwidth": 15, "collective_bus_bandwidth": 30}  # the probes' intervals
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


def score(fleet: Fleet, alert, episodes: list[dict], why: Why | None = None) -> dict:
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
                          "series": ep["labels"].get("series"),
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
            recall[label]["ttd_each_min"] = sorted(round(x, 1) for x in ttd[label])
        # faults the alert could not see: which pools, to tell "silenced by design" from "missed"
        miss = [e for e in es if id(e) not in detected]
        if miss:
            recall[label]["missed_in_small_pools"] = sum(
                1 for e in miss if fleet.pool_size[fleet.by_name[e.node].pool] < 5)
            recall[label]["missed"] = [missed_fact(fleet, e, why) for e in miss]
            if why is not None:
                recall[label]["missed_why"] = dict(Counter(m["why"]["main"] for m in recall[label]["missed"]
                                                           if "why" in m).most_common())
    causes = Counter(f["cause"] for f in false)
    n = tp + len(false)
    return {"alert": alert.display, "kind": alert.kind, "family": alert.family, "for_s": alert.for_s,
            "group": alert.group, "interval_s": alert.interval, "offset_s": alert.offset,
            "episodes": n, "true_episodes": tp, "false_episodes": len(false),
            "precision": round(tp / n, 3) if n else None,
            "false_per_1000_gpu_days": round(len(false) / fleet.gpu_days() * 1000, 2),
            "false_causes": dict(causes), "recall": recall, "false_examples": false[:25],
            "false_by_series": dict(Counter(f["series"] or "-" for f in false).most_common())}


def union(fleet: Fleet, name: str, family: str, rows_eps: list[tuple],
          kinds=("step", "ramp", "intermittent", "week", "held")) -> dict:
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
            recall[label]["ttd_each_min"] = sorted(round(x, 1) for x in t)
        onset = [(first[id(e)] - e.start) / 60 for e in hit]
        if onset:  # from the fault's start: includes waiting for a run that sees it (busy fleets)
            recall[label]["ttd_onset_median_min"] = round(statistics.median(onset), 1)
            recall[label]["ttd_onset_each_min"] = sorted(round(x, 1) for x in onset)
    return {"alert": name, "kind": "union", "family": family, "recall": recall}


def after_busy(fleet: Fleet, e) -> bool:
    """The fault's first degraded run came less than 5 probe intervals after a busy period ended (or
    the fault started inside one): its windows were refilling."""
    n = fleet.by_name[e.node]
    iv = 15 * 60 if e.family == "gpu_memory_bandwidth" else 30 * 60
    return any(a <= e.detect_from and b >= e.detect_from - 5 * iv for a, b in n.busy)


def missed_fact(fleet: Fleet, e, why: Why | None = None) -> dict:
    """What was around a fault no alert caught: its pool and size, the node's driver upgrade relative to
    the fault (hours; negative: before it), how much of the next 6 hours the node was busy."""
    n = fleet.by_name[e.node]
    t0 = e.detect_from if e.detect_from is not None else e.start
    busy = sum(max(0.0, min(b, t0 + 6 * HOUR) - max(a, t0)) for a, b in n.busy) / (6 * HOUR)
    out = {"node": e.node, "gpu": e.gpu, "pool": n.pool, "pool_nodes": fleet.pool_size[n.pool],
           "day": round((e.start - fleet.start) / DAY, 2),
           "upgrade_h": round((n.upgrade_at - t0) / HOUR, 1) if n.upgrade_at else None,
           "busy_next_6h": round(busy, 2), "no_degraded_run": e.detect_from is None}
    if why is not None and why.diag:
        end = e.end if e.end is not None else fleet.end
        out["why"] = why.summary(e.node, e.gpu, t0, end)
    return out


# --------------------------------------------------------------------------- the defects
def spells(eps: list[dict], step: int) -> list[tuple[int, int]]:
    """Episodes (of any series) merged into firing spells: a person sees one alert while any fires."""
    out: list[list[int]] = []
    for a, b in sorted((ep["start"], ep["end"]) for ep in eps):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


class Why:
    """Why an alert's condition did not hold on one series at an evaluation, from what replay.diagnose read:
    the statistic not published (and why: the exporter down, a driver change, else no baseline or no run for
    a day), too few peer nodes, the value at or below the floor, or at or below the MAD gate; "true" when
    it held."""

    def __init__(self, fleet: Fleet, alert, parts: dict | None, diag: dict) -> None:
        self.fleet, self.alert, self.diag = fleet, alert, diag
        self.floor = float(parts["floor"]) if parts else None
        self.op = parts.get("op") if parts else None
        self.min = int(parts["min"]) if parts and parts.get("min") else None
        self.gated = bool(parts and parts.get("gate"))
        self.keys: dict[tuple, list[tuple]] = defaultdict(list)
        self.median: dict[tuple, dict] = {}
        for k, at in diag.items():
            if k[0] == "median":  # the evaluations at which the series had a median (replay.diagnose)
                self.median[(k[1], k[2] or None)] = at
            else:
                self.keys[(k[0], k[1] or None)].append(k)

    def one(self, x: tuple) -> str:
        v, gate, nodes = x
        if self.op == "and" and (nodes is None or nodes < self.min):
            return "too few peers"
        if self.gated and gate is None:  # the MAD is recorded only where enough peer nodes report
            return "too few peers"
        if self.op == "unless" and nodes is not None and nodes >= self.min:
            return "peers report (own path off)"
        if v <= self.floor:
            return "below floor"
        if gate is not None and v <= gate:
            return "below MAD gate"
        return "true"

    def at(self, node: str, gpu: str | None, t: int) -> str:
        got = [self.diag[k].get(t) for k in self.keys.get((node, gpu), [])]
        got = [x for x in got if x is not None]
        if not got:
            n = self.fleet.by_name[node]
            if any(a <= t < b + 300 for a, b in n.outages):
                return "not published: exporter down"
            if n.upgrade_at is not None and 0 <= t - n.upgrade_at < 2 * DAY:
                return "not published: new driver"
            if t in self.median.get((node, gpu), ()):
                return "not published: no baseline (a median, no complete day)"
            return "not published: no run for a day (or warming)"
        reasons = [self.one(x) for x in got]
        if "true" in reasons:
            return "true"
        return reasons[max(range(len(got)), key=lambda i: got[i][0])]  # the series closest to firing

    def over(self, node: str, gpu: str | None, t0: float, t1: float) -> Counter:
        step = self.alert.interval
        first = t0 + (self.alert.offset - t0) % step
        return Counter(self.at(node, gpu, int(t)) for t in range(int(first), int(t1), step))

    def summary(self, node: str, gpu: str | None, t0: float, t1: float) -> dict:
        """What held the alert off over [t0, t1): the evaluations by reason, the main reason, and the largest
        value against the floor and the median MAD gate."""
        c = self.over(node, gpu, t0, t1)
        off = Counter({k: v for k, v in c.items() if k != "true"})
        vals = [x for k in self.keys.get((node, gpu), []) for t, x in self.diag[k].items() if t0 <= t < t1]
        out = {"main": off.most_common(1)[0][0] if off else "true", "evaluations": dict(c.most_common(3))}
        if vals:
            out["max_value"] = round(max(x[0] for x in vals), 4)
            gates = sorted(x[1] for x in vals if x[1] is not None)
            if gates:
                out["median_gate"] = round(gates[len(gates) // 2], 4)
        return out


def gap_cause(fleet: Fleet, node: str, a: float, b: float, why: Why | None = None, gpu: str | None = None) -> str:
    """Why an alert stopped firing between a and b on a series with a steady fault: from the diagnosis when
    there is one, else from the fleet's events."""
    if why is not None:
        return why.summary(node, gpu, a, b)["main"]
    n = fleet.by_name[node]
    if n.upgrade_at is not None and a - HOUR <= n.upgrade_at <= b:
        return "driver change"
    if any(x < b and y > a - 300 for x, y in n.outages):
        return "exporter outage"
    return "condition false"


def episodes_per_fault(fleet: Fleet, alert, episodes: list[dict], kinds=("step", "week", "held"),
                       why: Why | None = None) -> dict:
    """Per steady fault (a step that lasts to the end) the alert detected: its firing spells on the fault's
    series after the fault began (one is the target), and why each further one began (what was in the
    gap before it). Also the episodes (alert series: the change path's series per baseline count apart)."""
    by_spells: Counter = Counter()
    by_eps: Counter = Counter()
    by_size: dict = defaultdict(Counter)
    per_size: dict = defaultdict(list)   # fault label -> spells of each detected fault
    causes: Counter = Counter()
    examples = []
    for e in fleet.events:
        if e.kind not in kinds or not relevant(alert, e):
            continue
        mine = [ep for ep in episodes if matches(ep["labels"], e) and ep["start"] >= e.start]
        if not mine:
            continue
        sp = spells(mine, alert.interval)
        by_spells[len(sp)] += 1
        by_size[e.label]["1" if len(sp) == 1 else "more"] += 1
        per_size[e.label].append(len(sp))
        by_eps[len(mine)] += 1
        for (_, b0), (a1, _) in itertools.pairwise(sp):
            c = gap_cause(fleet, e.node, b0, a1, why, e.gpu)
            causes[c] += 1
            if len(examples) < 12:
                examples.append({"node": e.node, "gpu": e.gpu, "fault": e.label, "gap_from": b0, "gap_to": a1,
                                 "gap_min": round((a1 - b0) / 60), "cause": c})
    return {"faults": sum(by_spells.values()), "by_spells": dict(sorted(by_spells.items())),
            "by_size": {k: dict(v) for k, v in sorted(by_size.items())},
            "by_episodes": dict(sorted(by_eps.items())), "extra_spell_causes": dict(causes.most_common()),
            # issue 38: episodes (firing spells) per detected fault, median and max, per fault size
            "spells_per_fault": {k: {"n": len(v), "median": statistics.median(v), "max": max(v)}
                                 for k, v in sorted(per_size.items())},
            "examples": examples}


def week_coverage(fleet: Fleet, members: list[tuple], kinds=("week",), whys: dict | None = None) -> list[dict]:
    """Per week-long fault: when the first of the alerts fired on it, and how much of the time from then to
    the end some alert fired (the union, and each alert alone), with every gap and its cause."""
    out = []
    for e in fleet.events:
        if e.kind not in kinds:
            continue
        per, union_eps = {}, []
        for alert, eps in members:
            if not relevant(alert, e):
                continue
            mine = [ep for ep in eps if matches(ep["labels"], e) and ep["start"] >= e.start]
            union_eps += mine
            per[alert.display] = mine
        sp = spells(union_eps, 300)
        row = {"node": e.node, "gpu": e.gpu, "pool": fleet.by_name[e.node].pool, "size": e.size,
               "start_day": round((e.start - fleet.start) / DAY, 2), "detected": bool(sp)}
        if sp:
            t0 = sp[0][0]
            span = fleet.end - t0
            row["detected_after_min"] = round((t0 - (e.detect_from or e.start)) / 60)
            row["days_to_end"] = round(span / DAY, 2)
            row["covered"] = round(sum(b - a for a, b in sp) / span, 4)
            row["gaps"] = [{"from_day": round((b0 - fleet.start) / DAY, 2), "min": round((a1 - b0) / 60),
                            "why": {k: w.summary(e.node, e.gpu, b0, a1)["main"] for k, w in (whys or {}).items()
                                    if k in per}}
                           for (_, b0), (a1, _) in itertools.pairwise(sp)]
            row["per_alert_covered"] = {k: round(sum(b - a for a, b in spells(v, 300)) / span, 3)
                                        for k, v in per.items() if v}
        out.append(row)
    return out


def pooled_ttd(rec: dict, family: str, labels=("step 7%", "step 10%", "step 20%")) -> dict | None:
    """Every detected fault of these sizes pooled: median and max time to detect, minutes and probe intervals,
    and how many took more than 4 intervals."""
    each = [x for lab in labels for x in rec.get(lab, {}).get("ttd_each_min", [])]
    if not each:
        return None
    iv = INTERVAL_MIN[family]
    return {"n": len(each), "median_min": round(statistics.median(each), 1),
            "median_intervals": round(statistics.median(each) / iv, 2), "max_min": round(max(each), 1),
            "over_4_intervals": sum(1 for x in each if x > 4 * iv),
            "over_2_intervals": sum(1 for x in each if x > 2 * iv)}
