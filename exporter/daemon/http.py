"""The HTTP server: /metrics, /healthz, /readyz, /results.

/metrics serves the bytes rendered at the last result update plus a small dynamic
part (process CPU, memory and file descriptors), so a scrape costs no probe work.
Gzip is served when asked: the cached gzip member of the static part and a fresh
member for the dynamic part, concatenated (RFC 1952 allows several members; Go's
and Python's readers take them as one stream).
"""
from __future__ import annotations

import gzip
import json
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from fleetcanary.daemon.webconfig import WebConfig

log = logging.getLogger("fleetcanary.http")
HANDSHAKE_TIMEOUT = 10.0
OPEN_PATHS = ("/healthz", "/readyz")  # liveness/readiness stay open for kubelet probes; they reveal nothing

LANDING = b"""<html><head><title>fleetcanary</title></head><body><h1>fleetcanary</h1>
<p><a href="/metrics">/metrics</a> - probe results from scheduled runs</p>
<p><a href="/results">/results</a> - the latest result record per probe (JSON)</p>
<p><a href="/healthz">/healthz</a> - liveness, <a href="/readyz">/readyz</a> - readiness</p>
</body></html>
"""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512
    allow_reuse_address = True
    web: WebConfig  # set by MetricsServer; its ssl_context, when set, serves TLS

    def finish_request(self, request, client_address):
        # The TLS handshake runs here, in the connection's own thread, with a timeout: a
        # client that stalls its handshake never blocks accepting other connections.
        ctx = self.web.ssl_context
        if ctx is None:
            return super().finish_request(request, client_address)
        request.settimeout(HANDSHAKE_TIMEOUT)
        try:
            tls = ctx.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
            return None
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            try:
                tls.close()
            except OSError:
                pass


class _ProcessFigures:
    """prometheus_client's process metrics but the two that never move (virtual memory, the fd limit): the
    series budget (docs/metrics.md) has no room for them."""
    LEFT_OUT = ("process_virtual_memory_bytes", "process_max_fds")

    def __init__(self) -> None:
        self._proc = ProcessCollector(registry=None)

    def collect(self):
        return [f for f in self._proc.collect() if f.name not in self.LEFT_OUT]


class MetricsServer:
    def __init__(self, store, host: str, port: int, health, ready, request_timeout: float = 10.0, web=None) -> None:
        self.store = store
        self.health = health
        self.ready = ready
        self._proc_registry = CollectorRegistry(auto_describe=False)
        self._proc_registry.register(_ProcessFigures())
        self._gz_version = -1
        self._gz_static = b""
        self._gz_lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = request_timeout

            def log_message(self, fmt, *args):  # access logs off; errors go through log
                pass

            def _send(self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
                self.send_response(code)
                for k, v in self.server.web.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self):
                self.do_GET()

            def do_GET(self):
                path = self.path.split("?", 1)[0]
                try:
                    auth = self.headers.get("Authorization")
                    if path not in OPEN_PATHS and not self.server.web.check_authorization(auth):
                        self._send(401, b"unauthorized\n", "text/plain",
                                   {"WWW-Authenticate": 'Basic realm="fleetcanary", charset="UTF-8"'})
                        return
                    if path == "/metrics":
                        gz = "gzip" in (self.headers.get("Accept-Encoding") or "")
                        body = server.metrics_body(gz)
                        self._send(200, body, CONTENT_TYPE_LATEST, {"Content-Encoding": "gzip"} if gz else None)
                    elif path == "/healthz":
                        ok = server.health()
                        self._send(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n", "text/plain")
                    elif path == "/readyz":
                        ok = server.ready()
                        self._send(200 if ok else 503, b"ready\n" if ok else b"not ready\n", "text/plain")
                    elif path == "/results":
                        body = json.dumps(server.store.latest_records(), default=str, indent=1).encode()
                        self._send(200, body, "application/json")
                    elif path == "/":
                        self._send(200, LANDING, "text/html")
                    else:
                        self._send(404, b"not found\n", "text/plain")
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _refuse(self):
                self._send(405, b"method not allowed\n", "text/plain", {"Allow": "GET, HEAD"})

            do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

        self.httpd = _Server((host, port), Handler)
        self.httpd.web = web or WebConfig()
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    def metrics_body(self, gz: bool) -> bytes:
        self.store.expire()
        static = self.store.exposition
        dynamic = generate_latest(self._proc_registry)
        if not gz:
            return static + dynamic
        version = self.store.version
        with self._gz_lock:
            if version != self._gz_version:
                self._gz_static = gzip.compress(static, compresslevel=6)
                self._gz_version = version
            cached = self._gz_static
        return cached + gzip.compress(dynamic, compresslevel=1)

    def set_web(self, web) -> None:
        """A reloaded web config: new connections use its TLS context and users."""
        self.httpd.web = web

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        # shutdown() waits for serve_forever() to notice; it would block forever if the
        # server was never started.
        if self._thread.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()
