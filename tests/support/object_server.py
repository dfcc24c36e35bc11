"""A test object server on 127.0.0.1 (HTTP, or HTTPS with a certificate the test makes).

Behaviour per request, from the query string:
  size=N          body bytes (default 1 MiB)          delay_ms=D    sleep before the response
  rate=B          throttle the body to B bytes/second  status=S      answer with status S
  stall=1         send headers, then no body           retry_after=N add Retry-After
Honours Range: bytes=0-N. Records each request's path (without the query) for checks.
"""
from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from .servers import ServerThread, tls_context


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        parts = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(parts.query).items()}
        entry = {"path": parts.path, "headers": dict(self.headers), "start": time.perf_counter()}
        self.server.requests.append(entry)
        if "delay_ms" in q:
            time.sleep(int(q["delay_ms"]) / 1000)
        status = int(q.get("status", 200))
        size = int(q.get("size", 1 << 20))
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=0-") and status == 200:
            size = min(size, int(rng.split("-")[1]) + 1)
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(size if status < 300 else 0))
        self.send_header("Content-Type", "application/octet-stream")
        if "retry_after" in q:
            self.send_header("Retry-After", q["retry_after"])
        self.end_headers()
        self.wfile.flush()
        if status >= 300:
            return
        if q.get("stall") == "1":
            self.server.stop_event.wait(60)
            return
        rate = float(q.get("rate", 0))
        chunk = CHUNK_BYTES
        block = b"\xa5" * chunk
        sent, t0 = 0, time.perf_counter()
        try:
            while sent < size:
                n = min(chunk, size - sent)
                self.wfile.write(block[:n])
                sent += n
                if rate:
                    ahead = sent / rate - (time.perf_counter() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
        except (BrokenPipeError, ConnectionResetError):
            pass
        entry["end"] = time.perf_counter()


# The paced body is written a chunk at a time, the first at once, chunk k at k * CHUNK_BYTES / rate: a body of
# `size` bytes cannot arrive in less than (size - CHUNK_BYTES) / rate seconds after the request.
CHUNK_BYTES = 64 << 10


class ObjectServer(ServerThread):
    def __init__(self, tls_cert=None) -> None:
        stop_event = threading.Event()  # set on close: a stalled body ends instead of holding its thread
        super().__init__(_Handler, tls=tls_context(tls_cert) if tls_cert is not None else None,
                         on_close=[stop_event.set])
        # no client knows the port before this returns, so the handler's state may follow the start
        self.server.requests = []
        self.server.stop_event = stop_event
        self.base = self.url

    @property
    def requests(self):
        return self.server.requests
