"""A fake NVML backend built from recorded device facts (JSON), for tests and demos.

It implements the subset of the ``pynvml`` API that ``fleetcanary.probes.lib.nvml.Session`` calls,
with the same error behaviour: NVMLError carrying NVML's return codes (3 = not
supported, 15 = GPU is lost), so the code under test cannot tell it from the real
library. ``scripts/record-nvml-facts`` writes such a file from a real GPU node.

Facts format (every device field optional; absent means "not supported")::

    {"driver_version": "550.90.07", "cuda_driver_version": 12040,
     "devices": [{"uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:18:00.0",
                  "memory_total": 85520809984, "power_limit_mw": 700000,
                  "clocks": {"sm": 1980, "mem": 2619, "sm_max": 1980, "mem_max": 2619},
                  "persistence": 1, "mig": [0, 0],
                  "pcie": {"gen_current": 5, "gen_max": 5, "gen_gpu_max": 5, "width_current": 16, "width_max": 16},
                  "throttle_mask": 0, "utilization": 0, "processes": [],
                  "ecc": {"corrected_volatile": 0, "uncorrected_volatile": 0,
                          "corrected_aggregate": 0, "uncorrected_aggregate": 0},
                  "remapped_rows": [0, 0, false, false],
                  "nvlinks": [{"state": 1, "remote_bus_id": "...", "remote_type": 2,
                               "errors": {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}}],
                  "fabric": {"state": 3, "status": 0, "clique_id": 1, "cluster_uuid": "8c4d...-...",
                             "health_mask": 0},
                  "lost": false,
                  "power_mw": 650000, "temperature_c": 60,
                  "sequence": [{"sm": 1980, "mem": 2619, "power_mw": 690000, "temperature_c": 61,
                                "throttle_mask": 4}, ...]}],
     "topology": {"0,1": 10},       # common-ancestor level per unordered pair; default "topology_default"
     "topology_default": 40, "p2p_default": 0,
     "xid_events": [{"gpu": 3, "xid": 79}],
     "missing_calls": ["nvmlDeviceGetGpuFabricInfoV"]}   # calls this driver lacks (NVML_ERROR_FUNCTION_NOT_FOUND)

MIG and sharing (per device, optional): ``"minor": 3`` (the /dev/nvidiaN number; default the index),
``"mig_devices": [{"uuid": "MIG-...", "processes": [], "utilization": 0}]`` (the MIG devices of a GPU in MIG
mode, listed by nvmlDeviceGetMigDeviceHandleByIndex; absent: the call is not supported), ``"mps_processes":
[pid]`` (nvmlDeviceGetMPSComputeRunningProcesses) and, at the top level, ``"process_names": {"pid": "name"}``
(nvmlSystemGetProcessName).

``fabric`` is nvmlGpuFabricInfo: state as NVML_GPU_FABRIC_STATE_* (0 not supported .. 3 completed), status an
NVML return code, health_mask nvmlGpuFabricInfo_v2_t's healthMask (the V call only); a device without it answers
NVML_ERROR_NOT_SUPPORTED, as GPUs before Hopper do. A link with ``"error": CODE`` fails every query with that NVML
return code (999 NVML_ERROR_UNKNOWN, 3 not supported, ...).

``sequence`` is a load trace: the n-th read of a field (SM clock, memory clock, power,
temperature, throttle mask) returns the field of the n-th sample, and the last sample
repeats once the trace is used up. Fields a sample leaves out fall back to the device's
static facts. Each field has its own cursor, so a sampler reading every field once per
tick walks the trace one sample per tick whatever the order of its reads.
"""
from __future__ import annotations

import ctypes
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Recorded device facts (HGX H100 nodes healthy, busy, degraded, with a GPU lost; an H200; GB200 trays written by
# hand, fabric ready and not), shipped for the
# tests and `fleetcanary demo`.
FACTS_DIR = Path(__file__).resolve().parent / "nvml_facts"

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value

    def __str__(self) -> str:
        return {NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_GPU_IS_LOST: "GPU is lost",
                NVML_ERROR_TIMEOUT: "Timeout", NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
                NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded", NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
                NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
                NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument Version Mismatch",
                }.get(self.value, f"NVML error {self.value}")


@dataclass
class _Pci:
    busId: str


@dataclass
class _Mem:
    total: int
    free: int
    used: int


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int


@dataclass
class _Event:
    device: Any
    eventType: int
    eventData: int


# nvmlGpuFabricInfo_t and nvmlGpuFabricInfo_v2_t, laid out as nvidia-ml-py's ctypes structures: the caller passes
# one by reference (ctypes.byref) and NVML fills it in, so the fake must take what the real library takes.
_FABRIC_INFO_V2 = 0x02000024


class c_nvmlGpuFabricInfo_t(ctypes.Structure):  # noqa: N801 - nvidia-ml-py's name
    _fields_ = [("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint32),
                ("state", ctypes.c_uint)]


class c_nvmlGpuFabricInfoV_t(ctypes.Structure):  # noqa: N801 - nvidia-ml-py's name
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint32)]

    def __init__(self) -> None:
        super().__init__(version=_FABRIC_INFO_V2)


class _Handle:
    def __init__(self, index: int, facts: dict) -> None:
        self.index = index
        self.facts = facts


class _MigHandle(_Handle):
    """A MIG device: its own facts (uuid, processes, utilization), its parent's lost state."""

    def __init__(self, parent: _Handle, index: int, facts: dict) -> None:
        super().__init__(index, {**facts, "lost": parent.facts.get("lost", False)})
        self.parent = parent


class FakeNvml:
    NVMLError = NVMLError
    c_nvmlGpuFabricInfo_t = c_nvmlGpuFabricInfo_t
    c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfoV_t
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, facts: dict, path: Path | None = None) -> None:
        self.facts = facts
        # "xid_delivery": "once": each recorded XID happens once on the node, at the first wait of any process
        # reading these facts (marker files beside them), as a real XID does; by default every process that
        # waits sees them all (each test's worker gets its events)
        self._once = path if facts.get("xid_delivery") == "once" and path is not None else None
        self.devices = [_Handle(i, d) for i, d in enumerate(facts.get("devices", []))]
        self._events = [dict(e) for e in facts.get("xid_events", [])]
        self._cursor: dict[tuple[int, str], int] = {}
        self.initialised = False

    @classmethod
    def from_file(cls, path: str | Path) -> FakeNvml:
        return cls(json.loads(Path(path).read_text()), Path(path))

    # --- lifecycle --------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.facts.get("init_error"):
            raise NVMLError(int(self.facts["init_error"]))
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    # --- helpers ------------------------------------------------------------------
    def _dev(self, h: _Handle, key: str | None = None) -> Any:
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if h.facts.get("lost"):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if key is None:
            return h.facts
        if key not in h.facts:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return h.facts[key]

    def _seq(self, h: _Handle, field: str, static_key: str, sub: str | None = None) -> Any:
        """The next value of ``field`` from the device's sequence, else its static fact."""
        seq = self._dev(h).get("sequence")
        if seq:
            i = self._cursor.get((h.index, field), 0)
            self._cursor[(h.index, field)] = i + 1
            sample = seq[min(i, len(seq) - 1)]
            if field in sample:
                return sample[field]
        v = self._dev(h, static_key)
        return v[sub] if sub is not None else v

    # --- system -----------------------------------------------------------------------
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.facts.get("driver_version", "")

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        if "cuda_driver_version" not in self.facts:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(self.facts["cuda_driver_version"])

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> _Handle:
        if not 0 <= i < len(self.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.devices[i]

    # --- identity ---------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, h):
        return self._dev(h, "uuid")

    def nvmlDeviceGetName(self, h):
        return self._dev(h, "name")

    def nvmlDeviceGetSerial(self, h):
        return self._dev(h, "serial")

    def nvmlDeviceGetVbiosVersion(self, h):
        return self._dev(h, "vbios")

    def nvmlDeviceGetPciInfo(self, h):
        return _Pci(self._dev(h, "pci_bus_id"))

    def nvmlDeviceGetMemoryInfo(self, h):
        total = int(self._dev(h, "memory_total"))
        return _Mem(total, total, 0)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return int(self._dev(h, "power_limit_mw"))

    def nvmlDeviceGetClockInfo(self, h, ctype):
        key = "sm" if ctype == 1 else "mem"
        return int(self._seq(h, key, "clocks", key))

    def nvmlDeviceGetMaxClockInfo(self, h, ctype):
        c = self._dev(h, "clocks")
        return int(c["sm_max" if ctype == 1 else "mem_max"])

    def nvmlDeviceGetPersistenceMode(self, h):
        return int(self._dev(h, "persistence"))

    def nvmlDeviceGetMigMode(self, h):
        return list(self._dev(h, "mig"))

    # --- health -------------------------------------------------------------------------
    def _pcie(self, h, key):
        p = self._dev(h, "pcie")
        if key not in p:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(p[key])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._pcie(h, "gen_current")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._pcie(h, "gen_max")

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h):
        return self._pcie(h, "gen_gpu_max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._pcie(h, "width_current")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._pcie(h, "width_max")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return int(self._seq(h, "throttle_mask", "throttle_mask"))

    def nvmlDeviceGetPowerUsage(self, h):
        return int(self._seq(h, "power_mw", "power_mw"))

    def nvmlDeviceGetTemperature(self, h, sensor):
        return int(self._seq(h, "temperature_c", "temperature_c"))

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetTotalEccErrors(self, h, etype, counter):
        ecc = self._dev(h, "ecc")
        key = f"{'corrected' if etype == 0 else 'uncorrected'}_{'volatile' if counter == 0 else 'aggregate'}"
        return int(ecc[key])

    def nvmlDeviceGetRemappedRows(self, h):
        corr, unc, pending, failed = self._dev(h, "remapped_rows")
        return int(corr), int(unc), int(bool(pending)), int(bool(failed))

    def _link(self, h, link):
        links = self._dev(h, "nvlinks")
        if not 0 <= link < len(links) or links[link] is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if "error" in links[link]:  # the link's queries fail with this NVML return code
            raise NVMLError(int(links[link]["error"]))
        return links[link]

    def nvmlDeviceGetNvLinkState(self, h, link):
        return int(self._link(h, link)["state"])

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        names = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}
        return int(self._link(h, link).get("errors", {}).get(names[counter], 0))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return _Pci(self._link(h, link).get("remote_bus_id", ""))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return int(self._link(h, link).get("remote_type", 0))

    def _fabric(self, call: str, h, ref) -> None:
        if call in self.facts.get("missing_calls", ()):
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        f = self._dev(h, "fabric")
        info = ref._obj  # what ctypes.byref points at
        if isinstance(info, c_nvmlGpuFabricInfoV_t) and info.version != _FABRIC_INFO_V2:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        info.state, info.status, info.cliqueId = int(f["state"]), int(f.get("status", 0)), int(f.get("clique_id", 0))
        raw = uuid.UUID(f["cluster_uuid"]).bytes if f.get("cluster_uuid") else bytes(16)
        info.clusterUuid[:] = list(raw)
        if isinstance(info, c_nvmlGpuFabricInfoV_t):
            info.healthMask = int(f.get("health_mask", 0))

    def nvmlDeviceGetGpuFabricInfoV(self, h, ref):
        self._fabric("nvmlDeviceGetGpuFabricInfoV", h, ref)

    def nvmlDeviceGetGpuFabricInfo(self, h, ref):
        self._fabric("nvmlDeviceGetGpuFabricInfo", h, ref)

    def nvmlDeviceGetUtilizationRates(self, h):
        return _Util(int(self._dev(h, "utilization")), 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [_Proc(int(p), 0) for p in self._dev(h, "processes")]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h):
        return [_Proc(int(p), 0) for p in self._dev(h).get("mps_processes", [])]

    def nvmlSystemGetProcessName(self, pid):
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        name = (self.facts.get("process_names") or {}).get(str(pid))
        if name is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return name

    def nvmlDeviceGetMinorNumber(self, h):
        return int(self._dev(h).get("minor", h.index))

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return max(7, len(self._dev(h, "mig_devices")))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        devs = self._dev(h, "mig_devices")
        if i >= len(devs):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _MigHandle(h, i, devs[i])

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h):
        return h.parent

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        self._dev(a)
        self._dev(b)
        topo = self.facts.get("topology", {})
        key = f"{min(a.index, b.index)},{max(a.index, b.index)}"
        return int(topo.get(key, self.facts.get("topology_default", 40)))

    def nvmlDeviceGetP2PStatus(self, a, b, caps):
        self._dev(a)
        self._dev(b)
        p2p = self.facts.get("p2p", {})
        return int(p2p.get(f"{a.index},{b.index}", self.facts.get("p2p_default", 0)))

    # --- events ---------------------------------------------------------------------------
    def nvmlEventSetCreate(self):
        return {"handles": []}

    def nvmlDeviceRegisterEvents(self, h, types, evset):
        self._dev(h)
        evset["handles"].append(h)

    def nvmlEventSetWait_v2(self, evset, timeout_ms):
        registered = {h.index for h in evset["handles"]}
        for i, e in enumerate(self._events):
            if e["gpu"] in registered:
                self._events.pop(i)
                if self._once is not None and not self._first_to_see(e):
                    return self.nvmlEventSetWait_v2(evset, timeout_ms)
                return _Event(self.devices[e["gpu"]], self.nvmlEventTypeXidCriticalError, int(e["xid"]))
        time.sleep(max(timeout_ms, 0) / 1000)  # NVML blocks for the timeout when no event comes (a waiter's loop
        raise NVMLError(NVML_ERROR_TIMEOUT)     # would spin on a fake that returned at once)

    def _first_to_see(self, event: dict) -> bool:
        marker = self._once.with_name(f"{self._once.name}.xid-{event['gpu']}-{event['xid']}")
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            return True
        except FileExistsError:
            return False

    def nvmlEventSetFree(self, evset):
        evset["handles"].clear()
