"""A real Alertmanager on 127.0.0.1, a webhook receiver that records what it delivers, and a scrape
target whose exposition the test sets: the three loopback parts of the Alertmanager end-to-end test."""
from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import yaml

from .helpers import free_port, http_get, require_binary, unavailable, wait_for
from .servers import ServerThread


def alertmanager_binary() -> str:
    """Debian ships the server as prometheus-alertmanager; upstream tarballs call it alertmanager."""
    import shutil

    for name in ("prometheus-alertmanager", "alertmanager"):
        if shutil.which(name):
            return shutil.which(name)
    unavailable("alertmanager is not installed (Debian package prometheus-alertmanager; `make test` installs it "
                "as root)")
    raise AssertionError("unreachable")  # unavailable() fails or skips


class Alertmanager:
    def __init__(self, workdir: Path, config: dict) -> None:
        binary = alertmanager_binary()
        require_binary("amtool")
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "alertmanager.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        r = subprocess.run([require_binary("amtool"), "check-config", str(self.config)], capture_output=True,
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
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class WebhookReceiver(ServerThread):
    """Records every Alertmanager webhook POST: (path, arrival time, payload)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer.lock:
                    outer.received.append({"path": self.path, "at": time.monotonic(), "payload": json.loads(body)})
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(Handler)

    def notifications(self) -> list[dict]:
        with self.lock:
            return list(self.received)


class Exposition(ServerThread):
    """A scrape target serving whatever exposition text the test last set (GET /metrics)."""

    def __init__(self, text: str = "") -> None:
        self.text = text.encode()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = outer.text
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        super().__init__(Handler)

    def set(self, text: str) -> None:
        self.text = text.encode()
