"""The simulated fleet `fleetcanary demo` runs: what each piece is configured with, nothing started here.

Every node is an HGX H100 node as NVML reported it (the recorded facts the tests use,
probes/testing/nvml_facts), with its own GPU UUIDs and serials. One node's GPU carries the recorded faults
of a failing GPU: XIDs 63 (row remap recorded, a warning) and 94 (contained ECC error, critical), an
uncorrectable ECC error and a row remap waiting for a reset. Only what NVML shows can be simulated honestly: the
performance probes need CUDA, which the demo does not fake, so they are off and the demo says so.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetcanary.offline import demo_kube
from fleetcanary.offline import local_services as svc
from fleetcanary.probes import PROBES
from fleetcanary.probes.lib import yamltext
from fleetcanary.probes.testing.nvml_fake import FACTS_DIR

POOL = "demo-h100"
CLUSTER = "demo"
DEGRADED_GPU = 6
HEALTHY_FACTS = FACTS_DIR / "h100_8gpu_healthy.json"
DEGRADED_FACTS = FACTS_DIR / "h100_8gpu_degraded.json"
# The probes that read NVML alone (gpu_health; the XID watch runs beside it) and the inference canary, which
# needs no GPU. Everything else is off: the GPU performance probes need CUDA, the host ones would make six
# exporters on one machine compete for its cores, which is a fleet nobody has.
ON = ("gpu_health", "inference")


@dataclass(frozen=True)
class Expected:
    alert: str
    labels: dict[str, str]
    why: str


def node_names(count: int) -> list[str]:
    return [f"demo-h100-{i:02d}" for i in range(1, count + 1)]


def degraded_node(names: list[str]) -> str:
    """The bad node: in the middle of the list, so it is not the first row of every table."""
    return names[len(names) // 2]


def expected_alerts(node: str) -> list[Expected]:
    g = str(DEGRADED_GPU)
    return [
        # the XID catalogue classes 63 a memory-class warning (a remap recorded, applied at the next reset): a ticket
        Expected("FleetCanaryGPUXidWarning", {"node": node, "gpu": g, "xid": "63"},
                 "XID 63: a row remap recorded (a warning: it takes effect at the next reset)"),
        Expected("FleetCanaryGPUCriticalXid", {"node": node, "gpu": g, "xid": "94"},
                 "XID 94: a contained uncorrectable ECC error"),
        Expected("FleetCanaryGPUUncorrectableECC", {"node": node, "gpu": g}, "1 uncorrectable (volatile) ECC error"),
        Expected("FleetCanaryGPURowRemapPending", {"node": node, "gpu": g},
                 "a remapped row waits for a GPU reset (fires after 5 minutes pending)"),
    ]


def node_facts(index: int, degraded: bool) -> dict[str, Any]:
    """Recorded H100 node facts with this node's own UUIDs and serials; GPU DEGRADED_GPU failing if asked."""
    facts = json.loads(HEALTHY_FACTS.read_text())
    if degraded:
        bad = json.loads(DEGRADED_FACTS.read_text())
        facts["devices"][DEGRADED_GPU] = copy.deepcopy(bad["devices"][DEGRADED_GPU])
        facts["xid_events"] = [e for e in bad["xid_events"] if e["gpu"] == DEGRADED_GPU]
        facts["xid_delivery"] = "once"  # the XID watch and gpu_health's workers share the node: one XID, once
    for gpu, dev in enumerate(facts["devices"]):
        head, _, _ = dev["uuid"].rpartition("-")
        dev["uuid"] = f"{head}-{index:04x}{gpu:08x}"
        dev["serial"] = f"{dev['serial'][:-4]}{index:02d}{gpu:02d}"
    facts["recorded"] = (f"{facts['recorded']}; demo node {index}"
                         + (f", GPU {DEGRADED_GPU} as on the recorded degraded node" if degraded else ""))
    return facts


# The node conditions the bad GPU's faults set (demo_kube.FAULT_PREFIX + these): XID 94 is a critical memory-class
# XID, the ECC count is above 0, a row remap waits for a reset (docs/node-conditions.md)
EXPECTED_CONDITIONS = {"GPUHardwareXid": "HardwareXid", "GPUUncorrectableECC": "UncorrectableECCErrors",
                       "GPURowRemapFailure": "RowRemapPending"}


def exporter_config(workdir: Path, node: str, listen: str, llm_base_url: str, fast: bool,
                    api_url: str = "") -> dict[str, Any]:
    """One simulated node's exporter; with api_url (the demo's Kubernetes API), it writes its node conditions
    there, one per hard-fault class, as it would in a cluster with the node-conditions overlay."""
    probes: dict[str, Any] = {name: {"enabled": False} for name in sorted(PROBES) if name not in ON}
    probes["gpu_health"] = {"interval_seconds": 5 if fast else 15, "timeout_seconds": 4 if fast else 10}
    probes["inference"] = {"interval_seconds": 15 if fast else 30, "timeout_seconds": 10, "params": {
        "targets": [{"name": "demo-llm", "base_url": llm_base_url, "model": "fleetcanary-reference",
                     "stream_max_tokens": 16, "prefix_words": 128}]}}
    cfg: dict[str, Any] = {
        "state_dir": str(workdir / "state"),
        "pool": POOL,
        "node_name": node,
        "server": {"listen_address": listen},
        # NVML's critical-XID events (the simulated node has no kernel log of its own)
        "gpu": {"xid_watch": "on", "xid_log": "nvml"},
        "probes": probes,
    }
    if api_url:
        cfg["kubernetes"] = {"mode": "on", "api_url": api_url, "node_condition": {
            "enabled": True, "type": demo_kube.HEALTH_CONDITION, "probes": ["gpu_health"],
            "per_fault": True, "per_fault_prefix": demo_kube.FAULT_PREFIX}}
    return cfg


def prometheus_config(targets: dict[str, str], alertmanager: str, rule_files: list[Path], fast: bool) -> dict:
    interval = svc.FAST_INTERVAL if fast else "5s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "external_labels": {"demo": "fleetcanary"}},
        "rule_files": [str(f) for f in rule_files],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [{"job_name": "fleetcanary", "static_configs": [
            {"targets": [address], "labels": {"node": node, "cluster": CLUSTER}}
            for node, address in targets.items()]}],
    }


def alertmanager_config(example: str, webhook_url: str, remediate_url: str = "") -> dict[str, Any]:
    """The shipped example's routes and inhibit rules, with every receiver sending to the demo's own webhook
    (and to the demo's `fleetcanary remediate`, when given) and the waits shortened (a real pager groups for a
    minute; a newcomer should not wait for it)."""
    cfg = yamltext.load(example)
    cfg["route"].update({"group_wait": "2s", "group_interval": "5s"})
    for route in cfg["route"].get("routes", []):
        route.pop("group_wait", None)
        route.pop("group_interval", None)
    hooks = [{"url": webhook_url, "send_resolved": True}]
    if remediate_url:
        hooks.append({"url": remediate_url, "send_resolved": True, "max_alerts": 0})
    cfg["receivers"] = [{"name": r["name"], "webhook_configs": copy.deepcopy(hooks)} for r in cfg["receivers"]]
    return cfg


# The shipped policy's hard-fault rule (deploy/components/remediate/remediate.yaml; a test holds them equal)
HARD_FAULT_RULE = {
    "name": "hard-fault",
    "match": {"severities": ["critical"],
              "alertnames": ["FleetCanaryGPULost", "FleetCanaryGPUsMissing", "FleetCanaryGPURowRemapFailed",
                             "FleetCanaryNVLinkDown", "FleetCanaryGPUUncorrectableECC", "FleetCanaryGPUCriticalXid",
                             "FleetCanaryGPUApplicationXidRepeated"]},
    "actions": {"labels": {"fleetcanary.io/health": "failed"}, "taint": {"effect": "NoSchedule"}},
    "min_hold_seconds": 3600,
}


def remediate_config(listen: str, api_url: str, audit_log: str) -> dict[str, Any]:
    """`fleetcanary remediate` acting (dry-run off) on the demo's nodes: one replica (no lease), the shipped
    hard-fault rule, the shipped breaker."""
    return {"dry_run": False, "listen_address": listen, "node_label": "node", "audit_log": audit_log,
            "tick_seconds": 2, "lease": {"enabled": False},
            "kubernetes": {"api_url": api_url, "event_namespace": "default"},
            "breaker": {"max_nodes": 3, "max_pool_ratio": 0.1, "window_seconds": 3600},
            "release": {"quiet_seconds": 1800}, "rules": [HARD_FAULT_RULE]}


def matches(expected: Expected, alert: str, labels: dict[str, str]) -> bool:
    return alert == expected.alert and all(labels.get(k) == v for k, v in expected.labels.items())
