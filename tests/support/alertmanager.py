"""A real Alertmanager on 127.0.0.1, a webhook receiver that records what it delivers, and a scrape
target whose exposition the test sets: the three loopback parts of the Alertmanager end-to-end test."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from harness import alertmanager

from .helpers import require_binary, unavailable
from .servers import ServerThread


def alertmanager_binary() -> str:
    """Debian ships the server as prometheus-alertmanager; upstream tarballs call it alertmanager."""
    try:
        return alertmanager.alertmanager_binary()
    except RuntimeError:
        unavailable("alertmanager is not installed (Debian package prometheus-alertmanager; `make test` installs it "
                    "as root)")
        raise AssertionError("unreachable") from None  # unavailable() fails or skips


class Alertmanager(alertmanager.Alertmanager):
    """harness/alertmanager.py's, its binaries found the tests' way."""

    def __init__(self, workdir: Path, config: dict) -> None:
        super().__init__(workdir, config, binary=alertmanager_binary(), amtool=require_binary("amtool"))


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
