"""The shipped rules on VictoriaMetrics' vmalert and on Prometheus, fed the same series: the same alerts fire
on both, the expected ones, and none on a healthy node.

One exporter stand-in on 127.0.0.1 serves a small fleet, a path per node (tests/support/fleet_exporter.py); a
real Prometheus and a real single-node VictoriaMetrics scrape it with the same scrape config (the node label
comes from it, as in a real fleet), Prometheus evaluates the rule files itself and a real vmalert evaluates them
against VictoriaMetrics (datasource, remote write and remote read).

vmalert 1.79 (Debian bookworm's `victoria-metrics`) loads the shipped files unchanged (no keep_firing_for; the
change path's hold reads ALERTS: test_shipped_rules_load_unchanged_on_vmalert). The engines are compared on the same
rules rendered by alerts/build.py with build(scale=SCALE) and the hard-failure interval of the peer groups:
every group evaluates each second and every `for` is a 300th (15 minutes: 3 s), so the peer and own-history
alerts fire within the test's minute; expressions, labels and windows are the shipped ones.

The scenario is data: fleet() says what each node exports and which (alert, gpu, path) it must raise; change
it when the metrics or the rules change. run_fleet() compares the engines on whatever rule files it is given.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from alerts import build
from fleetcanary.probes.lib import yamltext
from tests.support.fleet_exporter import FleetExporter, Member, build_tests, judged_pages
from tests.support.helpers import wait_for
from tests.support.prometheus import Prometheus
from tests.support.vmalert import VictoriaMetrics, VMAlert, assert_loads, dry_run, evaluations, firing

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = [ROOT / "alerts" / "fleetcanary.rules.yml", ROOT / "alerts" / "fleetcanary.alerts.yml"]
SCALE = 1 / 300
# The peer groups' interval for every group: scaled, each group evaluates every second.
SETTINGS = build.SETTINGS.model_copy(update={"hard_interval": build.SETTINGS.interval})
# Only a hang reaches it: on a quiet machine both engines fire everything within half a minute of starting.
DEADLINE = 120.0
GPUS = ("0", "1")
KEYS = ("alertname", "node", "gpu", "path")
# Judged figures in the scenario: one per GPU and higher-is-better, one per node and lower-is-better.
JUDGED = ("gpu_memory_bandwidth", "storage_first_byte")
DEGRADED, DEGRADED_GPU = "node-6", "1"

Alert = tuple[str, str, str, str]  # (alertname, node, gpu, path); gpu "" for a node-level alert, path "" for a hard one


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
        s[f'fleetcanary_gpu_nvlink_links_up{{gpu="{g}"}}'] = 18
    return s


def judged(nodes: list[str]) -> tuple[dict[str, dict[str, float]], set[tuple[str, str, str, str]]]:
    """The judge's statistics of JUDGED on `nodes` (each GPU of GPUS for a per-GPU figure), one peer group of them
    all; DEGRADED's GPU DEGRADED_GPU (and its node-level figure) 30% worse on every statistic. Returns (node -> its
    series, the alerts it must raise as (node, alertname, gpu, path)): the peer change, level and fast paths,
    regression and drift; not the fast path on its own history (it has peers)."""
    figures = {f.key: f for f in build_tests.figures()}
    members, want = {}, set()
    for key in JUDGED:
        f = figures[key]
        bad = {k: build_tests.off(f, 0.3) for k in ("median", "newest", "change", "drift")}
        gpus = GPUS if build_tests.judged_figure(f).gpu else ("",)
        members[key] = [Member(n, gpu=g, **(bad if (n, g) in ((DEGRADED, DEGRADED_GPU), (DEGRADED, "")) else {}))
                        for n in nodes for g in gpus]
        want |= {(DEGRADED, build_tests.name(f, path), DEGRADED_GPU if gpus != ("",) else "", path)
                 for path in ("change", "level", "fast", "regression", "drift")}
    return judged_pages(members), want


def fleet() -> dict[str, tuple[dict[str, float], set[tuple[str, str, str]]]]:
    """node -> (its exposition, the (alertname, gpu, path) it must raise). Seven nodes, one peer group: two
    healthy, four with one hard failure each (a lost GPU also leaves the node short of GPUs), one whose GPU
    memory bandwidth and storage latency are 30% worse than its peers' and than its own best day."""
    faults: dict[str, tuple[dict[str, float], set[tuple[str, str, str]]]] = {
        "node-1": ({}, set()),
        "node-2": ({'fleetcanary_gpu_lost{gpu="1"}': 1, "fleetcanary_gpus_healthy": 1},
                   {("FleetCanaryGPULost", "1", ""), ("FleetCanaryGPUsMissing", "", "")}),
        "node-3": ({'fleetcanary_gpu_pcie_link_width{gpu="0"}': 8}, {("FleetCanaryPCIeLinkWidthDegraded", "0", "")}),
        "node-4": ({'fleetcanary_gpu_nvlink_links_up{gpu="0"}': 17, 'fleetcanary_gpu_nvlink_links_down{gpu="0"}': 1},
                   {("FleetCanaryNVLinkDown", "0", "")}),
        "node-5": ({'fleetcanary_gpu_remapped_rows_failed{gpu="1"}': 1}, {("FleetCanaryGPURowRemapFailed", "1", "")}),
        DEGRADED: ({}, set()),
        "node-7": ({}, set()),
    }
    pages, want = judged(list(faults))
    out = {}
    for node, (changes, alerts) in faults.items():
        series = healthy(node)
        # a fault changes what a healthy node exports, or adds a series published only while non-zero
        assert {k for k in changes if k not in series} <= {k for k in changes if "nvlink_links_down" in k}, \
            f"{node}: a fault on a series the node does not export"
        out[node] = ({**series, **changes, **pages[node]},
                     alerts | {(name, gpu, path) for n, name, gpu, path in want if n == node})
    return out


def scaled_rules(workdir: Path) -> list[Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in build.render(scale=SCALE, settings=SETTINGS).items():
        paths.append(workdir / name)
        paths[-1].write_text(text)
    return paths


def evaluated(url: str, groups: set[str], times: int) -> bool:
    """Every group in ``groups`` has done ``times`` evaluations on the engine at ``url``."""
    done = evaluations(url)
    return all(done.get(g, 0) >= times for g in groups)


def run_fleet(tmp_path: Path, rule_files: list[Path], nodes: dict) -> tuple[set[Alert], set[Alert], set[Alert]]:
    """Serve ``nodes`` (fleet()'s shape) to Prometheus and to VictoriaMetrics, evaluate ``rule_files`` on
    Prometheus and on vmalert until each fires at least what is expected and has evaluated every group for the
    longest `for` and a few more times; (expected, fired on Prometheus, fired on vmalert), all as (alertname,
    node, gpu, path)."""
    want = {(name, node, gpu, path) for node, (_, alerts) in nodes.items() for name, gpu, path in alerts}
    assert_loads(rule_files)
    docs = [yamltext.load(p.read_text()) for p in rule_files]
    # every group each second but the peers' spread (15 minutes scaled: 3 s), which the waits do not count: the
    # alerts read its newest, and it evaluates a third as often
    intervals = {g["name"]: build.seconds(g["interval"]) for d in docs for g in d["groups"]}
    assert intervals.pop("fleetcanary-peer-spread", 3) == 3 and set(intervals.values()) == {1}, intervals
    groups = set(intervals)
    longest_for = max(build.seconds(r.get("for", "0s")) for d in docs for g in d["groups"] for r in g["rules"])
    exporter = FleetExporter({node: series for node, (series, _) in nodes.items()})
    started: list = [exporter]
    try:
        started.append(prom := Prometheus(tmp_path / "prometheus", [], rule_files=[str(p) for p in rule_files],
                                          scrape_configs=exporter.scrape_configs()))
        started.append(vm := VictoriaMetrics(tmp_path / "vm", scrape_configs=exporter.scrape_configs()))
        started.append(vma := VMAlert(tmp_path / "vmalert", vm.url, rule_files))
        engines = {"prometheus": prom.url, "vmalert": vma.url}
        fired: dict[str, set[Alert]] = {}

        def all_fired(engine: str) -> bool:
            fired[engine] = firing(engines[engine], KEYS)
            return want <= fired[engine]

        for engine in engines:
            try:
                wait_for(lambda e=engine: all_fired(e), timeout=DEADLINE, what=f"the expected alerts on {engine}")
            except AssertionError as e:
                raise AssertionError(f"{e}; never fired: {sorted(want - fired.get(engine, set()))}; "
                                     f"fired: {sorted(fired.get(engine, set()))}") from None
        # Whatever else would fire has had time to: the series are the same from the first scrape, so an alert
        # fires at the latest once every group has evaluated for the longest `for` (in evaluations, a second
        # each) after its inputs, recorded a few evaluations in, exist.
        enough = longest_for + 5
        wait_for(lambda: all(evaluated(url, groups, enough) for url in engines.values()), timeout=DEADLINE,
                 what=f"{enough} evaluations of every group on both engines")
        return want, firing(prom.url, KEYS), firing(vma.url, KEYS)
    finally:
        for s in reversed(started):
            s.stop()


def test_shipped_rules_load_unchanged_on_vmalert():
    r = dry_run(RULE_FILES)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


def test_rules_with_a_deployers_settings_load_on_vmalert(tmp_path):
    """The settings of tests/test_alerts.py's override (a selector, a peer label, pool shards) load too."""
    s = build.SETTINGS.model_copy(update={"selector": 'job="fc"', "peer_labels": ("cluster",), "pools": ("a", "b")})
    paths = []
    for name, text in build.render(settings=s).items():
        paths.append(tmp_path / name)
        paths[-1].write_text(text)
    assert_loads(paths)


def test_the_scenario_judges_every_peer_path_on_one_node():
    alerts = {a for _, (_, want) in fleet().items() for a in want}
    assert {path for _, _, path in alerts} == {"", "change", "level", "fast", "regression", "drift"}
    assert {gpu for _, gpu, path in alerts if path} == {DEGRADED_GPU, ""}


@pytest.mark.long
def test_same_alerts_fire_on_vmalert_and_prometheus(tmp_path):
    want, on_prometheus, on_vmalert = run_fleet(tmp_path, scaled_rules(tmp_path / "rules"), fleet())
    assert on_prometheus == want, f"Prometheus: extra {sorted(on_prometheus - want)}"
    assert on_vmalert == on_prometheus, (f"only on vmalert: {sorted(on_vmalert - on_prometheus)}; "
                                         f"only on Prometheus: {sorted(on_prometheus - on_vmalert)}")
    healthy_nodes = {node for node, (_, alerts) in fleet().items() if not alerts}
    assert healthy_nodes == {"node-1", "node-7"}
    assert not {a for a in on_vmalert | on_prometheus if a[1] in healthy_nodes}
