"""A real VictoriaMetrics single node and a real vmalert on 127.0.0.1 for tests (Debian package
`victoria-metrics`, which ships `victoria-metrics`, `vmalert`, `vmagent` and the vm* tools).

    vm = VictoriaMetrics(tmp_path / "vm", scrape_configs=[...])   # scrapes like Prometheus does
    vma = VMAlert(tmp_path / "vmalert", vm.url, rule_files)        # datasource, remote write and read: vm
    firing(vma.url)                                                # {(alertname, node, gpu), ...}
    vma.stop(); vm.stop()

`firing` and `evaluations` read Prometheus as well (the same /api/v1/alerts shape; its own metric names), so
a test compares the two engines with one function. A missing binary fails under CI=true and skips
otherwise, as for prometheus (tests/support/helpers.py: require_binary).
"""
from __future__ import annotations

import json
import subprocess
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import yaml

from harness.http import instant_query
from harness.processes import stop_process

from .helpers import StopWaiting, free_port, http_get, require_binary, wait_for
from .servers import ServerThread


def dry_run(rule_files: list[Path | str]) -> subprocess.CompletedProcess:
    """`vmalert -dryRun` over ``rule_files``: parses them and validates every expression with MetricsQL and
    every template; returncode 0 when vmalert would load them as they are."""
    binary = require_binary("vmalert")
    return subprocess.run([binary, "-dryRun", "-loggerLevel=ERROR", *(f"-rule={p}" for p in rule_files)],
                          capture_output=True, text=True, timeout=60)


def assert_loads(rule_files: list[Path | str]) -> None:
    """vmalert accepts ``rule_files`` as they are; else fail with its words."""
    r = dry_run(rule_files)
    assert r.returncode == 0, (f"vmalert -dryRun refuses {[str(p) for p in rule_files]}:\n"
                               f"{(r.stdout + r.stderr)[-4000:]}")


def _ready(proc: subprocess.Popen, url: str, log: Path) -> bool:
    if proc.poll() is not None:
        raise StopWaiting(f"{Path(proc.args[0]).name} exited with {proc.returncode}: "
                          f"{log.read_text(errors='replace')[-3000:]}")
    return http_get(url, timeout=2)[0] == 200


class VictoriaMetrics:
    """A single-node VictoriaMetrics on a free port with its storage under ``workdir`` (removed with it).
    ``scrape_configs`` (Prometheus syntax) make it scrape as Prometheus would, through its own promscrape."""

    def __init__(self, workdir: Path, scrape_configs: list[dict] | None = None, scrape_interval: str = "1s") -> None:
        binary = require_binary("victoria-metrics")
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [binary, f"-storageDataPath={workdir / 'data'}", f"-httpListenAddr=127.0.0.1:{self.port}",
                # By default the newest 30 s are hidden from queries (samples still in flight from other
                # ingesters); here the only writers are its own scrapes and vmalert, and the rules must see
                # what was just scraped, as Prometheus's rules do.
                "-search.latencyOffset=0s",
                "-search.disableCache",  # no response cache: every evaluation reads the raw samples
                "-retentionPeriod=1d", "-loggerLevel=WARN"]
        if scrape_configs:
            cfg = workdir / "scrape.yml"
            cfg.write_text(yaml.safe_dump({"global": {"scrape_interval": scrape_interval},
                                           "scrape_configs": scrape_configs}))
            args.append(f"-promscrape.config={cfg}")
        self.log = workdir / "victoria-metrics.log"
        with open(self.log, "wb") as log:  # the process keeps its own descriptor
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: _ready(self.proc, self.url + "/health", self.log), timeout=60,
                     what="victoria-metrics ready")
        except BaseException:
            self.stop()
            raise

    def query(self, expr: str) -> list[dict]:
        return instant_query(self.url, expr)

    def stop(self) -> None:
        stop_process(self.proc)


class Notifier(ServerThread):
    """An Alertmanager stand-in that accepts what vmalert sends (vmalert will not start without one)."""

    def __init__(self) -> None:
        received: list[dict] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    received.extend(json.loads(body or b"[]"))
                except ValueError:
                    pass
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(Handler)


class VMAlert:
    """vmalert on a free port evaluating ``rule_files`` against ``datasource_url``, writing recording rules'
    results and alert state there (remote write) and restoring alert state from it (remote read); alerts go
    to a Notifier of its own. ``evaluation_interval``: for groups without their own interval."""

    def __init__(self, workdir: Path, datasource_url: str, rule_files: list[Path | str],
                 evaluation_interval: str = "1s") -> None:
        binary = require_binary("vmalert")
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.notifier = Notifier()
        self.log = workdir / "vmalert.log"
        args = [binary, f"-datasource.url={datasource_url}", f"-remoteWrite.url={datasource_url}",
                f"-remoteRead.url={datasource_url}", f"-notifier.url={self.notifier.url}",
                *(f"-rule={p}" for p in rule_files), f"-evaluationInterval={evaluation_interval}",
                # recording rules' results reach the datasource within a second, not the default 5 s
                "-remoteWrite.flushInterval=1s",
                f"-httpListenAddr=127.0.0.1:{self.port}", "-loggerLevel=WARN"]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: _ready(self.proc, self.url + "/health", self.log), timeout=60, what="vmalert ready")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        stop_process(self.proc)
        self.notifier.close()


def alerts(url: str) -> list[dict]:
    """Active alerts (pending and firing) from /api/v1/alerts of Prometheus or vmalert."""
    code, _, body = http_get(url + "/api/v1/alerts", timeout=5)
    data = json.loads(body)
    if code != 200 or data.get("status") != "success":
        raise AssertionError(f"{url}/api/v1/alerts: {code} {body[:500]!r}")
    return data["data"]["alerts"]


def firing(url: str, keys: tuple[str, ...] = ("alertname", "node", "gpu")) -> set[tuple[str, ...]]:
    """The firing alerts of Prometheus or vmalert as tuples of ``keys``' label values ("" where absent)."""
    return {tuple(a["labels"].get(k, "") for k in keys) for a in alerts(url) if a["state"] == "firing"}


def evaluations(url: str) -> dict[str, float]:
    """Rule group name -> evaluations done so far (less the missed ones), from the /metrics of Prometheus
    (prometheus_rule_group_iterations_total) or vmalert (vmalert_iteration_duration_seconds_count)."""
    from prometheus_client.parser import text_string_to_metric_families

    code, _, body = http_get(url + "/metrics", timeout=10)
    assert code == 200, f"{url}/metrics: {code}"
    done: dict[str, float] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            sign = {"prometheus_rule_group_iterations_total": 1, "prometheus_rule_group_iterations_missed_total": -1,
                    "vmalert_iteration_duration_seconds_count": 1, "vmalert_iteration_missed_total": -1}.get(s.name)
            if sign:
                group = s.labels.get("group") or s.labels["rule_group"].rsplit(";", 1)[-1]
                done[group] = done.get(group, 0.0) + sign * s.value
    return done
