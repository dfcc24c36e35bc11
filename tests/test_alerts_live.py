"""The shipped rules on a live Prometheus, in real time: every peer, fast-path, history and
driver-change alert fires, and healthy nodes stay silent. Seven nodes in one pool (one degraded,
one upgraded) and three in a pool below the peer minimum (one degraded: the fast path on its own
history, and no peer verdict).

promtool evaluates every group at the test's interval, so it cannot see a rule that reads a
slower group's output through the default lookback (the history alerts once never fired for
that reason). Here the rules come from alerts/build.py with every group interval, `for`,
`keep_firing_for` and covering window scaled by 1/60, and Prometheus runs with the lookback
scaled the same way (5 s for 5 min): the hourly group evaluates every minute against a 5 s
lookback, the shape of the shipped hour against 5 minutes. Data windows (75 m of runs, days of
history) are not scaled: 5.5 days of runs are backfilled as TSDB blocks (and the hourly 1-day
medians the baselines read, through promtool's rule backfill), then a fake exporter on
127.0.0.1 serves the same series live, with the same identity (job, instance).
"""
from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import free_port, http_get, load_script, require_binary, wait_for
from tests.support.servers import ServerThread

ROOT = Path(__file__).resolve().parent.parent
build = load_script(ROOT / "alerts" / "build.py", "fleetcanary_alerts_build")
build_tests = load_script(ROOT / "alerts" / "build_tests.py", "fleetcanary_alerts_build_tests")
backfill = load_script(ROOT / "alerts" / "backfill.py", "fleetcanary_alerts_backfill")

SCALE = 1 / 60
NODES = [f"n{i}" for i in range(1, 8)] + ["s1", "s2", "s3"]
DEGRADED = "n6"        # 25% worse for 8 h on the same driver: peer, fast-path and regression alerts
DRIVER_CHANGED = "n7"  # a new driver 12 h ago, 25% worse since: the driver-change alerts
SMALL_DEGRADED = "s3"  # in a pool of 3 nodes (s1-s3), 25% worse for 8 h: the fast path on its own history
TTFT_BUCKETS = (0.05, 0.1, 0.2, 0.45, 1.0, 2.0)


class Fleet:
    """Every series of a small fleet as a function of time: backfilled and served alike."""

    def __init__(self, now: float, instance: str) -> None:
        self.now0 = now
        self.ident = f'job="fleetcanary", instance="{instance}"'

    def factor(self, f, node: str, t: float) -> float:
        # The daily burn's figure is judged over 5 daily runs: degraded throughout.
        bad = ((node in (DEGRADED, SMALL_DEGRADED) and (t >= self.now0 - 8 * 3600 or f.slow))
               or (node == DRIVER_CHANGED and t >= self.now0 - 12 * 3600))
        return (0.75 if f.higher_is_better else 1.3) if bad else 1.0

    def driver(self, node: str, t: float) -> str:
        return "570.124.06" if node == DRIVER_CHANGED and t >= self.now0 - 12 * 3600 else "550.90.07"

    def samples(self, t: float) -> list[tuple[str, float]]:
        out = []
        for node in NODES:
            n = f'node="{node}", {self.ident}'
            pool = "pool-s" if node.startswith("s") else "pool-a"
            out.append((f'fleetcanary_node_info{{{n}, pool="{pool}", cpu_model="Xeon 8480", '
                        f'driver_version="{self.driver(node, t)}"}}', 1.0))
            out.append((f'fleetcanary_gpu_info{{{n}, gpu="0", model="H100", uuid="GPU-{node}"}}', 1.0))
            for f in build.FAMILIES:
                period = max(f.interval_minutes, 1) * 60
                run = int(t // period)  # the run whose figures are exported at t
                labels = ", ".join(f'{k}="{build_tests.ENTITY_VALUES[k]}"' for k in f.entity if k != "node")
                if f.key == "inference_ttft":
                    slow = self.factor(f, node, t) > 1
                    count = t / 60.0  # one request a minute, all in one bucket
                    for le in TTFT_BUCKETS:
                        inc = 1 if (le >= 0.45 if slow else le >= 0.1) else 0
                        out.append((f'fleetcanary_inference_time_to_first_token_seconds_bucket{{{n}, {labels}, '
                                    f'le="{le:g}"}}', round(count * inc)))
                    out.append((f'fleetcanary_inference_time_to_first_token_seconds_bucket{{{n}, {labels}, '
                                f'le="+Inf"}}', round(count)))
                    continue
                value = build_tests.HEALTHY[f.key] * self.factor(f, node, run * period)
                out.append((f'{f.metric}{{{n}, {labels}}}', build_tests.wobble(value, run)))
        return out

    def openmetrics(self, start: float, end: float, step: float) -> str:
        by_series: dict[str, list[str]] = {}
        t = start
        while t <= end:
            for s, v in self.samples(t):
                by_series.setdefault(s, []).append(f"{s} {v!r} {t:.0f}")
            t += step
        lines = []
        for metric in sorted({s.split("{")[0] for s in by_series}):
            # OpenMetrics: no space after a label's comma; buckets are backfilled as plain series
            lines.append(f"# TYPE {metric} gauge")
            for s in sorted(x for x in by_series if x.split("{")[0] == metric):
                lines += [x.replace(", ", ",") for x in by_series[s]]
        return "\n".join(lines) + "\n# EOF\n"


class Exporter(ServerThread):
    def __init__(self, fleet: Fleet, port: int) -> None:
        fleet_ = fleet

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                ident = fleet_.ident
                body = "".join(f"{s.replace(', ' + ident, '')} {v!r}\n" for s, v in fleet_.samples(time.time()))
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        super().__init__(Handler, port=port)


def expected_alerts() -> dict[str, str]:
    _, alerts = build.build()
    out = {}
    for g in alerts["groups"]:
        for a in g["rules"]:
            name = a["alert"]
            if name.endswith(("OwnHistory",)):
                out[name] = SMALL_DEGRADED
            elif name.endswith(("BelowPeers", "SlowerThanPeers", "Regression")):
                out[name] = DEGRADED  # the Far... fast-path alerts end the same way
            elif name.endswith(("DropAfterDriverChange", "RiseAfterDriverChange")):
                out[name] = DRIVER_CHANGED
    return out


def recorded_counts(url: str, missing: list[str]) -> dict[str, object]:
    """For a failure message: how many series of each recorded step the missing alerts read exist now,
    and the rule groups' last errors."""
    out: dict[str, object] = {}
    fams = {a["labels"]["family"] for g in build.build()[1]["groups"] for a in g["rules"]
            if a["alert"] in missing and "family" in a["labels"]}
    for f in build.FAMILIES:
        if f.key in fams:
            for key in ("smoothed", "median1d", "drift_median1d", "baseline", "change", "recent_hist_ratio"):
                name = build.names(f)[key]
                code, _, body = http_get(url + "/api/v1/query?query=" + urllib.parse.quote(f"count({name})"),
                                         timeout=10)
                res = json.loads(body)["data"]["result"] if code == 200 else None
                out[name] = res[0]["value"][1] if res else 0
    code, _, body = http_get(url + "/api/v1/rules?type=record", timeout=10)
    if code == 200:
        out["errors"] = [(r["name"], r.get("lastError")) for g in json.loads(body)["data"]["groups"]
                         for r in g["rules"] if r.get("lastError")][:10]
    return out


def evaluations(url: str) -> dict[str, float]:
    """Rule group -> evaluations done (scheduled iterations less the missed ones), from Prometheus's own metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    code, _, body = http_get(url + "/metrics", timeout=10)
    assert code == 200
    done: dict[str, float] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            sign = {"prometheus_rule_group_iterations_total": 1,
                    "prometheus_rule_group_iterations_missed_total": -1}.get(s.name)
            if sign:
                group = s.labels["rule_group"].rsplit(";", 1)[-1]
                done[group] = done.get(group, 0.0) + sign * s.value
    return done


def wait_until_evaluated(url: str, predicate, budget: dict[str, int], cap: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail once every group in ``budget`` has done that many evaluations
    (progress, not seconds), or after ``cap`` seconds if Prometheus stops evaluating at all."""
    deadline = time.monotonic() + cap
    while True:
        if predicate():
            return
        done = evaluations(url)
        if all(done.get(g, 0) >= n for g, n in budget.items()) or time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen after {({g: done.get(g, 0) for g in budget})} evaluations")
        time.sleep(2)  # the poll interval; nothing waits on it


@pytest.mark.long
def test_every_peer_fast_history_and_driver_change_alert_fires_on_a_live_prometheus(tmp_path):
    prometheus = require_binary("prometheus")
    promtool = require_binary("promtool")
    rendered = build.render(scale=SCALE)
    rules = [tmp_path / "fleetcanary.rules.yml", tmp_path / "fleetcanary.alerts.yml"]
    for p in rules:
        p.write_text(rendered[p.name])
    groups = {g["name"]: g["interval"] for g in yaml.safe_load(rules[0].read_text())["groups"]}
    assert groups == {"fleetcanary-inventory": "1s", "fleetcanary-peers": "1s", "fleetcanary-peers-slow": "15s",
                      "fleetcanary-daily": "1m", "fleetcanary-fabric": "1s"}

    port = free_port()
    fleet = Fleet(time.time(), f"127.0.0.1:{port}")
    om = tmp_path / "backfill.om"
    end = fleet.now0 - 30
    start = end - 5.5 * 86400
    om.write_text(fleet.openmetrics(start, end, 600))  # one sample per run of the 10-minute probe
    data = tmp_path / "data"
    r = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(om),
                        str(data)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # The 1-day medians the baselines are built from, as the hourly group would have recorded them.
    # Per-driver families build theirs from the 1-day medians of days on one driver (labelled with it).
    daily = [build.names(f)["drift_median1d" if f.per_driver else "median1d"] for f in build.FAMILIES if f.history]
    # The lookback must cover the backfill's 10-minute sample spacing: the node-info joins are instant
    # selectors, and at 5 minutes half of all hourly evaluation instants (which ones depends on the
    # time of day the test starts) found no sample, so the driver join and every per-driver baseline
    # came out empty and the per-driver regression alerts could never fire.
    backfill.backfill_rules(data, daily, int(start + 86400), int(end), 3600, tmp_path, lookback="15m")

    exporter = Exporter(fleet, port)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [{"job_name": "fleetcanary", "honor_labels": True,
                            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}))
    prom_port = free_port()
    with open(tmp_path / "prometheus.log", "wb") as log:  # Prometheus keeps its own descriptor
        proc = subprocess.Popen([prometheus, f"--config.file={cfg}", f"--storage.tsdb.path={data}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}", "--query.lookback-delta=5s",
                                 "--storage.tsdb.retention.time=30d", "--log.level=warn"],
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{prom_port}"
    want = expected_alerts()
    # 10 peer, 8 fast-path, 8 own-history fast-path, 8 regression, 8 driver-change alerts
    assert len(want) == 42, sorted(want)
    fired: dict[str, set[str]] = {}
    try:
        wait_for(lambda: proc.poll() is None and http_get(url + "/-/ready", timeout=2)[0] == 200, timeout=120,
                 what="prometheus ready")

        def all_fired():
            code, _, body = http_get(url + "/api/v1/alerts", timeout=5)
            assert code == 200
            for a in json.loads(body)["data"]["alerts"]:
                if a["state"] == "firing":
                    fired.setdefault(a["labels"]["alertname"], set()).add(a["labels"].get("node", ""))
            return all(want[name] in fired.get(name, set()) for name in want)

        # The slowest: P2P's regression `for` of 120 min (120 s here) after the hourly group's first
        # evaluation (up to 60 s here). The deadline is counted in the rule groups' own evaluations, not in
        # seconds: a loaded machine that misses evaluations gets the time it lost (an absolute cap only bounds
        # a hang). 12 evaluations of the hourly group (12 h scaled, 12 minutes on time) and 720 of the peers
        # group are six times what the slowest alert needs.
        try:
            wait_until_evaluated(url, all_fired, {"fleetcanary-daily": 12, "fleetcanary-peers": 720}, cap=3600,
                                 what="every peer, fast, history and driver-change alert")
        except AssertionError as e:
            missing = sorted(n for n in want if want[n] not in fired.get(n, set()))
            raise AssertionError(f"{e}; never fired: {missing}; fired: {fired}; "
                                 f"recorded: {recorded_counts(url, missing)}") from None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        exporter.stop()
    # the two cases stay apart: no regression on the node whose driver changed, no driver-change
    # alert on the node that kept its driver, and the healthy nodes are silent
    for name, node in want.items():
        other = DRIVER_CHANGED if node == DEGRADED else DEGRADED
        if name.endswith(("Regression", "AfterDriverChange")):
            assert other not in fired.get(name, set()), (name, fired[name])
        # the own-history fast path is for groups the peer fast path cannot judge
        if name.endswith("OwnHistory"):
            assert DEGRADED not in fired.get(name, set()), (name, fired[name])
        # peers cannot judge a pool of 3
        if name.endswith(("BelowPeers", "SlowerThanPeers")):
            assert SMALL_DEGRADED not in fired.get(name, set()), (name, fired[name])
    healthy = {f"n{i}" for i in range(1, 6)} | {"s1", "s2"}
    assert not any(healthy & nodes for nodes in fired.values()), fired
