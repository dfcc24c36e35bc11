"""The explicit probe map: name -> probe class.

Adding a probe is one module, one line here, one test module. Probe modules must not
import torch, NVML or prometheus_client at module level: the daemon imports this map
for configuration and metric specs, and it never loads those.

The map is built on first use (PEP 562): a probe worker imports only `fleetcanary.probes.base` and its
own probe's module, not all thirteen (about 60 ms of CPU on every probe run, and every run is a new process),
and the XID reader under `fleetcanary.probes.lib` imports neither.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetcanary.probes.base import Probe

    PROBES: dict[str, type[Probe]]

# (module under fleetcanary.probes, class), in the order the map lists them
_ENTRIES = (
    ("host_memory_bandwidth", "HostMemoryBandwidth"),
    ("gpu_health", "GpuHealth"),
    ("nic_health", "NicHealth"),
    ("gpu_bandwidth", "GpuBandwidth"),
    ("gpu_compute", "GpuCompute"),
    ("gpu_p2p", "GpuP2P"),
    ("gpu_sustained", "GpuSustained"),
    ("collectives", "Collectives"),
    ("fabric", "Fabric"),
    ("storage", "Storage"),
    ("object_storage", "ObjectStorage"),
    ("inference", "Inference"),
    ("train_step", "TrainStep"),
)


def _build() -> dict[str, type[Probe]]:
    out: dict[str, type[Probe]] = {}
    for module, cls_name in _ENTRIES:
        cls = getattr(importlib.import_module(f"{__name__}.{module}"), cls_name)
        out[cls.name] = cls
    return out


def __getattr__(name: str) -> Any:
    if name == "PROBES":
        probes = globals()["PROBES"] = _build()
        return probes
    if name == "Probe":  # not at import: a helper under fleetcanary.probes.lib (the XID reader) needs no pydantic
        from fleetcanary.probes.base import Probe
        return Probe
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PROBES", "Probe"]
