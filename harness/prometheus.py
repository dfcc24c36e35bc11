"""A real Prometheus on 127.0.0.1 (tests, benchmarks), and where the Prometheus binaries are.

    prom = Prometheus(workdir, ["127.0.0.1:9835"], rule_files=[...])   # scraping, evaluating; prom.stop()

tests/support/prometheus.py resolves the binary the tests' way (missing: a skip, or a failure under CI=true).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from harness.http import http_get, instant_query
from harness.poll import wait_for
from harness.ports import free_port
from harness.processes import stop_process


def binary(name: str) -> str:
    """The path of a Prometheus binary (prometheus, promtool): RuntimeError when it is not installed."""
    path = shutil.which(name)
    if not path:
        raise RuntimeError(f"{name} is not installed (apt-get install prometheus)")
    return path


class Prometheus:
    def __init__(self, workdir: Path, scrape_targets: list[str], rule_files: list[str] | None = None,
                 scrape_interval: str = "1s", evaluation_interval: str = "1s",
                 target_labels: dict[str, dict[str, str]] | None = None, scrape_configs: list[dict] | None = None,
                 alertmanagers: list[str] | None = None, binary_path: str | None = None) -> None:
        """``target_labels``: per-target labels (e.g. {"169.254.7.10:9835": {"node": "node-0"}}) for a fleet
        of several nodes; without it every target gets node="test-node". ``scrape_configs`` replaces the
        job altogether; ``alertmanagers`` (host:port) receive the alerts. ``binary_path``: the prometheus
        binary, else the one on PATH."""
        binary_path = binary_path or binary("prometheus")
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
            "rule_files": rule_files or [],
            "scrape_configs": scrape_configs or [
                {"job_name": "fleetcanary", "static_configs": [{"targets": scrape_targets}],
                 "relabel_configs": [{"target_label": "node", "replacement": "test-node"}]}
                if target_labels is None else
                {"job_name": "fleetcanary", "static_configs": [{"targets": [t], "labels": target_labels[t]}
                                                               for t in scrape_targets]}],
        }
        if alertmanagers:
            cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": alertmanagers}]}]}
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(cfg))
        with open(workdir / "prometheus.log", "wb") as log:  # Prometheus keeps its own descriptor
            self.proc = subprocess.Popen(
                [binary_path, f"--config.file={self.config}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for(lambda: self.proc.poll() is None and http_get(self.url + "/-/ready", timeout=2)[0] == 200,
                 timeout=60, what="prometheus ready")

    def query(self, expr: str) -> list[dict]:
        return instant_query(self.url, expr)

    def targets_up(self) -> bool:
        return any(float(r["value"][1]) == 1.0 for r in self.query('up{job="fleetcanary"}'))

    def stop(self) -> None:
        stop_process(self.proc)
