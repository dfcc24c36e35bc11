"""Kubernetes: node metadata, GPU allocation gating and the FleetCanaryHealthy node condition.

One background thread talks to the API server with the official client (in-cluster
config, or kubernetes.api_url's loopback plain-HTTP server such as `kubectl proxy`):
it reads this node (labels, GPU capacity), lists the pods bound to it (field
selector spec.nodeName), where DRA is served this node's ResourceSlices and the ResourceClaims
(daemon/kube_dra.py: GPUs held through claims count as requested, and the slices map DRA devices
to GPU UUIDs for the pod-resources view) and, when enabled, patches the node's status condition. Every
call has a connect/read timeout and no retries; an error is counted by operation and
reason, and the last known state stays in force. Probes never wait on the API: the
daemon hands workers the last snapshot.

The condition follows node-problem-detector's shape (type, status, reason, message,
lastHeartbeatTime, lastTransitionTime) but is a health condition: True while healthy,
False after N consecutive failed runs of a watched probe, True again after a success.
With node_condition.per_fault, the same PATCH carries one condition per hard-fault class in
node-problem-detector's sense (True while the fault is present; daemon/hard_faults.py decides them):
every type always present, False with a "No..." reason while clear.
"""
from __future__ import annotations

import copy
import datetime
import logging
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fleetcanary.core import kube_platform

MERGE_PATCH = "application/merge-patch+json"  # RFC 7386: what the label and quarantine writes send
log = logging.getLogger("fleetcanary.kube")

GPU_RESOURCE = "nvidia.com/gpu"
TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
FAILED = ("failure", "timeout", "crash")
ERROR_REASONS = ("unauthorized", "forbidden", "not_found", "client_error", "server_error", "timeout",
                 "connection", "bad_response")
OPERATIONS = ("read_node", "list_pods", "patch_node_status", "create_pod", "read_pod", "delete_pod",
              "list_resourceslices", "read_resourceclaim", "create_resourceclaim", "delete_resourceclaim")
DRA_RETRY_SYNCS = 10  # a cluster that serves no resource.k8s.io is asked again after this many syncs



def in_cluster(environ=os.environ) -> bool:
    return bool(environ.get("KUBERNETES_SERVICE_HOST"))


def wanted(cfg, environ=os.environ) -> bool:
    return cfg.mode == "on" or (cfg.mode == "auto" and (in_cluster(environ) or bool(cfg.api_url)))


def classify(exc: BaseException) -> str:
    """An API failure as one of ERROR_REASONS."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import (
        ConnectTimeoutError,
        MaxRetryError,
        NewConnectionError,
        ProtocolError,
        ReadTimeoutError,
    )

    if isinstance(exc, MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, ApiException):
        status = exc.status or 0
        return {401: "unauthorized", 403: "forbidden", 404: "not_found"}.get(
            status, "server_error" if status >= 500 else "client_error" if status >= 400 else "bad_response")
    if isinstance(exc, NewConnectionError):  # a subclass of ConnectTimeoutError in urllib3
        return "connection"
    if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, (ProtocolError, ConnectionError, OSError)):
        return "connection"
    return "bad_response"


def sync_period(refresh: float, rng: random.Random, first: bool = False) -> float:
    """Seconds to the next pod list: the first at a random phase of the period (a tenth to a whole one), then
    the period within +-10%, so nodes that started together do not list in step and do not fall back into it."""
    return rng.uniform(0.1, 1.0) * refresh if first else rng.uniform(0.9, 1.1) * refresh


def gpus_requested(pod, resources=None) -> int:
    """GPU devices a pod holds through extended resources (`resources`: a compiled pattern of GPU resource names,
    daemon/pod_resources.resource_matcher; default nvidia.com/gpu, gpu.shared and mig-*): containers' sum, or
    its largest init container if more. A value that is not a whole number counts 0."""
    from fleetcanary.daemon.pod_resources import GPU_RESOURCES

    match = (resources or GPU_RESOURCES).fullmatch

    def count(v) -> int:
        try:
            return max(0, int(str(v)))
        except ValueError:
            return 0

    def amount(c) -> int:
        res = c.resources
        if res is None:
            return 0
        limits, requests = res.limits or {}, res.requests or {}
        return sum(max(count(limits.get(n, 0)), count(requests.get(n, 0)))
                   for n in set(limits) | set(requests) if match(n))
    spec = pod.spec
    if spec is None:
        return 0
    regular = sum(amount(c) for c in spec.containers or [])
    init = max((amount(c) for c in spec.init_containers or []), default=0)
    return max(regular, init)


@dataclass
class Snapshot:
    labels: dict[str, str] = field(default_factory=dict)       # gpu_product, instance_type, zone, pool
    gpu_capacity: int | None = None
    gpus_requested: int | None = None
    gpu_pods: list[str] = field(default_factory=list)           # namespace/name of pods holding GPUs
    gpu_allocatable: int | None = None                          # nvidia.com/gpu in the node's allocatable
    gpus_claimed: int | None = None                             # of gpus_requested: GPU devices held through DRA
    dra_gpus: int | None = None                                 # whole GPUs this node's ResourceSlices publish
    slices: Any = None                                          # dra.SliceMap of this node, as last read
    last_success: float | None = None
    errors: Counter = field(default_factory=Counter)            # (operation, reason) -> count
    condition_status: str | None = None                         # "True"/"False" as last patched
    fault_conditions: dict[str, str] = field(default_factory=dict)  # per-fault type -> status as last patched
    platform: dict[str, Any] = field(default_factory=dict)      # core/kube_platform: nodeInfo, NVIDIA components, image


class Kube:
    def __init__(self, cfg, node_name: str, api=None, on_change=None) -> None:
        """api: a kubernetes CoreV1Api (tests pass one configured for a local server)."""
        self.cfg = cfg
        self.node_name = node_name
        self.api = api
        self.on_change = on_change or (lambda: None)
        self._lock = threading.Lock()
        self._snap = Snapshot()
        self._failures: Counter = Counter()
        self._desired: tuple[str, str, str] = ("True", "ProbesPassing", "fleetcanary probes are passing")
        self._transition = datetime.datetime.now(datetime.timezone.utc)
        self._faults: dict[str, tuple[str, str, str]] = {}          # type -> (status, reason, message)
        self._fault_transitions: dict[str, datetime.datetime] = {}
        self._faults_sent: dict[str, tuple[str, str, str]] = {}    # as last patched
        self._patched_at = 0.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rng = random.Random()
        from fleetcanary.daemon.pod_resources import DEFAULT_GPU_RESOURCES, resource_matcher

        # the GPU resource names' pattern, compiled once (the config does not change under a Kube)
        self._gpu_resources = resource_matcher(getattr(cfg, "gpu_resource_names", None) or DEFAULT_GPU_RESOURCES)
        self._node_read_at: float | None = None  # monotonic time of the last successful Node read
        self._dra = None
        self._dra_skip = 0  # syncs left before resource.k8s.io is asked again (not served)
        self._slices_age = 0  # syncs since the slices were read

    @classmethod
    def in_cluster(cls, cfg, node_name: str, on_change=None, token_file: str | None = None,
                   ca_file: str | None = None, environ=os.environ) -> Kube:
        """The API server from the pod's service account (paths overridable for tests and odd setups), or,
        when kubernetes.api_url names one, that loopback server (Kube.at: no service account is read)."""
        if cfg is not None and getattr(cfg, "api_url", ""):
            return cls.at(cfg, node_name, cfg.api_url, on_change)
        from kubernetes import client
        from kubernetes.config.incluster_config import InClusterConfigLoader

        conf = client.Configuration()
        token_file = token_file or environ.get("FLEETCANARY_KUBE_TOKEN_FILE") or TOKEN_FILE
        ca_file = ca_file or environ.get("FLEETCANARY_KUBE_CA_FILE") or CA_FILE
        InClusterConfigLoader(token_file, ca_file, environ=environ).load_and_set(conf)
        conf.retries = False  # a bounded call: one attempt, then the next refresh
        return cls(cfg, node_name, client.CoreV1Api(client.ApiClient(conf)), on_change)

    @classmethod
    def at(cls, cfg, node_name: str, url: str, on_change=None) -> Kube:
        """A loopback API server over plain HTTP that authenticates for us (`kubectl proxy`, the demo's): no
        token and no CA are loaded, so no credential can go over plain HTTP. Only loopback URLs are taken."""
        from kubernetes import client

        from fleetcanary.core.config import LOOPBACK_API_URL

        if not LOOPBACK_API_URL.match(url):
            raise ValueError(f"kubernetes.api_url {url!r}: only a loopback plain-HTTP API server is served this way")
        conf = client.Configuration(host=url)
        conf.retries = False
        log.info("kubernetes: the API server at %s (loopback, no credentials sent)", url)
        return cls(cfg, node_name, client.CoreV1Api(client.ApiClient(conf)), on_change)

    # --- reads for the daemon ------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        with self._lock:
            return copy.deepcopy(self._snap)

    def slices(self):
        """This node's ResourceSlices (dra.SliceMap) as last read; None before a read or without DRA."""
        with self._lock:
            return self._snap.slices

    def context(self) -> dict[str, Any]:
        """What invasive probes' gating needs (fleetcanary.probes.lib.gpu_gate reads it)."""
        s = self.snapshot()
        ctx: dict[str, Any] = {}
        if s.gpu_capacity is not None:
            ctx["expected_gpus"] = s.gpu_capacity
        if s.gpus_requested is not None:
            ctx["allocated_gpu_count"] = s.gpus_requested
            ctx["gpus_allocated"] = self.cfg.gpu_allocation_policy == "skip" and s.gpus_requested > 0
            ctx["gpu_pods"] = s.gpu_pods[:20]
        return ctx

    # --- node condition ---------------------------------------------------------------------
    def observe(self, probe: str, outcome: str, detail: str = "") -> None:
        """Count a run of a watched probe; a change of the desired condition wakes the API thread."""
        nc = self.cfg.node_condition
        if not nc.enabled or probe not in nc.probes or outcome == "skipped":
            return
        with self._lock:
            self._failures[probe] = self._failures[probe] + 1 if outcome in FAILED else 0
            failing = sorted(p for p, n in self._failures.items() if n >= nc.consecutive_failures)
            if failing:
                desired = ("False", "ProbeFailing", "; ".join(
                    f"{p} failed {self._failures[p]} consecutive runs" for p in failing)
                    + (f" (last: {outcome}: {detail[:200]})" if detail else ""))
            else:
                desired = ("True", "ProbesPassing", "fleetcanary probes are passing")
            changed = desired[0] != self._desired[0]
            self._desired = desired
            if changed:
                self._transition = datetime.datetime.now(datetime.timezone.utc)
        if changed:
            self._wake.set()

    def set_faults(self, conditions: dict[str, tuple[str, str, str]]) -> None:
        """The per-fault conditions as daemon/hard_faults.py decides them; a changed status, reason or
        message wakes the API thread (a status change also moves lastTransitionTime)."""
        if not self.cfg.node_condition.per_fault:
            return
        now = datetime.datetime.now(datetime.timezone.utc)
        with self._lock:
            changed = conditions != self._faults
            for t, (status, _, _) in conditions.items():
                if t not in self._faults or self._faults[t][0] != status:
                    self._fault_transitions[t] = now
            self._faults = dict(conditions)
        if changed:
            self._wake.set()

    # --- the API thread ---------------------------------------------------------------------------
    def start(self) -> None:
        """One sync now (bounded by the API timeout), so the first probe runs already know the pods."""
        self.sync()
        self._thread = threading.Thread(target=self._loop, name="fleetcanary-kube", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.cfg.api_timeout_seconds * 3 + 2)

    def _loop(self) -> None:
        # the first period at a random phase, then each within +-10%: a fleet that started together spreads
        # over a whole period and stays spread (API load per node constant and small: docs/deploy.md)
        next_sync = time.monotonic() + sync_period(self.cfg.refresh_seconds, self._rng, first=True)
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_sync:
                self.sync()
                next_sync = now + sync_period(self.cfg.refresh_seconds, self._rng)
            self.patch_condition()
            next_heartbeat = self._patched_at + self.cfg.node_condition.heartbeat_seconds
            self._wake.wait(timeout=max(0.1, min(next_sync, next_heartbeat) - time.monotonic()))
            self._wake.clear()

    def request_timeout(self):
        t = self.cfg.api_timeout_seconds
        return (t, t)

    def count_error(self, operation: str, exc: BaseException) -> None:
        reason = classify(exc)
        with self._lock:
            self._snap.errors[(operation, reason)] += 1
        log.warning("kubernetes %s: %s (%s)", operation, reason, str(exc).splitlines()[0][:200] if str(exc) else "")
        self.on_change()

    def sync(self, read_node: bool | None = None) -> bool:
        """Read the node (read_node; None: when node_refresh_seconds have passed since the last read, or it has
        never been read) and list its pods. Never raises; errors keep the last known state."""
        ok = True
        node = None
        due = read_node if read_node is not None else self._node_read_at is None or \
            time.monotonic() - self._node_read_at >= max(self.cfg.node_refresh_seconds, self.cfg.refresh_seconds)
        try:
            if due:
                node = self.api.read_node(self.node_name, _request_timeout=self.request_timeout())
                self._node_read_at = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - any API failure is counted and survived
            self.count_error("read_node", exc)
            ok = False
        if node is not None:
            labels = (node.metadata.labels if node.metadata else None) or {}
            cap = (node.status.capacity if node.status else None) or {}
            alloc = (node.status.allocatable if node.status else None) or {}
            new = {"gpu_product": labels.get(self.cfg.gpu_product_label, ""),
                   "instance_type": labels.get(self.cfg.instance_type_label, ""),
                   "zone": labels.get(self.cfg.zone_label, ""),
                   "pool": labels.get(self.cfg.pool_label, "") if self.cfg.pool_label else ""}
            try:
                capacity = int(str(cap[GPU_RESOURCE])) if GPU_RESOURCE in cap else None
            except ValueError:
                capacity = None
            try:  # the device plugin advertises nvidia.com/gpu; a node whose GPUs a DRA driver hands out does not
                allocatable = int(str(alloc[GPU_RESOURCE])) if GPU_RESOURCE in alloc else None
            except ValueError:
                allocatable = None
            with self._lock:
                self._snap.labels = new
                self._snap.gpu_capacity = capacity
                self._snap.gpu_allocatable = allocatable
                self._snap.platform = {k: v for k, v in self._snap.platform.items()
                                       if k not in kube_platform.NODE_KEYS} | kube_platform.from_node(node)
        try:
            pods = self.api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node_name},status.phase!=Succeeded,status.phase!=Failed",
                resource_version="0",  # from the watch cache: no quorum read of etcd for every node every minute
                _request_timeout=self.request_timeout())
        except Exception as exc:  # noqa: BLE001 - any API failure is counted and survived
            self.count_error("list_pods", exc)
            ok = False
        else:
            holding = [(p, gpus_requested(p, self._gpu_resources)) for p in pods.items or []]
            holding = [(p, n) for p, n in holding if n > 0]
            requested = sum(n for _, n in holding)
            gpu_pods = {f"{p.metadata.namespace}/{p.metadata.name}" for p, _ in holding}
            with self._lock:
                advertised = self._snap.gpu_allocatable or self._snap.gpu_capacity
            claimed = self.sync_dra(pods.items or [], advertised)
            if claimed is not None:
                requested += len(claimed.devices)
                gpu_pods |= claimed.pods
            on_node = kube_platform.from_pods(pods.items or [], kube_platform.own_pod_name(),
                                              kube_platform.own_namespace())
            with self._lock:
                self._snap.platform = {k: v for k, v in self._snap.platform.items()
                                       if k not in kube_platform.POD_KEYS} | on_node
                self._snap.gpus_requested = requested
                self._snap.gpus_claimed = len(claimed.devices) if claimed is not None else None
                self._snap.gpu_pods = sorted(gpu_pods)
        if ok:
            with self._lock:
                self._snap.last_success = time.time()
        self.on_change()
        return ok

    def sync_dra(self, pods, capacity: int | None):
        """On a node that may use DRA (no nvidia.com/gpu capacity, or a pod here with resource claims; where a
        GPU DRA driver is configured and resource.k8s.io is served): this node's ResourceSlices (every
        kube_dra.SLICE_SYNCS syncs) and the claims of `pods` (this node's). Returns what the claims hold, or
        None (no DRA; or a claim could not be read: counted, and the node-wide view goes without claims this
        time; the slices last read stay)."""
        from fleetcanary.daemon import kube_dra

        drivers = tuple(getattr(self.cfg, "dra_gpu_drivers", None) or ())
        with_claims = [(p, kube_dra.pod_claims(p)) for p in pods if p.metadata]
        with_claims = [(p, names) for p, names in with_claims if names]
        if not drivers or not hasattr(self.api, "api_client") or (capacity and not with_claims):
            return None
        if self._dra_skip > 0:
            self._dra_skip -= 1
            return None
        if self._dra is None:
            self._dra = kube_dra.Reader(self.api.api_client, self.node_name, self.request_timeout())
        if self._snap.slices is None or self._slices_age >= kube_dra.SLICE_SYNCS:
            try:
                slices = self._dra.slices(drivers)
            except kube_dra.NotServed:
                self._dra_skip = DRA_RETRY_SYNCS
                with self._lock:
                    self._snap.slices, self._snap.dra_gpus = None, None
                return None
            except Exception as exc:  # noqa: BLE001 - counted; the slices last read stay
                self.count_error("list_resourceslices", exc)
                if self._snap.slices is None:  # never read (RBAC without resourceslices?): ask again later
                    self._dra_skip = DRA_RETRY_SYNCS
                    return None
            else:
                self._slices_age = 0
                with self._lock:
                    self._snap.slices = slices
                    self._snap.dra_gpus = sum(1 for d in slices.devices.values() if d.type == "gpu")
        self._slices_age += 1
        claims = []
        try:
            for p, names in with_claims:
                claims += [c for c in (self._dra.claim(p.metadata.namespace, n) for n in names) if c]
        except kube_dra.NotServed:
            return None
        except Exception as exc:  # noqa: BLE001 - counted; the node-wide view goes without claims this time
            self.count_error("read_resourceclaim", exc)
            return None
        bound = [(p.metadata.namespace, p.metadata.name, p.metadata.uid or "") for p, _ in with_claims]
        return kube_dra.claimed(claims, bound, drivers)

    def patch_condition(self, force: bool = False) -> bool:
        nc = self.cfg.node_condition
        if not nc.enabled:
            return False
        with self._lock:
            status, reason, message = self._desired
            faults = dict(self._faults) if nc.per_fault else {}
            sent = self._faults_sent
            due = (force or status != self._snap.condition_status or faults != sent
                   or time.monotonic() - self._patched_at >= nc.heartbeat_seconds)
            transition = self._transition
            transitions = dict(self._fault_transitions)
        if not due:
            return False
        now = datetime.datetime.now(datetime.timezone.utc)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        conds = [{"type": nc.type, "status": status, "reason": reason, "message": message,
                  "lastHeartbeatTime": stamp, "lastTransitionTime": transition.strftime("%Y-%m-%dT%H:%M:%SZ")}]
        for t, (fstatus, freason, fmessage) in sorted(faults.items()):  # one PATCH; merged by type
            conds.append({"type": t, "status": fstatus, "reason": freason, "message": fmessage,
                          "lastHeartbeatTime": stamp,
                          "lastTransitionTime": transitions.get(t, now).strftime("%Y-%m-%dT%H:%M:%SZ")})
        body = {"status": {"conditions": conds}}
        try:
            self.api.patch_node_status(self.node_name, body, _request_timeout=self.request_timeout(),
                                       _content_type="application/strategic-merge-patch+json")
        except Exception as exc:  # noqa: BLE001 - counted; the heartbeat is retried within 30 s
            self.count_error("patch_node_status", exc)
            with self._lock:
                self._patched_at = time.monotonic() - nc.heartbeat_seconds + min(30.0, nc.heartbeat_seconds)
            return False
        with self._lock:
            self._snap.condition_status = status
            self._snap.fault_conditions = {t: c[0] for t, c in faults.items()}
            self._faults_sent = faults
            self._patched_at = time.monotonic()
        log.info("node condition %s=%s (%s)", nc.type, status, reason)
        self.on_change()
        return True
