"""The NVML layer: one small module over nvidia-ml-py (the ``pynvml`` module).

Worker-side only: the daemon never imports this. Every NVML call goes through a
``Session`` so that the backend can be the real library or, in tests, a fake built
from recorded device facts (``FLEETCANARY_FAKE_NVML=/path/facts.json``; see
``probes/testing/nvml_fake.py``). The same code reads both.
"""
from __future__ import annotations

import ctypes
import os
import uuid
from dataclasses import dataclass
from typing import Any

UNKNOWN = "unknown"
FAKE_ENV = "FLEETCANARY_FAKE_NVML"

# Throttle ("clocks event") reason bits, from nvml.h; the label set is this fixed list.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that mean the GPU runs slower than it should (idle and app clocks are benign).
HARMFUL_THROTTLE = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                    "hw_power_brake_slowdown")

# nvmlGpuTopologyLevel_t -> link label (nvidia-smi topo -m vocabulary)
TOPOLOGY_LEVELS: dict[int, str] = {
    0: "same_board",        # NVML_TOPOLOGY_INTERNAL
    10: "pcie_single_switch",  # PIX
    20: "pcie_multi_switch",   # PXB
    30: "pcie_host_bridge",    # PHB
    40: "numa_node",           # NODE: across host bridges within a NUMA node
    50: "cross_socket",        # SYS: across the CPU interconnect
}
LINK_TYPES = ("nvlink", *TOPOLOGY_LEVELS.values(), "unknown")

NVLINK_ERROR_COUNTERS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}
NVLINK_MAX_LINKS = 18

# nvmlGpuFabricState_t (NVML_GPU_FABRIC_STATE_*): a GPU's registration with its NVLink fabric (NVSwitch systems:
# HGX with the fabric manager, NVL72 with NVLink management); the label vocabulary of the fabric record.
FABRIC_STATES: dict[int, str] = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
_NVML_ERROR_NOT_SUPPORTED, _NVML_ERROR_FUNCTION_NOT_FOUND = 3, 13
# What NVML answers for a link index the GPU does not have (NVML_ERROR_INVALID_ARGUMENT past its own link count).
_NVLINK_ABSENT = (_NVML_ERROR_NOT_SUPPORTED, 2)



# nvmlGpuFabricInfo_v2_t.healthMask, from nvml.h (NVML_GPU_FABRIC_HEALTH_MASK_*): field -> (shift, width, values);
# 0 in every field is "not supported" and leaves the field out.
FABRIC_HEALTH_FIELDS: dict[str, tuple[int, int, dict[int, Any]]] = {
    "degraded_bandwidth": (0, 0x3, {1: True, 2: False}),
    "route_recovery": (2, 0x3, {1: True, 2: False}),            # a route recovery is in progress
    "route_unhealthy": (4, 0x3, {1: True, 2: False}),
    "access_timeout_recovery": (6, 0x3, {1: True, 2: False}),
    "incorrect_configuration": (8, 0xF, {1: "none", 2: "incorrect_sysguid", 3: "incorrect_chassis_sn",
                                         4: "no_partition", 5: "insufficient_nvlinks", 6: "incompatible_gpu_fw",
                                         7: "invalid_location", 8: "gpu_state_invalid"}),
    "partition_assigned": (12, 0x3, {1: True, 2: False}),
    "gfm_connected": (14, 0x3, {1: True, 2: False}),             # the global fabric manager (NVL72: NMX) reaches it
}
# Health fields that make a registered fabric unhealthy (value -> not healthy).
FABRIC_UNHEALTHY = {"degraded_bandwidth": True, "route_unhealthy": True, "partition_assigned": False}


def fabric_health(mask: int) -> dict[str, Any]:
    """The fields of a fabric health mask that the GPU supports (a field that reads 0 is left out)."""
    out = {}
    for name, (shift, width, values) in FABRIC_HEALTH_FIELDS.items():
        v = (mask >> shift) & width
        if v:
            out[name] = values.get(v, f"value_{v}")
    return out


def fabric_problems(fabric: dict[str, Any] | None) -> list[str]:
    """What keeps a GPU's NVLink fabric from being ready, in words; [] for a ready fabric or none at all."""
    if not fabric or fabric.get("state") in (None, "not_supported", UNKNOWN):
        return []
    if fabric.get("state") != "completed":
        return [f"state {fabric.get('state')}"]
    out = [] if fabric.get("status") in (None, "success") else [f"status {fabric.get('status')}"]
    health = fabric.get("health") or {}
    out += [f"{k} {str(health[k]).lower()}" for k, bad in FABRIC_UNHEALTHY.items() if health.get(k) == bad]
    cfg = health.get("incorrect_configuration")
    if cfg not in (None, "none"):
        out.append(f"configuration {cfg}")
    return out


def nvlink_domain(fabric: dict[str, Any] | None) -> str:
    """The GPU's NVLink domain, "<cluster UUID>/<clique id>" (what every GPU of one NVL72 rack's NVLink partition
    shares), or "" for a GPU without a registered fabric (no fabric, not completed, or a zero cluster UUID:
    an HGX node's own NVSwitches, a domain of one node)."""
    if not fabric or fabric.get("state") != "completed":
        return ""
    cluster = str(fabric.get("cluster_uuid") or "")
    if not cluster or cluster == str(uuid.UUID(int=0)):
        return ""
    return f"{cluster}/{fabric.get('clique_id')}"


class NvmlUnavailable(Exception):
    """NVML cannot be used here. ``no_driver`` is True when there is simply no GPU driver."""

    def __init__(self, msg: str, no_driver: bool) -> None:
        super().__init__(msg)
        self.no_driver = no_driver


def _backend():
    path = os.environ.get(FAKE_ENV)
    if path:
        from fleetcanary.probes.testing import nvml_fake

        return nvml_fake.FakeNvml.from_file(path)
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as exc:
        raise NvmlUnavailable("nvidia-ml-py is not installed", no_driver=True) from exc
    return pynvml


@dataclass
class GpuHandle:
    index: int
    handle: Any
    lost: bool = False
    error: str = ""


class Session:
    """An initialised NVML. Use as a context manager; shutdown on exit."""

    def __init__(self, lib) -> None:
        self.lib = lib

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.lib.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutdown failures change nothing for the caller
            pass

    # --- small helpers -------------------------------------------------------
    def _try(self, fn, *args, default: Any = UNKNOWN):
        try:
            return fn(*args)
        except self.lib.NVMLError:
            return default

    @staticmethod
    def _str(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    # --- inventory ----------------------------------------------------------
    def device_count(self) -> int:
        return int(self.lib.nvmlDeviceGetCount())

    def handles(self) -> list[GpuHandle]:
        out = []
        for i in range(self.device_count()):
            try:
                h = self.lib.nvmlDeviceGetHandleByIndex(i)
                self.lib.nvmlDeviceGetUUID(h)  # a lost GPU fails here
                out.append(GpuHandle(i, h))
            except self.lib.NVMLError as exc:
                out.append(GpuHandle(i, None, lost=True, error=self._str(exc)))
        return out

    def driver_version(self) -> str:
        return self._str(self._try(self.lib.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> str:
        v = self._try(self.lib.nvmlSystemGetCudaDriverVersion_v2)
        if isinstance(v, int):
            return f"{v // 1000}.{(v % 1000) // 10}"
        return UNKNOWN

    def identity(self, g: GpuHandle) -> dict[str, Any]:
        h, lib = g.handle, self.lib
        pci = self._try(lib.nvmlDeviceGetPciInfo, h, default=None)
        bus_id = self._str(pci.busId) if pci is not None else UNKNOWN
        return {
            "index": g.index,
            "uuid": self._str(self._try(lib.nvmlDeviceGetUUID, h)),
            "model": self._str(self._try(lib.nvmlDeviceGetName, h)),
            "pci_bus_id": bus_id,
            "serial": self._str(self._try(lib.nvmlDeviceGetSerial, h)),
            "vbios": self._str(self._try(lib.nvmlDeviceGetVbiosVersion, h)),
        }

    def memory_total_bytes(self, g: GpuHandle) -> int | str:
        m = self._try(self.lib.nvmlDeviceGetMemoryInfo, g.handle, default=None)
        return int(m.total) if m is not None else UNKNOWN

    def mig_mode(self, g: GpuHandle) -> str:
        v = self._try(self.lib.nvmlDeviceGetMigMode, g.handle, default=None)
        if v is None:
            return "unsupported"
        return "enabled" if v[0] else "disabled"

    def persistence_mode(self, g: GpuHandle) -> str:
        v = self._try(self.lib.nvmlDeviceGetPersistenceMode, g.handle, default=None)
        return UNKNOWN if v is None else ("enabled" if v else "disabled")

    def power_limit_watts(self, g: GpuHandle) -> float | str:
        v = self._try(self.lib.nvmlDeviceGetEnforcedPowerLimit, g.handle, default=None)
        return UNKNOWN if v is None else v / 1000.0

    def clocks_mhz(self, g: GpuHandle) -> dict[str, Any]:
        lib = self.lib
        out = {}
        for name, ctype in (("sm", 1), ("memory", 2)):  # NVML_CLOCK_SM, NVML_CLOCK_MEM
            out[f"{name}_current"] = self._try(lib.nvmlDeviceGetClockInfo, g.handle, ctype)
            out[f"{name}_max"] = self._try(lib.nvmlDeviceGetMaxClockInfo, g.handle, ctype)
        return out

    # --- health --------------------------------------------------------------
    def pcie(self, g: GpuHandle) -> dict[str, Any]:
        lib, h = self.lib, g.handle
        return {
            "gen_current": self._try(lib.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "gen_max": self._try(lib.nvmlDeviceGetMaxPcieLinkGeneration, h),
            "gen_gpu_max": self._try(lib.nvmlDeviceGetGpuMaxPcieLinkGeneration, h),
            "width_current": self._try(lib.nvmlDeviceGetCurrPcieLinkWidth, h),
            "width_max": self._try(lib.nvmlDeviceGetMaxPcieLinkWidth, h),
        }

    def throttle_reasons(self, g: GpuHandle) -> list[str] | str:
        lib = self.lib
        fn = (getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
              or lib.nvmlDeviceGetCurrentClocksThrottleReasons)
        mask = self._try(fn, g.handle, default=None)
        if mask is None:
            return UNKNOWN
        return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]

    def sample(self, g: GpuHandle) -> dict[str, Any]:
        """One reading for a load trace: SM and memory clock (MHz), power (W), temperature (C) and
        the throttle ("clocks event") reason mask; None for what the GPU does not report."""
        lib, h = self.lib, g.handle
        fn = (getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
              or lib.nvmlDeviceGetCurrentClocksThrottleReasons)
        power = self._try(lib.nvmlDeviceGetPowerUsage, h, default=None)
        return {
            "sm_mhz": self._try(lib.nvmlDeviceGetClockInfo, h, 1, default=None),
            "mem_mhz": self._try(lib.nvmlDeviceGetClockInfo, h, 2, default=None),
            "power_w": None if power is None else power / 1000.0,
            "temp_c": self._try(lib.nvmlDeviceGetTemperature, h, 0, default=None),  # NVML_TEMPERATURE_GPU
            "mask": self._try(fn, h, default=None),
        }

    def ecc_errors(self, g: GpuHandle) -> dict[str, Any]:
        lib, h = self.lib, g.handle
        out = {}
        for etype_name, etype in (("corrected", 0), ("uncorrected", 1)):
            for counter_name, counter in (("volatile", 0), ("aggregate", 1)):
                out[f"{etype_name}_{counter_name}"] = self._try(lib.nvmlDeviceGetTotalEccErrors, h, etype, counter)
        return out

    def remapped_rows(self, g: GpuHandle) -> dict[str, Any]:
        v = self._try(self.lib.nvmlDeviceGetRemappedRows, g.handle, default=None)
        if v is None:
            return {"correctable": UNKNOWN, "uncorrectable": UNKNOWN, "pending": UNKNOWN, "failed": UNKNOWN}
        corr, unc, pending, failed = v
        return {"correctable": int(corr), "uncorrectable": int(unc), "pending": int(bool(pending)),
                "failed": int(bool(failed))}

    def nvlinks(self, g: GpuHandle) -> list[dict[str, Any]]:
        """The GPU's NVLink links: state and error counters. A link index NVML answers "not supported" or "invalid
        argument" for is a link this GPU does not have (PCIe cards, indices past the GPU's own count) and is left
        out. A link whose state read fails any other way exists and cannot be shown to be active: it reads as down
        (up 0, the error kept), so a GPU whose every link query fails shows its links down, not no links (the blind
        spot of leptonai/gpud#1085). gpu_health also marks down a GPU that answers "not supported" on every link
        while its node's other GPUs of the model have links, or while it has an NVLink fabric (`absent_links`)."""
        lib, h = self.lib, g.handle
        links = []
        for link in range(NVLINK_MAX_LINKS):
            try:
                state = lib.nvmlDeviceGetNvLinkState(h, link)
            except lib.NVMLError as exc:
                if getattr(exc, "value", None) in _NVLINK_ABSENT:
                    continue
                links.append({"link": link, "up": 0, "errors": {}, "remote_pci_bus_id": UNKNOWN,
                              "error": self._str(exc)})
                continue
            errors = {}
            for cid, cname in NVLINK_ERROR_COUNTERS.items():
                errors[cname] = self._try(lib.nvmlDeviceGetNvLinkErrorCounter, h, link, cid)
            remote = self._try(lib.nvmlDeviceGetNvLinkRemotePciInfo, h, link, default=None)
            links.append({"link": link, "up": int(bool(state)), "errors": errors,
                          "remote_pci_bus_id": self._str(remote.busId) if remote is not None else UNKNOWN})
        return links

    def fabric(self, g: GpuHandle) -> dict[str, Any] | None:
        """The GPU's NVLink fabric (nvmlDeviceGetGpuFabricInfoV, else the v1 call of drivers before 550): state
        (FABRIC_STATES), status ("success", or NVML's error string and code; None until the state is completed,
        NVML says it means nothing before), clique id and cluster UUID. None where the GPU has no fabric: state
        not_supported, the call not supported, or missing from the driver or nvidia-ml-py. A read that fails
        otherwise is state "unknown" with the error (no fault is made of it)."""
        lib = self.lib
        info = None
        for call, struct in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                             ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
            fn, cls = getattr(lib, call, None), getattr(lib, struct, None)
            if fn is None or cls is None:
                continue
            candidate = cls()   # the V struct sets its version in __init__
            try:
                fn(g.handle, ctypes.byref(candidate))
            except lib.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == _NVML_ERROR_FUNCTION_NOT_FOUND:
                    continue        # a driver without this call: try the older one
                if code == _NVML_ERROR_NOT_SUPPORTED:
                    return None
                return {"state": UNKNOWN, "status": None, "clique_id": None, "cluster_uuid": None,
                        "error": self._str(exc)}
            info = candidate
            break
        if info is None or int(info.state) == 0:  # no call for it, or NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
            return None
        state = FABRIC_STATES.get(int(info.state), f"state_{int(info.state)}")
        status = None
        if state == "completed":
            code = int(info.status)
            status = "success" if code == 0 else f"{self._error_string(code)} ({code})"
        out = {"state": state, "status": status, "clique_id": int(info.cliqueId),
               "cluster_uuid": str(uuid.UUID(bytes=bytes(info.clusterUuid)))}
        if hasattr(info, "healthMask"):  # the V (v2) struct, drivers 550 and later
            out["health"] = fabric_health(int(info.healthMask))
        return out

    def _error_string(self, code: int) -> str:
        try:
            return self._str(self.lib.NVMLError(code))
        except Exception:  # noqa: BLE001 - a code this nvidia-ml-py does not know: the number says it
            return "NVML error"

    def utilization_ratio(self, g: GpuHandle) -> float | None:
        u = self._try(self.lib.nvmlDeviceGetUtilizationRates, g.handle, default=None)
        return None if u is None else u.gpu / 100.0

    def compute_processes(self, g: GpuHandle) -> list[int]:
        procs = self._try(self.lib.nvmlDeviceGetComputeRunningProcesses, g.handle, default=[])
        return [int(p.pid) for p in procs]

    # --- MIG and sharing (probes/lib/gpu_gate.py) ----------------------------------------------------------
    # Each call is looked up first: an nvidia-ml-py too old to have one answers "not known", never AttributeError.
    def _call(self, name: str, *args, default: Any = None):
        fn = getattr(self.lib, name, None)
        return default if fn is None else self._try(fn, *args, default=default)

    def minor_number(self, g: GpuHandle) -> int | None:
        """The GPU's minor number (/dev/nvidia<minor>): what NVIDIA's DRA driver names a GPU by."""
        v = self._call("nvmlDeviceGetMinorNumber", g.handle)
        return int(v) if v is not None else None

    def mig_devices(self, g: GpuHandle) -> list[GpuHandle] | None:
        """The MIG devices of a GPU in MIG mode, as handles whose ``index`` is the MIG slot; None where NVML
        cannot list them (the caller then cannot tell which GPU a MIG UUID belongs to)."""
        count = self._call("nvmlDeviceGetMaxMigDeviceCount", g.handle)
        if count is None:
            return None
        out = []
        for i in range(int(count)):
            h = self._call("nvmlDeviceGetMigDeviceHandleByIndex", g.handle, i)
            if h is not None:  # an empty slot: NOT_FOUND
                out.append(GpuHandle(i, h))
        return out

    def uuid(self, g: GpuHandle) -> str:
        return self._str(self._try(self.lib.nvmlDeviceGetUUID, g.handle))

    def mps_processes(self, g: GpuHandle) -> list[int]:
        """Clients of an MPS server on this GPU (NVML lists them apart from the compute processes)."""
        procs = self._call("nvmlDeviceGetMPSComputeRunningProcesses", g.handle, default=[])
        return [int(p.pid) for p in procs or []]

    def process_name(self, pid: int) -> str:
        return self._str(self._call("nvmlSystemGetProcessName", pid, default=""))

    def link_type(self, a: GpuHandle, b: GpuHandle, bus_ids: dict[int, str]) -> str:
        """How two GPUs connect: nvlink (direct or through NVSwitch) or the PCIe topology level."""
        for link in self.nvlinks(a):
            if link["up"] and (link["remote_pci_bus_id"] == bus_ids.get(b.index)
                               or self._is_nvswitch(a, link["link"])):
                return "nvlink"
        level = self._try(self.lib.nvmlDeviceGetTopologyCommonAncestor, a.handle, b.handle, default=None)
        return TOPOLOGY_LEVELS.get(level, UNKNOWN) if level is not None else UNKNOWN

    def _is_nvswitch(self, g: GpuHandle, link: int) -> bool:
        fn = getattr(self.lib, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        if fn is None:
            return False
        t = self._try(fn, g.handle, link, default=None)
        return t == 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH

    def p2p_supported(self, a: GpuHandle, b: GpuHandle) -> bool | None:
        fn = getattr(self.lib, "nvmlDeviceGetP2PStatus", None)
        if fn is None:
            return None
        st = self._try(fn, a.handle, b.handle, 0, default=None)  # NVML_P2P_CAPS_INDEX_READ
        return None if st is None else st == 0  # NVML_P2P_STATUS_OK

    def wait_xid_events(self, gpus: list[GpuHandle], timeout_ms: int) -> list[dict[str, Any]]:
        """Critical XID events during a bounded wait. [] when events are unsupported."""
        lib = self.lib
        try:
            evset = lib.nvmlEventSetCreate()
        except lib.NVMLError:
            return []
        by_handle = {}
        try:
            for g in gpus:
                try:
                    lib.nvmlDeviceRegisterEvents(g.handle, lib.nvmlEventTypeXidCriticalError, evset)
                    by_handle[id(g.handle)] = g.index
                except lib.NVMLError:
                    continue
            events = []
            remaining = timeout_ms
            while remaining > 0 and by_handle:
                try:
                    data = lib.nvmlEventSetWait_v2(evset, remaining)
                except lib.NVMLError:  # timeout: no event
                    break
                gpu = next((g.index for g in gpus if g.handle == data.device), None)
                events.append({"gpu": gpu, "xid": int(data.eventData)})
                remaining = 0 if len(events) > 64 else remaining // 2
            return events
        finally:
            self._try(lib.nvmlEventSetFree, evset)

    def xid_event_stream(self, gpus: list[GpuHandle], wait_ms: int = 5000):
        """Critical XID events for as long as the caller iterates: {"gpu", "xid", "pci_bus_id"} per event, None
        after each `wait_ms` without one (so the caller can look up). Raises NVMLError on anything but a timeout;
        NvmlUnavailable where events are unsupported."""
        lib = self.lib
        try:
            evset = lib.nvmlEventSetCreate()
        except lib.NVMLError as exc:
            raise NvmlUnavailable(f"NVML events unsupported: {exc}") from None
        try:
            bus = {}
            for g in gpus:
                try:
                    lib.nvmlDeviceRegisterEvents(g.handle, lib.nvmlEventTypeXidCriticalError, evset)
                    bus[g.index] = self.identity(g)["pci_bus_id"]
                except lib.NVMLError:
                    continue
            if not bus:
                raise NvmlUnavailable("no GPU takes XID event registrations")
            while True:
                try:
                    data = lib.nvmlEventSetWait_v2(evset, wait_ms)
                except lib.NVMLError as exc:
                    if getattr(exc, "value", None) == lib.NVML_ERROR_TIMEOUT:
                        yield None
                        continue
                    raise
                gpu = next((g.index for g in gpus if g.handle == data.device), None)
                yield {"gpu": gpu, "xid": int(data.eventData), "pci_bus_id": bus.get(gpu, "")}
        finally:
            self._try(lib.nvmlEventSetFree, evset)

    # --- records -------------------------------------------------------------
    def environment_facts(self) -> dict[str, Any]:
        handles = self.handles()
        gpus = []
        for g in handles:
            if g.lost:
                gpus.append({"index": g.index, "lost": True, "error": g.error})
                continue
            gpus.append({**self.identity(g), "memory_bytes": self.memory_total_bytes(g),
                         "power_limit_watts": self.power_limit_watts(g), "clocks_mhz": self.clocks_mhz(g),
                         "persistence_mode": self.persistence_mode(g), "mig_mode": self.mig_mode(g)})
        models = sorted({g.get("model", UNKNOWN) for g in gpus if not g.get("lost")})
        return {
            "gpu_model": models[0] if len(models) == 1 else (",".join(models) or UNKNOWN),
            "gpu_count": len(handles),
            "driver_version": self.driver_version(),
            "cuda_driver_version": self.cuda_driver_version(),
            "gpus": gpus,
        }


def open_session() -> Session:
    lib = _backend()
    try:
        lib.nvmlInit()
    except lib.NVMLError as exc:
        code = getattr(exc, "value", None)
        no_driver = code in (getattr(lib, "NVML_ERROR_LIBRARY_NOT_FOUND", 12),
                             getattr(lib, "NVML_ERROR_DRIVER_NOT_LOADED", 9))
        raise NvmlUnavailable(f"NVML init failed: {Session._str(exc)}", no_driver=no_driver) from exc
    return Session(lib)
