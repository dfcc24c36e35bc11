import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import free_port, http_get, wait_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def state_dir(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    return d


class DaemonProcess:
    """`fleetcanary run` as a real subprocess on 127.0.0.1."""

    def __init__(self, tmp_path: Path, config: dict, env: dict | None = None) -> None:
        self.port = free_port()
        self.state_dir = tmp_path / "dstate"
        cfg = {"state_dir": str(self.state_dir), "server": {"listen_address": f"127.0.0.1:{self.port}"}, **config}
        self.config_path = tmp_path / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg))
        self.log_path = tmp_path / "daemon.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetcanary", "run", "--config", str(self.config_path)],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {})},
        )
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for(lambda: self.proc.poll() is None and http_get(self.url + "/readyz", timeout=2)[0] == 200,
                 timeout=30, what="daemon ready")

    def metrics(self) -> str:
        return http_get(self.url + "/metrics")[2].decode()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def start_daemon(tmp_path):
    started = []

    def start(config: dict, env: dict | None = None) -> DaemonProcess:
        d = DaemonProcess(tmp_path, config, env)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


SMALL_HOST_BW = {"params": {"array_bytes": 8 << 20, "repeats": 3}, "interval_seconds": 30, "timeout_seconds": 20}


@pytest.fixture(autouse=True)
def _test_process_stays_unpatched():
    """Locust imports gevent, which monkey-patches threading for the whole process: every later test's
    threads would become greenlets, and a worker's output drain would block the test run. Locust runs
    in subprocesses only."""
    yield
    assert "gevent" not in sys.modules, "this test imported gevent (locust) into the test process"
