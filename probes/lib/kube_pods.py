"""One bounded Kubernetes API call from a worker: list the pods matching a label selector
in a namespace, with their node names and pod IPs.

Probes import nothing of the daemon, whose Kubernetes client lists only this node's pods;
a probe that needs other nodes' pods (the fabric probe's members) makes this one GET with
the pod's service account (token and CA from the standard paths, overridable as for the
daemon with FLEETCANARY_KUBE_TOKEN_FILE / FLEETCANARY_KUBE_CA_FILE), one attempt, a
timeout, and a one-line error. `requests` rather than the kubernetes client: one GET does
not need the client's model classes, and the error stays one line.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from pydantic import BaseModel, Field

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class DaemonSetPods(BaseModel):
    """Config fields of a probe that finds its fleet as the pods of this DaemonSet (the fabric probe's members,
    the inference canary's probers)."""

    kubernetes_namespace: str = Field(
        "", description="Namespace of the DaemonSet's pods; empty: the service account's own namespace.")
    kubernetes_label_selector: str = Field(
        "app.kubernetes.io/name=fleetcanary", description="Label selector of the DaemonSet's pods.")
    kubernetes_api_timeout_seconds: float = Field(5.0, gt=0, le=60, description="Timeout of the pod list call.")


class KubeError(Exception):
    """The API could not answer; ``reason`` is short and carries no token."""


@dataclass(frozen=True)
class Pod:
    name: str
    node: str
    ip: str
    phase: str
    ready: bool
    terminating: bool


def namespace_of_service_account(environ=os.environ) -> str:
    path = os.path.join(os.path.dirname(environ.get("FLEETCANARY_KUBE_TOKEN_FILE") or f"{SA_DIR}/token"), "namespace")
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def list_pods(namespace: str, label_selector: str, timeout: float, environ=os.environ) -> list[Pod]:
    import requests

    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeError("not in a Kubernetes pod (KUBERNETES_SERVICE_HOST is not set)")
    token_file = environ.get("FLEETCANARY_KUBE_TOKEN_FILE") or f"{SA_DIR}/token"
    ca_file = environ.get("FLEETCANARY_KUBE_CA_FILE") or f"{SA_DIR}/ca.crt"
    namespace = namespace or namespace_of_service_account(environ)
    if not namespace:
        raise KubeError("no namespace configured and none in the service account")
    try:
        with open(token_file) as f:
            token = f.read().strip()
    except OSError as exc:
        raise KubeError(f"cannot read the service account token {token_file}: {exc.strerror}") from None
    h = f"[{host}]" if ":" in host else host
    url = f"https://{h}:{port}/api/v1/namespaces/{namespace}/pods"
    try:
        r = requests.get(url, params={"labelSelector": label_selector}, headers={"Authorization": f"Bearer {token}"},
                         verify=ca_file, timeout=(timeout, timeout))
    except requests.Timeout:
        raise KubeError("the API server did not answer in time") from None
    except requests.RequestException as exc:
        raise KubeError(f"cannot reach the API server: {type(exc).__name__}") from None
    if r.status_code != 200:
        raise KubeError(f"listing pods in {namespace} answered HTTP {r.status_code}")
    try:
        items = r.json()["items"] or []
        pods = []
        for p in items:
            meta, spec, status = p.get("metadata") or {}, p.get("spec") or {}, p.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
            pods.append(Pod(str(meta.get("name", "")), str(spec.get("nodeName") or ""), str(status.get("podIP") or ""),
                            str(status.get("phase") or ""), ready, bool(meta.get("deletionTimestamp"))))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise KubeError("the pod list is not what the API returns") from None
    return pods
