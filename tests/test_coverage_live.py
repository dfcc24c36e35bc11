"""Coverage on a live Prometheus: each node's exposition as the exporter renders it (fleetcanary.daemon.state from
run records: the GPUs each gpu_bandwidth run measured, train_step per node, skips held by pods), scraped as a
fleet; the shipped rules (alerts/build.py at a 300th of their intervals) record each pool's measured share and
raise FleetCanaryPoolUnmeasured on the pool whose GPUs are held, and the dashboards' coverage panels answer.

Pool a: 3 nodes, every GPU measured. Pool b: 3 nodes whose GPUs 1-3 are held by pods (gpu_bandwidth measured
GPU 0 only, and skipped gpu_allocated); train_step measured everywhere.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from alerts import build
from fleetcanary.core.record import RunRecord
from fleetcanary.daemon.state import ResultStore
from fleetcanary.probes import PROBES
from tests.support.fleet_exporter import FleetExporter
from tests.support.prometheus import Prometheus
from tests.support.vmalert import alerts, evaluations

ROOT = Path(__file__).resolve().parent.parent
SCALE = 1 / 300
SETTINGS = build.SETTINGS.model_copy(update={"hard_interval": build.SETTINGS.interval})
NODES = {"a1": "pool-a", "a2": "pool-a", "a3": "pool-a", "b1": "pool-b", "b2": "pool-b", "b3": "pool-b"}
GPUS = range(4)
CAP = 300.0


def exposition(node: str, pool: str, now: float) -> dict[str, float]:
    """What the node's exporter publishes, from its run records ({series: value}, the node label left to the
    scrape)."""
    store = ResultStore(PROBES, ["gpu_bandwidth", "train_step"])
    store.set_enabled(["gpu_bandwidth", "train_step"], {"gpu_bandwidth": 900.0, "train_step": 3600.0})
    store.set_node_extra_labels({"pool": pool})
    store.set_environment({"gpus": [{"index": g} for g in GPUS]})
    held = pool == "pool-b"
    store.apply(RunRecord("gpu_bandwidth", "success", started_at=now - 60, wall_seconds=10,
                          result={"gpu_seconds": {str(g): 1.0 for g in GPUS if not (held and g > 0)}}))
    for k in range(3 if held else 0):
        store.apply(RunRecord("gpu_bandwidth", "skipped", "gpu_allocated", started_at=now - 30 + k))
    store.apply(RunRecord("train_step", "success", started_at=now - 60, wall_seconds=2,
                          result={"gpu_seconds": {"0": 0.3}}))
    page = {}
    for fam in text_string_to_metric_families(store.exposition.decode()):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            page[f"{s.name}{{{labels}}}"] = s.value
    return page


def coverage_panels() -> list[tuple[str, str]]:
    out = []
    for board in sorted((ROOT / "dashboards" / "json").glob("*.json")):
        for p in json.loads(board.read_text())["panels"]:
            if p["title"].startswith("Coverage"):
                out += [(p["title"], t["expr"]) for t in p["targets"]]
    return out


def test_pool_coverage_is_recorded_and_the_held_pool_alone_is_reported_on_a_live_prometheus(tmp_path):
    now = time.time()
    exporter = FleetExporter({n: exposition(n, pool, now) for n, pool in NODES.items()})
    rules = []
    for name, text in build.render(scale=SCALE, settings=SETTINGS).items():
        rules.append(tmp_path / name)
        rules[-1].write_text(text)
    prom = None
    try:
        prom = Prometheus(tmp_path / "prometheus", [], rule_files=[str(p) for p in rules],
                          scrape_configs=exporter.scrape_configs())
        group = "fleetcanary-coverage-alerts"
        deadline = time.monotonic() + CAP

        def unmeasured() -> list[dict]:
            return [a for a in alerts(prom.url)
                    if a["labels"]["alertname"] == "FleetCanaryPoolUnmeasured" and a["state"] == "firing"]

        # the alert's `for` (30 minutes: 6 s scaled) and a few evaluations more, counted in evaluations
        while time.monotonic() < deadline and (not unmeasured() or evaluations(prom.url).get(group, 0) < 12):
            time.sleep(0.5)
        fired = unmeasured()
        share = {r["metric"]["pool"]: float(r["value"][1])
                 for r in prom.query("pool:fleetcanary_gpu_measured:ratio_1d")}
        per_node = {(r["metric"]["node"], r["metric"].get("gpu", ""), r["metric"]["probe"]): float(r["value"][1])
                    for r in prom.query("fleetcanary_gpu_last_measured_timestamp_seconds")}
        panels = {(title, expr): prom.query(expr.replace("$pool", ".*").replace("$cluster", ".*")
                                            .replace("$node", "b1")) for title, expr in coverage_panels()}
    finally:
        if prom:
            prom.stop()
        exporter.stop()
    assert [(a["labels"]["pool"], a["labels"]["probe"], a["labels"]["severity"]) for a in fired] == \
        [("pool-b", "gpu_bandwidth", "warning")]
    assert "25%" in fired[0]["annotations"]["description"]
    # the description's skip query ran on the live server: the pages are static, so the skip counters never
    # increased while scraped (alerts/tests/coverage.test.yml shows the reasons of counters that do)
    assert fired[0]["annotations"]["description"].endswith("by reason: none")
    # pool b: GPU 0 and the node's training step of 5 (GPU, probe) pairs per node
    # (a mean of 0s and 1s: Prometheus's avg sums incrementally, 0.39999999999999997 for 2 of 5)
    assert share == pytest.approx({"pool-a": 1.0, "pool-b": 0.4}, rel=1e-12)
    assert len(per_node) == len(NODES) * (len(GPUS) + 1)
    assert per_node[("b1", "1", "gpu_bandwidth")] == 0.0  # never measured
    assert abs(per_node[("b1", "0", "gpu_bandwidth")] - (now - 50)) < 1e-3  # when the run ended
    assert abs(per_node[("a2", "", "train_step")] - (now - 58)) < 1e-3
    assert len(panels) == 3 and all(panels.values()), {k[0]: v for k, v in panels.items()}
