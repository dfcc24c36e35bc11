"""Read RDMA ports (/sys/class/infiniband) and network interfaces (/sys/class/net) from sysfs.

Written by hand: no maintained Python library reads these trees from a configurable root.
prometheus/procfs (Go, node_exporter's infiniband collector) does; psutil and pyroute2 read
the current network namespace's interfaces through ioctl/netlink (no recorded tree, no
carrier_changes in psutil) and nothing in Python reads the RDMA class. The formats parsed
here are the kernel's (drivers/infiniband/core/sysfs.c, net/core/net-sysfs.c):

    ports/N/state       "4: ACTIVE"                  (NOP, DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER)
    ports/N/phys_state  "5: LinkUp"                  (Sleep, Polling, Disabled, PortConfigurationTraining,
                                                      LinkUp, LinkErrorRecovery, Phy Test)
    ports/N/rate        "400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)", "10 Gb/sec (4X)" (old kernels)
    ports/N/link_layer  "InfiniBand" | "Ethernet"    (RoCE ports say Ethernet)
    ports/N/counters/*, ports/N/hw_counters/*, net/IF/statistics/*, net/IF/carrier_changes: decimal

Every read returns a value or a classified problem; nothing here raises on bad input.
"""
from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field

MAX_READ = 4096
STATE = re.compile(r"^(\d+):\s*([A-Za-z_ ]+)$")
RATE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec \((\d+)X(?: ?([A-Z0-9]+))?\)$")

# IBTA PortCounters error counters the kernel shows under counters/, with their width in bits:
# they saturate (stop) at 2**bits - 1 rather than wrap, so a saturated counter hides new errors.
ERROR_COUNTERS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_xmit_discards": 16,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
}
# Driver hardware counters (hw_counters/, mlx5 names) worth a series: receive-queue drops,
# transport retries and timeouts, RoCE ICRC errors and congestion notifications. Others stay out.
HW_COUNTERS: tuple[str, ...] = (
    "out_of_buffer", "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err",
    "implied_nak_seq_err", "duplicate_request", "rx_icrc_encapsulated", "np_cnp_sent",
    "np_ecn_marked_roce_packets", "rp_cnp_handled", "req_cqe_error", "resp_cqe_error",
)
NET_STATS: tuple[str, ...] = ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped")
PORT_ACTIVE, PHYS_LINK_UP = 4, 5
NAME = re.compile(r"^[A-Za-z0-9_.:@+-]{1,64}$")


def safe_name(name: str) -> bool:
    """A device or interface name that cannot leave its directory."""
    return bool(NAME.match(name)) and name not in (".", "..")


@dataclass
class Problems:
    """Files that could not be read or parsed: path relative to the sysfs root -> why."""

    root: str
    items: dict[str, str] = field(default_factory=dict)

    def add(self, path: str, why: str) -> None:
        self.items.setdefault(os.path.relpath(path, self.root), why)


def read_text(path: str) -> tuple[str | None, str | None]:
    """(text, None), or (None, why): 'absent', 'unreadable: <errno name>' or 'not text'."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_READ)
    except FileNotFoundError:
        return None, "absent"
    except OSError as exc:
        return None, f"unreadable: {errno.errorcode.get(exc.errno or 0, 'error')}"
    try:
        return raw.decode("ascii").strip(), None
    except UnicodeDecodeError:
        return None, "not text"


def read_int(path: str, problems: Problems, required: bool = True) -> int | None:
    """A decimal counter; absent files are a problem only when required."""
    text, why = read_text(path)
    if text is None:
        if why != "absent" or required:
            problems.add(path, why or "absent")
        return None
    try:
        return int(text, 10)
    except ValueError:
        problems.add(path, f"not an integer: {text[:40]!r}")
        return None


def parse_state(text: str) -> tuple[int, str] | None:
    """'4: ACTIVE' -> (4, 'ACTIVE'); phys_state '7: Phy Test' -> (7, 'Phy Test')."""
    m = STATE.match(text)
    return (int(m.group(1)), m.group(2).strip()) if m else None


def parse_rate(text: str) -> tuple[float, int, str] | None:
    """'400 Gb/sec (4X NDR)' -> (400.0, 4, 'NDR'); '10 Gb/sec (4X)' -> (10.0, 4, '')."""
    m = RATE.match(text)
    return (float(m.group(1)), int(m.group(2)), m.group(3) or "") if m else None


@dataclass
class Port:
    device: str
    port: str
    state: tuple[int, str] | None = None
    phys_state: tuple[int, str] | None = None
    rate: tuple[float, int, str] | None = None
    link_layer: str | None = None
    counters: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)

    @property
    def up(self) -> bool | None:
        if self.state is None or self.phys_state is None:
            return None
        return self.state[0] == PORT_ACTIVE and self.phys_state[0] == PHYS_LINK_UP

    @property
    def saturated(self) -> list[str]:
        return sorted(c for c, v in self.counters.items() if v >= 2 ** ERROR_COUNTERS[c] - 1)

    def to_dict(self) -> dict:
        return {"device": self.device, "port": self.port, "state": self.state, "phys_state": self.phys_state,
                "rate": self.rate, "link_layer": self.link_layer, "counters": self.counters,
                "hw_counters": self.hw_counters, "saturated": self.saturated}


def read_field(path: str, parse, problems: Problems):
    text, why = read_text(path)
    if text is None:
        problems.add(path, why or "absent")
        return None
    value = parse(text)
    if value is None:
        problems.add(path, f"unexpected format: {text[:40]!r}")
    return value


def read_port(base: str, device: str, port: str, problems: Problems) -> Port:
    d = os.path.join(base, device, "ports", port)
    p = Port(device, port)
    p.state = read_field(os.path.join(d, "state"), parse_state, problems)
    p.phys_state = read_field(os.path.join(d, "phys_state"), parse_state, problems)
    p.rate = read_field(os.path.join(d, "rate"), parse_rate, problems)
    p.link_layer = read_field(os.path.join(d, "link_layer"), lambda t: t or None, problems)
    # counters/ is absent on some RoCE and virtual devices; hw_counters/ only where the driver has them.
    for sub, names, out in (("counters", ERROR_COUNTERS, p.counters), ("hw_counters", HW_COUNTERS, p.hw_counters)):
        if os.path.isdir(os.path.join(d, sub)):
            for name in names:
                v = read_int(os.path.join(d, sub, name), problems, required=False)
                if v is not None and v >= 0:
                    out[name] = v
    return p


def list_dir(path: str, problems: Problems) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return None
    except OSError as exc:
        problems.add(path, f"unreadable: {errno.errorcode.get(exc.errno or 0, 'error')}")
        return None


def rdma_ports(root: str, devices: list[str], problems: Problems) -> list[Port]:
    """Every port of every RDMA device (or of the named ones) under root/class/infiniband."""
    base = os.path.join(root, "class", "infiniband")
    names = list_dir(base, problems) or []
    if devices:
        names = [n for n in names if n in devices]
    out = []
    for dev in names:
        if not safe_name(dev):
            continue
        ports = list_dir(os.path.join(base, dev, "ports"), problems)
        if ports is None:
            problems.add(os.path.join(base, dev, "ports"), "absent")
            continue
        for port in sorted((p for p in ports if p.isdigit()), key=int):
            out.append(read_port(base, dev, port, problems))
    return out


def device_info(root: str, device: str) -> dict[str, str]:
    """Identity of an RDMA device: hca_type, fw_ver, board_id (empty where the driver has none)."""
    out = {}
    for name in ("hca_type", "fw_ver", "board_id"):
        text, _ = read_text(os.path.join(root, "class", "infiniband", device, name))
        out[name] = (text or "")[:64]
    return out


@dataclass
class Interface:
    name: str
    present: bool
    operstate: str | None = None
    carrier: int | None = None
    speed_mbps: int | None = None
    mtu: int | None = None
    carrier_changes: int | None = None
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def up(self) -> bool | None:
        """operstate up; 'unknown' (drivers that do not report it) counts when the carrier is on."""
        if self.operstate is None:
            return None
        return self.operstate == "up" or (self.operstate == "unknown" and self.carrier == 1)

    def to_dict(self) -> dict:
        return {"interface": self.name, "present": self.present, "operstate": self.operstate,
                "carrier": self.carrier, "speed_mbps": self.speed_mbps, "mtu": self.mtu,
                "carrier_changes": self.carrier_changes, "statistics": self.stats}


def read_interface(root: str, name: str, problems: Problems) -> Interface:
    d = os.path.join(root, "class", "net", name)
    if not os.path.isdir(d):
        return Interface(name, False)
    i = Interface(name, True)
    i.operstate = read_field(os.path.join(d, "operstate"), lambda t: t or None, problems)
    # carrier and speed answer EINVAL while the interface is down, and speed is -1 where unknown:
    # not a problem, just no value.
    text, _ = read_text(os.path.join(d, "carrier"))
    i.carrier = int(text) if text in ("0", "1") else None
    text, _ = read_text(os.path.join(d, "speed"))
    if text is not None and re.fullmatch(r"-?\d+", text) and int(text) > 0:
        i.speed_mbps = int(text)
    i.mtu = read_int(os.path.join(d, "mtu"), problems)
    i.carrier_changes = read_int(os.path.join(d, "carrier_changes"), problems)
    for name_ in NET_STATS:
        v = read_int(os.path.join(d, "statistics", name_), problems)
        if v is not None and v >= 0:
            i.stats[name_] = v
    return i
