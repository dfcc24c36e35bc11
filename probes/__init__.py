"""The explicit probe map: name -> probe class.

Adding a probe is one module, one line here, one test module. Probe modules must not
import torch, NVML or prometheus_client at module level: the daemon imports this map
for configuration and metric specs, and it never loads those.
"""
from __future__ import annotations

from .base import Probe
from .host_memory_bandwidth import HostMemoryBandwidth

PROBES: dict[str, type[Probe]] = {
    HostMemoryBandwidth.name: HostMemoryBandwidth,
}

__all__ = ["PROBES", "Probe"]
