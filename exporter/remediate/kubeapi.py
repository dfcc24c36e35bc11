"""The Kubernetes API calls the controller makes, on the exporter's in-cluster client (fleetcanary.daemon.kube:
the service account's token and CA, FLEETCANARY_KUBE_TOKEN_FILE/CA_FILE overrides, no retries) and its error
classification. Objects travel as plain JSON dicts through the client's generic call path: the controller
reads and writes a few fields of Nodes, Events and Leases, and the typed models would only round-trip them.

Every call has the configured connect/read timeout; a failure raises ApiError with the operation and a reason
from fleetcanary.daemon.kube.ERROR_REASONS plus ``conflict`` (409) and ``invalid`` (422)."""
from __future__ import annotations

import json
import os
from typing import Any

from fleetcanary.daemon import kube

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"


class ApiError(Exception):
    def __init__(self, operation: str, reason: str, detail: str = "") -> None:
        super().__init__(f"kubernetes {operation}: {reason}" + (f" ({detail})" if detail else ""))
        self.operation, self.reason = operation, reason


class KubeAPI:
    def __init__(self, api_client, timeout_seconds: float) -> None:
        self.client = api_client
        self.timeout = (timeout_seconds, timeout_seconds)

    @classmethod
    def in_cluster(cls, timeout_seconds: float, environ=os.environ) -> KubeAPI:
        """The API server from the pod's service account, configured exactly as the exporter's client."""
        return cls(kube.Kube.in_cluster(None, "", environ=environ).api.api_client, timeout_seconds)

    @classmethod
    def at(cls, url: str, timeout_seconds: float) -> KubeAPI:
        """A loopback API server over plain HTTP that authenticates for us (`kubectl proxy`, the demo's), as the
        exporter's client reaches one (no credentials loaded, loopback only)."""
        return cls(kube.Kube.at(None, "", url).api.api_client, timeout_seconds)

    def call(self, operation: str, method: str, path: str, body: Any = None, query: list | None = None,
             content_type: str = "application/json") -> dict:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            params = self.client.param_serialize(method, path, query_params=query or [], header_params=headers,
                                                 body=body, auth_settings=["BearerToken"])
            resp = self.client.call_api(*params, _request_timeout=self.timeout)
            data = resp.read()
        except Exception as exc:  # noqa: BLE001 - any transport failure is classified and raised as one line
            raise ApiError(operation, kube.classify(exc), str(exc).splitlines()[0][:160] if str(exc) else "") \
                from None
        if resp.status >= 300:
            reason = {409: "conflict", 422: "invalid"}.get(resp.status)
            if reason is None:
                from kubernetes.client.exceptions import ApiException

                reason = kube.classify(ApiException(status=resp.status, reason=resp.reason))
            raise ApiError(operation, reason, f"HTTP {resp.status}")
        try:
            out = json.loads(data or b"{}")
        except ValueError:
            raise ApiError(operation, "bad_response", "not JSON") from None
        if not isinstance(out, dict):
            raise ApiError(operation, "bad_response", "not an object")
        return out

    # --- nodes -----------------------------------------------------------------------------------
    def read_node(self, name: str) -> dict:
        return self.call("read_node", "GET", f"/api/v1/nodes/{name}")

    def list_nodes(self) -> list[dict]:
        return list(self.call("list_nodes", "GET", "/api/v1/nodes").get("items") or [])

    def patch_node(self, name: str, patch: dict) -> dict:
        return self.call("patch_node", "PATCH", f"/api/v1/nodes/{name}", patch, content_type=kube.MERGE_PATCH)

    # --- events ----------------------------------------------------------------------------------
    def create_event(self, namespace: str, event: dict) -> dict:
        return self.call("create_event", "POST", f"/api/v1/namespaces/{namespace}/events", event)

    # --- leases ----------------------------------------------------------------------------------
    def read_lease(self, namespace: str, name: str) -> dict | None:
        try:
            return self.call("read_lease", "GET", LEASES.format(ns=namespace) + f"/{name}")
        except ApiError as exc:
            if exc.reason == "not_found":
                return None
            raise

    def create_lease(self, namespace: str, lease: dict) -> dict:
        return self.call("create_lease", "POST", LEASES.format(ns=namespace), lease)

    def replace_lease(self, namespace: str, lease: dict) -> dict:
        return self.call("update_lease", "PUT", LEASES.format(ns=namespace) + f"/{lease['metadata']['name']}", lease)
