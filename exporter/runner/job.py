"""A probe job: what the runner hands a worker (class, parameters, context, deadline)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fleetcanary.probes.base import Probe

RESULT_FD_ENV = "FLEETCANARY_RESULT_FD"
WATCH_FD_ENV = "FLEETCANARY_WATCH_FD"     # the read end of the daemon's life pipe: EOF when the daemon is gone
PARENT_PID_ENV = "FLEETCANARY_PARENT_PID"  # the process that started the worker, for the PDEATHSIG race check
WORKER_MODULE = "fleetcanary.runner.worker"


def class_path(cls: type[Probe]) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def import_path(cls: type[Probe]) -> list[str]:
    """Where a worker must look for a probe class that is not part of fleetcanary (a test's
    own probes): the folder above the class's top-level package. Empty for our own probes,
    so outside tests a worker's import path is exactly the installation's."""
    if cls.__module__ == "fleetcanary" or cls.__module__.startswith("fleetcanary."):
        return []
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if not file:
        return []
    return [str(Path(file).resolve().parents[cls.__module__.count(".")])]


def probe_context(settings, budget_left: dict[str, float] | None = None,
                  kube_ctx: dict[str, Any] | None = None, budget_window_seconds: float = 3600.0,
                  xid_watch_running: bool = False) -> dict[str, Any]:
    """The ProbeContext fields (less the deadline, which the runner sets at start). ``budget_left``
    is per GPU over ``budget_window_seconds``, the probe's own budget window (daemon/scheduler.py);
    ``xid_watch_running``: the daemon's continuous XID watch sees every XID (gpu_health need not wait)."""
    return {
        "node_name": settings.node_name,
        "state_dir": settings.state_dir,
        "gpu": {
            "budget_ratio": settings.gpu.budget_ratio,
            "budget_seconds_per_hour": settings.gpu.budget_ratio * 3600.0,
            "budget_window_seconds": budget_window_seconds,
            "budget_left_seconds": budget_left or {},
            "busy_utilization_ratio": settings.gpu.busy_utilization_ratio,
            "skip_when_compute_processes": settings.gpu.skip_when_compute_processes,
            "expected_count": settings.gpu.expected_count,
            "xid_watch_running": xid_watch_running,
            "xid_overrides": settings.xid.override_map(),
        },
        "kube": kube_ctx or {},
    }


def build(name: str, cls: type[Probe], params: dict[str, Any], context: dict[str, Any],
          collect_gpu_facts: bool = True) -> dict[str, Any]:
    """The job a worker reads from its stdin."""
    return {"name": name, "class": class_path(cls), "params": params, "context": context,
            "collect_gpu_facts": collect_gpu_facts, "import_path": import_path(cls)}
