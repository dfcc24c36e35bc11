"""The shipped rules on VictoriaMetrics' vmalert and on Prometheus, fed the same series: the same alerts fire
on both, the expected ones, and none on a healthy node.

One exporter stand-in on 127.0.0.1 serves a small fleet, a path per node; a real Prometheus and a real
single-node VictoriaMetrics scrape it with the same scrape config (the node label comes from it, as in a
real fleet), Prometheus evaluates the rule files itself and a real vmalert evaluates them against
VictoriaMetrics (datasource, remote write and remote read). The rule files are alerts/*.yml as they ship:
no interval, `for` or expression is scaled, so only alerts with `for: 0m` in groups without an interval
of their own (evaluated every second here, on both engines) can fire within the test's minute.

The scenario is data: fleet() says what each node exports and which (alert, gpu) it must raise; change
it when the metrics or the rules change. run_fleet() compares the engines on whatever rule files it is
given.

vmalert 1.79 (Debian bookworm's `victoria-metrics`) refuses `keep_firing_for`, which Prometheus 2.42
accepts: test_shipped_rules_load_unchanged_on_vmalert records that, and the engines are compared on
copies without that one field (tests/support/vmalert.py: vmalert_rule_files), which changes when a firing
alert resolves, never whether or when it fires.
"""
from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import wait_for
from tests.support.prometheus import Prometheus
from tests.support.servers import ServerThread
from tests.support.vmalert import (
    UNSUPPORTED_RULE_FIELDS,
    VictoriaMetrics,
    VMAlert,
    dry_run,
    evaluations,
    firing,
    refused_fields,
    vmalert_rule_files,
)

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = [ROOT / "alerts" / "fleetcanary.rules.yml", ROOT / "alerts" / "fleetcanary.alerts.yml"]
# Only a hang reaches it: on a quiet machine both engines fire everything within seconds of starting.
DEADLINE = 90.0
GPUS = ("0", "1")
LINKS = ("0", "1")

Alert = tuple[str, str, str]  # (alertname, node, gpu); gpu "" for a node-level alert


def healthy(node: str) -> dict[str, float]:
    """A healthy 2-GPU node's exposition: series (without the node label, which the scrape adds) -> value."""
    s = {f'fleetcanary_node_info{{pool="pool-a",cpu_model="Xeon 8480",gpu_model="H100",'
         f'driver_version="550.90.07",node_name="{node}"}}': 1,
         "fleetcanary_gpus_expected": len(GPUS), "fleetcanary_gpus_healthy": len(GPUS)}
    for g in GPUS:
        s[f'fleetcanary_gpu_info{{gpu="{g}",model="H100",uuid="GPU-{node}-{g}"}}'] = 1
        s[f'fleetcanary_gpu_lost{{gpu="{g}"}}'] = 0
        s[f'fleetcanary_gpu_pcie_link_width{{gpu="{g}"}}'] = 16
        s[f'fleetcanary_gpu_pcie_link_width_max{{gpu="{g}"}}'] = 16
        s[f'fleetcanary_gpu_pcie_link_generation{{gpu="{g}"}}'] = 5
        s[f'fleetcanary_gpu_pcie_link_generation_max{{gpu="{g}"}}'] = 5
        s[f'fleetcanary_gpu_remapped_rows_pending{{gpu="{g}"}}'] = 0
        s[f'fleetcanary_gpu_remapped_rows_failed{{gpu="{g}"}}'] = 0
        # Counters start at 0, as the exporter's pre-declared ones do. One first seen above zero splits the
        # engines: Prometheus's increase() counts nothing before a series' second sample, MetricsQL's counts
        # a small first value as an increase from 0 (vmalert then raises FleetCanaryGPUUncorrectableECC for
        # a count left from before the exporter started, and FleetCanaryGPUCriticalXid for an XID series
        # born at 1, which Prometheus never raises).
        for c in ("volatile", "aggregate"):
            for t in ("corrected", "uncorrected"):
                s[f'fleetcanary_gpu_ecc_errors_total{{gpu="{g}",type="{t}",counter="{c}"}}'] = 0
        for link in LINKS:
            s[f'fleetcanary_gpu_nvlink_up{{gpu="{g}",link="{link}"}}'] = 1
    return s


def fleet() -> dict[str, tuple[dict[str, float], set[tuple[str, str]]]]:
    """node -> (its exposition, the (alertname, gpu) it must raise). Six nodes: two healthy, four with one
    hard failure each (a lost GPU also leaves the node short of GPUs)."""
    faults: dict[str, tuple[dict[str, float], set[tuple[str, str]]]] = {
        "node-1": ({}, set()),
        "node-2": ({'fleetcanary_gpu_lost{gpu="1"}': 1, "fleetcanary_gpus_healthy": 1},
                   {("FleetCanaryGPULost", "1"), ("FleetCanaryGPUsMissing", "")}),
        "node-3": ({'fleetcanary_gpu_pcie_link_width{gpu="0"}': 8}, {("FleetCanaryPCIeLinkWidthDegraded", "0")}),
        "node-4": ({'fleetcanary_gpu_nvlink_up{gpu="0",link="1"}': 0}, {("FleetCanaryNVLinkDown", "0")}),
        "node-5": ({'fleetcanary_gpu_remapped_rows_failed{gpu="1"}': 1}, {("FleetCanaryGPURowRemapFailed", "1")}),
        "node-6": ({}, set()),
    }
    out = {}
    for node, (changes, alerts) in faults.items():
        series = healthy(node)
        assert changes.keys() <= series.keys(), f"{node}: a fault on a series the node does not export"
        out[node] = ({**series, **changes}, alerts)
    return out


class FleetExporter(ServerThread):
    """Serves each node's exposition at /nodes/NODE/metrics."""

    def __init__(self, expositions: dict[str, dict[str, float]]) -> None:
        pages = {f"/nodes/{node}/metrics": "".join(f"{s} {v!r}\n" for s, v in series.items()).encode()
                 for node, series in expositions.items()}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                page = pages.get(self.path)
                self.send_response(200 if page is not None else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(page or b"")))
                self.end_headers()
                self.wfile.write(page or b"")

            def log_message(self, *args):
                pass

        super().__init__(Handler)
        self.nodes = list(expositions)

    def scrape_configs(self) -> list[dict]:
        """One job, a target per node: the node label and the path come from the target's labels."""
        return [{"job_name": "fleetcanary", "scrape_interval": "1s",
                 "static_configs": [{"targets": [self.address],
                                     "labels": {"node": n, "__metrics_path__": f"/nodes/{n}/metrics"}}
                                    for n in self.nodes]}]


def evaluated_again(url: str, groups: set[str], times: int):
    """A predicate: every group in ``groups`` has done ``times`` more evaluations than when this was called."""
    start = evaluations(url)
    return lambda: all(evaluations(url).get(g, 0) >= start.get(g, 0) + times for g in groups)


def run_fleet(tmp_path: Path, rule_files: list[Path], nodes: dict) -> tuple[set[Alert], set[Alert], set[Alert]]:
    """Serve ``nodes`` (fleet()'s shape) to Prometheus and to VictoriaMetrics, evaluate ``rule_files`` on
    Prometheus and on vmalert until each fires at least what is expected, then twice more; (expected,
    fired on Prometheus, fired on vmalert), all as (alertname, node, gpu)."""
    want = {(name, node, gpu) for node, (_, alerts) in nodes.items() for name, gpu in alerts}
    vm_rules, _ = vmalert_rule_files(rule_files, tmp_path / "vmalert-rules")
    exporter = FleetExporter({node: series for node, (series, _) in nodes.items()})
    started: list = [exporter]
    try:
        started.append(prom := Prometheus(tmp_path / "prometheus", [], rule_files=[str(p) for p in rule_files],
                                          scrape_configs=exporter.scrape_configs()))
        started.append(vm := VictoriaMetrics(tmp_path / "vm", scrape_configs=exporter.scrape_configs()))
        started.append(vma := VMAlert(tmp_path / "vmalert", vm.url, vm_rules))
        engines = {"prometheus": prom.url, "vmalert": vma.url}
        fired: dict[str, set[Alert]] = {}

        def all_fired(engine: str) -> bool:
            fired[engine] = firing(engines[engine])
            return want <= fired[engine]

        for engine in engines:
            try:
                wait_for(lambda e=engine: all_fired(e), timeout=DEADLINE, what=f"the expected alerts on {engine}")
            except AssertionError as e:
                raise AssertionError(f"{e}; never fired: {sorted(want - fired.get(engine, set()))}; "
                                     f"fired: {sorted(fired.get(engine, set()))}") from None
        # Whatever else the per-second groups would raise has had time to fire: each engine evaluates every
        # group without its own interval twice more (a group with `interval: 1m` may not have run at all).
        per_second = {g["name"] for p in rule_files for g in yaml.safe_load(p.read_text())["groups"]
                      if "interval" not in g}
        for engine, url in engines.items():
            wait_for(evaluated_again(url, per_second, 2), timeout=DEADLINE, what=f"two more evaluations on {engine}")
            fired[engine] = firing(url)
        return want, fired["prometheus"], fired["vmalert"]
    finally:
        for s in reversed(started):
            s.stop()


def test_shipped_rules_load_unchanged_on_vmalert():
    r = dry_run(RULE_FILES)
    refused = refused_fields(r.stdout + r.stderr)
    if r.returncode != 0 and refused and refused <= set(UNSUPPORTED_RULE_FIELDS):
        pytest.xfail(f"this vmalert refuses {sorted(refused)} (Prometheus 2.42 accepts it); the engines are "
                     f"compared without it")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


def test_same_alerts_fire_on_vmalert_and_prometheus(tmp_path):
    want, on_prometheus, on_vmalert = run_fleet(tmp_path, RULE_FILES, fleet())
    assert on_prometheus == want, f"Prometheus: extra {sorted(on_prometheus - want)}"
    assert on_vmalert == on_prometheus, (f"only on vmalert: {sorted(on_vmalert - on_prometheus)}; "
                                         f"only on Prometheus: {sorted(on_prometheus - on_vmalert)}")
    healthy_nodes = {node for node, (_, alerts) in fleet().items() if not alerts}
    assert healthy_nodes and not {a for a in on_vmalert | on_prometheus if a[1] in healthy_nodes}
