"""A real Alertmanager on 127.0.0.1 (tests, the remediation controller's tests), its config checked by amtool first.

    am = Alertmanager(workdir, {"route": ..., "receivers": [...]})   # am.url, am.alerts(); am.stop()

tests/support/alertmanager.py finds the binaries the tests' way (missing: a skip, or a failure under CI=true).
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from harness.http import http_get
from harness.poll import wait_for
from harness.ports import free_port
from harness.processes import stop_process

# Debian ships the server as prometheus-alertmanager; upstream tarballs call it alertmanager.
NAMES = ("prometheus-alertmanager", "alertmanager")


def _which(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise RuntimeError(f"{name} is not installed (apt-get install prometheus-alertmanager)")
    return path


def alertmanager_binary() -> str:
    """The Alertmanager server on PATH under either name; RuntimeError when neither is."""
    for name in NAMES:
        if shutil.which(name):
            return shutil.which(name)
    raise RuntimeError("alertmanager is not installed (apt-get install prometheus-alertmanager)")


class Alertmanager:
    def __init__(self, workdir: Path, config: dict, binary: str | None = None, amtool: str | None = None) -> None:
        """``binary``, ``amtool``: their paths, else those on PATH (RuntimeError when missing)."""
        binary = binary or alertmanager_binary()
        amtool = amtool or _which("amtool")
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "alertmanager.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        r = subprocess.run([amtool, "check-config", str(self.config)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        self.port = free_port()
        # --cluster.listen-address= turns the HA gossip off: it would bind 0.0.0.0:9094.
        with open(workdir / "alertmanager.log", "wb") as log:  # Alertmanager keeps its own descriptor
            self.proc = subprocess.Popen(
                [binary, f"--config.file={self.config}", f"--storage.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        try:
            wait_for(lambda: self.proc.poll() is None and http_get(self.url + "/-/ready", timeout=2)[0] == 200,
                     timeout=60, what="alertmanager ready")
        except AssertionError:
            self.stop()
            raise

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alerts(self) -> list[dict]:
        """Every alert it holds, active, inhibited, silenced or unprocessed (GET /api/v2/alerts)."""
        code, _, body = http_get(self.url + "/api/v2/alerts")
        assert code == 200, body
        return json.loads(body)

    def stop(self) -> None:
        stop_process(self.proc)
