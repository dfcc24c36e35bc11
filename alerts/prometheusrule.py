"""The rules as Prometheus Operator PrometheusRule objects, each small enough to apply.

`kubectl apply` (client side) stores the whole object as JSON in the `last-applied-configuration` annotation,
and an object's annotations may hold 262,144 bytes in all: a fleet's rules with two sharded pools came to
299,021 bytes in one object, which client-side apply refuses. So the groups are packed in order into objects
whose JSON stays under LIMIT (a margin under the annotation limit for the object's own metadata and the
kubectl annotation's key); a group is never split (its rules are evaluated in order, and the records a group
writes may feed the next rule in it). Used by `fleetcanary rules --format prometheusrule`, deploy/build.py
and the Helm chart's files.
"""
from __future__ import annotations

import json
import re

ANNOTATION_LIMIT = 262_144
LIMIT = 200_000
LABEL_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")


def parse_labels(text: str) -> dict[str, str]:
    """`k=v,k2=v2` (Kubernetes label syntax, checked) -> a mapping; ValueError naming the bad part."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not LABEL_NAME.match(key) or not LABEL_VALUE.match(value):
            raise ValueError(f"not a Kubernetes label: {part!r} (want name=value, e.g. release=kube-prometheus-stack)")
        out[key] = value
    return out


def _size(obj: dict) -> int:
    return len(json.dumps(obj, separators=(",", ":")).encode())


def objects(groups: list[dict], name: str, namespace: str, labels: dict[str, str],
            limit: int = LIMIT) -> list[dict]:
    """The groups packed in order into PrometheusRule objects `name` (one) or `name-1`, `name-2`, ... (several),
    each at most `limit` bytes as JSON. ValueError when one group alone is over it, or the name is not a DNS
    label."""
    if not DNS_NAME.match(name):
        raise ValueError(f"not a Kubernetes object name: {name!r} (lower-case letters, digits and '-', 52 at most)")

    def obj(gs: list[dict], n: str) -> dict:
        meta: dict = {"name": n}
        if namespace:
            meta["namespace"] = namespace
        if labels:
            meta["labels"] = dict(labels)
        return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": meta,
                "spec": {"groups": gs}}

    packs: list[list[dict]] = []
    for g in groups:
        if _size(obj([g], name + "-00")) > limit:
            raise ValueError(f"rule group {g.get('name')!r} alone is over {limit} bytes; split its pools (shards)")
        if packs and _size(obj([*packs[-1], g], name + "-00")) <= limit:
            packs[-1].append(g)
        else:
            packs.append([g])
    if len(packs) == 1:
        return [obj(packs[0], name)]
    return [obj(p, f"{name}-{i}") for i, p in enumerate(packs, 1)]
