"""Gating for invasive GPU probes, run inside the worker before any CUDA work.

A GPU is not touched when it has compute processes, when its utilization is over
the configured threshold, when Kubernetes has allocated it to a pod, or when its
GPU-time budget would be exceeded (what is left over the probe's budget window, its
interval clamped to one hour..one day, as the daemon computed it: daemon/scheduler.py).
With the default ``node`` policy, one busy GPU skips the whole probe: host-to-device
copies on an idle GPU still share PCIe switches and host memory with a job on its
neighbour. The ``gpu`` policy measures the idle GPUs only.

Allocation comes in two grains. Where the kubelet's pod-resources socket answers, the daemon
passes the UUIDs of the GPUs and MIG devices pods hold (``allocated_gpu_uuids``,
``allocated_mig_uuids``): those GPUs are left out, and the free ones are measured under either
policy; a fleet at 70-95% allocation would otherwise measure almost nothing. ``node`` then guards
only against GPUs busy without an allocation (a workload outside Kubernetes). Where it does not,
the API server's node-wide view (``gpus_allocated``: some pod holds a GPU) skips every GPU.

DRA devices come as GPU and MIG UUIDs where this node's ResourceSlices placed them, else as GPU minor
numbers (``allocated_gpu_minors``: NVIDIA's DRA driver names a GPU ``gpu-<minor>``), matched here with
nvmlDeviceGetMinorNumber; a held device neither places (``allocated_unmapped_devices``) holds every GPU.

MIG: a held MIG device holds its parent GPU only (found by listing each MIG-mode GPU's MIG devices; where
NVML cannot list them, every MIG-mode GPU counts as held). A GPU in MIG mode cannot be measured whole; a probe
that supports MIG (``mig=True``) gets the free MIG devices of the free MIG-mode GPUs in ``Gate.mig`` (parent
index -> MIG UUIDs; CUDA addresses each by its UUID), any other skips the GPU with ``unsupported``.

MPS: a GPU whose compute processes include the MPS server (nvidia-cuda-mps-server), that has MPS clients, or
that has compute processes while an MPS control daemon's pipe is reachable (CUDA_MPS_PIPE_DIRECTORY, default
/tmp/nvidia-mps) is shared by MPS: skipped with ``gpu_mps`` (a tenant's workload, like ``gpu_busy``).
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetcanary.probes.base import ProbeError, ProbeSkipped
from fleetcanary.probes.lib import nvml


def open_session() -> nvml.Session:
    """NVML, or ProbeSkipped("no_gpu") where there is no driver; a broken NVML fails the probe."""
    try:
        return nvml.open_session()
    except nvml.NvmlUnavailable as exc:
        if exc.no_driver:
            raise ProbeSkipped("no_gpu", str(exc)) from None
        raise ProbeError("nvml_error", str(exc)) from None


MPS_SERVER = "nvidia-cuda-mps-server"
MPS_PIPE_DEFAULT = "/tmp/nvidia-mps"


def mps_control_reachable(environ=os.environ) -> bool:
    """An MPS control daemon's pipe is where a CUDA client would look for it."""
    return (Path(environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DEFAULT) / "control").exists()


@dataclass
class Gate:
    usable: list[nvml.GpuHandle]
    skipped: dict[int, str] = field(default_factory=dict)  # gpu index -> skip reason
    uuids: dict[int, str] = field(default_factory=dict)    # gpu index -> GPU UUID (how CUDA is told which)
    mig: dict[int, list[str]] = field(default_factory=dict)  # MIG-mode gpu index -> free MIG UUIDs (mig=True)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"measured_gpus": [g.index for g in self.usable],
                               "skipped_gpus": {str(k): v for k, v in self.skipped.items()}}
        if self.mig:
            out["measured_mig_devices"] = {str(k): v for k, v in self.mig.items()}
        return out


def _held_mig_parents(session: nvml.Session, mig_devs: dict[int, list[nvml.GpuHandle] | None],
                      held: set[str]) -> set[int]:
    """The MIG-mode GPUs a held MIG device belongs to; every MIG-mode GPU where one cannot be placed."""
    parents, placed = set(), set()
    for idx, devs in mig_devs.items():
        uuids = {session.uuid(d) for d in devs or []}
        if uuids & held:
            parents.add(idx)
            placed |= uuids & held
    return parents | (set(mig_devs) if held - placed else set())


def gate(session: nvml.Session, handles: list[nvml.GpuHandle], gpu_ctx: dict[str, Any], kube_ctx: dict[str, Any],
         cost_seconds: float, policy: str = "node", mig: bool = False) -> Gate:
    """Decide which GPUs (and, with ``mig``, which MIG devices) an invasive probe may use. Raises ProbeSkipped
    if none."""
    threshold = float(gpu_ctx.get("busy_utilization_ratio", 0.05))
    check_procs = bool(gpu_ctx.get("skip_when_compute_processes", True))
    budget_left = {str(k): float(v) for k, v in (gpu_ctx.get("budget_left_seconds") or {}).items()}
    allocated = {str(x) for x in (kube_ctx.get("allocated_gpus") or [])}
    allocated_uuids = {str(x) for x in (kube_ctx.get("allocated_gpu_uuids") or [])}
    allocated_minors = {int(x) for x in (kube_ctx.get("allocated_gpu_minors") or []) if str(x).isdigit()}
    held_mig = {str(x) for x in (kube_ctx.get("allocated_mig_uuids") or [])}
    # a held device nobody could place, or the API server's node-wide view: every GPU is held
    all_allocated = bool(kube_ctx.get("gpus_allocated")) or bool(kube_ctx.get("allocated_unmapped_devices"))
    # The kubelet says which GPU each pod holds: an allocated GPU is left out, and under policy "node" only
    # GPUs busy without an allocation (a workload the kubelet does not know) leave the whole node alone.
    per_gpu = "allocated_gpu_uuids" in kube_ctx or "allocated_gpus" in kube_ctx
    mps_pipe = mps_control_reachable()
    me = os.getpid()
    live = [g for g in handles if not g.lost]
    mig_devs = {g.index: session.mig_devices(g) for g in live if session.mig_mode(g) == "enabled"}
    mig_parents = _held_mig_parents(session, mig_devs, held_mig) if held_mig else set()
    usable, skipped, uuids, free_mig = [], {}, {}, {}

    def in_use(g: nvml.GpuHandle) -> str:
        """gpu_mps, gpu_busy or "" for a GPU or MIG device."""
        procs = [p for p in session.compute_processes(g) if p != me] if check_procs else []
        if check_procs and (session.mps_processes(g) or (procs and mps_pipe)
                            or any(session.process_name(p) == MPS_SERVER for p in procs)):
            return "gpu_mps"
        util = session.utilization_ratio(g)
        return "gpu_busy" if procs or (util is not None and util > threshold) else ""

    for g in handles:
        if g.lost:
            skipped[g.index] = "unsupported"
            continue
        uuid = session.uuid(g)
        minor = session.minor_number(g) if allocated_minors else None
        if all_allocated or str(g.index) in allocated or uuid in allocated_uuids or g.index in mig_parents \
                or (minor is not None and minor in allocated_minors):
            skipped[g.index] = "gpu_allocated"
            continue
        busy = in_use(g)
        if busy:
            skipped[g.index] = busy
            continue
        if str(g.index) in budget_left and budget_left[str(g.index)] < cost_seconds:
            skipped[g.index] = "budget"
            continue
        if g.index in mig_devs:  # not measurable whole: its free MIG devices, where the probe takes them
            free = [session.uuid(d) for d in mig_devs[g.index] or [] if not in_use(d)] if mig else []
            if free:
                free_mig[g.index] = free
            else:
                skipped[g.index] = "unsupported"
            continue
        usable.append(g)
        uuids[g.index] = uuid
    busy = {i: r for i, r in skipped.items()
            if r in ("gpu_busy", "gpu_mps") or (r == "gpu_allocated" and not per_gpu)}
    if policy == "node" and busy:
        reason = Counter(busy.values()).most_common(1)[0][0]
        raise ProbeSkipped(reason, f"GPUs {sorted(busy)} in use; policy 'node' leaves the whole node alone")
    if not usable and not free_mig:
        if not skipped:
            raise ProbeSkipped("no_gpu", "NVML lists no GPU")
        reason = Counter(skipped.values()).most_common(1)[0][0]
        why = (f" ({cost_seconds:g} s needed, left over the last {gpu_ctx.get('budget_window_seconds', 3600):g} s: "
               f"{ {k: round(v, 2) for k, v in budget_left.items()} })" if reason == "budget" else "")
        in_mig = sorted(i for i, r in skipped.items() if r == "unsupported" and i in mig_devs)
        if in_mig:
            why += (f"; GPUs {in_mig} are in MIG mode and this probe measures whole GPUs" if not mig else
                    f"; GPUs {in_mig} are in MIG mode with no free MIG device")
        raise ProbeSkipped(reason, f"no usable GPU: {skipped}{why}")
    return Gate(usable, skipped, uuids, free_mig)
