"""GPUs given to pods through Dynamic Resource Allocation (DRA), as the kubelet's pod-resources API lists them
(ContainerResources.dynamic_resources: driver, pool, device name and CDI devices of each allocated device) and
as the API server records them (ResourceClaim status.allocation.devices.results).

What a DRA device name means is the driver's business. NVIDIA's DRA driver (`gpu.nvidia.com`,
k8s-dra-driver-gpu) names a whole GPU `gpu-<n>` and a MIG device `gpu-<n>-mig-<...>`; older releases took
<n> from the NVML index, newer ones from the GPU's minor number (/dev/nvidia<n>), and the MIG suffix changed
form (profile ID and placement, then the profile name). Its CDI device names
(`k8s.gpu.nvidia.com/claim=<claim UID>-<device name>`) carry no more than the device name. So the name alone
cannot say which GPU a device is. The driver's ResourceSlices can: each device publishes the attributes
`type` (gpu, mig), `uuid`, `index`, `minor` and, for a MIG device, `parentUUID`. The mapping is therefore:

1. this node's ResourceSlices (read by daemon/kube.py with the field selector spec.nodeName=NODE,
   resource.k8s.io v1, else v1beta2, else v1beta1): (driver, pool, device) -> GPU UUID, or MIG UUID and its
   parent's UUID. Exact on every driver release, and it needs only `list` on resourceslices.
2. Where no slice names the device (RBAC without resourceslices, the API server unreachable, a slice not yet
   read): the name, read the way the current driver writes it: `gpu-<n>` and `gpu-<n>-mig-...` name GPU minor
   <n>, which the probe worker's gate maps to an NVML device by its minor number (nvmlDeviceGetMinorNumber).
3. A device of a GPU driver that neither names (another naming scheme, a newer driver): every GPU counts as
   held (`unmapped` > 0) rather than a tenant's GPU counting as free.

Devices of other drivers (a NIC's DRA driver, say) are not GPUs and are ignored; `kubernetes.dra_gpu_drivers`
lists the drivers whose devices are GPUs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

NVIDIA_DRIVER = "gpu.nvidia.com"
GPU_NAME = re.compile(r"^gpu-(\d+)$")
MIG_NAME = re.compile(r"^gpu-(\d+)-mig-[a-z0-9][a-z0-9.-]*$")
UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{1,80}$")


@dataclass(frozen=True)
class SliceDevice:
    """What a ResourceSlice says of one device."""

    type: str = ""            # "gpu" or "mig" (NVIDIA's driver); "" when not published
    uuid: str = ""
    parent_uuid: str = ""     # a MIG device's GPU
    index: int | None = None
    minor: int | None = None


@dataclass
class SliceMap:
    """(driver, pool, device name) -> SliceDevice, for this node's ResourceSlices."""

    devices: dict[tuple[str, str, str], SliceDevice] = field(default_factory=dict)
    api_version: str = ""     # the resource.k8s.io version they were read with

    def get(self, driver: str, pool: str, device: str) -> SliceDevice | None:
        return self.devices.get((driver, pool, device))


def _attr(attrs: dict[str, Any], name: str, driver: str) -> Any:
    """An attribute's value: {"string": ..} / {"int": ..} / {"version": ..} / {"bool": ..}, by its short name or
    qualified with the driver's domain."""
    a = attrs.get(name)
    if a is None:
        a = attrs.get(f"{driver}/{name}")
    if not isinstance(a, dict):
        return None
    for k in ("string", "int", "version", "bool"):
        if k in a:
            return a[k]
    return None


def slice_map(items: list[dict[str, Any]], drivers: tuple[str, ...] = (NVIDIA_DRIVER,),
              api_version: str = "") -> SliceMap:
    """ResourceSlice objects (as JSON dicts) -> a SliceMap of the GPU drivers' devices. v1 and v1beta2 put
    `attributes` on the device, v1beta1 under `basic`. Devices whose `uuid` is not a GPU or MIG UUID are left
    out (the name fallback applies to them)."""
    out = SliceMap(api_version=api_version)
    def obj(v) -> dict:
        return v if isinstance(v, dict) else {}

    for s in items if isinstance(items, list) else []:
        spec = obj(obj(s).get("spec"))
        driver = spec.get("driver")
        if not isinstance(driver, str) or driver not in drivers:
            continue
        pool = obj(spec.get("pool")).get("name")
        pool = pool if isinstance(pool, str) else ""
        devices = spec.get("devices")
        for dev in devices if isinstance(devices, list) else []:
            if not isinstance(dev, dict) or not isinstance(dev.get("name"), str) or not dev["name"]:
                continue
            attrs = obj(dev.get("attributes")) or obj(obj(dev.get("basic")).get("attributes"))
            uuid = str(_attr(attrs, "uuid", driver) or "")
            if not UUID.match(uuid):
                continue
            parent = str(_attr(attrs, "parentUUID", driver) or "")
            idx, minor = _attr(attrs, "index", driver), _attr(attrs, "minor", driver)
            idx, minor = (v if isinstance(v, int) and not isinstance(v, bool) else None for v in (idx, minor))
            out.devices[(driver, pool, dev["name"])] = SliceDevice(
                type=str(_attr(attrs, "type", driver) or ("mig" if uuid.startswith("MIG-") else "gpu")),
                uuid=uuid, parent_uuid=parent if UUID.match(parent) else "",
                index=idx, minor=minor)
    return out


@dataclass(frozen=True)
class Device:
    """One allocated DRA device."""

    driver: str
    pool: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"


@dataclass
class Resolved:
    gpu_uuids: set[str] = field(default_factory=set)
    mig_uuids: set[str] = field(default_factory=set)
    gpu_minors: set[int] = field(default_factory=set)   # from names: the worker maps them with NVML
    unmapped: list[str] = field(default_factory=list)   # driver/pool/device keys neither way placed


def resolve(devices, slices: SliceMap | None) -> Resolved:
    """Allocated GPU-driver devices -> the GPUs they hold: by slice, else by name (module docstring)."""
    out = Resolved()
    for d in devices:
        s = slices.get(d.driver, d.pool, d.name) if slices is not None else None
        if s is not None:
            if s.uuid.startswith("MIG-"):
                out.mig_uuids.add(s.uuid)    # its parent is found by the gate (NVML), and by the slice:
                if s.parent_uuid:
                    out.gpu_uuids.add(s.parent_uuid)
            else:
                out.gpu_uuids.add(s.uuid)
            continue
        m = GPU_NAME.match(d.name) or MIG_NAME.match(d.name)
        if m and d.driver == NVIDIA_DRIVER:
            out.gpu_minors.add(int(m.group(1)))
        else:
            out.unmapped.append(d.key)
    return out
