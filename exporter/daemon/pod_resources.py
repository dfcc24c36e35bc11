"""Which GPUs the kubelet has given to pods: its pod-resources API (v1 `List`, gRPC over the unix
socket `/var/lib/kubelet/pod-resources/kubelet.sock`), the same source dcgm-exporter reads to label
GPU metrics with pods.

The device plugin's device IDs are GPU UUIDs (`GPU-...`) for whole GPUs (`nvidia.com/gpu`, also
under time-slicing: `GPU-...::N`, advertised as `nvidia.com/gpu.shared` with `renameByDefault`), and MIG
device UUIDs (`MIG-...`, or the older `MIG-GPU-<uuid>/<gi>/<ci>`) for MIG slices (`nvidia.com/gpu` with the
single strategy, `nvidia.com/mig-<profile>` with the mixed one). Which resource names are GPUs is
configurable (kubernetes.gpu_resource_names, shell-style patterns; a renamed resource is one more pattern).

Devices given through DRA come in each container's `dynamic_resources` (Kubernetes 1.34+ sends them by
default): driver, pool and device name per allocated device. Those of a GPU driver (kubernetes.dra_gpu_drivers,
default NVIDIA's `gpu.nvidia.com`) are mapped to GPU and MIG UUIDs through this node's ResourceSlices, else
by name to GPU minor numbers (daemon/dra.py says why and how). A node may have both (device plugin and DRA).

The daemon never calls NVML: it hands the UUIDs (and minors) to the probe worker, whose gate maps them to GPU
indices (a MIG device to its parent GPU).

Every call has a deadline; a socket that accepts and never answers is a `timeout`, a missing
socket `absent`. A failure keeps nothing: the caller falls back to the API server's view.
"""
from __future__ import annotations

import fnmatch
import logging
import os
import re
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetcanary.daemon import dra

log = logging.getLogger("fleetcanary.pod_resources")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
METHOD = "/v1.PodResourcesLister/List"
DEFAULT_GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")


def resource_matcher(patterns=DEFAULT_GPU_RESOURCES) -> re.Pattern[str]:
    """One regex for the shell-style resource-name patterns (case-sensitive, as the kubelet compares)."""
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns) or r"(?!)")


GPU_RESOURCES = resource_matcher()
REASONS = ("absent", "timeout", "unavailable", "unimplemented", "permission", "bad_response", "error")


class PodResourcesError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Holder:
    namespace: str
    pod: str
    container: str
    resource: str


@dataclass
class Allocation:
    """GPU devices held by containers: device ID -> who holds it (a device shared by time-slicing can have
    several holders; the first is kept)."""
    devices: dict[str, Holder] = field(default_factory=dict)
    dra: dict[dra.Device, Holder] = field(default_factory=dict)   # a GPU driver's DRA devices

    @property
    def held(self) -> set[str]:
        """Every held device's key (device plugin IDs and DRA driver/pool/device): what a change is seen by."""
        return set(self.devices) | {d.key for d in self.dra}

    @property
    def gpu_uuids(self) -> list[str]:
        """Whole GPUs held, as NVML names them (a time-slicing replica suffix `::N` dropped)."""
        return sorted({gpu_uuid(d) for d in self.devices if gpu_uuid(d)})

    @property
    def mig_uuids(self) -> list[str]:
        """MIG devices held: `MIG-<uuid>`, or the parent GPU's UUID for the older `MIG-GPU-<uuid>/..` IDs
        (listed in gpu_uuids too: the parent is in use)."""
        return sorted(d for d in self.devices if d.startswith("MIG-") and not d.startswith("MIG-GPU-"))

    @property
    def pods(self) -> list[str]:
        return sorted({f"{h.namespace}/{h.pod}" for h in (*self.devices.values(), *self.dra.values())})

    def context(self, slices: dra.SliceMap | None = None) -> dict[str, Any]:
        """What the GPU gate needs: held GPU and MIG UUIDs (device plugin, and DRA devices mapped by the
        ResourceSlices), GPU minors of DRA devices only their names place, and how many DRA devices neither
        places (the gate then leaves every GPU alone)."""
        r = dra.resolve(self.dra, slices)
        ctx: dict[str, Any] = {"allocated_gpu_uuids": sorted(set(self.gpu_uuids) | r.gpu_uuids),
                               "allocated_mig_uuids": sorted(set(self.mig_uuids) | r.mig_uuids),
                               "allocation_source": "pod_resources", "gpu_pods": self.pods[:20]}
        if r.gpu_minors:
            ctx["allocated_gpu_minors"] = sorted(r.gpu_minors)
        if r.unmapped:
            ctx["allocated_unmapped_devices"] = r.unmapped[:20]
        if self.dra:
            ctx["dra_devices"] = len(self.dra)
        return ctx


def gpu_uuid(device_id: str) -> str:
    """The GPU UUID a device ID names, or "" for a MIG device (its parent is found by NVML)."""
    d = device_id.split("::", 1)[0]
    if d.startswith("GPU-"):
        return d
    if d.startswith("MIG-GPU-"):  # MIG-GPU-<gpu uuid>/<gi>/<ci> (device plugin before MIG UUIDs)
        return d[len("MIG-"):].split("/", 1)[0]
    return ""


def parse(response, resources: re.Pattern[str] = GPU_RESOURCES,
          dra_drivers: tuple[str, ...] = (dra.NVIDIA_DRIVER,)) -> Allocation:
    """A ListPodResourcesResponse -> the GPU devices held by containers: device-plugin devices of a GPU
    resource name, DRA devices of a GPU driver (the claim's namespace/name is the holder's resource)."""
    out = Allocation()
    for pod in response.pod_resources:
        for c in pod.containers:
            for dev in c.devices:
                if not resources.fullmatch(dev.resource_name):
                    continue
                for d in dev.device_ids:
                    out.devices.setdefault(d, Holder(pod.namespace, pod.name, c.name, dev.resource_name))
            for dyn in c.dynamic_resources:
                claim = f"{dyn.claim_namespace or pod.namespace}/{dyn.claim_name}"
                for r in dyn.claim_resources:
                    if r.driver_name in dra_drivers and r.device_name:
                        out.dra.setdefault(dra.Device(r.driver_name, r.pool_name, r.device_name),
                                           Holder(pod.namespace, pod.name, c.name, f"claim:{claim}"))
    return out


class Client:
    """One channel to the kubelet's socket, opened on first use and kept; `list()` is one bounded call."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_seconds: float = 2.0,
                 resource_names=DEFAULT_GPU_RESOURCES, dra_drivers=(dra.NVIDIA_DRIVER,)) -> None:
        self.socket_path = socket_path
        self.timeout = timeout_seconds
        self.resources = resource_matcher(resource_names)
        self.dra_drivers = tuple(dra_drivers)
        self._channel = None
        self._call = None
        self._request = None

    def _stub(self):
        if self._call is None:
            import grpc

            from fleetcanary.daemon import podresources_pb2 as pb

            self._channel = grpc.insecure_channel(f"unix://{os.path.abspath(self.socket_path)}")
            self._call = self._channel.unary_unary(
                METHOD, request_serializer=pb.ListPodResourcesRequest.SerializeToString,
                response_deserializer=pb.ListPodResourcesResponse.FromString)
            self._request = pb.ListPodResourcesRequest()
        return self._call

    def available(self) -> bool:
        try:
            return stat.S_ISSOCK(os.stat(self.socket_path).st_mode)
        except OSError:
            return False

    def list(self) -> Allocation:
        if not self.available():
            raise PodResourcesError("absent", f"no socket at {self.socket_path}")
        import grpc

        call = self._stub()
        try:
            response = call(self._request, timeout=self.timeout, wait_for_ready=False)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            reason = {grpc.StatusCode.DEADLINE_EXCEEDED: "timeout", grpc.StatusCode.UNAVAILABLE: "unavailable",
                      grpc.StatusCode.UNIMPLEMENTED: "unimplemented", grpc.StatusCode.PERMISSION_DENIED: "permission",
                      grpc.StatusCode.INTERNAL: "bad_response"}.get(code, "error")
            details = e.details() if hasattr(e, "details") else str(e)
            raise PodResourcesError(reason, f"{code.name if code else 'error'}: {(details or '')[:200]}") from None
        return parse(response, self.resources, self.dra_drivers)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._call = None


class Watcher:
    """Refreshes the allocation every `refresh_seconds` on its own thread; the daemon reads `context()` when it
    builds a probe's job. A view older than three refreshes (the socket went away, the kubelet hangs) is
    dropped, and the caller falls back to the node-wide check. `on_change(before, after)` runs on the thread
    when the set of held GPU devices changes (a pod ended: its GPUs are free). `slices()` gives this node's
    ResourceSlices as last read from the API server (None: not read), to map DRA devices to GPUs."""

    def __init__(self, client: Client, refresh_seconds: float = 5.0, clock=time.monotonic,
                 on_change: Callable[[Allocation | None, Allocation], None] | None = None,
                 slices: Callable[[], dra.SliceMap | None] | None = None) -> None:
        self.client = client
        self.slices = slices or (lambda: None)
        self._unmapped: frozenset[str] = frozenset()
        self.refresh_seconds = refresh_seconds
        self.clock = clock
        self.on_change = on_change
        self.errors: Counter[str] = Counter()
        self.refreshes = 0
        self._alloc: Allocation | None = None
        self._ok_at: float | None = None
        self._last_error = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        try:
            alloc = self.client.list()
        except PodResourcesError as e:
            with self._lock:
                self.errors[e.reason] += 1
                new = e.reason != self._last_error
                self._last_error = e.reason
            if new:  # once per change of reason, not every few seconds
                (log.info if e.reason == "absent" else log.warning)("kubelet pod-resources: %s", e)
            return
        with self._lock:
            before = self._alloc
            self._alloc, self._ok_at = alloc, self.clock()
            self.refreshes += 1
            if self._last_error:
                log.info("kubelet pod-resources: answering again (%d GPU devices held)", len(alloc.held))
            self._last_error = ""
        if self.on_change is not None and (before is None or before.held != alloc.held):
            self.on_change(before, alloc)

    def allocation(self) -> Allocation | None:
        """The last allocation, while it is fresh (three refreshes)."""
        with self._lock:
            if self._ok_at is None or self.clock() - self._ok_at > 3 * self.refresh_seconds:
                return None
            return self._alloc

    def context(self) -> dict[str, Any] | None:
        """What the GPU gate needs, or None (no fresh view: the node-wide check stays)."""
        a = self.allocation()
        if a is None:
            return None
        ctx = a.context(self.slices())
        unmapped = frozenset(ctx.get("allocated_unmapped_devices") or ())
        if unmapped and unmapped != self._unmapped:  # once per change, not once per job
            log.warning("kubelet pod-resources: GPU DRA devices no ResourceSlice or name places (%s): every GPU "
                        "counts as held while they are", ", ".join(sorted(unmapped)[:5]))
        self._unmapped = unmapped
        return ctx

    def start(self) -> None:
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="fleetcanary-pod-resources", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_seconds):
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.client.timeout + 5)
        self.client.close()
