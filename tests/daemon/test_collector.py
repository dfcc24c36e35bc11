"""The exporter's own reason counters: a reason appears once it has happened, except those a rule reads with
increase(), which start at 0 (a series born at 1 hides its first event from increase()). The same for run outcomes,
invalid samples, confirmation runs and the device counters a probe declares zero_published; a probe that is off
has its enabled 0 and nothing else."""
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from fleetcanary.core.record import CRASH_REASONS, RunRecord
from fleetcanary.daemon.collector import DECLARED_AT_ZERO, RUNS_FROM_ZERO
from fleetcanary.daemon.kube import ERROR_REASONS, OPERATIONS, Snapshot
from fleetcanary.daemon.state import ResultStore
from fleetcanary.probes import PROBES
from fleetcanary.probes.base import SKIP_REASONS
from fleetcanary.probes.lib import yamltext

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
    # success, failure and skipped of every probe from the start: the rules and dashboards read them with
    # increase(); timeout and crash once they happen (ProbeFailing sums them with failure)
    runs = {(dict(k[1])["probe"], dict(k[1])["outcome"]): v for k, v in series(store).items()
            if k[0] == "fleetcanary_probe_runs_total"}
    assert set(runs) == {(p, o) for p in PROBES for o in RUNS_FROM_ZERO} and set(runs.values()) == {0}
    assert set(RUNS_FROM_ZERO) == {"success", "failure", "skipped"}
    store.apply(RunRecord("storage", "skipped", "not_configured"))
    store.apply(RunRecord("storage", "skipped", "not_configured"))
    store.apply(RunRecord("gpu_p2p", "failure", "verification_failed"))
    store.apply(RunRecord("gpu_health", "crash", "oom_killed"))
    store.apply(RunRecord("fabric", "skipped", "peer_unavailable"))
    runs = {(dict(k[1])["probe"], dict(k[1])["outcome"]): v for k, v in series(store).items()
            if k[0] == "fleetcanary_probe_runs_total"}
    assert runs[("gpu_health", "crash")] == 1 and ("gpu_health", "timeout") not in runs
    assert reasons(store, "fleetcanary_probe_skips_total") == {("fabric", "peer_unavailable"): 1,
                                                               ("storage", "not_configured"): 2}
    assert reasons(store, "fleetcanary_probe_failures_total") == {("collectives", "wrong_result"): 0,
                                                                  ("gpu_p2p", "verification_failed"): 1}
    assert reasons(store, "fleetcanary_probe_crashes_total") == {("gpu_health", "oom_killed"): 1}
    text = store.exposition.decode()
    for name in KINDS:  # the family is still declared (HELP and TYPE) with no series in it
        assert f"# TYPE {name} counter" in text


def test_a_driver_too_old_skip_is_counted_per_probe_from_the_first_one():
    """No zero for it (the alert reads it as counted() does): the series is born at 1 with the first skip."""
    store = ResultStore(dict(PROBES), list(PROBES))
    store.rerender()
    assert ("gpu_bandwidth", "driver_too_old") not in reasons(store, "fleetcanary_probe_skips_total")
    store.apply(RunRecord("gpu_bandwidth", "skipped", "driver_too_old"))
    store.apply(RunRecord("gpu_compute", "skipped", "driver_too_old"))
    store.apply(RunRecord("gpu_bandwidth", "skipped", "driver_too_old"))
    skips = reasons(store, "fleetcanary_probe_skips_total")
    assert {k: v for k, v in skips.items() if k[1] == "driver_too_old"} == {("gpu_bandwidth", "driver_too_old"): 2,
                                                                           ("gpu_compute", "driver_too_old"): 1}


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
    first one; and a rule may only read these counters with both the probe and the reason fixed. Unless it reads
    them as alerts/build.py's counted() does (a series born counting counts too): then nothing needs a zero."""
    read, born_counting = set(), set()
    for path in RULE_FILES:
        for group in yamltext.load(path.read_text())["groups"]:
            for rule in group["rules"]:
                for name, sel in re.findall(r"(fleetcanary_probe_(?:skips|failures|crashes)_total)(\{[^}]*\})?",
                                            rule["expr"]):
                    labels = dict(re.findall(r'(\w+)="([^"]*)"', sel))
                    if f"unless {name}{sel} offset" in " ".join(rule["expr"].split()):
                        born_counting.add((rule["alert"], KINDS[name], labels.get("reason")))
                        continue
                    assert {"probe", "reason"} <= set(labels), f"{rule.get('alert') or rule.get('record')}: {name}{sel}"
                    read.add((KINDS[name], labels["probe"], labels["reason"]))
    assert read == set(DECLARED_AT_ZERO)
    assert born_counting == {("FleetCanaryCUDAProbesDriverTooOld", "skips", "driver_too_old")}
    for kind, probe, reason in DECLARED_AT_ZERO:
        assert probe in PROBES
        assert reason in {"skips": SKIP_REASONS, "crashes": CRASH_REASONS,
                          "failures": PROBES[probe].all_failure_reasons()}[kind]


def probe_series(store, probe: str) -> dict[str, float]:
    return {k[0]: v for k, v in series(store).items()
            if k[0].startswith("fleetcanary_probe_") and dict(k[1]).get("probe") == probe}


def test_a_probe_that_is_off_publishes_nothing():
    store = ResultStore(dict(PROBES), [p for p in PROBES if p != "fabric"])
    store.set_enabled([p for p in PROBES if p != "fabric"], dict.fromkeys(PROBES, 60.0), {})
    assert probe_series(store, "fabric") == {}
    assert set(probe_series(store, "gpu_health")) == {"fleetcanary_probe_interval_seconds",
                                                      "fleetcanary_probe_runs_total"}
    # the declared-at-zero skip of fabric (its partner-availability rules) only while fabric is on
    assert reasons(store, "fleetcanary_probe_skips_total") == {}
    store.set_enabled(list(PROBES), dict.fromkeys(PROBES, 60.0), {})
    assert reasons(store, "fleetcanary_probe_skips_total") == {("fabric", "peer_unavailable"): 0}


def test_invalid_samples_and_confirmation_runs_appear_once_they_happen():
    store = ResultStore(dict(PROBES), list(PROBES))
    store.rerender()
    names = {k[0] for k in series(store)}
    assert "fleetcanary_probe_invalid_samples_total" not in names
    assert "fleetcanary_probe_confirmation_runs_total" not in names
    store.apply(RunRecord("host_memory_bandwidth", "success", samples=[{"metric": "fleetcanary_nope", "value": 1}]))
    store.apply(RunRecord("host_memory_bandwidth", "success", trigger="confirmation"))
    assert probe_series(store, "host_memory_bandwidth")["fleetcanary_probe_invalid_samples_total"] == 1
    assert probe_series(store, "host_memory_bandwidth")["fleetcanary_probe_confirmation_runs_total"] == 1
    assert "fleetcanary_probe_invalid_samples_total" not in probe_series(store, "gpu_health")


def test_a_zero_published_counter_shows_its_zeros_only_where_declared():
    """ECC: the uncorrected volatile count from 0 (the alert reads its increase()), the others once above 0, and
    a counter that drops back to 0 (a driver reload) has no series until it counts again."""
    store = ResultStore(dict(PROBES), list(PROBES))

    def ecc(**counts):
        return RunRecord("gpu_health", "success", samples=[
            {"metric": "fleetcanary_gpu_ecc_errors_total", "value": v,
             "labels": {"gpu": "0", "type": key.split("_")[0], "counter": key.split("_")[1]}}
            for key, v in counts.items()])

    def exposed():
        return {(dict(k[1])["type"], dict(k[1])["counter"]): v for k, v in series(store).items()
                if k[0] == "fleetcanary_gpu_ecc_errors_total"}

    store.apply(ecc(uncorrected_volatile=0, corrected_volatile=0, corrected_aggregate=3, uncorrected_aggregate=0))
    assert exposed() == {("uncorrected", "volatile"): 0, ("corrected", "aggregate"): 3}
    store.apply(ecc(uncorrected_volatile=0, corrected_volatile=2, corrected_aggregate=5, uncorrected_aggregate=0))
    assert exposed() == {("uncorrected", "volatile"): 0, ("corrected", "volatile"): 2, ("corrected", "aggregate"): 5}
    store.apply(ecc(uncorrected_volatile=0, corrected_volatile=0, corrected_aggregate=5, uncorrected_aggregate=0))
    assert exposed() == {("uncorrected", "volatile"): 0, ("corrected", "aggregate"): 5}
    spec = PROBES["gpu_health"].spec("fleetcanary_gpu_ecc_errors_total")
    assert spec.published({"type": "uncorrected", "counter": "volatile"}, 0)
    assert not spec.published({"type": "uncorrected", "counter": "aggregate"}, 0)
    assert PROBES["gpu_health"].spec("fleetcanary_gpu_xid_errors_total").zero_published is None  # every series


# Counters a rule reads also at label values published only once above 0, and why missing a series' first
# count is acceptable there.
LATE_READS_ACCEPTED = {
    "fleetcanary_rdma_port_errors_total": "the rising-errors alert wants more than 10 an hour (100 for transmit "
                                          "discards): a series born above 0 delays it by that first count at most",
}


def test_every_zero_published_series_a_rule_reads_with_increase_starts_at_zero():
    """A counter the exporter publishes only once above 0 (MetricSpec.zero_published): every label set a rule
    selects must be published from 0, or be accepted above; regex matchers count each alternative."""
    specs = {spec.name: spec for cls in PROBES.values() for spec in cls.metrics if spec.zero_published is not None}
    late = set()
    for path in RULE_FILES:
        for group in yamltext.load(path.read_text())["groups"]:
            for rule in group["rules"]:
                for name, sel in re.findall(r"(fleetcanary_\w+_total)(\{[^}]*\})?", rule["expr"]):
                    if name not in specs:
                        continue
                    matchers = re.findall(r'(\w+)\s*(=~|=)\s*"([^"]*)"', sel)
                    fixed = {k: v for k, op, v in matchers if op == "="}
                    choices = [(k, v.split("|")) for k, op, v in matchers if op == "=~"] or [("", [""])]
                    for label, values in choices:
                        for v in values:
                            pinned = {**fixed, label: v} if label else fixed
                            if not specs[name].published(pinned, 0):
                                late.add((name, tuple(sorted(pinned.items()))))
    assert {name for name, _ in late} <= set(LATE_READS_ACCEPTED), late
    assert ("fleetcanary_rdma_port_errors_total", (("counter", "symbol_error"),)) in late  # the check sees them
    assert not [lab for name, lab in late if ("counter", "link_downed") in lab]  # the flap alert fires on any
