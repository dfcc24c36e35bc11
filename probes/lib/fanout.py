"""Which nodes probe an endpoint: k of the fleet's members, chosen by rendezvous (highest random weight)
hashing, so requests per endpoint do not grow with the fleet.

Every node computes the same choice from the member list it sees: each member's weight for an
endpoint is sha256(endpoint, member); the k highest probe it. A member that joins or leaves moves only
the endpoints it ranks among the top k of (about k/n of them), and the others keep their probers, so a
rolling update does not reshuffle the fleet's canaries. Members come from the pods of the DaemonSet
(the fabric probe's source: running, not terminating pods with a node, named by their node), from a
static list, or, outside Kubernetes, this node alone; an endpoint can instead be probed only by the
nodes that host its own pods (a label selector), k of them.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable

from fleetcanary.probes.base import ProbeError


def weight(key: str, member: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{key}\0{member}".encode()).digest()[:8], "big")


def choose(key: str, members: Iterable[str], k: int) -> list[str]:
    """The k members (all when k is 0 or there are fewer) with the highest weight for `key`, highest first."""
    ranked = sorted(set(members), key=lambda m: (-weight(key, m), m))
    return ranked if k <= 0 else ranked[:k]


def nodes_of_pods(namespace: str, label_selector: str, timeout: float, environ=None) -> list[str]:
    """Nodes of the running, not terminating pods matching the selector (ProbeError members_unavailable)."""
    from fleetcanary.probes.lib import kube_pods

    try:
        pods = kube_pods.list_pods(namespace, label_selector, timeout, environ or os.environ)
    except kube_pods.KubeError as exc:
        raise ProbeError("members_unavailable", f"Kubernetes: {exc}") from None
    return sorted({p.node for p in pods if p.phase == "Running" and not p.terminating and p.node})
