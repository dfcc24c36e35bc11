"""Recording rules, alerts and runbook text for the cross-node fabric probe.

Imported by alerts/build.py (``groups``: a "fleetcanary-fabric" recording group and alert group).
docs/fabric.md explains the localization; in short:

- The probe publishes only the latest pair's figures (no per-peer label on figure series),
  the latest partner as one info series, and the start of the slot the figures belong to.
  A figure is *current* while ``time() - pair_slot_timestamp < slot_seconds``: a skipped slot
  leaves the old figure in /metrics but not current, so skips are never read as slowness.
- Per evaluation, each current pair figure (send/recv bandwidth) is compared with the pool's
  reference (a high quantile of all current figures: a slow node drags down its own figure and
  its partner's, up to half of a small fleet's, so the median would follow it), and the verdict
  is written onto the latest partner's info series: one (node, partner) series per meeting.
- Over WINDOW, the distinct partners a node was measured with are those series; a partner
  counts as slow when the pair was slow for most of their meetings in the window.
- FleetCanaryFabricNodeSlow: at least fabric_min_partners (3) distinct partners measured and more than
  half of them slow. A slow node is slow with all of its partners; each of its partners is
  slow with one (it), so only the culprit fires. One bad link between two good nodes makes
  each of them slow with one partner: neither fires.
- FleetCanaryFabricNodeUnreachable: most of a node's meeting attempts ended without its
  partner (peer_unavailable skips), at least fabric_min_partners of them, while the pool's median node
  mostly meets its partners (so a pool whose GPUs are all busy does not fire on its idle node).

Prometheus 2.42: nothing experimental.
"""
from __future__ import annotations

from fleetcanary.core.rulesettings import RuleSettings
from fleetcanary.rules.common import Group, Shard, alert, record

WINDOW = "1h"              # several slots: 12 at the default 300 s slot
# The thresholds are settings (fleetcanary.core.rulesettings): fabric_min_partners (3, distinct partners measured
# before any verdict), fabric_slow_ratio (0.7: a pair below this share of the pool reference is slow),
# fabric_reference_quantile (0.75: the pool reference, a healthy pair's figure even when 2 of 4 figures are slow),
# fabric_unreachable_share (0.5).

CURRENT = "node:fleetcanary_fabric_pair_bandwidth:current"
REFERENCE = "pool:fleetcanary_fabric_pair_bandwidth:reference"
RATIO = "node:fleetcanary_fabric_pair_bandwidth:reference_ratio"
SLOW = "node_partner:fleetcanary_fabric_pair_slow:bool"
MEASURED = f"node:fleetcanary_fabric_partners_measured:count{WINDOW}"
SLOW_COUNT = f"node:fleetcanary_fabric_partners_slow:count{WINDOW}"
SLOW_SHARE = f"node:fleetcanary_fabric_partners_slow:ratio{WINDOW}"
UNAVAILABLE = f"node:fleetcanary_fabric_peer_unavailable:count{WINDOW}"
UNAVAILABLE_SHARE = f"node:fleetcanary_fabric_peer_unavailable:ratio{WINDOW}"

_SKIPS = 'fleetcanary_probe_skips_total{probe="fabric", reason="peer_unavailable"}'
_TRIED = 'fleetcanary_probe_runs_total{probe="fabric", outcome=~"success|failure|timeout"}'


def _rec(name: str, expr: str) -> dict:
    return record(name, " ".join(expr.split()))


def groups(s: RuleSettings, shards: list[Shard]) -> list[Group]:
    return [Group("rules", "fleetcanary-fabric", "hard_interval", recording_rules(s)),
            Group("alerts", "fleetcanary-fabric-alerts", "hard_interval", alert_rules(s))]


def recording_rules(s: RuleSettings) -> list[dict]:
    return [
        _rec(CURRENT, "(max by (node) (fleetcanary_fabric_sendrecv_bandwidth_bytes_per_second) "
             "and on(node) ((time() - max by (node) (fleetcanary_fabric_pair_slot_timestamp_seconds)) "
             "< on(node) max by (node) (fleetcanary_fabric_slot_seconds))) "
             "* on(node) group_left(pool) node:fleetcanary_pool:info"),
        _rec(REFERENCE, f"quantile by (pool) ({s.fabric_reference_quantile:g}, {CURRENT})"),
        _rec(RATIO, f"{CURRENT} / on(pool) group_left() {REFERENCE}"),
        _rec(SLOW, f"max by (node, partner) (fleetcanary_fabric_last_partner_info) "
             f"* on(node) group_left() ({RATIO} < bool {s.fabric_slow_ratio:g})"),
        _rec(MEASURED, f"count by (node) (max_over_time({SLOW}[{WINDOW}]))"),
        _rec(SLOW_COUNT, f"sum by (node) (avg_over_time({SLOW}[{WINDOW}]) >= bool 0.5)"),
        _rec(SLOW_SHARE, f"{SLOW_COUNT} / on(node) {MEASURED}"),
        _rec(UNAVAILABLE, f"sum by (node) (increase({_SKIPS}[{WINDOW}]))"),
        _rec(UNAVAILABLE_SHARE, f"({UNAVAILABLE} or on(node) (sum by (node) (increase({_TRIED}[{WINDOW}])) * 0)) "
             f"/ on(node) (sum by (node) (increase({_TRIED}[{WINDOW}])) + on(node) group_left() "
             f"({UNAVAILABLE} or on(node) (sum by (node) (increase({_TRIED}[{WINDOW}])) * 0))) >= 0"),
    ]


def alert_rules(s: RuleSettings) -> list[dict]:
    share, partners = f"{s.fabric_unreachable_share:g}", s.fabric_min_partners
    return [
        alert("FleetCanaryFabricNodeSlow", f"{SLOW_SHARE} > 0.5 and on(node) {MEASURED} >= {partners}", "5m",
              {"severity": "warning"}, "A node is slow with most of its fabric partners",
              f"{{{{ $labels.node }}}} was below {s.fabric_slow_ratio:.0%} of the pool's pair bandwidth with "
              f"{{{{ $value | humanizePercentage }}}} of the distinct partners it met in the last {WINDOW} (at least "
              f"{partners} needed): the common factor is this node."),
        alert("FleetCanaryFabricNodeUnreachable",
              f"{UNAVAILABLE_SHARE} > {share} and on(node) {UNAVAILABLE} >= {partners} "
              f"and on() (quantile({share}, {UNAVAILABLE_SHARE}) < {share})",
              "10m", {"severity": "warning"}, "A node fails to meet most of its fabric partners",
              f"{{{{ $labels.node }}}} missed its partner in {{{{ $value | humanizePercentage }}}} of its fabric "
              f"slots in the last {WINDOW}, while most nodes meet theirs."),
    ]


RUNBOOKS: dict[str, tuple[str, str, str]] = {
    "FleetCanaryFabricNodeSlow": (
        "The fabric probe rotates partners every slot. This node's pair bandwidth (send/recv between it and the "
        "slot's partner) was below 70% of the pool's reference with most of the distinct partners it met over the "
        "last hour. Because the partners differ, the common factor is this node: its NIC, its port, its cable or "
        "its switch port. One bad link between two good nodes does not fire (each sees one slow partner).",
        "The node's nic_health series (port state, rate below expected, symbol and link-downed counters); "
        "`ibstat` / `ibv_devinfo` (rate, width); `ethtool <if>` for RoCE/Ethernet; the fabric probe's records "
        "(`fleetcanary results --probe fabric`: partner, figures per pair); `ib_write_bw` against a known-good "
        "node; the node detail dashboard's pair history.",
        "A port trained at a lower rate or width, a dirty or damaged cable or transceiver, a flapping switch port, "
        "a PCIe link of the NIC trained below its width, the wrong NCCL_IB_HCA/NCCL_SOCKET_IFNAME (traffic on a "
        "slower interface), a rate limit or QoS policy on the node's port, CPU starvation on a gloo (TCP) fleet."),
    "FleetCanaryFabricNodeUnreachable": (
        "Most of this node's fabric slots ended without meeting its partner (skips with reason peer_unavailable), "
        "while the pool's typical node meets its partners: other nodes cannot reach this node's rendezvous, or it "
        "cannot reach theirs.",
        "`fleetcanary_probe_skips_total{probe=\"fabric\"}` on this node and its recent partners; the skip details "
        "in the records (connect refused, timed out, no partner in time, refused connections); the NetworkPolicy "
        "of the fabric overlay and host firewalls for the rendezvous port; the node's clock (NTP): a node whose "
        "clock is off by more than the meeting window is always in the wrong slot; the member list it sees.",
        "A firewall or NetworkPolicy dropping the rendezvous port, a node clock far off, a different fleet secret "
        "(its partners count bad_handshake rejections), the node missing from the others' member list, the "
        "fabric interface down, the daemon busy with other GPU probes at the slot start."),
}
