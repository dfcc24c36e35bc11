#!/usr/bin/env python3
"""Replay of `fleetcanary remediate` on the detection fleets: which nodes each quarantine policy would take out,
for how long, how many of those quarantines were false, how long from a fault to its quarantine, how often the
breaker tripped, and how many quarantines were released while their fault still lasted (flaps).

Input: the episodes files of `benchmarks/detection/run.py --episodes FILE` (every replayed alert episode with its
labels, start and end; the fleet's faults; each node's pool). Each episode's start is a firing notification,
its end a resolved one (an episode still open at the fleet's end never resolves).

The decisions are the controller's own: a real fleetcanary.remediate Controller (policy, breaker, hold, quiet
period, refire, ownership record) runs on a simulated clock that jumps from notification to notification and to
the moments a release falls due, against an in-memory node store (Nodes below) that answers the four calls the
controller makes of the API server: read, list and merge-patch a node (refusing a stale resourceVersion), and
create an Event. Without a lease (one replica) and with dry-run off, so quarantines start, last and end.

False quarantine: the alert that started it had no fault it judges (benchmarks/detection/score.py `relevant`
and `matches`: the same node, the same GPU where both name one) active at the quarantine's start. Time to
quarantine, per fault: from its start to the first time a quarantine held its node for it (by an alert that
judges it, starting the quarantine or joining one under way); a fault's start, not its first degraded run: a
ramp counts from where it began. Flap: a quarantine released before the fault that justified
it ended (a fault to the fleet's end counts as lasting).

    python -m benchmarks.remediation_replay EPISODES.json [EPISODES-2.json ...] [--out FILE]
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import heapq
import json
import logging
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

from benchmarks.common import write_result
from benchmarks.detection.replay import classify
from benchmarks.detection.score import HARD_EVENTS, matches, relevant
from fleetcanary.offline.demo_kube import merge
from fleetcanary.probes.lib import yamltext
from fleetcanary.remediate import ownership
from fleetcanary.remediate.config import Settings
from fleetcanary.remediate.controller import Controller
from fleetcanary.remediate.kubeapi import ApiError
from fleetcanary.remediate.webhook import Alert, Payload

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "deploy/components/remediate/remediate.yaml"
POOL_LABEL = "fleetcanary.io/pool"
HOUR = 3600.0
DEGRADED = {"labels": {"fleetcanary.io/health": "degraded"}, "taint": {"effect": "PreferNoSchedule"}}
PERF_PATHS = ("change", "level", "fast", "own_fast", "regression", "drift", "driver_change")


def policies() -> dict[str, dict]:
    """The policies compared: the shipped config, and three of its variations (the shipped breaker, release and
    hard-fault rule throughout; each node labelled with its pool, which the breaker counts per)."""
    base = yamltext.load(SHIPPED.read_text())
    base.update(dry_run=False, audit_log="", pool_label=POOL_LABEL, lease={"enabled": False})
    hard = [r for r in base["rules"] if r["name"] == "hard-fault"]
    critical = {"name": "critical", "match": {"severities": ["critical"]}, "actions": DEGRADED,
                "min_hold_seconds": 7200}
    warnings = [{"name": f"warning-{p.replace('_', '-')}", "match": {"severities": ["warning"], "labels": {"path": p}},
                 "actions": DEGRADED, "min_hold_seconds": 7200} for p in PERF_PATHS]
    return {"shipped default": base,
            "hard faults only": base | {"rules": hard},
            "critical only": base | {"rules": [*hard, critical]},
            "warnings too": base | {"rules": [*hard, critical, *warnings]}}


class Nodes:
    """The nodes of one fleet in memory, as the controller sees them through its KubeAPI: JSON objects with a
    resourceVersion, JSON merge patches (RFC 7386) refused with 409 when made from a stale read. Every change of
    the ownership record is reported to ``on_change(node, before, after, time)``."""

    def __init__(self, pools: dict[str, str], clock, on_change) -> None:
        self.items = {n: {"metadata": {"name": n, "uid": f"uid-{n}", "resourceVersion": "1",
                                       "labels": {POOL_LABEL: p}, "annotations": {}}, "spec": {}}
                      for n, p in sorted(pools.items())}
        self.version, self.clock, self.on_change, self.events = 1, clock, on_change, 0

    def read_node(self, name: str) -> dict:
        if name not in self.items:
            raise ApiError("read_node", "not_found", "HTTP 404")
        return copy.deepcopy(self.items[name])

    def list_nodes(self) -> list[dict]:
        return copy.deepcopy(list(self.items.values()))

    def patch_node(self, name: str, patch: dict) -> dict:
        node = self.items[name]
        if patch.get("metadata", {}).get("resourceVersion") not in (None, node["metadata"]["resourceVersion"]):
            raise ApiError("patch_node", "conflict", "HTTP 409")
        before = node["metadata"]["annotations"].get(ownership.ANNOTATION)
        merge(node, patch)
        self.version += 1
        node["metadata"]["resourceVersion"] = str(self.version)
        self.on_change(name, before, node["metadata"]["annotations"].get(ownership.ANNOTATION), self.clock.time())
        return copy.deepcopy(node)

    def create_event(self, namespace: str, event: dict) -> dict:
        self.events += 1
        return event


class SimClock:
    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


def judged(ep: dict) -> SimpleNamespace:
    """What score.relevant needs of the episode's alert: its kind (peer, fast, history, ... or hard) and family."""
    hard = ep["figure"] in HARD_EVENTS
    kind = "hard" if hard else classify(ep["alert"], {"figure": ep["figure"], "path": ep["path"]})
    return SimpleNamespace(kind=kind, family=ep["figure"])


def alert_of(ep: dict, status: str) -> Alert:
    labels = {"alertname": ep["alert"], "severity": ep["severity"], **ep["labels"]}
    if ep["path"]:
        labels["path"] = ep["path"]
    if ep["figure"] not in HARD_EVENTS:
        labels["figure"] = ep["figure"]
    fp = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]
    return Alert(status=status, labels=labels, fingerprint=fp)


def replay(data: dict, settings: dict) -> dict:
    """One policy over one fleet: every quarantine with its start, end, trigger and verdict, and the counts."""
    clock = SimClock()
    quarantines: list[dict] = []
    open_q: dict[str, dict] = {}
    trigger: dict[str, dict] = {}   # fingerprint -> episode

    def on_change(node: str, before: str | None, after: str | None, t: float) -> None:
        if before is None and after is not None:
            fp = next(iter(json.loads(after)["alerts"]))
            open_q[node] = {"node": node, "start": t, "end": None, "episode": trigger[fp], "fps": {fp},
                            "joined": []}
            quarantines.append(open_q[node])
        elif before is not None and after is None:
            open_q.pop(node)["end"] = t
        elif after is not None:   # an alert added to a held node: it holds the node too
            q = open_q[node]
            for fp in set(json.loads(after)["alerts"]) - q["fps"]:
                q["fps"].add(fp)
                q["joined"].append((t, trigger[fp]))

    nodes = Nodes(data["pools"], clock, on_change)
    ctl = Controller(Settings.model_validate(settings), nodes, "replay", clock=clock)
    queue: list[tuple[float, int, int, dict | None]] = []   # (time, order, seq, episode); order 0 resolves first
    for i, ep in enumerate(data["episodes"]):
        heapq.heappush(queue, (ep["start"], 1, i, ep))
        if ep["end"] is not None and ep["end"] < data["end"]:
            heapq.heappush(queue, (ep["end"], 0, i, ep))
    seq, due_at = len(data["episodes"]), set()
    while queue:
        t, order, _, ep = heapq.heappop(queue)
        clock.now = t
        if ep is None:
            ctl.tick()
        else:
            alert = alert_of(ep, "resolved" if order == 0 else "firing")
            trigger.setdefault(alert.fingerprint, ep)
            if order == 1:
                trigger[alert.fingerprint] = ep
            ctl.handle(Payload(version="4", status=alert.status, alerts=[alert]))
        for name in list(open_q):   # when each held node may be released: a tick then
            rec = ownership.read(nodes.items[name])
            if rec is not None and rec.all_resolved():
                due = max(rec.hold_until, rec.last_resolved() + ctl.s.release.quiet_seconds)
                if t < due < data["end"] and due not in due_at:
                    due_at.add(due)
                    seq += 1
                    heapq.heappush(queue, (due, 2, seq, None))
    faults = [SimpleNamespace(**f, index=i) for i, f in enumerate(data["faults"])]
    for q in quarantines:
        verdict(q, faults, data["end"])
        q["held_for"] = {}   # fault index -> from its start to when this quarantine first held the node for it
        for t, ep in [(q["start"], q["episode"]), *q.pop("joined")]:
            for f in judged_faults(ep, faults, t, data["end"]):
                q["held_for"].setdefault(f.index, t - f.start)
        del q["fps"]
    return {"quarantines": quarantines, "events": nodes.events,
            "breaker_trips": sample(ctl, "fleetcanary_remediate_breaker_trips_total"),
            "breaker_refusals": sample(ctl, "fleetcanary_remediate_refusals_total", reason="breaker")}


def judged_faults(ep: dict, faults: list, t: float, end: float) -> list:
    """The faults the episode's alert judges, on its node (and GPU), active at t."""
    alert = judged(ep)
    return [f for f in faults if relevant(alert, f) and matches(ep["labels"], f)
            and f.start <= t <= (f.end if f.end is not None else end)]


def verdict(q: dict, faults: list, end: float) -> None:
    hits = judged_faults(q["episode"], faults, q["start"], end)
    q["false"] = not hits
    if hits:
        first = min(hits, key=lambda f: f.start)
        q["fault"] = first.label
        q["to_quarantine_s"] = q["start"] - first.start
        lasts = max(f.end if f.end is not None else end for f in hits)
        q["flap"] = q["end"] is not None and q["end"] < lasts


def sample(ctl: Controller, name: str, **labels) -> int:
    reg = ctl.metrics.registry
    return int(sum(s.value for m in reg.collect() for s in m.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())))


def summary(result: dict, data: dict) -> dict:
    qs = result["quarantines"]
    end = data["end"]
    hours = sum(((q["end"] if q["end"] is not None else end) - q["start"]) / HOUR for q in qs)
    first: dict[int, float] = {}   # per fault, when a quarantine first held its node for it (by its own alert)
    for q in qs:
        for i, dt in q["held_for"].items():
            first[i] = min(first.get(i, dt), dt)
    ttq = sorted(v / 60 for v in first.values())
    false = [q for q in qs if q["false"]]
    return {"quarantines": len(qs), "nodes_quarantined": len({q["node"] for q in qs}),
            "node_hours": round(hours, 1), "false_quarantines": len(false),
            "false_nodes": len({q["node"] for q in false}),
            "to_quarantine_median_min": round(statistics.median(ttq), 1) if ttq else None,
            "to_quarantine_max_min": round(max(ttq), 1) if ttq else None,
            "breaker_trips": result["breaker_trips"], "breaker_refusals": result["breaker_refusals"],
            "flaps": sum(1 for q in qs if q.get("flap")),
            "still_held_at_end": sum(1 for q in qs if q["end"] is None), "events": result["events"],
            "by_alert": count(q["episode"]["display"] for q in qs),
            "faults_quarantined": caught(set(first), data["faults"]),
            "false_examples": [{"node": q["node"], "alert": q["episode"]["display"],
                                "gpu": q["episode"]["labels"].get("gpu"),
                                "day": round((q["start"] - data["start"]) / 86400, 2),
                                "hours": round(((q["end"] or end) - q["start"]) / HOUR, 1)} for q in false[:20]]}


def caught(hit: set[int], faults: list[dict]) -> dict[str, str]:
    """Per kind of fault (family and label): how many of them a quarantine held for (by an alert that judges
    it, the one that started the quarantine or one that joined it), of how many."""
    per: dict[str, list[int]] = {}
    for i, f in enumerate(faults):
        per.setdefault(f"{f['family']} {f['label']}", []).append(i)
    return {k: f"{sum(1 for i in ix if i in hit)} of {len(ix)}" for k, ix in sorted(per.items())}


def count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def table(fleet: str, rows: dict[str, dict]) -> str:
    head = ("| policy | nodes | quarantines | node-hours | false | fault to quarantine med (max) min | "
            "breaker trips (refused) | flaps |")
    out = [fleet, "", head, "|---" * 8 + "|"]
    for name, s in rows.items():
        ttq = (f"{s['to_quarantine_median_min']:g} ({s['to_quarantine_max_min']:g})"
               if s["to_quarantine_median_min"] is not None else "-")
        out.append(f"| {name} | {s['nodes_quarantined']} | {s['quarantines']} | {s['node_hours']:g} | "
                   f"{s['false_quarantines']} | {ttq} | {s['breaker_trips']} ({s['breaker_refusals']}) | "
                   f"{s['flaps']} |")
    return "\n".join(out)


def load(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
        missing = [k for k in ("start", "end", "pools", "faults", "episodes") if k not in data]
        if missing:
            raise KeyError(", ".join(missing))
        return data
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"remediation replay: {path}: not an episodes file of benchmarks/detection/run.py "
                         f"--episodes ({type(exc).__name__}: {exc})") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("episodes", nargs="+", help="episodes files of benchmarks/detection/run.py --episodes")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/remediation-replay.json"))
    args = ap.parse_args(argv)
    logging.getLogger("fleetcanary.remediate").setLevel(logging.CRITICAL)
    result: dict = {"policies": policies(), "fleets": {}}
    for path in args.episodes:
        data = load(path)
        fleet = Path(path).stem
        rows = {name: summary(replay(data, settings), data) for name, settings in result["policies"].items()}
        result["fleets"][fleet] = {"file": str(path), "nodes": len(data["pools"]),
                                   "days": round((data["end"] - data["start"]) / 86400, 2),
                                   "episodes": len(data["episodes"]), "faults": len(data["faults"]),
                                   "policies": rows}
        print(table(f"{fleet}: {len(data['pools'])} nodes, {len(data['episodes'])} alert episodes, "
                    f"{len(data['faults'])} faults", rows))
        print()
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
