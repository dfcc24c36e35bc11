"""The judge in a real daemon: an exporter restart is never a driver change, and the statistics of
the runs before the restart are published at once."""
from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from fleetcanary.judge.store import FigureStore
from tests.judge.test_store import DRIVER, node_days


def samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_a_restarted_exporter_keeps_its_driver_and_statistics(start_daemon, tmp_path):
    state = tmp_path / "daemon" / "state"
    node_days(FigureStore(str(state)), 3, probes={"gpu_bandwidth"}, start=time.time() - 3 * 86400)
    d = start_daemon({"state_dir": str(state), "pool": "pool-a", "probes": {}}, env={"NODE_NAME": "node-a"})
    text = d.metrics()
    info = samples(text, "fleetcanary_node_info")[0]
    assert info.labels["driver_version"] == DRIVER, info.labels  # never "unknown" before the first GPU run
    change = samples(text, "fleetcanary_judge_change")
    assert len(change) == 24  # 8 GPUs x 3 directions
    assert {(s.labels["pool"], s.labels["driver_version"], s.labels["baseline"]) for s in change} == \
        {("pool-a", DRIVER, "current_driver")}
    assert all(0.95 < s.value < 1.05 for s in change)
