"""The claim pod's GPUs on a node whose GPUs are handed out by a DRA driver (daemon/claim.py).

Such a node advertises no `nvidia.com/gpu`: a pod that requests it never schedules. There the claim pod asks
through a ResourceClaim of the device class the driver installs (NVIDIA's: `gpu.nvidia.com`,
kubernetes.claim.device_class), for as many GPUs as the claim wants, and references it in
spec.resourceClaims; the scheduler allocates the node's GPUs to it once they are free, as it places the pod
(the pod's node affinity keeps both on this node). The claim is created just before the pod, named as the
pod, owned by the exporter pod as the claim pod is, and deleted with it.

Which way a node takes (`mode`): the device plugin where the Node's allocatable has `nvidia.com/gpu` (also on
a node that runs both), else DRA where this node's ResourceSlices publish whole GPUs of a GPU driver, else the
device plugin (the old behaviour; the claim then waits and is withdrawn).
"""
from __future__ import annotations

from typing import Any

REQUEST = "gpus"   # the request's name in the claim and the pod's resourceClaims entry


def mode(snapshot) -> str | None:
    """The resource.k8s.io version to claim through (DRA), or None for the device plugin."""
    if snapshot is None or (snapshot.gpu_allocatable or snapshot.gpu_capacity or 0) > 0:
        return None
    slices = snapshot.slices
    if not snapshot.dra_gpus or slices is None or not slices.api_version:
        return None
    return slices.api_version.rsplit("/", 1)[-1]


def resource_claim(name: str, namespace: str, gpus: int, device_class: str, version: str,
                   owner: dict | None = None) -> dict[str, Any]:
    """The ResourceClaim (a plain dict as the API takes it). v1 and v1beta2 put the class and count under
    `exactly`; v1beta1 on the request itself."""
    one = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": int(gpus)}
    request = {"name": REQUEST, **({"exactly": one} if version in ("v1", "v1beta2") else one)}
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": {"app.kubernetes.io/name": "fleetcanary",
                                       "app.kubernetes.io/component": "claim"}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": [request]}}}


def use_claim(pod: dict[str, Any], claim_name: str) -> dict[str, Any]:
    """The claim pod changed to take its GPUs from the ResourceClaim instead of nvidia.com/gpu."""
    spec = pod["spec"]
    spec["resourceClaims"] = [{"name": REQUEST, "resourceClaimName": claim_name}]
    for c in spec["containers"]:
        res = c.setdefault("resources", {})
        res.get("limits", {}).pop("nvidia.com/gpu", None)
        res["claims"] = [{"name": REQUEST}]
    return pod


def _api(api_client, version: str):
    from kubernetes import client

    from fleetcanary.daemon.kube_dra import APIS

    return getattr(client, APIS[version])(api_client)


def create(api_client, version: str, namespace: str, body: dict, _request_timeout=None) -> None:
    """Create the claim; one that exists already (left by an exporter that stopped in between) is kept."""
    from kubernetes.client.exceptions import ApiException

    try:
        _api(api_client, version).create_namespaced_resource_claim(namespace, body, _request_timeout=_request_timeout)
    except ApiException as exc:
        if exc.status != 409:
            raise


def delete(api_client, version: str, namespace: str, name: str, _request_timeout=None) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        _api(api_client, version).delete_namespaced_resource_claim(name, namespace, _request_timeout=_request_timeout)
    except ApiException as exc:
        if exc.status != 404:
            raise
