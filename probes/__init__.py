"""The explicit probe map: name -> probe class.

Adding a probe is one module, one line here, one test module. Probe modules must not
import torch, NVML or prometheus_client at module level: the daemon imports this map
for configuration and metric specs, and it never loads those.
"""
from __future__ import annotations

from .base import Probe
from .collectives import Collectives
from .gpu_bandwidth import GpuBandwidth
from .gpu_health import GpuHealth
from .gpu_p2p import GpuP2P
from .host_memory_bandwidth import HostMemoryBandwidth
from .inference import Inference
from .object_storage import ObjectStorage
from .storage import Storage

PROBES: dict[str, type[Probe]] = {
    HostMemoryBandwidth.name: HostMemoryBandwidth,
    GpuHealth.name: GpuHealth,
    GpuBandwidth.name: GpuBandwidth,
    GpuP2P.name: GpuP2P,
    Collectives.name: Collectives,
    Storage.name: Storage,
    ObjectStorage.name: ObjectStorage,
    Inference.name: Inference,
}

__all__ = ["PROBES", "Probe"]
