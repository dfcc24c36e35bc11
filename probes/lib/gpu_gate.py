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
the API server's node-wide view (``gpus_allocated``: some pod requests nvidia.com/gpu) skips every
GPU.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
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


@dataclass
class Gate:
    usable: list[nvml.GpuHandle]
    skipped: dict[int, str] = field(default_factory=dict)  # gpu index -> skip reason

    def record(self) -> dict[str, Any]:
        return {"measured_gpus": [g.index for g in self.usable],
                "skipped_gpus": {str(k): v for k, v in self.skipped.items()}}


def gate(session: nvml.Session, handles: list[nvml.GpuHandle], gpu_ctx: dict[str, Any], kube_ctx: dict[str, Any],
         cost_seconds: float, policy: str = "node") -> Gate:
    """Decide which GPUs an invasive probe may use. Raises ProbeSkipped if none."""
    threshold = float(gpu_ctx.get("busy_utilization_ratio", 0.05))
    check_procs = bool(gpu_ctx.get("skip_when_compute_processes", True))
    budget_left = {str(k): float(v) for k, v in (gpu_ctx.get("budget_left_seconds") or {}).items()}
    allocated = {str(x) for x in (kube_ctx.get("allocated_gpus") or [])}
    allocated_uuids = {str(x) for x in (kube_ctx.get("allocated_gpu_uuids") or [])}
    allocated_mig = bool(kube_ctx.get("allocated_mig_uuids"))
    all_allocated = bool(kube_ctx.get("gpus_allocated"))
    # The kubelet says which GPU each pod holds: an allocated GPU is left out, and under policy "node" only
    # GPUs busy without an allocation (a workload the kubelet does not know) leave the whole node alone.
    per_gpu = "allocated_gpu_uuids" in kube_ctx or "allocated_gpus" in kube_ctx
    me = os.getpid()
    usable, skipped = [], {}
    for g in handles:
        if g.lost:
            skipped[g.index] = "unsupported"
            continue
        uuid = session.identity(g)["uuid"] if allocated_uuids else ""
        # a MIG slice held by a pod: its parent GPU is in use (a GPU in MIG mode is not measured whole anyway)
        mig_held = allocated_mig and session.mig_mode(g) == "enabled"
        if all_allocated or str(g.index) in allocated or uuid in allocated_uuids or mig_held:
            skipped[g.index] = "gpu_allocated"
            continue
        procs = [p for p in session.compute_processes(g) if p != me] if check_procs else []
        util = session.utilization_ratio(g)
        if procs or (util is not None and util > threshold):
            skipped[g.index] = "gpu_busy"
            continue
        if str(g.index) in budget_left and budget_left[str(g.index)] < cost_seconds:
            skipped[g.index] = "budget"
            continue
        usable.append(g)
    busy = {i: r for i, r in skipped.items() if r == "gpu_busy" or (r == "gpu_allocated" and not per_gpu)}
    if policy == "node" and busy:
        reason = Counter(busy.values()).most_common(1)[0][0]
        raise ProbeSkipped(reason, f"GPUs {sorted(busy)} in use; policy 'node' leaves the whole node alone")
    if not usable:
        if not skipped:
            raise ProbeSkipped("no_gpu", "NVML lists no GPU")
        reason = Counter(skipped.values()).most_common(1)[0][0]
        why = (f" ({cost_seconds:g} s needed, left over the last {gpu_ctx.get('budget_window_seconds', 3600):g} s: "
               f"{ {k: round(v, 2) for k, v in budget_left.items()} })" if reason == "budget" else "")
        raise ProbeSkipped(reason, f"no usable GPU: {skipped}{why}")
    return Gate(usable, skipped)
