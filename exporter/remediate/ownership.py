"""Ownership: what the controller set on a node is recorded on that node, in one annotation, and nothing else
is ever undone. The node is the source of truth: a new leader (or a restart) reads the record and carries on
where the last one stopped, so a handover never repeats or forgets an action.

The record (annotation ``fleetcanary.io/quarantined-by``, JSON):
    {"v": 1, "since": ISO, "hold_until": ISO,
     "alerts": {FINGERPRINT: {"alertname", "rule", "fired": ISO, "resolved": ISO or null}},
     "set": {"labels": {KEY: VALUE}, "taint": EFFECT or null, "cordon": bool}}
``set`` holds only what the controller changed: a label already at the value, a taint key someone else put
there, a node already cordoned are not in it, so a release leaves them as they were.

Patches are JSON merge patches (RFC 7386) that carry the node's resourceVersion: the API server refuses
one made from a stale read (409), and the caller reads again. The taint list is replaced whole (merge
patches replace lists), which the resourceVersion makes safe.
"""
from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Any

from .policy import Wanted

ANNOTATION = "fleetcanary.io/quarantined-by"


class ForeignRecord(Exception):
    """The annotation is there but is not a record this controller can read: hands off."""


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def epoch(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


@dataclass
class Record:
    since: float
    hold_until: float
    alerts: dict[str, dict[str, Any]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    taint: str | None = None
    cordon: bool = False

    def to_json(self) -> str:
        return json.dumps({"v": 1, "since": iso(self.since), "hold_until": iso(self.hold_until),
                           "alerts": self.alerts,
                           "set": {"labels": self.labels, "taint": self.taint, "cordon": self.cordon}},
                          sort_keys=True, separators=(",", ":"))

    def all_resolved(self) -> bool:
        return all(a.get("resolved") for a in self.alerts.values())

    def last_resolved(self) -> float:
        return max((epoch(a["resolved"]) for a in self.alerts.values() if a.get("resolved")), default=0.0)


def read(node: dict) -> Record | None:
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    if text is None:
        return None
    try:
        d = json.loads(text)
        s = d["set"]
        if d.get("v") != 1 or not isinstance(d["alerts"], dict):
            raise ValueError("unknown version")
        return Record(since=epoch(d["since"]), hold_until=epoch(d["hold_until"]), alerts=d["alerts"],
                      labels=dict(s.get("labels") or {}), taint=s.get("taint"), cordon=bool(s.get("cordon")))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ForeignRecord(f"{ANNOTATION} is not a record of this controller ({type(exc).__name__})") from None


def labels(node: dict) -> dict[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def taints(node: dict) -> list[dict]:
    return list((node.get("spec") or {}).get("taints") or [])


def _patch(node: dict, metadata: dict | None = None, spec: dict | None = None) -> dict:
    p: dict[str, Any] = {"metadata": {"resourceVersion": node["metadata"].get("resourceVersion", "")}}
    p["metadata"].update(metadata or {})
    if spec:
        p["spec"] = spec
    return p


def quarantine(node: dict, wanted: Wanted, record: Record, taint_key: str) -> tuple[dict, list[str]]:
    """The patch that brings the node to ``wanted`` and stores ``record`` (updated in place with what it sets),
    and the changes it makes in words (empty when only the record changes)."""
    changes: list[str] = []
    current = labels(node)
    new_labels = {}
    for k, v in wanted.labels.items():
        if current.get(k) != v:
            new_labels[k] = v
            record.labels[k] = v
            changes.append(f"label {k}={v}")
    spec: dict[str, Any] = {}
    if wanted.taint_effect:
        ts = taints(node)
        mine = [t for t in ts if t.get("key") == taint_key]
        if not mine:
            spec["taints"] = [*ts, {"key": taint_key, "value": "true", "effect": wanted.taint_effect}]
            record.taint = wanted.taint_effect
            changes.append(f"taint {taint_key}:{wanted.taint_effect}")
        elif record.taint == "PreferNoSchedule" and wanted.taint_effect == "NoSchedule" \
                and mine[0].get("effect") == "PreferNoSchedule":   # ours, and a rule now wants the stronger one
            spec["taints"] = [t if t.get("key") != taint_key else {**t, "effect": "NoSchedule"} for t in ts]
            record.taint = "NoSchedule"
            changes.append(f"taint {taint_key}:NoSchedule (was PreferNoSchedule)")
    if wanted.cordon and not (node.get("spec") or {}).get("unschedulable"):
        spec["unschedulable"] = True
        record.cordon = True
        changes.append("cordon")
    meta: dict[str, Any] = {"annotations": {ANNOTATION: record.to_json()}}
    if new_labels:
        meta["labels"] = new_labels
    return _patch(node, meta, spec), changes


def note(node: dict, record: Record) -> dict:
    """A patch that only stores the record (an alert added, resolved or firing again)."""
    return _patch(node, {"annotations": {ANNOTATION: record.to_json()}})


def release(node: dict, record: Record, taint_key: str) -> tuple[dict, list[str]]:
    """The patch that undoes what ``record`` says the controller set, where it is still as set, and drops the
    record; the changes in words. What someone changed since is theirs and stays."""
    changes: list[str] = []
    current = labels(node)
    drop = {k: None for k, v in record.labels.items() if current.get(k) == v}
    changes += [f"remove label {k}" for k in drop]
    spec: dict[str, Any] = {}
    if record.taint:
        ts = taints(node)
        keep = [t for t in ts if not (t.get("key") == taint_key and t.get("effect") == record.taint)]
        if len(keep) != len(ts):
            spec["taints"] = keep
            changes.append(f"remove taint {taint_key}:{record.taint}")
    if record.cordon and (node.get("spec") or {}).get("unschedulable"):
        spec["unschedulable"] = False
        changes.append("uncordon")
    meta: dict[str, Any] = {"annotations": {ANNOTATION: None}}
    if drop:
        meta["labels"] = drop
    return _patch(node, meta, spec), changes
