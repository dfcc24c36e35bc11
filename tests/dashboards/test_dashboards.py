"""Dashboards: generated JSON current, every panel with a unit and a 'good' description, every name real,
and every panel query answered by a real Prometheus.

Live: `fleetcanary demo --this-host --fast` runs the exporter (host memory bandwidth, storage, collectives on gloo,
the inference canary against the reference server) and a Prometheus with the shipped rules. Queries that
need GPUs, firing alerts or the judged statistics (a baseline needs a complete day of runs, a peer group
several nodes) run on a synthetic GPU fleet backfilled into a second Prometheus instead.
"""
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dashboards import build
from fleetcanary.core import resources
from fleetcanary.offline import local_services as svc
from fleetcanary.probes.lib import yamltext
from harness import backfill
from harness.backfill import RECORD_NAME, BackfilledPrometheus, backfill_rules, create_blocks
from tests.support import synthetic_fleet
from tests.support.helpers import http_get, require_binary, wait_for

ROOT = Path(__file__).resolve().parents[2]
BOARDS = ROOT / "dashboards"

NEEDS_SYNTHETIC = re.compile(r"fleetcanary_gpu_|gpu:|node_gpu:|fleetcanary_gpu_model|ALERTS|"
                             r"collective_bus_bandwidth_bytes_per_second:peer|fleetcanary_train_step_|"
                             r"fleetcanary_rdma_|fleetcanary_net_interface_|fabric|"
                             r"fleetcanary_judge_(median|newest|change|drift)|:fleetcanary_judge_|"
                             # the exporter's own error counters: none on a healthy daemon (a series once above 0)
                             r"fleetcanary_(history_write_errors|judge_store_errors|config_reloads)_total")
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "ALERTS", "ALERTS_FOR_STATE", "process_resident_memory_bytes",
                  "process_cpu_seconds_total", "process_open_fds"}
PROMQL_WORDS = {"by", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "without", "bool",
                "offset", "le"}


def boards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((BOARDS / "json").glob("*.json"))}


def panel_queries():
    for name, board in boards().items():
        for p in board["panels"]:
            for t in p.get("targets", []):
                yield name, p["title"], t["expr"]


def metric_names(expr: str) -> set[str]:
    """Series names an expression reads: identifiers not followed by '(' and outside label matchers/strings."""
    bare = re.sub(r'"[^"]*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\b(by|on|ignoring|without|group_left|group_right)\s*\([^)]*\)", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    bare = re.sub(r"\boffset\s+[0-9smhdwy]+", "", bare)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", bare):
        tail = bare[m.end():].lstrip()
        if tail.startswith("(") or m.group() in PROMQL_WORDS or re.fullmatch(r"\d.*", m.group()):
            continue
        names.add(m.group())
    return names


RULE_FILES = (ROOT / "alerts/fleetcanary.rules.yml", ROOT / "alerts/fleetcanary.alerts.yml")


def recording_rules() -> list[dict]:
    """Every recording rule shipped: the peer statistics are recorded in the alert file's peers group."""
    return [r for f in RULE_FILES for g in yamltext.load(f.read_text())["groups"] for r in g["rules"] if "record" in r]


def judge_families() -> set[str]:
    """The judge's families as the exporter exposes them (fleetcanary.judge.exposition)."""
    from fleetcanary.judge.exposition import families
    from fleetcanary.judge.store import FigureStore

    return {f.name + ("_total" if f.type == "counter" else "")
            for f in families(FigureStore(None), {}, 0.0, lambda probe: 0.0)}


def catalog() -> set[str]:
    documented = set(re.findall(r"`(fleetcanary_[a-z0-9_]+)`", (ROOT / "docs/metrics.md").read_text()))
    records = {r["record"] for r in recording_rules()}
    return documented | records | judge_families() | PROMETHEUS_OWN


def known(name: str, names: set[str]) -> bool:
    return name in names or re.sub(r"_(bucket|sum|count)$", "", name) in names


def test_the_sources_make_exactly_the_committed_boards():
    assert sorted(build.render()) == sorted(boards()), "dashboards/json holds other files than the sources make"


def test_every_dashboard_source_has_its_board_with_the_template_variables():
    b = boards()
    sources = {build.json_name(p) for p in build.sources()}
    assert set(b) == sources and {"fleet-overview.json", "node-detail.json"} <= sources
    for name, board in b.items():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource", name
        assert "pool" in variables, name
        assert board["uid"].startswith("fleetcanary-") and "fleetcanary" in board["tags"]
    assert "node" in {v["name"] for v in b["node-detail.json"]["templating"]["list"]}
    assert "model" in {v["name"] for v in b["fleet-overview.json"]["templating"]["list"]}


def test_every_panel_has_a_unit_and_says_what_good_looks_like():
    bad = []
    for name, board in boards().items():
        for p in board["panels"]:
            unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit") or p.get("format")
            if not unit:
                bad.append(f"{name}: {p['title']}: no unit")
            if "Good:" not in (p.get("description") or ""):
                bad.append(f"{name}: {p['title']}: the description does not say what good looks like")
            if p.get("datasource") != "${datasource}":
                bad.append(f"{name}: {p['title']}: not on the datasource variable")
    assert not bad, "\n".join(bad)


def test_every_name_a_dashboard_uses_exists():
    names = catalog()
    unknown = sorted({f"{b}: {title}: {n}" for b, title, expr in panel_queries() for n in metric_names(expr)
                      if not known(n, names)})
    assert not unknown, "names used by dashboards but neither documented nor recorded:\n" + "\n".join(unknown)


def test_the_catalog_check_catches_a_misspelt_name():
    names = catalog()
    found = metric_names('sum by (gpu) (fleetcanary_gpu_memory_bandwith_bytes_per_second{node="$node"}) '
                         '/ on(figure) group_left pool:fleetcanary_judge_median:peer_median '
                         '* fleetcanary_judge_meidan{figure="x"}')
    assert found == {"fleetcanary_gpu_memory_bandwith_bytes_per_second", "fleetcanary_judge_meidan",
                     "pool:fleetcanary_judge_median:peer_median"}
    assert sorted(n for n in found if not known(n, names)) == ["fleetcanary_gpu_memory_bandwith_bytes_per_second",
                                                               "fleetcanary_judge_meidan"]


# ----------------------------------------------------------------------------------- live and synthetic
def substitute(expr: str, node: str, rate: str) -> str:
    for var in ("$cluster", "$pool", "$model", "$target", "$job", "$figure"):
        expr = expr.replace(f'~"{var}"', '~".*"')  # =~ (All) and !~ (none left out)
    return expr.replace("$node", node).replace("$__rate_interval", rate)


class Live:
    """`fleetcanary demo --this-host --fast` as a subprocess: its exporter and Prometheus."""

    def __init__(self, workdir: Path) -> None:
        require_binary("prometheus")
        self.out = workdir / "demo.out"
        with open(self.out, "wb") as out:  # the demo keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fleetcanary", "demo", "--this-host", "--fast", "--listen", "127.0.0.1:0",
                 "--prometheus-listen", "127.0.0.1:0", "--workdir", str(workdir / "demo"), "--duration", "600"],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        line = wait_for(lambda: re.search(r"Prometheus:\s+(http://\S+)", self.out.read_text()), timeout=90,
                        what="the demo's Prometheus")
        self.url = line.group(1)
        self.node = socket.gethostname() or "demo"

    def query(self, expr: str) -> list[dict]:
        import urllib.parse
        code, _, body = http_get(self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        data = json.loads(body)
        assert code == 200 and data["status"] == "success", f"{expr}: {data}"
        return data["data"]["result"]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait()
        return rc


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    lv = Live(tmp_path_factory.mktemp("live"))
    yield lv
    rc = lv.stop()
    assert rc == 0, lv.out.read_text()


DRIVER, PREVIOUS_DRIVER = "570.124.06", "565.57.01"


def judged_statistics(start: int, end: int) -> str:
    """OpenMetrics lines of the statistics each synthetic node would publish (fleetcanary_judge_*), steady over
    the window: per GPU its memory bandwidth, matmul, P2P slowest link and training step, per node a collective,
    host memory and storage; GPU 5 of node 3 at 92% of its best day (d2d), every GPU figure 3% below its best
    day on the previous driver (an upgrade in the last two weeks); a per-node offset keeps the peers' MAD > 0."""
    sf = synthetic_fleet
    ts = range(start, end + 1, sf.STEP)
    fams: dict[str, list[str]] = {}

    def add(name: str, labels: dict, value: float) -> None:
        lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
        fams.setdefault(name, []).extend(f"{name}{{{lab}}} {value:.6g} {t}" for t in ts)

    for n, node in enumerate(sf.NODES):
        offset = 1 + 0.002 * (n - 2.5)
        rows = [("collective_bus_bandwidth", "all_reduce/1048576/8/nccl", "", "H100", DRIVER, 1.2e11, 1.0),
                ("host_memory_bandwidth", "copy", "", "Xeon 8480", "", 2.0e11, 1.0),
                ("host_memory_bandwidth", "triad", "", "Xeon 8480", "", 2.2e11, 1.0),
                ("storage_read", "scratch/cold", "", "", "", 2.5e9, 1.0),
                ("storage_first_byte", "scratch/cold", "", "", "", 4e-4, 1.0)]
        for g in sf.GPUS:
            rows += [("gpu_memory_bandwidth", "d2d", str(g), "H100", DRIVER, sf.D2D, 0.92 if (n, g) == (3, 5) else 1),
                     ("gpu_memory_bandwidth", "h2d", str(g), "H100", DRIVER, sf.H2D, 1.0),
                     ("gpu_memory_bandwidth", "d2h", str(g), "H100", DRIVER, sf.H2D, 1.0),
                     ("gpu_matmul_throughput", "bf16", str(g), "H100", DRIVER, sf.MATMUL, 1.0),
                     ("gpu_p2p_bandwidth", "slowest_link", str(g), "H100", DRIVER, 3.6e11, 1.0),
                     ("train_step_time", "bf16", str(g), "H100", DRIVER, sf.STEP_SECONDS, 1.0)]
        for figure, series, gpu, model, driver, value, change in rows:
            labels = {"node": node, "figure": figure, "series": series, "gpu": gpu, "pool": "train-a",
                      "model": model, "driver_version": driver}
            add("fleetcanary_judge_median", labels, value * offset * change)
            add("fleetcanary_judge_newest", labels, value * offset * change * 1.001)
            add("fleetcanary_judge_change", {**labels, "baseline": "current_driver", "baseline_driver": driver},
                offset * change)
            add("fleetcanary_judge_drift", labels, change)
            if driver:
                add("fleetcanary_judge_change",
                    {**labels, "baseline": "previous_driver", "baseline_driver": PREVIOUS_DRIVER}, 0.97 * change)
    return "".join(f"# TYPE {name} gauge\n" + "\n".join(lines) + "\n" for name, lines in fams.items())


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    require_binary("promtool")
    work = tmp_path_factory.mktemp("synthetic")
    end = int(time.time()) // 300 * 300 - 3600
    om = work / "fleet.om"
    start, end = synthetic_fleet.write(om, end)
    text = om.read_text()
    om.write_text(text.removesuffix("# EOF\n") + judged_statistics(start, end) + "# EOF\n")
    data = work / "data"
    create_blocks(om, data)
    wanted = sorted({n for _, _, e in panel_queries() for n in RECORD_NAME.findall(e)})
    records = work / "records.yml"
    records.write_text(yaml.safe_dump({"groups": [{"name": "records", "rules": recording_rules()}]}))
    with pytest.MonkeyPatch.context() as mp:  # rule_stages reads the rules file only; the peers' are in the alerts'
        mp.setattr(backfill, "rule_stages", functools.partial(backfill.rule_stages, rules_path=records))
        backfill_rules(data, wanted, start, end, 300, work)
    prom = BackfilledPrometheus(data, work / "prometheus.log")
    prom.end = end
    yield prom
    prom.stop()


@pytest.mark.long
def test_every_panel_query_returns_data(live, synthetic):
    queries = list(panel_queries())
    synth = [(b, t, e) for b, t, e in queries if NEEDS_SYNTHETIC.search(e)]
    on_live = [(b, t, e) for b, t, e in queries if not NEEDS_SYNTHETIC.search(e)]
    assert len(on_live) >= 25 and len(synth) >= 10, (len(on_live), len(synth))

    def empty_live():
        return [(b, t, e) for b, t, e in on_live if not live.query(substitute(e, live.node, "1m"))]

    missing: list = []

    def settled():
        missing[:] = empty_live()
        return not missing

    try:
        wait_for(settled, timeout=180, interval=3, what="every live panel query to return data")
    except AssertionError:
        pass
    node = synthetic_fleet.NODES[2]
    missing += [(b, t, e) for b, t, e in synth
                if not synthetic.query(substitute(e, node, "15m"), synthetic.end)]
    assert not missing, "panels that return nothing:\n" + "\n".join(f"{b}: {t}: {e}" for b, t, e in missing)


def test_the_fast_host_demo_evaluates_every_group_every_few_seconds_and_changes_nothing_else(tmp_path):
    """A group's own interval overrides Prometheus's global one: `demo --this-host --fast` writes copies of the
    shipped rule files with every group at the fast interval (its fleet overview joins on the inventory's
    records, which were a minute late), each rule as shipped; promtool checks the copies."""
    promtool = require_binary("promtool")
    with resources.rule_files() as shipped:
        fast = svc.fast_rule_files(shipped, tmp_path)
        before = [yamltext.load(p.read_text()) for p in shipped]
    after = [yamltext.load(p.read_text()) for p in fast]
    assert [p.name for p in fast] == [p.name for p in shipped] and all(p.parent == tmp_path for p in fast)
    groups = [g for doc in after for g in doc["groups"]]
    assert len(groups) >= 10 and {g["interval"] for g in groups} == {svc.FAST_INTERVAL} == {"2s"}
    assert {g.get("interval") for doc in before for g in doc["groups"]} >= {"1m", "5m", "15m"}
    strip = [[{k: v for k, v in g.items() if k != "interval"} for g in doc["groups"]] for doc in before]
    assert [[{k: v for k, v in g.items() if k != "interval"} for g in doc["groups"]] for doc in after] == strip
    r = subprocess.run([promtool, "check", "rules", *map(str, fast)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_template_variable_queries_resolve(live, synthetic):
    queries = []
    for name, board in boards().items():
        for v in board["templating"]["list"]:
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", v.get("query") or "")
            if v["type"] != "query" or not m:
                continue
            if v["name"] == "cluster":  # no cluster label on a single-cluster Prometheus: All (.*) matches all
                assert v["includeAll"] and v["allValue"] == ".*", v
                continue
            queries.append((f"{name}: ${v['name']}: {v['query']}",
                            f"group by ({m.group(2)}) ({substitute(m.group(1), '.*', '1m')})"))
    assert len(queries) >= 5, queries
    left: list[str] = []

    def resolved() -> bool:
        left[:] = [what for what, expr in queries
                   if not (synthetic.query(expr, synthetic.end) if "gpu" in expr else live.query(expr))]
        return not left

    # the demo's Prometheus may not have scraped yet where this test is the first to use its fixture
    try:
        wait_for(resolved, timeout=180, interval=3, what="every template variable to have values")
    except AssertionError:
        pass
    assert not left, "variables with no values:\n" + "\n".join(left)


def test_every_link_opens_a_dashboard_with_the_variables_it_sets():
    """Data links (a node cell opens that node's dashboard) and dashboard links: the target uid exists, every
    `var-NAME` of the URL is a variable there, and a tag link finds the other fleetcanary dashboards."""
    by_uid = {b["uid"]: b for b in boards().values()}
    found = 0
    for name, board in boards().items():
        for link in board.get("links", []):
            tagged = [b for b in by_uid.values() if set(link["tags"]) <= set(b["tags"]) and b["uid"] != board["uid"]]
            assert link["type"] == "dashboards" and len(tagged) >= 2, (name, link)
            assert link["keepTime"] and link["includeVars"], (name, link)
        for p in board["panels"]:
            overrides = p.get("fieldConfig", {}).get("overrides", [])
            links = [lk for o in overrides for prop in o["properties"] if prop["id"] == "links" for lk in prop["value"]]
            links += p.get("fieldConfig", {}).get("defaults", {}).get("links", [])
            for lk in links:
                m = re.fullmatch(r"/d/([\w-]+)\?(.*)", lk["url"])
                assert m and m.group(1) in by_uid, (name, p["title"], lk["url"])
                target_vars = {v["name"] for v in by_uid[m.group(1)]["templating"]["list"]}
                for var in re.findall(r"var-(\w+)=", m.group(2)):
                    assert var in target_vars, (name, p["title"], var)
                found += 1
    assert found >= 10, found


def test_the_firing_alerts_table_names_node_gpu_since_and_how_far(synthetic):
    board = boards()["fleet-overview.json"]
    p = next(p for p in board["panels"] if p["title"].startswith("Firing fleetcanary alerts"))
    since, worse = (synthetic.query(substitute(t["expr"], ".*", "15m"), synthetic.end) for t in p["targets"])
    rows = {(r["metric"]["alertname"], r["metric"]["node"], r["metric"].get("gpu")): float(r["value"][1])
            for r in since}
    assert set(rows) == {("FleetCanaryNVLinkDown", synthetic_fleet.NODES[2], "1"),
                         ("FleetCanaryGPUMemoryBandwidthBelowPeers", synthetic_fleet.NODES[3], "5")}
    assert all(v / 1000 < synthetic.end for v in rows.values())  # a time before now, in ms for Grafana
    assert {(r["metric"]["node"], r["metric"]["gpu"]) for r in worse} == {(synthetic_fleet.NODES[3], "5")}
    assert max(float(r["value"][1]) for r in worse) > 0.05  # the 8% slow GPU's change below its peers'
