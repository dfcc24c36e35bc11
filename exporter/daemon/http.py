"""The HTTP server: /metrics, /healthz, /readyz, /results, and POST /confirm where server.confirm_requests is on.

/metrics serves the bytes rendered at the last result update plus a small dynamic
part (process CPU, memory and file descriptors), so a scrape costs no probe work.
Gzip is served when asked: the cached gzip member of the static part and a fresh
member for the dynamic part, concatenated (RFC 1952 allows several members; Go's
and Python's readers take them as one stream).

Nothing a client does can starve the daemon (issue 37): connections are capped in all and per source
address (past either cap the accept loop answers 503 and closes at once, spawning no thread, so one
address cannot take every slot and a scraper from another still gets in), and the whole request line
and headers must arrive within a deadline however slowly the bytes trickle (the socket timeout alone
is per recv). Each connection then holds at most one thread and one descriptor for a bounded time.

POST /confirm (daemon/requests.py) is the one write: off unless configured (405 as any other POST then),
behind the same basic auth as /metrics (401), its body at most requests.MAX_BODY bytes (413 unread, 411 without
a Content-Length) that must arrive within the header deadline too, rate-limited (429 with Retry-After), and
each refusal one log line and a count in fleetcanary_confirm_requests_total{outcome}.
"""
from __future__ import annotations

import errno
import gzip
import io
import json
import logging
import math
import re
import socket
import ssl
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from fleetcanary.daemon import requests as requestsmod
from fleetcanary.daemon.collector import CONFIRM_REQUESTS, HTTP_ERRORS, HTTP_REFUSED
from fleetcanary.daemon.webconfig import WebConfig

log = logging.getLogger("fleetcanary.http")
HANDSHAKE_TIMEOUT = 10.0
MAX_CONNECTIONS = 64             # defaults; server.max_connections etc. in the config
MAX_CONNECTIONS_PER_CLIENT = 8
HEADER_TIMEOUT = 10.0
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
           b"Retry-After: 1\r\nConnection: close\r\n\r\nbusy\n")
OPEN_PATHS = ("/healthz", "/readyz")  # liveness/readiness stay open for kubelet probes; they reveal nothing

LANDING = b"""<html><head><title>fleetcanary</title></head><body><h1>fleetcanary</h1>
<p><a href="/metrics">/metrics</a> - probe results from scheduled runs</p>
<p><a href="/results">/results</a> - the latest result record per probe (JSON)</p>
<p><a href="/healthz">/healthz</a> - liveness, <a href="/readyz">/readyz</a> - readiness</p>
</body></html>
"""


_QVALUE = re.compile(r"(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)")


def accept_encoding_q(header: str | None) -> dict[str, float]:
    """Accept-Encoding (RFC 9110 12.5.3) as {coding: q}, codings lower-cased; an element with a malformed
    q-value is left out (as if absent). A later element for the same coding wins."""
    out: dict[str, float] = {}
    for element in (header or "").split(","):
        coding, *params = (p.strip() for p in element.split(";"))
        if not coding or not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", coding):
            continue
        q, ok = 1.0, True
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                value = value.strip()
                if _QVALUE.fullmatch(value):
                    q = float(value)
                else:
                    ok = False
        if ok:
            out[coding.lower()] = q
    return out


def wants_gzip(header: str | None) -> bool:
    """Whether to answer with gzip: gzip (or x-gzip, or else `*`) is acceptable (q > 0) and not less
    preferred than identity (identity's q: its own, else `*`'s, else 1). No header: identity."""
    if not header:
        return False
    q = accept_encoding_q(header)
    star = q.get("*")
    gz = q.get("gzip", q.get("x-gzip", star if star is not None else 0.0))
    identity = q.get("identity", star if star is not None else 1.0)
    return gz > 0 and gz >= identity


class _DeadlineIO(socket.SocketIO):
    """The socket's reads for a handler: while the handler's header deadline is armed, each recv waits at
    most until it (a client that trickles a byte every few seconds cannot hold a connection open)."""

    def __init__(self, sock, handler, base_timeout: float) -> None:
        super().__init__(sock, "rb")
        sock._io_refs += 1  # as socket.makefile does: the socket closes once its files are closed too
        self._handler, self._base = handler, base_timeout

    def readinto(self, b):
        deadline = self._handler.header_deadline
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request line and headers not complete within the header deadline")
            self._sock.settimeout(min(self._base, left))
        return super().readinto(b)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512
    allow_reuse_address = True
    web: WebConfig  # set by MetricsServer; its ssl_context, when set, serves TLS
    max_connections = MAX_CONNECTIONS
    max_connections_per_client = MAX_CONNECTIONS_PER_CLIENT
    header_timeout = HEADER_TIMEOUT

    def server_activate(self) -> None:
        self._slots_lock = threading.Lock()
        self.active = 0
        self.per_client: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()  # why -> connections refused (capacity, per_client)
        self.evicted = 0
        self.errors: Counter[str] = Counter()  # reset, timeout, internal: connections that ended in an error
        self._waiting: dict[int, tuple[int, object]] = {}  # handler -> (accepted as, handler): awaiting headers
        self._accepted: dict[int, int] = {}  # a connection's descriptor (TLS keeps it) -> its place in the accept order
        self._accept_seq = 0
        super().server_activate()

    def process_request(self, request, client_address):
        """The accept loop: take a slot and start the connection's thread, or refuse it here and now.

        Fair shares: while half the slots are free anyone gets one; past that, an address holding
        max_connections_per_client is refused (so one address takes at most half the slots, and any other
        still gets in). All slots taken: the connection that has waited longest for a request's headers is
        cut (a request that is still arriving is the only kind a flood can hold; a scraper's headers come at
        once), and the new one gets its slot; with none to cut, it is refused."""
        client = str(client_address[0])
        with self._slots_lock:
            why = None
            if self.active >= self.max_connections // 2 and \
                    self.per_client[client] >= self.max_connections_per_client:
                why = "per_client"
            elif self.active >= self.max_connections and \
                    (self.active >= 2 * self.max_connections or not self._evict_oldest_waiting()):
                why = "capacity"
            if why:
                self.refused[why] += 1
            else:
                self.active += 1
                self.per_client[client] += 1
                self._accept_seq += 1
                self._accepted[request.fileno()] = self._accept_seq
        if why:
            self._refuse(request, client, why)
            return
        try:
            super().process_request(request, client_address)
        except RuntimeError:  # no thread could be started
            self._release(client, request.fileno())
            self.shutdown_request(request)

    def _evict_oldest_waiting(self) -> bool:
        """Cut the connection that has waited longest for a request's headers (its thread then ends at once and
        frees its slot); False if none waits. Called with the slots lock held. Oldest by the accept order, not by
        when each thread got to its first read (threads start in any order on a busy host)."""
        if not self._waiting:
            return False
        key = min(self._waiting, key=lambda k: self._waiting[k][0])
        handler = self._waiting.pop(key)[1]
        try:  # the plain socket's shutdown, also under TLS: the blocked read sees EOF and the handler ends
            socket.socket.shutdown(handler.connection, socket.SHUT_RDWR)
        except OSError:
            pass
        self.evicted += 1
        if self.evicted in (1, 10, 100) or self.evicted % 1000 == 0:
            log.warning("HTTP: all %d connections taken; cut the one waiting longest for its request (%d so far)",
                        self.max_connections, self.evicted)
        return True

    def waiting(self, handler, on: bool) -> None:
        """A handler starts (on) or stops waiting for a request's line and headers."""
        with self._slots_lock:
            if on:
                seq = self._accepted.get(handler.connection.fileno(), self._accept_seq)
                self._waiting[id(handler)] = (seq, handler)
            else:
                self._waiting.pop(id(handler), None)

    def process_request_thread(self, request, client_address):
        fd = request.fileno()  # before the handler closes it
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(str(client_address[0]), fd)

    def _release(self, client: str, fd: int) -> None:
        with self._slots_lock:
            self._accepted.pop(fd, None)
            self.active -= 1
            self.per_client[client] -= 1
            if self.per_client[client] <= 0:
                del self.per_client[client]

    def _refuse(self, request, client: str, why: str) -> None:
        """503 without blocking (nothing is sent on a TLS port: that would need a handshake), then close."""
        if self.refused[why] in (1, 10, 100) or self.refused[why] % 1000 == 0:
            log.warning("HTTP connection from %s refused (%s; %d so far): limits max_connections=%d, "
                        "max_connections_per_client=%d", client, why, self.refused[why], self.max_connections,
                        self.max_connections_per_client)
        if self.web.ssl_context is None:
            try:
                request.setblocking(False)
                request.send(REFUSED)
            except OSError:
                pass
        self.shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        """A connection's thread ended in an exception: counted, and a line only for a fault of ours (socketserver
        printed 20 lines of traceback to stderr for every client that reset its connection)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, TimeoutError):
            self.errors["timeout"] += 1
        elif isinstance(exc, (ConnectionError, ssl.SSLError)) or (isinstance(exc, OSError) and exc.errno in (
                errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED, errno.ENOTCONN, errno.EBADF)):
            self.errors["reset"] += 1
        else:
            self.errors["internal"] += 1
            log.error("HTTP: a request from %s failed: %s: %s", client_address[0], type(exc).__name__,
                      " ".join(str(exc).split())[:200])

    def finish_request(self, request, client_address):
        # The TLS handshake runs here, in the connection's own thread, within the header deadline as a
        # whole: a client that stalls or trickles its handshake never blocks accepting other connections.
        ctx = self.web.ssl_context
        if ctx is None:
            return super().finish_request(request, client_address)
        try:
            tls = ctx.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        except (ssl.SSLError, OSError) as exc:
            log.debug("TLS with %s failed: %s", client_address[0], exc)
            return None
        try:
            _handshake(tls, min(HANDSHAKE_TIMEOUT, self.header_timeout))
        except (ssl.SSLError, OSError) as exc:
            log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
            tls.close()
            return None
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            try:
                tls.close()
            except OSError:
                pass


def _handshake(tls: ssl.SSLSocket, timeout: float) -> None:
    """The server side of a TLS handshake, all of it within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("TLS handshake not complete within the deadline")
        tls.settimeout(left)
        try:
            tls.do_handshake()
            return
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            continue


class _ProcessFigures:
    """prometheus_client's process metrics but the two that never move (virtual memory, the fd limit): the
    series budget (docs/metrics.md) has no room for them."""
    LEFT_OUT = ("process_virtual_memory_bytes", "process_max_fds")

    def __init__(self) -> None:
        self._proc = ProcessCollector(registry=None)

    def collect(self):
        return [f for f in self._proc.collect() if f.name not in self.LEFT_OUT]


class _Refusals:
    """fleetcanary_http_connections_refused_total and fleetcanary_http_connection_errors_total, read at each scrape
    (a flood must not re-render the exposition for every connection it makes); a reason appears once it has
    happened."""

    def __init__(self, server: _Server) -> None:
        self.server = server

    def collect(self):
        fam = HTTP_REFUSED.family()
        counts = {**self.server.refused, "cut": self.server.evicted}
        for reason in ("capacity", "per_client", "cut"):
            if counts.get(reason):
                fam.add_metric([reason], counts[reason])
        errors = HTTP_ERRORS.family()
        for reason in ("reset", "timeout", "internal"):
            if self.server.errors.get(reason):
                errors.add_metric([reason], self.server.errors[reason])
        return [f for f in (fam, errors) if f.samples]


class _ConfirmCounts:
    """fleetcanary_confirm_requests_total, read at each scrape; an outcome appears once it has happened."""

    def __init__(self, counts: Counter[str]) -> None:
        self.counts = counts

    def collect(self):
        fam = CONFIRM_REQUESTS.family()
        for outcome, n in sorted(self.counts.items()):
            fam.add_metric([outcome], n)
        return [fam] if fam.samples else []


class MetricsServer:
    def __init__(self, store, host: str, port: int, health, ready, request_timeout: float = 10.0, web=None,
                 confirm=None) -> None:
        """confirm: what takes POST /confirm (the Daemon: confirm_enabled(), confirm_request(body),
        confirm_status(id)); None: no such endpoint."""
        self.store = store
        self.confirm = confirm
        self.confirm_counts: Counter[str] = Counter()
        self._confirm_lock = threading.Lock()
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

            header_deadline: float | None = None

            def log_message(self, fmt, *args):  # access logs off; errors go through log
                pass

            def setup(self):
                super().setup()
                self.rfile.close()
                self.rfile = io.BufferedReader(_DeadlineIO(self.connection, self, request_timeout))

            def handle_one_request(self):
                # The request line and headers (and, on a kept-alive connection, the wait for the next
                # request) must all arrive within the header deadline; a GET's handler reads nothing more.
                self.header_deadline = time.monotonic() + self.server.header_timeout
                self.server.waiting(self, True)
                try:
                    super().handle_one_request()
                finally:
                    self.header_deadline = None
                    self.server.waiting(self, False)

            def parse_request(self):
                ok = super().parse_request()
                # Headers are in: the answer is written under the plain per-operation timeout again.
                self.server.waiting(self, False)
                self.header_deadline = None
                self.connection.settimeout(request_timeout)
                return ok

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
                        gz = wants_gzip(self.headers.get("Accept-Encoding"))
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
                    elif path.startswith("/confirm/") and server.confirm_on():
                        found = server.confirm.confirm_status(path[len("/confirm/"):][:64])
                        if found is None:
                            self._send(404, b"no such request (or forgotten since)\n", "text/plain")
                        else:
                            self._send(200, json.dumps(found).encode(), "application/json")
                    else:
                        self._send(404, b"not found\n", "text/plain")
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _refuse(self):
                self._send(405, b"method not allowed\n", "text/plain", {"Allow": "GET, HEAD"})

            do_PUT = do_DELETE = do_PATCH = _refuse

            def _no(self, code: int, outcome: str, why: str, extra: dict[str, str] | None = None) -> None:
                server.count_confirm(outcome)
                log.warning("POST /confirm from %s: %d %s", self.client_address[0], code, why)
                self.close_connection = True
                self._send(code, (why + "\n").encode(), "text/plain", extra)

            def do_POST(self):
                path = self.path.split("?", 1)[0]
                try:
                    if path != "/confirm" or not server.confirm_on():
                        self.close_connection = True
                        self._refuse()
                        return
                    if not self.server.web.check_authorization(self.headers.get("Authorization")):
                        server.count_confirm("unauthorized")
                        self.close_connection = True
                        self._send(401, b"unauthorized\n", "text/plain",
                                   {"WWW-Authenticate": 'Basic realm="fleetcanary", charset="UTF-8"'})
                        return
                    length = self.headers.get("Content-Length", "")
                    if not length.isdigit():
                        self._no(411, "bad_request", "a Content-Length is required")
                        return
                    if int(length) > requestsmod.MAX_BODY:
                        self._no(413, "too_large", f"body of {length[:12]} bytes is over the "
                                 f"{requestsmod.MAX_BODY}-byte cap")
                        return
                    # the body within the header deadline too: a trickled body holds no slot for long
                    self.header_deadline = time.monotonic() + self.server.header_timeout
                    try:
                        body = self.rfile.read(int(length))
                    except OSError as exc:
                        self.header_deadline = None
                        self._no(400, "bad_request", f"body not read: {type(exc).__name__}")
                        return
                    self.header_deadline = None
                    if len(body) < int(length):
                        self._no(400, "bad_request", "body shorter than its Content-Length")
                        return
                    try:
                        code, answer, extra = server.confirm.confirm_request(body)
                    except requestsmod.BadRequest as exc:
                        self._no(400, "bad_request", str(exc))
                        return
                    except requestsmod.Limited as exc:
                        self._no(429, "rate_limited", str(exc),
                                 {"Retry-After": str(max(1, math.ceil(exc.retry_after)))})
                        return
                    server.count_confirm("accepted")
                    self._send(code, json.dumps(answer).encode(), "application/json", extra)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = _Server((host, port), Handler)
        self.httpd.web = web or WebConfig()
        self._proc_registry.register(_Refusals(self.httpd))
        self._proc_registry.register(_ConfirmCounts(self.confirm_counts))
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    def confirm_on(self) -> bool:
        return self.confirm is not None and self.confirm.confirm_enabled()

    def count_confirm(self, outcome: str) -> None:
        with self._confirm_lock:
            self.confirm_counts[outcome] += 1

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

    def set_limits(self, max_connections: int = MAX_CONNECTIONS,
                   max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT,
                   header_timeout: float = HEADER_TIMEOUT) -> None:
        """The connection caps and the header deadline (server.* in the config), at start and at each reload: the
        accept loop reads them for every new connection."""
        self.httpd.max_connections = max_connections
        self.httpd.max_connections_per_client = max_connections_per_client
        self.httpd.header_timeout = header_timeout

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
