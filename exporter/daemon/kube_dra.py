"""The API server's view of DRA on this node (resource.k8s.io): its ResourceSlices, which map a GPU driver's
devices to GPU UUIDs (daemon/dra.py), and the ResourceClaims allocated to pods on it, which the node-wide
fallback counts when the kubelet's pod-resources socket does not answer.

What is read, and when, so that a fleet does not list DRA objects every minute for nothing: only on a node
that may use DRA (its allocatable has no nvidia.com/gpu, or a pod bound to it has spec.resourceClaims);
the slices (field selector spec.nodeName=NODE) on the first such sync and every SLICE_SYNCS syncs after;
the claims one by one, by name, for the pods on this node that have them (spec.resourceClaims'
resourceClaimName, or status.resourceClaimStatuses for a claim made from a template), never a
cluster-wide list.

The newest served version is used: v1 (Kubernetes 1.34+), else v1beta2 (1.33), else v1beta1 (1.32); a 404 on
a version tries the next, and the one that answered is kept until it 404s. Each list is one bounded call (the
caller's timeout, no retries); the lists are read as JSON, not the client's models, so one object that a
client release does not know never loses the whole list.

A claim holds GPUs on this node when its status.reservedFor names a pod bound to this node and its
status.allocation.devices.results name a device of a GPU driver (kubernetes.dra_gpu_drivers). A claim
shared by several pods counts once.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fleetcanary.daemon import dra

VERSIONS = ("v1", "v1beta2", "v1beta1")
APIS = {"v1": "ResourceV1Api", "v1beta2": "ResourceV1beta2Api", "v1beta1": "ResourceV1beta1Api"}
SLICE_SYNCS = 10


class NotServed(Exception):
    """No resource.k8s.io version is served (a cluster without DRA)."""


class Reader:
    """Lists this node's ResourceSlices and every ResourceClaim through the newest served version."""

    def __init__(self, api_client, node: str, timeout) -> None:
        self.api_client = api_client
        self.node = node
        self.timeout = timeout
        self.version: str | None = None

    def _get(self, method: str, *args, **kw) -> tuple[dict[str, Any], str]:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        order = [self.version] + [v for v in VERSIONS if v != self.version] if self.version else list(VERSIONS)
        for v in order:
            api = getattr(client, APIS[v])(self.api_client)
            try:
                resp = getattr(api, method)(*args, _preload_content=False, _request_timeout=self.timeout, **kw)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            data = resp.data if hasattr(resp, "data") else resp.read()
            body = json.loads(data)
            if not isinstance(body, dict):
                raise ValueError(f"resource.k8s.io/{v}: not an object")
            self.version = v
            return body, v
        self.version = None
        raise NotServed("resource.k8s.io is not served (no DRA on this cluster)")

    def slices(self, drivers: tuple[str, ...]) -> dra.SliceMap:
        body, v = self._get("list_resource_slice", field_selector=f"spec.nodeName={self.node}")
        items = body.get("items")
        if not isinstance(items, list):
            raise ValueError("ResourceSliceList without items")
        return dra.slice_map([i for i in items if isinstance(i, dict)], drivers, api_version=f"resource.k8s.io/{v}")

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One ResourceClaim, or None where it does not exist (any more)."""
        from kubernetes.client.exceptions import ApiException

        if self.version is None:
            raise NotServed("resource.k8s.io: no version found yet")
        try:
            return self._get("read_namespaced_resource_claim", name, namespace)[0]
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise


def pod_claims(pod) -> list[str]:
    """The names of the ResourceClaims a pod (a kubernetes client V1Pod) uses: spec.resourceClaims'
    resourceClaimName, and the generated names of those made from a template (status.resourceClaimStatuses)."""
    names = [c.resource_claim_name for c in (pod.spec.resource_claims if pod.spec else None) or []
             if getattr(c, "resource_claim_name", None)]
    names += [c.resource_claim_name for c in (pod.status.resource_claim_statuses if pod.status else None) or []
              if getattr(c, "resource_claim_name", None)]
    return sorted(set(names))


@dataclass
class Claimed:
    """GPU-driver devices allocated to claims reserved for pods on this node."""

    devices: set[dra.Device] = field(default_factory=set)
    pods: set[str] = field(default_factory=set)     # namespace/name


def _obj(v) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v) -> list[Any]:
    return v if isinstance(v, list) else []


def claimed(claims: list[dict[str, Any]], pods: list[tuple[str, str, str]], drivers: tuple[str, ...]) -> Claimed:
    """claims: ResourceClaims (JSON, outside input: any shape); pods: (namespace, name, uid) of the pods bound to
    this node."""
    by_uid = {uid: (ns, name) for ns, name, uid in pods if uid}
    by_name = {(ns, name) for ns, name, _ in pods}
    out = Claimed()
    for c in _list(claims):
        ns = _obj(_obj(c).get("metadata")).get("namespace")
        status = _obj(_obj(c).get("status"))
        holders = []
        for ref in _list(status.get("reservedFor")):
            r = _obj(ref)
            if (r.get("resource") or "pods") != "pods":
                continue
            uid, name = r.get("uid"), r.get("name")
            pod = by_uid.get(uid) if isinstance(uid, str) else None
            if pod is None and isinstance(ns, str) and isinstance(name, str) and (ns, name) in by_name:
                pod = (ns, name)
            if pod:
                holders.append(pod)
        if not holders:
            continue
        got = set()
        for res in _list(_obj(_obj(status.get("allocation")).get("devices")).get("results")):
            r = _obj(res)
            driver, pool, device = r.get("driver"), r.get("pool", ""), r.get("device")
            if isinstance(driver, str) and driver in drivers and isinstance(device, str) and device \
                    and isinstance(pool, str):
                got.add(dra.Device(driver, pool, device))
        if got:
            out.devices |= got
            out.pods |= {f"{p[0]}/{p[1]}" for p in holders}
    return out
