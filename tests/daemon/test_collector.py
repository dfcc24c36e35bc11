"""The exporter's own reason counters: a reason appears once it has happened, except those a rule reads with
increase(), which start at 0 (a series born at 1 hides its first event from increase())."""
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from fleetcanary.core.record import CRASH_REASONS, RunRecord
from fleetcanary.daemon.collector import DECLARED_AT_ZERO
from fleetcanary.daemon.kube import ERROR_REASONS, OPERATIONS, Snapshot
from fleetcanary.daemon.state import ResultStore
from fleetcanary.probes import PROBES
from fleetcanary.probes.base import SKIP_REASONS

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = (ROOT / "alerts/fleetcanary.rules.yml", ROOT / "alerts/fleetcanary.alerts.yml")
KINDS = {"fleetcanary_probe_skips_total": "skips", "fleetcanary_probe_failures_total": "failures",
         "fleetcanary_probe_crashes_total": "crashes"}


def series(store) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(store.exposition.decode()) for s in f.samples}


def reasons(store, name: str) -> dict[tuple[str, str], float]:
    return {(dict(k[1])["probe"], dict(k[1])["reason"]): v for k, v in series(store).items() if k[0] == name}


def test_reasons_appear_once_they_happen_and_the_rules_reasons_start_at_zero():
    store = ResultStore(dict(PROBES), list(PROBES))
    store.rerender()
    assert reasons(store, "fleetcanary_probe_skips_total") == {("fabric", "peer_unavailable"): 0}
    assert reasons(store, "fleetcanary_probe_failures_total") == {("collectives", "wrong_result"): 0}
    assert reasons(store, "fleetcanary_probe_crashes_total") == {}
    # every outcome of every probe from the start: the probe-health alerts read them with increase()
    runs = {(dict(k[1])["probe"], dict(k[1])["outcome"]): v for k, v in series(store).items()
            if k[0] == "fleetcanary_probe_runs_total"}
    assert len(runs) == 5 * len(PROBES) and set(runs.values()) == {0}
    store.apply(RunRecord("storage", "skipped", "not_configured"))
    store.apply(RunRecord("storage", "skipped", "not_configured"))
    store.apply(RunRecord("gpu_p2p", "failure", "verification_failed"))
    store.apply(RunRecord("gpu_health", "crash", "oom_killed"))
    store.apply(RunRecord("fabric", "skipped", "peer_unavailable"))
    assert reasons(store, "fleetcanary_probe_skips_total") == {("fabric", "peer_unavailable"): 1,
                                                               ("storage", "not_configured"): 2}
    assert reasons(store, "fleetcanary_probe_failures_total") == {("collectives", "wrong_result"): 0,
                                                                  ("gpu_p2p", "verification_failed"): 1}
    assert reasons(store, "fleetcanary_probe_crashes_total") == {("gpu_health", "oom_killed"): 1}
    text = store.exposition.decode()
    for name in KINDS:  # the family is still declared (HELP and TYPE) with no series in it
        assert f"# TYPE {name} counter" in text


def test_kubernetes_api_errors_appear_once_they_happen():
    store = ResultStore(dict(PROBES), list(PROBES))
    snap = Snapshot(last_success=1000.0, gpus_requested=0)
    store.set_kube(snap, "FleetCanaryHealthy", {})
    assert not [k for k in series(store) if k[0] == "fleetcanary_kubernetes_api_errors_total"]
    snap.errors[("list_pods", "forbidden")] += 3
    store.set_kube(snap, "FleetCanaryHealthy", {})
    errors = {k: v for k, v in series(store).items() if k[0] == "fleetcanary_kubernetes_api_errors_total"}
    assert errors == {("fleetcanary_kubernetes_api_errors_total",
                       (("operation", "list_pods"), ("reason", "forbidden"))): 3}
    assert len(OPERATIONS) * len(ERROR_REASONS) > 1  # what a zero for every pair used to cost


def test_every_reason_the_rules_read_starts_at_zero():
    """A rule that selects a skip, failure or crash reason must find it declared at 0, or increase() misses the
    first one; and a rule may only read these counters with both the probe and the reason fixed."""
    read = set()
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                for name, sel in re.findall(r"(fleetcanary_probe_(?:skips|failures|crashes)_total)(\{[^}]*\})?",
                                            rule["expr"]):
                    labels = dict(re.findall(r'(\w+)="([^"]*)"', sel))
                    assert {"probe", "reason"} <= set(labels), f"{rule.get('alert') or rule.get('record')}: {name}{sel}"
                    read.add((KINDS[name], labels["probe"], labels["reason"]))
    assert read == set(DECLARED_AT_ZERO)
    for kind, probe, reason in DECLARED_AT_ZERO:
        assert probe in PROBES
        assert reason in {"skips": SKIP_REASONS, "crashes": CRASH_REASONS,
                          "failures": PROBES[probe].all_failure_reasons()}[kind]
