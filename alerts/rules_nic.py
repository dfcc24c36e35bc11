"""Alerts and runbook text for RDMA ports and Ethernet interfaces (the nic_health probe).

Thresholds, per port and hour (error counters are the HCA's running totals; increase() handles
the resets of a driver reload, and counters_saturated tells when one stopped counting):
- link_downed: any increase. The port retrained or went down; ibdiagnet flags a single one.
- symbol_error, link_error_recovery, port_rcv_errors, port_rcv_remote_physical_errors,
  local_link_integrity_errors, excessive_buffer_overrun_errors: more than 10, the default
  thresholds of infiniband-diags' ibcheckerrs. A few symbol errors an hour on a long HDR/NDR
  link happen on healthy cables; tens an hour is a cable, transceiver or port going bad.
- port_xmit_discards: more than 100 (ibcheckerrs' default): discards also come from congestion
  and from a peer port that went down, so they need more before they mean a bad link.
Ethernet: two carrier flaps (4 carrier changes) in an hour, more than 10 errors in an hour.
Down and missing need no threshold: they wait 5 minutes (several 60 s runs) and fire. alerts/build.py puts them
in their own group, "fleetcanary-nic" (``groups``).

An unused port of a dual-port HCA is down by design: a port that is down counts when it is in
expected_ports, or (with no list configured) when it was up at some time in the last day.

No recording rules: the alerts use increase() directly. A recorded increase would be read by the alert group
one evaluation late or not, as promtool and Prometheus order the groups, and make the values in the
descriptions depend on it.
"""
from __future__ import annotations

from fleetcanary.core.rulesettings import RuleSettings
from fleetcanary.rules.common import Group, Shard, alert

ERRORS_1H = "increase(fleetcanary_rdma_port_errors_total{{counter{sel}}}[1h])"
ERRORS_2H = "increase(fleetcanary_rdma_port_errors_total{{counter{sel}}}[2h])"  # a flap alert holds an hour more
LINE_ERRORS = ("symbol_error|link_error_recovery|port_rcv_errors|port_rcv_remote_physical_errors|"
               "local_link_integrity_errors|excessive_buffer_overrun_errors")
COUNT = '{{ $value | printf "%.0f" }}'  # increase() extrapolates: 4.057 carrier changes reads as 4
PORT = "{{ $labels.device }}/{{ $labels.port }} on {{ $labels.node }}"


def groups(s: RuleSettings, shards: list[Shard]) -> list[Group]:
    return [Group("alerts", "fleetcanary-nic", "hard_interval", alerts(s))]


def alerts(s: RuleSettings) -> list[dict]:
    """The thresholds are settings (rdma_line_errors_per_hour, rdma_discards_per_hour, net_carrier_changes_per_hour,
    net_errors_per_hour)."""
    def a(name, expr, for_, sev, summary, desc):
        return alert(name, " ".join(expr.split()), for_, {"severity": sev}, summary, desc)

    on = "on(node, device, port)"
    return [
        a("FleetCanaryRDMAPortDown",
          # expected: listed in expected_ports, or (no list) up within the last day by the node's own memory
          # (probes/lib/ports_seen: a day of every port's samples each minute was most of this group's cost)
          f"(fleetcanary_rdma_port_up == 0) and {on} (fleetcanary_rdma_port_expected == 1)",
          "5m", "critical", "An RDMA port is down",
          f"Port {PORT} is not ACTIVE with physical state LinkUp; it is expected, or it was up in the last day."),
        a("FleetCanaryRDMAPortMissing", "fleetcanary_rdma_port_present == 0", "5m", "critical",
          "An expected RDMA port is missing",
          f"Port {PORT} is in expected_ports but sysfs does not show it: the HCA or its driver is gone."),
        a("FleetCanaryRDMAPortCountLow",
          "(fleetcanary_rdma_ports_present < on(node) fleetcanary_rdma_ports_expected "
          "or fleetcanary_rdma_ports_present < on(node) max_over_time(fleetcanary_rdma_ports_present[1d])) "
          "unless on(node) (fleetcanary_rdma_port_present == 0)",
          "10m", "warning", "Fewer RDMA ports than expected",
          "{{ $labels.node }} shows {{ $value }} RDMA ports, fewer than configured or than it had in the last day."),
        a("FleetCanaryRDMAPortRateBelowExpected",
          f"fleetcanary_rdma_port_rate_bytes_per_second * 8 / 1e9 and {on} "
          "(fleetcanary_rdma_port_rate_below_expected == 1)",
          "15m", "warning", "An RDMA port trained below its expected rate",
          f"Port {PORT} is up at {{{{ $value }}}} Gb/s, below the rate configured for it (fewer lanes or a lower "
          "speed: a downtrained link)."),
        a("FleetCanaryRDMAPortFlapping", ERRORS_2H.format(sel='="link_downed"') + " > 0", "0m", "warning",
          "An RDMA port went down and retrained",
          f"Port {PORT} counted {COUNT} link-downed events in the last 2 hours."),
        a("FleetCanaryRDMAPortErrorsRising",
          ERRORS_1H.format(sel=f'=~"{LINE_ERRORS}"') + f" > {s.rdma_line_errors_per_hour:g} or "
          + ERRORS_1H.format(sel='="port_xmit_discards"') + f" > {s.rdma_discards_per_hour:g}",
          "10m", "warning", "An RDMA port's error counters are rising",
          f"Port {PORT}: {{{{ $labels.counter }}}} rose by {COUNT} in the last hour (thresholds: "
          f"{s.rdma_line_errors_per_hour:g} an hour, {s.rdma_discards_per_hour:g} for transmit discards)."),
        a("FleetCanaryRDMAPortCountersSaturated", "fleetcanary_rdma_port_counters_saturated > 0", "1h", "info",
          "An RDMA port's error counters stopped counting",
          f"Port {PORT} has {{{{ $value }}}} error counters at their maximum; new errors on it no longer show."),
        a("FleetCanaryNetInterfaceDown",
          "(fleetcanary_net_interface_up == 0) or (fleetcanary_net_interface_present == 0)", "5m", "critical",
          "A watched network interface is down or missing",
          "Interface {{ $labels.interface }} on {{ $labels.node }} is down or does not exist."),
        a("FleetCanaryNetInterfaceFlapping",
          f"max_over_time((increase(fleetcanary_net_interface_carrier_changes_total[1h]) >= "
          f"{s.net_carrier_changes_per_hour:g})[1h:5m])", "0m",
          "warning", "A network interface's link flaps",
          "Interface {{ $labels.interface }} on {{ $labels.node }} changed carrier " + COUNT + " times "
          "in an hour within the last 2 hours (a down and up is 2)."),
        a("FleetCanaryNetInterfaceErrors",
          f"increase(fleetcanary_net_interface_errors_total[1h]) > {s.net_errors_per_hour:g}", "15m", "warning",
          "A network interface counts errors",
          "Interface {{ $labels.interface }} on {{ $labels.node }} counted " + COUNT + " "
          "{{ $labels.direction }} errors in the last hour."),
        a("FleetCanaryNICSysfsUnreadable", "fleetcanary_nic_sysfs_errors > 0", "30m", "warning",
          "Port or interface files cannot be read",
          "nic_health on {{ $labels.node }} could not read or parse {{ $value }} sysfs files; what they hold is "
          "not watched."),
    ]


IBSTAT = "`ibstat` (or `cat /sys/class/infiniband/DEV/ports/N/{state,phys_state,rate}`)"
RUNBOOKS: dict[str, tuple[str, str, str]] = {
    "FleetCanaryRDMAPortDown": (
        "An InfiniBand or RoCE port that should carry traffic is not ACTIVE/LinkUp. Jobs using it fail or fall back "
        "to slower paths; NCCL may hang at init.",
        f"{IBSTAT} on the node; `ibportstate` or the switch side (UFM, `iblinkinfo --down`); `dmesg | grep -i mlx5`; "
        "physical state Polling means no link partner, Disabled means administratively down, LinkUp with state "
        "INIT or ARMED means the subnet manager has not activated it.",
        "An unplugged or broken cable or transceiver, a switch port down, no subnet manager (INIT/ARMED), a "
        "firmware or driver fault after a reset."),
    "FleetCanaryRDMAPortMissing": (
        "A port listed in expected_ports does not exist in sysfs: its HCA is not enumerated or its driver is not "
        "loaded.",
        "`ls /sys/class/infiniband`; `lspci | grep -i mellanox`; `dmesg | grep -i -e mlx5 -e pcie`; `lsmod | grep "
        "mlx5_ib`; whether the device was renamed (rdma-core udev naming).",
        "An HCA that fell off the PCIe bus, a driver that failed to load, a renamed device (update expected_ports), "
        "a firmware upgrade needing a reboot."),
    "FleetCanaryRDMAPortCountLow": (
        "The node shows fewer RDMA ports than expected_port_count, or than it showed at some time in the last day, "
        "and no single expected port explains it.",
        "`ls /sys/class/infiniband`; `lspci | grep -i mellanox`; `dmesg` for mlx5 and PCIe AER errors.",
        "An HCA gone from the bus, a driver reload that failed, a removed card (the alert then clears after a day)."),
    "FleetCanaryRDMAPortRateBelowExpected": (
        "An up port trained below its configured rate: fewer lanes (2X instead of 4X) or a lower speed (EDR instead "
        "of HDR). Every collective through it runs at that rate.",
        f"{IBSTAT}: the width and speed; `mlxlink -d DEV -m` for lane and cable diagnostics; the switch port's "
        "view; compare with the same port on healthy nodes.",
        "A damaged cable or dirty connector losing lanes, a transceiver or cable of a lower grade, a switch port "
        "forced to a lower speed, a port of the wrong expected rate in config (HDR100 is 100 Gb/s on 2X)."),
    "FleetCanaryRDMAPortFlapping": (
        "The port's LinkDownedCounter rose: the link went down and retrained in the last hour. Flaps abort RDMA "
        "connections and stall collectives.",
        "`perfquery -x` on the port (LinkDownedCounter, LinkErrorRecoveryCounter, SymbolErrorCounter); `mlxlink -d "
        "DEV -m -c` for BER and cable info; `dmesg` for 'link down' messages; the switch port's counters.",
        "A marginal cable or transceiver, a switch or HCA port fault, power events on the switch, maintenance on "
        "the fabric (then expected)."),
    "FleetCanaryRDMAPortErrorsRising": (
        "A physical-layer or receive error counter of the port rose past its hourly threshold (10; 100 for "
        "transmit discards): the link corrupts or drops packets and retransmits them.",
        "`perfquery -x` twice a minute apart; `mlxlink -d DEV -m -c` (effective and raw BER, FEC); `ibdiagnet -P "
        "all=1` for the fabric view; the same counters on the switch side of the link.",
        "A bad or dirty cable or transceiver (symbol errors, integrity errors), a failing port, congestion or a "
        "peer that went down (transmit discards), buffer overruns from a misconfigured VL/QoS."),
    "FleetCanaryRDMAPortCountersSaturated": (
        "One or more IBTA error counters of the port reached their maximum (they are 4 to 16 bits wide and stop "
        "there), so new errors no longer raise them and the rising-errors alerts are blind for that port.",
        "`perfquery -x DEV PORT`: which counters; check the link as for rising errors, then clear them with "
        "`perfquery -R`.", "Errors accumulated over a long uptime or a bad link that was never cleared."),
    "FleetCanaryNetInterfaceDown": (
        "A network interface listed in nic_health's interfaces is operationally down or does not exist.",
        "`ip link show IF`; `ethtool IF` (link detected, speed); `dmesg` for the driver; the switch port.",
        "A cable or switch port fault, an interface taken down, a renamed interface (update the config), a "
        "driver that failed to load."),
    "FleetCanaryNetInterfaceFlapping": (
        "The interface lost and regained carrier twice or more in the last hour.",
        "`ip -s link show IF` (carrier_changes); `ethtool -S IF` for link-down and FEC counters; `dmesg` for 'Link "
        "is Down'; the switch port's log.",
        "A marginal cable or transceiver, auto-negotiation trouble, a switch port fault."),
    "FleetCanaryNetInterfaceErrors": (
        "The interface counted more than 10 receive or transmit errors in the last hour.",
        "`ip -s -s link show IF`; `ethtool -S IF` (CRC, FEC, symbol errors); the same counters on the switch port.",
        "A bad cable or transceiver (CRC errors), duplex or speed mismatch, driver or firmware trouble."),
    "FleetCanaryNICSysfsUnreadable": (
        "nic_health could not read or parse some port or interface files for half an hour: those values are "
        "missing from the metrics and the alerts above cannot see them.",
        "`curl -s localhost:9835/results` and read nic_health's `extra.problems` (each file and why); `cat` the "
        "file on the node.",
        "A driver that returns errors for a counter (firmware fault), a kernel with another format, a container "
        "without /sys mounted as expected (sysfs_root)."),
}
