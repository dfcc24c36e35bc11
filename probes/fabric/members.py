"""The fabric's members: (name, host, port) sorted by name, from the static list or from the
pods of this DaemonSet (named by their node, at their pod IP).

Every member computes the schedule from the list it sees; two members seeing different
lists for a moment (a pod starting) only makes some pairs miss each other for a slot,
which both sides report as peer_unavailable. From Kubernetes only running, not
terminating pods with an IP and a node count; a node with two such pods (a rolling
update) keeps the pod whose name sorts first, which every member picks alike.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

from fleetcanary.probes.base import ProbeError
from fleetcanary.probes.fabric.spec import Config, parse_address


@dataclass(frozen=True)
class Endpoint:
    name: str
    host: str
    port: int


def members(config: Config) -> list[Endpoint]:
    if config.members_from == "kubernetes":
        return from_kubernetes(config)
    out = []
    for m in config.members:
        try:
            host, port = parse_address(m.address, config.port)
        except ValueError as exc:
            raise ProbeError("members_unavailable", f"member {m.name}: {exc}") from None
        out.append(Endpoint(m.name, host, port))
    return sorted(out, key=lambda e: e.name)


def from_kubernetes(config: Config, environ=None) -> list[Endpoint]:
    import os

    from fleetcanary.probes.lib import kube_pods

    try:
        pods = kube_pods.list_pods(config.kubernetes_namespace, config.kubernetes_label_selector,
                                   config.kubernetes_api_timeout_seconds, environ or os.environ)
    except kube_pods.KubeError as exc:
        raise ProbeError("members_unavailable", f"Kubernetes: {exc}") from None
    by_node: dict[str, Endpoint] = {}
    for p in sorted(pods, key=lambda p: p.name):
        if p.phase != "Running" or p.terminating or not p.ip or not p.node or p.node in by_node:
            continue
        by_node[p.node] = Endpoint(p.node, p.ip, config.port)
    return sorted(by_node.values(), key=lambda e: e.name)


def resolve(host: str) -> set[str]:
    """The IPs a member's host stands for; empty when it does not resolve."""
    try:
        return {ai[4][0] for ai in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return set()
