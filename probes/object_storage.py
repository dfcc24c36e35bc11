"""Object storage over HTTP(S): time per phase (resolve, connect, tls, first_byte,
transfer), as blackbox_exporter reports them, and read throughput over a bounded
number of bytes, optionally from N concurrent streams (many nodes pulling one model).

Each target is a plain or presigned URL. A presigned URL carries its signature in the
query string, so the URL can be read from an environment variable or a file instead of
the config, and it never appears in metrics, logs or records: only the target's name,
scheme and host do. The phases are measured on the standard library's sockets and
http.client, because requests/urllib3 do not expose them.

Failures are classified: dns_failure, connect_refused, connect_timeout, tls_error,
http_4xx, http_5xx, stalled (no body byte within the read timeout after the headers),
read_timeout, short_body and io_error.
"""
from __future__ import annotations

import concurrent.futures
import http.client
import os
import socket
import ssl
import time
from typing import ClassVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleetcanary.probes.base import (
    Figure,
    MetricSpec,
    Probe,
    ProbeConfig,
    ProbeContext,
    ProbeError,
    ProbeResult,
    ProbeSkipped,
    Sample,
)

PHASES = ("resolve", "connect", "tls", "first_byte", "transfer")
FAILURE_REASONS = ("dns_failure", "connect_refused", "connect_timeout", "tls_error", "http_4xx", "http_5xx",
                   "stalled", "read_timeout", "short_body", "io_error", "bad_url")


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(..., pattern=r"^[a-zA-Z0-9_.:-]{1,64}$", description="Label value for this target.")
    url: str | None = Field(None, description="Plain URL of an object. Use url_env or url_file for presigned URLs.")
    url_env: str | None = Field(None, description="Environment variable holding the URL (secret: never logged).")
    url_file: str | None = Field(None, description="File holding the URL (secret: never logged).")
    max_bytes: int = Field(64 << 20, ge=1, le=16 << 30, description="Bytes to read per stream (a Range request).")
    use_range: bool = Field(True, description="Ask for bytes=0-(max_bytes-1); the body is also cut at max_bytes.")
    streams: int = Field(1, ge=1, le=64, description="Concurrent streams for the aggregate throughput figure.")
    connect_timeout_seconds: float = Field(5.0, gt=0, le=120, description="Resolve + connect + TLS timeout.")
    read_timeout_seconds: float = Field(10.0, gt=0, le=600, description="Longest wait for any byte after the request.")
    ca_file: str | None = Field(None, description="CA bundle to verify the server with (default: system CAs).")
    verify_tls: bool = Field(True, description="Verify the server certificate and name.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra request headers (values never logged).")

    @model_validator(mode="after")
    def _one_source(self) -> Target:
        if sum(x is not None for x in (self.url, self.url_env, self.url_file)) != 1:
            raise ValueError("give exactly one of url, url_env, url_file")
        return self


class Config(ProbeConfig):
    targets: tuple[Target, ...] = Field((), description="Objects to fetch. None configured: the probe skips.")
    repeats: int = Field(3, ge=1, le=50, description="Single-stream fetches per target; medians are published.")


class FetchError(Exception):
    def __init__(self, reason: str, detail: str, phases: dict[str, float] | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.phases = reason, detail, phases or {}


def resolve_url(t: Target) -> str:
    if t.url is not None:
        return t.url
    if t.url_env is not None:
        v = os.environ.get(t.url_env)
        if not v:
            raise FetchError("bad_url", f"environment variable {t.url_env} is not set")
        return v.strip()
    try:
        with open(t.url_file, encoding="utf-8") as f:  # type: ignore[arg-type]
            return f.read().strip()
    except OSError as exc:
        raise FetchError("bad_url", f"cannot read url_file: {exc.strerror}") from None


def fetch(url: str, t: Target) -> tuple[dict[str, float], int, int]:
    """One GET. Returns (phase seconds, HTTP status, body bytes)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError("bad_url", f"target {t.name}: URL must be http(s)://host/...")
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise FetchError("dns_failure", f"cannot resolve the host of target {t.name}: {exc}") from None
    phases["resolve"] = time.perf_counter() - t0
    family, stype, proto, _, addr = infos[0]
    sock = socket.socket(family, stype, proto)
    sock.settimeout(t.connect_timeout_seconds)
    t1 = time.perf_counter()
    try:
        sock.connect(addr)
    except TimeoutError:
        sock.close()
        raise FetchError("connect_timeout", f"no connection within {t.connect_timeout_seconds:g}s", phases) from None
    except ConnectionRefusedError:
        sock.close()
        raise FetchError("connect_refused", "connection refused", phases) from None
    except OSError as exc:
        sock.close()
        raise FetchError("io_error", f"connect: {exc.strerror or exc}", phases) from None
    phases["connect"] = time.perf_counter() - t1
    try:
        if parts.scheme == "https":
            ctx = ssl.create_default_context(cafile=t.ca_file)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            if not t.verify_tls:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            t2 = time.perf_counter()
            try:
                sock = ctx.wrap_socket(sock, server_hostname=host)
            except TimeoutError:
                raise FetchError("connect_timeout", "TLS handshake timed out", phases) from None
            except (ssl.SSLError, ssl.CertificateError) as exc:
                raise FetchError("tls_error", f"TLS: {getattr(exc, 'reason', None) or exc}", phases) from None
            phases["tls"] = time.perf_counter() - t2
        else:
            phases["tls"] = 0.0
        sock.settimeout(t.read_timeout_seconds)
        conn = http.client.HTTPConnection(host, port)
        conn.sock = sock
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        headers = {"User-Agent": "fleetcanary", **t.headers}
        if t.use_range:
            headers["Range"] = f"bytes=0-{t.max_bytes - 1}"
        t3 = time.perf_counter()
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
        except TimeoutError:
            raise FetchError("read_timeout", f"no response within {t.read_timeout_seconds:g}s", phases) from None
        except (http.client.HTTPException, OSError) as exc:
            raise FetchError("io_error", f"request: {type(exc).__name__}", phases) from None
        status = resp.status
        if 400 <= status < 500:
            raise FetchError("http_4xx", f"HTTP {status}", phases)
        if status >= 500:
            raise FetchError("http_5xx", f"HTTP {status}", phases)
        # First byte: the first body byte (headers alone do not prove the object streams).
        try:
            first = resp.read(1)
        except TimeoutError:
            raise FetchError("stalled", f"headers, then no body byte within {t.read_timeout_seconds:g}s",
                             phases) from None
        phases["first_byte"] = time.perf_counter() - t3
        got = len(first)
        t4 = time.perf_counter()
        try:
            while got < t.max_bytes:
                chunk = resp.read(min(1 << 20, t.max_bytes - got))
                if not chunk:
                    break
                got += len(chunk)
        except TimeoutError:
            raise FetchError("stalled", f"body stalled after {got} bytes", phases) from None
        except (http.client.HTTPException, OSError) as exc:
            raise FetchError("io_error", f"body: {type(exc).__name__}", phases) from None
        phases["transfer"] = time.perf_counter() - t4
        expected = resp.getheader("Content-Length")
        if expected is not None and expected.isdigit() and got < min(int(expected), t.max_bytes):
            raise FetchError("short_body", f"{got} of {expected} bytes", phases)
        return phases, status, got
    finally:
        sock.close()


class ObjectStorage(Probe):
    name = "object_storage"
    needs_targets = True
    Config = Config
    failure_reasons = FAILURE_REASONS
    default_interval_seconds = 900.0
    default_timeout_seconds = 300.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("fleetcanary_object_phase_seconds", "gauge", "Time per phase of a GET: resolve, connect, tls, "
                   "first_byte (request sent to the first body byte), transfer; median of the repeats.",
                   "seconds", ("target", "phase")),
        MetricSpec("fleetcanary_object_read_bytes_per_second", "gauge", "Read throughput over at most max_bytes per "
                   "stream; streams=1 is the median of single fetches, streams=N the aggregate of N at once.",
                   "bytes_per_second", ("target", "streams")),
        MetricSpec("fleetcanary_object_success", "gauge", "1 if every fetch of the target succeeded in the last run.",
                   "boolean", ("target",)),
        MetricSpec("fleetcanary_object_failures_total", "counter", "Failed fetches by reason: " +
                   ", ".join(FAILURE_REASONS) + ".", "total", ("target", "reason")),
    )

    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        if not config.targets:
            raise ProbeSkipped("not_configured", "no object storage targets")
        res = ProbeResult(parameters={"repeats": config.repeats}, touched={"targets": []})
        failures: dict[str, tuple[str, str]] = {}
        for t in config.targets:
            try:
                url = resolve_url(t)
                parts = urlsplit(url)
                res.touched["targets"].append({"target": t.name, "scheme": parts.scheme, "host": parts.hostname})
                self._target(t, url, config.repeats, res)
            except FetchError as exc:
                failures[t.name] = (exc.reason, exc.detail)
                res.samples.append(Sample("fleetcanary_object_failures_total",
                                          {"target": t.name, "reason": exc.reason}, 1))
            res.samples.append(Sample("fleetcanary_object_success", {"target": t.name},
                                      0.0 if t.name in failures else 1.0))
        res.extra["failures"] = {k: {"reason": r, "detail": d} for k, (r, d) in failures.items()}
        if failures and len(failures) == len(config.targets):
            name, (reason, detail) = next(iter(failures.items()))
            raise ProbeError(reason, f"{name}: {detail}", result=res)
        return res

    @staticmethod
    def _target(t: Target, url: str, repeats: int, res: ProbeResult) -> None:
        runs = [fetch(url, t) for _ in range(repeats)]
        for phase in PHASES:
            fig = Figure(f"{phase}", "seconds", [r[0][phase] for r in runs], {"target": t.name, "phase": phase},
                         higher_is_better=False)
            res.figures.append(fig)
            res.samples.append(Sample("fleetcanary_object_phase_seconds", fig.labels, fig.median))
        bws = [r[2] / (r[0]["first_byte"] + r[0]["transfer"]) for r in runs]
        fig = Figure("read", "bytes_per_second", bws, {"target": t.name, "streams": "1"})
        res.figures.append(fig)
        res.samples.append(Sample("fleetcanary_object_read_bytes_per_second", fig.labels, fig.median))
        if t.streams > 1:
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(t.streams) as pool:
                results = list(pool.map(lambda _: fetch(url, t), range(t.streams)))
            wall = time.perf_counter() - t0
            total = sum(r[2] for r in results)
            fig = Figure("read_concurrent", "bytes_per_second", [total / wall],
                         {"target": t.name, "streams": str(t.streams)})
            res.figures.append(fig)
            res.samples.append(Sample("fleetcanary_object_read_bytes_per_second", fig.labels, fig.median))
        res.extra.setdefault("status", {})[t.name] = runs[-1][1]
