"""NIC and port health from sysfs: RDMA (InfiniBand and RoCE) ports and configured Ethernet interfaces.

Every port under <sysfs_root>/class/infiniband and every configured interface under
<sysfs_root>/class/net.

Non-invasive (reads a few hundred small files, sends nothing), so it runs on every node every
minute. Per RDMA port: its identity (link layer, and its device's HCA type, firmware and board),
up (ACTIVE and LinkUp), rate and width against the expected rate and the IBTA error counters
(what the alerts read); with no expected_ports list, a port down now that was up within the last day
is expected (the node's memory of its ports in the state directory, probes/lib/ports_seen, which the
port-down alert reads instead of a day of Prometheus samples); a port that is expected but absent
(present 0) and a port with saturated counters have a series for that, a healthy port none; opt-in,
the logical and physical state as 0/1 series per state (``port_states``) and a bounded set of driver
hardware counters (``hw_counters``), which no rule reads and which cost 13 and 13 series a port; per
interface: operational state, speed, MTU, carrier changes, errors and drops. Ports expected but absent are reported
(present 0), files that cannot be read or parsed are counted and named in the record; neither
stops the run. Counters are the kernel's running totals, published as cumulative counters:
rules use increase()/rate() on them. Of the IBTA error counters, link_downed is published from 0
(the flap alert fires on any increase, and increase() misses the first event of a series born
above 0); the others only while above 0 (8 ports x 7 counters that stay at 0 on a healthy node;
their alerts want 10 or 100 an hour).

Reading the error counters of an InfiniBand port makes the kernel query the HCA's performance
management agent; it neither resets them nor disturbs traffic.
"""
from __future__ import annotations

import os
import re
import time
from typing import ClassVar

from pydantic import Field, field_validator

from fleetcanary.probes.base import (
    MetricSpec,
    Probe,
    ProbeConfig,
    ProbeContext,
    ProbeError,
    ProbeResult,
    ProbeSkipped,
    Sample,
)
from fleetcanary.probes.lib import nic_sysfs as sysfs
from fleetcanary.probes.lib import ports_seen

R = "fleetcanary_rdma_port_"
N = "fleetcanary_net_interface_"
DP = ("device", "port")
PORT_KEY = re.compile(r"^[A-Za-z0-9_.:@+-]{1,64}/\d{1,3}$")
# IB PortState and PortPhysicalState codes -> label values (a fixed set, one series each).
STATES = {0: "nop", 1: "down", 2: "init", 3: "armed", 4: "active", 5: "active_defer"}
PHYS_STATES = {1: "sleep", 2: "polling", 3: "disabled", 4: "port_configuration_training", 5: "link_up",
               6: "link_error_recovery", 7: "phy_test"}


def _gbps(v: float) -> float:
    return v * 1e9 / 8


class Config(ProbeConfig):
    sysfs_root: str = Field("/sys", description="Where sysfs is mounted; tests point it at a recorded tree.")
    devices: list[str] = Field(
        default_factory=list, description="RDMA devices to watch (e.g. mlx5_0). Empty: every device present.")
    expected_ports: list[str] = Field(
        default_factory=list, description="RDMA ports this node must have, as DEVICE/PORT (mlx5_0/1); "
        "a missing one is reported with present 0.")
    expected_port_count: int | None = Field(
        None, ge=0, description="RDMA ports this node must have, when names differ between nodes. "
        "None: the length of expected_ports (when set).")
    expected_rate_gbps: float | None = Field(
        None, gt=0, description="Expected rate of every RDMA port in Gb/s as sysfs shows it (NDR 4X: 400, "
        "HDR 4X: 200, HDR100: 100). None: no rate check.")
    port_rates_gbps: dict[str, float] = Field(
        default_factory=dict, description="Expected rate in Gb/s per port (DEVICE/PORT), over expected_rate_gbps.")
    interfaces: list[str] = Field(
        default_factory=list, description="Ethernet interfaces to watch (e.g. eth0, ens1f0np0); a missing one "
        "is reported with present 0.")
    port_states: bool = Field(
        False, description="Opt-in: each RDMA port's logical and physical state as one 0/1 series per state "
        "(fleetcanary_rdma_port_state, fleetcanary_rdma_port_physical_state: 13 series a port). Off: "
        "fleetcanary_rdma_port_up only; the states are in the run record.")
    hw_counters: bool = Field(
        False, description="Opt-in: the driver hardware counters of each RDMA port "
        "(fleetcanary_rdma_port_hw_events_total: receive drops, retries and timeouts, ICRC errors, congestion "
        "notifications; up to 13 series a port). Off: they are read into the run record only.")

    @field_validator("devices", "interfaces")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if not sysfs.safe_name(x)]
        if bad:
            raise ValueError(f"not a device or interface name: {bad}")
        return v

    @field_validator("expected_ports")
    @classmethod
    def _ports(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if not PORT_KEY.match(x) or not sysfs.safe_name(x.split("/")[0])]
        if bad:
            raise ValueError(f"ports are DEVICE/PORT (mlx5_0/1), got {bad}")
        return v

    @field_validator("port_rates_gbps")
    @classmethod
    def _rates(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [k for k, r in v.items() if not PORT_KEY.match(k) or not sysfs.safe_name(k.split("/")[0]) or r <= 0]
        if bad:
            raise ValueError(f"keys are DEVICE/PORT (mlx5_0/1) and rates positive Gb/s, got {bad}")
        return v


class NicHealth(Probe):
    name = "nic_health"
    Config = Config
    failure_reasons = ("sysfs_unreadable",)
    reason_docs: ClassVar[dict[str, str]] = {
        "sysfs_unreadable": "sysfs_root has no class/ directory (wrong sysfs_root, or sysfs not mounted)."}
    default_interval_seconds = 60.0
    default_timeout_seconds = 30.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(R + "info", "gauge", "RDMA port identity, one series per port that exists: its link layer "
                   "(InfiniBand, or Ethernet for RoCE) and its device's HCA type, firmware version and board id "
                   "(empty where the driver has none); value 1.", "info",
                   DP + ("link_layer", "link_width", "hca_type", "fw_ver", "board_id")),
        MetricSpec(R + "present", "gauge", "0 for a port in expected_ports that does not exist; a port that exists "
                   "has no series (fleetcanary_rdma_port_info has it).", "boolean", DP),
        MetricSpec(R + "expected", "gauge", "1 if the port is in expected_ports, 0 if present but not listed; "
                   "with no list, 1 for a port down now that was up within the last day (the node's memory in its "
                   "state directory), absent for the others.", "boolean", DP),
        MetricSpec(R + "up", "gauge", "1 if the port is ACTIVE with physical state LinkUp.", "boolean", DP),
        MetricSpec(R + "state", "gauge", "1 for the port's current logical state (IB PortState), 0 for the others; "
                   "with port_states only.", "boolean", DP + ("state",)),
        MetricSpec(R + "physical_state", "gauge", "1 for the port's current physical state, 0 for the others; with "
                   "port_states only.", "boolean", DP + ("state",)),
        MetricSpec(R + "rate_bytes_per_second", "gauge", "Signalling rate the port trained at (sysfs rate).",
                   "bytes_per_second", DP),
        MetricSpec(R + "expected_rate_bytes_per_second", "gauge", "The rate configured as expected for the port.",
                   "bytes_per_second", DP),
        MetricSpec(R + "rate_below_expected", "gauge", "1 if an up port trained below its expected rate "
                   "(a downtrained link: fewer lanes or a lower speed).", "boolean", DP),
        MetricSpec(R + "errors_total", "counter", "IBTA port error counters as the HCA counts them (counters/): "
                   "link_downed from 0 (the flap alert reads any increase), the others while above 0.",
                   "total", DP + ("counter",), cumulative=True, zero_published=((("counter", "link_downed"),),)),
        MetricSpec(R + "hw_events_total", "counter", "Driver hardware counters of the port (hw_counters/): "
                   "receive drops, transport retries and timeouts, ICRC errors, congestion notifications; with "
                   "hw_counters only.", "total", DP + ("counter",), cumulative=True),
        MetricSpec(R + "counters_saturated", "gauge", "Error counters of the port stuck at their maximum (they "
                   "saturate, so new errors no longer show until they are cleared); no series while none is.",
                   "count", DP),
        MetricSpec("fleetcanary_rdma_ports_present", "gauge", "RDMA ports found on this node.", "count"),
        MetricSpec("fleetcanary_rdma_ports_up", "gauge", "RDMA ports ACTIVE and LinkUp on this node.", "count"),
        MetricSpec("fleetcanary_rdma_ports_expected", "gauge", "RDMA ports this node should have, from config; "
                   "absent when not configured.", "count"),
        MetricSpec(N + "present", "gauge", "1 if the configured interface exists.", "boolean", ("interface",)),
        MetricSpec(N + "up", "gauge", "1 if the interface's operational state is up (or unknown with carrier).",
                   "boolean", ("interface",)),
        MetricSpec(N + "speed_bytes_per_second", "gauge", "Link speed the interface reports; absent where the "
                   "kernel gives none (interface down, speed unknown).", "bytes_per_second", ("interface",)),
        MetricSpec(N + "mtu_bytes", "gauge", "MTU of the interface.", "bytes", ("interface",)),
        MetricSpec(N + "carrier_changes_total", "counter", "Carrier transitions (a down and up again is 2).",
                   "total", ("interface",), cumulative=True),
        MetricSpec(N + "errors_total", "counter", "Receive or transmit errors the driver counted.", "total",
                   ("interface", "direction"), cumulative=True),
        MetricSpec(N + "dropped_total", "counter", "Received or transmitted packets dropped.", "total",
                   ("interface", "direction"), cumulative=True),
        MetricSpec("fleetcanary_nic_sysfs_errors", "gauge", "Port and interface files the last run could not "
                   "read or parse, and its own memory of the ports up (probes/lib/ports_seen) where it could not "
                   "read or write it (each named in the run record).", "count"),
    )

    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        root = config.sysfs_root
        if not os.path.isdir(os.path.join(root, "class")):
            raise ProbeError("sysfs_unreadable", f"{root}/class is not a directory")
        problems = sysfs.Problems(root)
        expected = list(dict.fromkeys(config.expected_ports))
        devices = sorted(set(config.devices) | {k.split("/")[0] for k in expected}) if config.devices else []
        ports = sysfs.rdma_ports(root, devices, problems)
        n_expected = config.expected_port_count if config.expected_port_count is not None else \
            (len(expected) if expected else None)
        if not ports and not expected and not n_expected and not config.interfaces:
            raise ProbeSkipped("not_configured", f"no RDMA port under {root}/class/infiniband and no interfaces "
                               "configured")
        samples: list[Sample] = []

        def add(m: str, labels: dict, v: float) -> None:
            samples.append(Sample(m, labels, float(v)))

        devices = {dev: sysfs.device_info(root, dev) for dev in sorted({p.device for p in ports})}
        present = {f"{p.device}/{p.port}" for p in ports}
        for p in ports:
            self._port(config, p, add, expected, devices[p.device])
        missing = [k for k in expected if k not in present]
        for key in missing:
            dev, port = key.split("/")
            add(R + "present", {"device": dev, "port": port}, 0)
            add(R + "expected", {"device": dev, "port": port}, 1)
        if ports:
            self._remember(ctx.state_dir, ports, add, expected, problems)
        add("fleetcanary_rdma_ports_present", {}, len(ports))
        add("fleetcanary_rdma_ports_up", {}, sum(1 for p in ports if p.up))
        if n_expected is not None:
            add("fleetcanary_rdma_ports_expected", {}, n_expected)
        interfaces = [sysfs.read_interface(root, name, problems) for name in dict.fromkeys(config.interfaces)]
        for i in interfaces:
            self._interface(i, add)
        add("fleetcanary_nic_sysfs_errors", {}, len(problems.items))
        return ProbeResult(
            samples=samples, parameters=config.model_dump(),
            touched={"sysfs_root": root, "rdma_ports": sorted(present), "interfaces": list(config.interfaces),
                     "invasive": False},
            extra={"ports": [p.to_dict() for p in ports], "missing_ports": missing,
                   "interfaces": [i.to_dict() for i in interfaces], "problems": problems.items})

    @staticmethod
    def _remember(state_dir: str, ports: list[sysfs.Port], add, expected: list[str], problems) -> None:
        """Without an expected_ports list, a port down now that was up within the last day is expected (1): the
        node's memory of its ports (probes/lib/ports_seen), kept with or without a list."""
        now = time.time()
        seen, why = ports_seen.load(state_dir)
        if not expected:
            for p in ports:
                if p.up is False and ports_seen.recently_up(seen, f"{p.device}/{p.port}", now):
                    add(R + "expected", {"device": p.device, "port": p.port}, 1)
        seen, changed = ports_seen.update(seen, [f"{p.device}/{p.port}" for p in ports if p.up], now)
        if changed:
            why = ports_seen.save(state_dir, seen) or why
        if why:
            problems.items.setdefault(str(ports_seen.path(state_dir)), why)

    @staticmethod
    def _port(config: Config, p: sysfs.Port, add, expected: list[str], device: dict[str, str]) -> None:
        dp = {"device": p.device, "port": p.port}
        key = f"{p.device}/{p.port}"
        if expected:
            add(R + "expected", dp, 1 if key in expected else 0)
        width = str(p.rate[1]) if p.rate is not None else ""
        add(R + "info", {**dp, "link_layer": (p.link_layer or "")[:32], "link_width": width, **device}, 1)
        if config.port_states:
            for metric, value, names in ((R + "state", p.state, STATES),
                                         (R + "physical_state", p.phys_state, PHYS_STATES)):
                if value is not None:
                    for code, label in names.items():
                        add(metric, {**dp, "state": label}, 1 if value[0] == code else 0)
        if p.up is not None:
            add(R + "up", dp, 1 if p.up else 0)
        want = config.port_rates_gbps.get(key, config.expected_rate_gbps)
        if want is not None:
            add(R + "expected_rate_bytes_per_second", dp, _gbps(want))
        if p.rate is not None:
            gbps, _, _ = p.rate
            add(R + "rate_bytes_per_second", dp, _gbps(gbps))
            # A down port's rate is whatever it last negotiated or a default: judged only while up.
            if want is not None and p.up:
                add(R + "rate_below_expected", dp, 1 if gbps < want else 0)
        for name, v in p.counters.items():
            add(R + "errors_total", {**dp, "counter": name}, v)
        if config.hw_counters:
            for name, v in p.hw_counters.items():
                add(R + "hw_events_total", {**dp, "counter": name}, v)
        if p.saturated:  # the alert reads > 0
            add(R + "counters_saturated", dp, len(p.saturated))

    @staticmethod
    def _interface(i: sysfs.Interface, add) -> None:
        lab = {"interface": i.name}
        add(N + "present", lab, 1 if i.present else 0)
        if not i.present:
            return
        if i.up is not None:
            add(N + "up", lab, 1 if i.up else 0)
        if i.speed_mbps is not None:
            add(N + "speed_bytes_per_second", lab, i.speed_mbps * 1e6 / 8)
        if i.mtu is not None:
            add(N + "mtu_bytes", lab, i.mtu)
        if i.carrier_changes is not None:
            add(N + "carrier_changes_total", lab, i.carrier_changes)
        for direction in ("rx", "tx"):
            for kind, metric in (("errors", N + "errors_total"), ("dropped", N + "dropped_total")):
                v = i.stats.get(f"{direction}_{kind}")
                if v is not None:
                    add(metric, {**lab, "direction": direction}, v)
