from prometheus_client.parser import text_string_to_metric_families

from fleetcanary.core.record import RunRecord
from fleetcanary.daemon.state import MAX_LABEL_VALUE, ResultStore
from fleetcanary.probes import PROBES
from tests.support.fault_probes import FAULT_PROBES
from tests.support.helpers import run_job


def parse(store):
    return {s.name + str(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(store.exposition.decode()) for s in f.samples}


def test_undeclared_metrics_and_wrong_labels_are_dropped_and_counted(tmp_path):
    probes = {**PROBES, "bad_samples": FAULT_PROBES["bad_samples"]}
    store = ResultStore(probes, list(probes))
    out = run_job(FAULT_PROBES["bad_samples"], {}, tmp_path, 60, name="bad_samples")  # 60 s: bounds a hang
    store.apply(out)
    text = store.exposition.decode()
    assert 'fleetcanary_test_fault_value{mode="good"} 1.0' in text
    assert "fleetcanary_not_declared" not in text
    assert 'fleetcanary_probe_invalid_samples_total{probe="bad_samples"} 2.0' in text


def test_hostile_label_values_keep_the_exposition_valid():
    probes = {"ok": FAULT_PROBES["ok"]}
    store = ResultStore(probes, ["ok"])
    hostile = 'a"b\\c\nd} x{y="1"} ' + "z" * 500
    store.apply(RunRecord("ok", "success", samples=[
        {"metric": "fleetcanary_test_fault_value", "labels": {"mode": hostile}, "value": 2.0}]))
    fams = list(text_string_to_metric_families(store.exposition.decode()))
    vals = [s for f in fams for s in f.samples if s.name == "fleetcanary_test_fault_value"]
    assert len(vals) == 1 and vals[0].labels["mode"] == hostile[:MAX_LABEL_VALUE] and vals[0].value == 2.0


def test_failed_run_clears_values_and_skip_keeps_them():
    probes = {"ok": FAULT_PROBES["ok"]}
    store = ResultStore(probes, ["ok"])
    good = RunRecord("ok", "success",
                     samples=[{"metric": "fleetcanary_test_fault_value", "labels": {"mode": "m"}, "value": 3.0}],
                     started_at=1000.0, wall_seconds=1.0)
    store.apply(good)
    store.apply(RunRecord("ok", "skipped", "gpu_busy", started_at=2000.0))
    v = parse(store)
    assert v["fleetcanary_test_fault_value[('mode', 'm')]"] == 3.0
    # a skip is no verdict: probe_success and the duration stay the last measuring run's (not a 0 that reads
    # as a failure, the same as a broken probe's)
    assert v["fleetcanary_probe_success[('probe', 'ok')]"] == 1.0
    assert v["fleetcanary_probe_duration_seconds[('probe', 'ok')]"] == 1.0
    assert v["fleetcanary_probe_skips_total[('probe', 'ok'), ('reason', 'gpu_busy')]"] == 1.0
    assert "fleetcanary_probe_skips_total[('probe', 'ok'), ('reason', 'budget')]" not in v  # once it happens
    assert v["fleetcanary_probe_runs_total[('outcome', 'failure'), ('probe', 'ok')]"] == 0.0  # from 0 ...
    assert "fleetcanary_probe_runs_total[('outcome', 'crash'), ('probe', 'ok')]" not in v  # ... crash once it happens
    assert v["fleetcanary_probe_last_success_timestamp_seconds[('probe', 'ok')]"] == 1001.0
    store.apply(RunRecord("ok", "timeout", "deadline", started_at=3000.0, wall_seconds=5.0))
    v = parse(store)
    assert "fleetcanary_test_fault_value[('mode', 'm')]" not in v
    assert v["fleetcanary_probe_success[('probe', 'ok')]"] == 0.0
    assert v["fleetcanary_probe_last_success_timestamp_seconds[('probe', 'ok')]"] == 1001.0  # not a success
    assert v["fleetcanary_probe_runs_total[('outcome', 'timeout'), ('probe', 'ok')]"] == 1.0


def test_a_probe_that_only_ever_skipped_has_no_success_verdict():
    store = ResultStore({"ok": FAULT_PROBES["ok"]}, ["ok"])
    store.apply(RunRecord("ok", "skipped", "gpu_allocated", started_at=2000.0))
    v = parse(store)
    assert "fleetcanary_probe_success[('probe', 'ok')]" not in v
    assert v["fleetcanary_probe_runs_total[('outcome', 'skipped'), ('probe', 'ok')]"] == 1.0


def test_gpu_seconds_accumulate_per_gpu():
    probes = {"ok": FAULT_PROBES["ok"]}
    store = ResultStore(probes, ["ok"])
    for _ in range(3):
        store.apply(RunRecord("ok", "success", result={"gpu_seconds": {"0": 0.25, "1": 0.5}}))
    v = parse(store)
    assert v["fleetcanary_gpu_probe_seconds_total[('gpu', '0')]"] == 0.75
    assert v["fleetcanary_gpu_probe_seconds_total[('gpu', '1')]"] == 1.5


def test_a_failed_run_publishes_the_evidence_it_carries():
    probes = {"ok": FAULT_PROBES["ok"]}
    store = ResultStore(probes, ["ok"])
    store.apply(RunRecord("ok", "failure", "other", samples=[
        {"metric": "fleetcanary_test_fault_value", "labels": {"mode": "target_down"}, "value": 0.0}]))
    v = parse(store)
    assert v["fleetcanary_test_fault_value[('mode', 'target_down')]"] == 0.0
    assert v["fleetcanary_probe_success[('probe', 'ok')]"] == 0.0
    assert "fleetcanary_probe_last_success_timestamp_seconds[('probe', 'ok')]" not in v


def test_figures_stop_being_exported_once_older_than_the_freshness_bound():
    """A skipped run keeps the last figures only for FRESH_INTERVALS x the interval; after that the
    series leave the exposition (Prometheus marks them stale), while counters and timestamps stay."""
    from fleetcanary.judge.freshness import FRESH_INTERVALS

    probes = {"ok": FAULT_PROBES["ok"]}
    store = ResultStore(probes, ["ok"])
    store.set_enabled(["ok"], {"ok": 600.0}, {"ok": 120.0})
    store.apply(RunRecord("ok", "success", samples=[
        {"metric": "fleetcanary_test_fault_value", "labels": {"mode": "m"}, "value": 3.0}],
        started_at=1000.0, wall_seconds=10.0))
    store.apply(RunRecord("ok", "skipped", "gpu_busy", started_at=1600.0))
    key = "fleetcanary_test_fault_value[('mode', 'm')]"
    bound = 1010.0 + FRESH_INTERVALS * 600.0 + 120.0  # finished + 1.5 intervals + the probe's timeout
    assert store.expire(now=bound - 1) is False
    assert parse(store)[key] == 3.0
    version = store.version
    assert store.expire(now=bound + 1) is True
    v = parse(store)
    assert key not in v
    assert store.version > version
    assert v["fleetcanary_probe_last_success_timestamp_seconds[('probe', 'ok')]"] == 1010.0
    assert v["fleetcanary_probe_runs_total[('outcome', 'skipped'), ('probe', 'ok')]"] == 1.0
    assert store.expire(now=bound + 2) is False  # nothing left to drop: no re-render per scrape
    # the next successful run exports again
    store.apply(RunRecord("ok", "success", samples=[
        {"metric": "fleetcanary_test_fault_value", "labels": {"mode": "m"}, "value": 4.0}],
        started_at=bound + 100, wall_seconds=1.0))
    assert store.expire(now=bound + 200) is False
    assert parse(store)[key] == 4.0


def test_figures_without_a_known_interval_are_kept():
    probes = {"ok": FAULT_PROBES["ok"]}
    store = ResultStore(probes, ["ok"])
    store.apply(RunRecord("ok", "success", samples=[
        {"metric": "fleetcanary_test_fault_value", "labels": {"mode": "m"}, "value": 3.0}],
        started_at=1000.0, wall_seconds=1.0))
    assert store.expire(now=1e12) is False
    assert parse(store)["fleetcanary_test_fault_value[('mode', 'm')]"] == 3.0


def test_a_scrape_drops_expired_figures():
    """The HTTP server checks freshness before it serves /metrics (plain and gzip alike)."""
    import gzip

    from fleetcanary.daemon.http import MetricsServer

    probes = {"ok": FAULT_PROBES["ok"]}
    store = ResultStore(probes, ["ok"])
    store.set_enabled(["ok"], {"ok": 60.0})
    store.apply(RunRecord("ok", "success", samples=[
        {"metric": "fleetcanary_test_fault_value", "labels": {"mode": "m"}, "value": 3.0}],
        started_at=1000.0, wall_seconds=1.0))  # long ago: expired by now
    assert b"fleetcanary_test_fault_value{" in store.exposition
    server = MetricsServer(store, "127.0.0.1", 0, health=lambda: True, ready=lambda: True)
    try:
        assert b"fleetcanary_test_fault_value{" not in gzip.decompress(server.metrics_body(gz=True))
        assert b"fleetcanary_test_fault_value{" not in server.metrics_body(gz=False)
        assert b'fleetcanary_probe_last_success_timestamp_seconds{probe="ok"} 1001.0' in server.metrics_body(False)
    finally:
        server.httpd.server_close()


def test_coverage_is_per_gpu_and_invasive_probe_from_successful_runs_only():
    """The recorded node's 8 GPUs; gpu_bandwidth measured GPUs 0-4 (3 held by pods), then skipped; train_step is
    measured per node; a failed run measures nothing; a non-invasive probe has no coverage series."""
    store = ResultStore(PROBES, ["gpu_bandwidth", "train_step", "host_memory_bandwidth"])
    store.set_environment({"gpus": [{"index": i} for i in range(8)]})
    v = parse(store)
    cov = "fleetcanary_gpu_last_measured_timestamp_seconds"
    assert {k: x for k, x in v.items() if k.startswith(cov)} == {
        **{f"{cov}[('gpu', '{g}'), ('probe', 'gpu_bandwidth')]": 0.0 for g in range(8)},
        f"{cov}[('gpu', ''), ('probe', 'train_step')]": 0.0}
    store.apply(RunRecord("gpu_bandwidth", "success", started_at=1000.0, wall_seconds=5.0,
                          result={"gpu_seconds": {str(g): 0.5 for g in (0, 1, 2, 4, 7)}}))
    store.apply(RunRecord("gpu_bandwidth", "skipped", "gpu_allocated", started_at=2000.0))
    store.apply(RunRecord("gpu_bandwidth", "failure", "other", started_at=3000.0,
                          result={"gpu_seconds": {"3": 0.5}}))
    store.apply(RunRecord("train_step", "success", started_at=4000.0, wall_seconds=1.0,
                          result={"gpu_seconds": {"5": 0.3}}))
    v = parse(store)
    for g in range(8):
        assert v[f"{cov}[('gpu', '{g}'), ('probe', 'gpu_bandwidth')]"] == (1005.0 if g in (0, 1, 2, 4, 7) else 0.0)
    assert v[f"{cov}[('gpu', ''), ('probe', 'train_step')]"] == 4001.0
    assert not [k for k in v if k.startswith(cov) and "host_memory" in k]
    # kept across a restart: what the daemon writes to the state directory, read back by a new store
    again = ResultStore(PROBES, ["gpu_bandwidth", "train_step"])
    assert again.restore_coverage([*store.dump_coverage(), ["0", "no_such_probe", 5.0], "garbage", ["1"]]) == 6
    assert parse(again)[f"{cov}[('gpu', '7'), ('probe', 'gpu_bandwidth')]"] == 1005.0


def test_a_node_without_gpus_publishes_no_coverage():
    store = ResultStore(PROBES, ["gpu_bandwidth", "train_step"])
    store.set_environment({"gpus": []})
    assert not [k for k in parse(store) if k.startswith("fleetcanary_gpu_last_measured_timestamp_seconds")]
    store.apply(RunRecord("train_step", "success", started_at=10.0, wall_seconds=1.0))  # measured on the CPU
    assert parse(store)["fleetcanary_gpu_last_measured_timestamp_seconds[('gpu', ''), ('probe', 'train_step')]"] == 11.0
