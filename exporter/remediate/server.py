"""HTTP: POST /webhook (Alertmanager's webhook v4), GET /metrics, GET /healthz.

A body is read only up to ``max_body_bytes`` (413 beyond, without reading it), must be an Alertmanager
payload (400 with one line otherwise), and each bad request is one log line and a counted metric. A replica
that does not lead answers 200 and does nothing: Alertmanager sends the same notification to every replica
(the Service or both URLs), and the leader acts on its copy; a 5xx would only make Alertmanager retry at a
replica that will never act. Only while no replica is known to lead (a cold start) is the answer 503, so that
Alertmanager retries the notification instead of losing it until its repeat interval."""
from __future__ import annotations

import logging
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import webhook
from .controller import Controller

log = logging.getLogger("fleetcanary.remediate.http")
READ_TIMEOUT = 10.0


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], controller: Controller, max_body_bytes: int) -> None:
        host = address[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.controller = controller
        self.max_body_bytes = max_body_bytes
        super().__init__(address, Handler)


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    timeout = READ_TIMEOUT   # a client that stalls mid-request is dropped, not waited on

    def log_message(self, *args) -> None:
        pass

    def _reply(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _bad(self, code: int, outcome: str, why: str) -> None:
        self.server.controller.metrics.webhooks.labels(outcome).inc()
        log.warning("webhook from %s refused: %s", self.client_address[0], why)
        self.close_connection = True
        self._reply(code, (why + "\n").encode())

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._reply(200, generate_latest(self.server.controller.metrics.registry), CONTENT_TYPE_LATEST)
        elif self.path == "/healthz":
            self._reply(200, b"ok\n")
        else:
            self._reply(404, b"not found; try /metrics, /healthz or POST /webhook\n")

    def do_POST(self) -> None:
        if self.path != "/webhook":
            self._bad(404, "bad_request", f"POST {self.path[:80]!r}: only /webhook takes a POST")
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._bad(411, "bad_request", "no Content-Length (Alertmanager always sends one)")
            return
        if int(length) > self.server.max_body_bytes:
            self._bad(413, "too_large", f"body of {length} bytes is over the {self.server.max_body_bytes}-byte cap")
            return
        try:
            body = self.rfile.read(int(length))
        except OSError as exc:
            self._bad(400, "bad_request", f"body not read: {exc}")
            return
        try:
            payload = webhook.parse(body)
        except webhook.BadPayload as exc:
            self._bad(400, "bad_request", str(exc))
            return
        outcome = self.server.controller.handle(payload)
        self.server.controller.metrics.webhooks.labels(outcome).inc()
        self._reply(503 if outcome == "no_leader" else 200, (outcome + "\n").encode())
