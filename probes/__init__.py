"""The explicit probe map: name -> probe class.

Adding a probe is one module, one line here, one test module. Probe modules must not
import torch, NVML or prometheus_client at module level: the daemon imports this map
for configuration and metric specs, and it never loads those.
"""
from __future__ import annotations

from fleetcanary.probes.base import Probe
from fleetcanary.probes.collectives import Collectives
from fleetcanary.probes.fabric import Fabric
from fleetcanary.probes.gpu_bandwidth import GpuBandwidth
from fleetcanary.probes.gpu_compute import GpuCompute
from fleetcanary.probes.gpu_health import GpuHealth
from fleetcanary.probes.gpu_p2p import GpuP2P
from fleetcanary.probes.gpu_sustained import GpuSustained
from fleetcanary.probes.host_memory_bandwidth import HostMemoryBandwidth
from fleetcanary.probes.inference import Inference
from fleetcanary.probes.nic_health import NicHealth
from fleetcanary.probes.object_storage import ObjectStorage
from fleetcanary.probes.storage import Storage
from fleetcanary.probes.train_step import TrainStep

PROBES: dict[str, type[Probe]] = {
    HostMemoryBandwidth.name: HostMemoryBandwidth,
    GpuHealth.name: GpuHealth,
    NicHealth.name: NicHealth,
    GpuBandwidth.name: GpuBandwidth,
    GpuCompute.name: GpuCompute,
    GpuP2P.name: GpuP2P,
    GpuSustained.name: GpuSustained,
    Collectives.name: Collectives,
    Fabric.name: Fabric,
    Storage.name: Storage,
    ObjectStorage.name: ObjectStorage,
    Inference.name: Inference,
    TrainStep.name: TrainStep,
}

__all__ = ["PROBES", "Probe"]
