"""The controller's tests: the real controller (in-process where time must move, a real `fleetcanary remediate`
process behind a real Alertmanager elsewhere) against the project's Kubernetes API stand-in."""
from __future__ import annotations

import hashlib
import threading

import pytest

from fleetcanary.remediate import config
from fleetcanary.remediate.controller import Controller
from fleetcanary.remediate.kubeapi import KubeAPI as Client
from fleetcanary.remediate.ownership import ANNOTATION
from fleetcanary.remediate.webhook import Payload
from tests.support.kube_api import KubeAPI, node

POOL = "example.com/pool"
EPOCH = 1_900_000_000.0

RULES = [
    {"name": "hard-fault", "match": {"severities": ["critical"], "labels": {"class": "hardware"}},
     "actions": {"labels": {"fleetcanary.io/health": "failed"}, "taint": {"effect": "NoSchedule"}, "cordon": True},
     "min_hold_seconds": 600},
    {"name": "slow", "match": {"alertnames": ["FleetCanaryGPUMemoryBandwidthFarBelowPeers"]},
     "actions": {"labels": {"fleetcanary.io/health": "degraded"}, "taint": {"effect": "PreferNoSchedule"}},
     "min_hold_seconds": 600},
]


class FakeClock:
    """Wall and monotonic time that move only when the test moves them."""

    def __init__(self) -> None:
        self.wall, self.mono = EPOCH, 1000.0
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self.wall

    def monotonic(self) -> float:
        with self._lock:
            return self.mono

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.wall += seconds
            self.mono += seconds


@pytest.fixture
def api(tmp_path):
    a = KubeAPI(tmp_path)
    for i in range(1, 11):
        a.nodes[f"gpu-{i}"] = node(f"gpu-{i}", {POOL: "train-a" if i <= 8 else "infer-b"}, 8)
        a.nodes[f"gpu-{i}"]["metadata"]["uid"] = f"uid-gpu-{i}"
    yield a
    a.close()


def environ(api) -> dict[str, str]:
    return {**api.environ, "FLEETCANARY_KUBE_TOKEN_FILE": str(api.token_file),
            "FLEETCANARY_KUBE_CA_FILE": str(api.ca_file)}


def settings(**over) -> config.Settings:
    data = {"dry_run": False, "pool_label": POOL, "rules": RULES, "release": {"quiet_seconds": 300},
            "breaker": {"max_nodes": 3, "max_pool_ratio": 0.5, "window_seconds": 3600},
            "lease": {"enabled": False}} | over
    return config.Settings.model_validate(data)


def controller(api, clock, identity: str = "replica-a", **over) -> Controller:
    s = settings(**over)
    # 10 s: the decisions are on a fake clock; a real call on a machine shared by the suite's workers can take
    # seconds (a create_event read timed out at 2 s once under load), and no test here waits out a timeout
    return Controller(s, Client.in_cluster(10.0, environ=environ(api)), identity, clock=clock,
                      namespace="fleetcanary")


def alert(node_name: str, name: str = "FleetCanaryGPULost", status: str = "firing", severity: str = "critical",
          **labels) -> dict:
    labels = {"alertname": name, "severity": severity, "node": node_name,
              **({"class": "hardware"} if name == "FleetCanaryGPULost" else {}), **labels}
    fp = hashlib.sha256(repr(sorted(labels.items())).encode()).hexdigest()[:16]
    return {"status": status, "labels": labels, "fingerprint": fp, "startsAt": "2030-03-17T17:46:40Z",
            "annotations": {"summary": f"GPU 3 of {node_name} fell off the bus",
                            "description": "value 412 GB/s, peers' median 3.1 TB/s, baseline 3.2 TB/s over 12 runs"}}


def payload(*alerts: dict) -> Payload:
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return Payload.model_validate({"version": "4", "status": status, "alerts": list(alerts)})


def resolved(a: dict) -> dict:
    return {**a, "status": "resolved"}


def node_writes(api) -> list[tuple[str, dict]]:
    """Node patches that change more than the record (labels, taints, cordon)."""
    return [(n, p) for n, p in api.node_patches
            if p.get("spec") or set(p.get("metadata") or {}) - {"resourceVersion", "annotations"}]


def quarantined(api, name: str) -> bool:
    n = api.nodes[name]
    return ANNOTATION in (n["metadata"].get("annotations") or {})
