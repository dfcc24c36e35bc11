"""Test servers on 127.0.0.1: one way to start a socketserver server in a thread and to stop it.

    srv = ServerThread(Handler)                      # a ThreadingHTTPServer on a free port
    srv = ServerThread(Handler, port=p, tls=ctx)     # a given port; HTTPS with a server-side SSLContext
    srv = ServerThread(server=existing)              # a server built elsewhere (simulate_llm.serve, a TCPServer)
    with ServerThread(Handler) as srv: ...           # or srv.close() / srv.stop() in a fixture's teardown

close() releases whatever handlers wait on (``on_close``), stops serve_forever, closes the listening
socket and joins the thread; it is idempotent, so a fixture may call it after a test already did.
"""
from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def tls_context(cert) -> ssl.SSLContext:
    """A server-side context holding a trustme certificate (``ca.issue_cert("127.0.0.1")``)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(ctx)
    return ctx


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet HTTP/1.1 handler whose replies are JSON objects (the API stand-ins' and fake exporters' base)."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args) -> None:
        pass

    def _reply(self, code: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class ServerThread:
    """A socketserver server serving from a daemon thread until close()."""

    def __init__(self, handler=None, *, server=None, host: str = "127.0.0.1", port: int = 0,
                 tls: ssl.SSLContext | None = None, on_close: Iterable[Callable[[], object]] = ()) -> None:
        if (handler is None) == (server is None):
            raise TypeError("give a handler class or a server, not both")
        if server is None:
            server = ThreadingHTTPServer((host, port), handler)
            # a handler still busy (a stalled body, a held connection) never keeps the test process alive
            server.daemon_threads = True
        if tls is not None:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        self.server = server
        self.host, self.port = server.server_address[:2]
        self.address = f"{self.host}:{self.port}"
        self.url = f"{'https' if tls is not None else 'http'}://{self.address}"
        self._on_close = list(on_close)
        self._closed = False
        self.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
                                       name=f"test-server-{self.port}")
        self.thread.start()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for release in self._on_close:
            release()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    stop = close  # a fixture stops servers and processes (Daemon, Prometheus, Alertmanager) alike

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
