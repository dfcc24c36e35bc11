"""One request to an OpenAI-compatible endpoint, timed the way the canary defines it.

Definitions (timestamps are perf_counter_ns taken as each read returns):
- TTFT: send to the first chunk carrying non-empty content, reasoning content or tool
  calls. Role-only and empty chunks do not count.
- E2E: send to the last content chunk. The [DONE] marker and the stream's close are
  recorded separately (done_seconds, close_seconds).
- ITL: (E2E - TTFT) / (N - 1), N from usage.completion_tokens when the server sends
  it, else the number of content chunks; ``token_count_source`` says which.
- Raw gaps between content chunks are kept.

Outcomes are a bounded set: success, http_4xx, http_429, http_5xx, connect_error,
timeout, stream_error, empty (quality_fail is decided by the caller). Retry-After is
recorded. The bearer token goes only into the Authorization header: never into a
result, an error detail or a log line.
"""
from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from fleetcanary.probes.lib.sse import SSEParser

OUTCOMES = ("success", "http_4xx", "http_429", "http_5xx", "connect_error", "timeout", "stream_error", "empty",
            "quality_fail")


@dataclass
class Endpoint:
    base_url: str                       # e.g. http://127.0.0.1:8000/v1
    api: str = "chat"                   # chat | completions
    token: str | None = None            # bearer token (secret)
    headers: dict[str, str] = field(default_factory=dict)
    ca_file: str | None = None
    verify_tls: bool = True
    connect_timeout: float = 5.0
    read_timeout: float = 30.0          # longest silence between reads (a stall)
    total_timeout: float = 120.0        # whole request


@dataclass
class RequestResult:
    outcome: str
    detail: str = ""
    status: int | None = None
    retry_after: float | None = None
    stream: bool = True
    send_ns: int = 0
    ttft: float | None = None
    e2e: float | None = None
    itl: float | None = None
    done_seconds: float | None = None
    close_seconds: float | None = None
    chunk_times: list[float] = field(default_factory=list)   # seconds since send, content chunks
    gaps: list[float] = field(default_factory=list)
    output_tokens: int = 0
    token_count_source: str = "none"     # usage | chunks | none
    prompt_tokens: int | None = None
    text: str = ""
    done: bool = False
    cancelled: bool = False
    comments: int = 0
    response_id: str | None = None

    def tokens_per_second(self) -> float | None:
        if self.e2e and self.output_tokens:
            return self.output_tokens / self.e2e
        return None

    def record(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("text", "send_ns")}
        d["text_chars"] = len(self.text)
        return d


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return None  # an HTTP date: recorded as unknown


def _path(base_url: str, api: str) -> tuple[Any, str]:
    parts = urlsplit(base_url)
    prefix = parts.path.rstrip("/")
    return parts, f"{prefix}/{'chat/completions' if api == 'chat' else 'completions'}"


def build_body(api: str, model: str, prompt: str, max_tokens: int, stream: bool, temperature: float = 0.0,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "stream": stream}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    if extra:
        body.update(extra)
    return body


def _content(obj: dict[str, Any], api: str) -> tuple[str, bool]:
    """(text, carries_content) of one chunk. Reasoning content and tool calls count as content."""
    choices = obj.get("choices") or []
    if not choices or not isinstance(choices, list):
        return "", False
    c = choices[0] if isinstance(choices[0], dict) else {}
    if api == "completions":
        text = c.get("text") or ""
        return text, bool(text)
    delta = c.get("delta") or c.get("message") or {}
    if not isinstance(delta, dict):
        return "", False
    text = delta.get("content") or ""
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    tools = delta.get("tool_calls") or []
    return (text if isinstance(text, str) else ""), bool(text or reasoning or tools)


def request(ep: Endpoint, body: dict[str, Any], cancel_after_chunks: int | None = None) -> RequestResult:
    """Send one request. cancel_after_chunks: close the stream after that many content
    chunks, as a user who cancels does (outcome success, ``cancelled`` set)."""
    stream = bool(body.get("stream"))
    api = ep.api
    parts, path = _path(ep.base_url, api)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    res = RequestResult(outcome="connect_error", stream=stream)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json",
               **ep.headers}
    if ep.token:
        headers["Authorization"] = f"Bearer {ep.token}"
    payload = json.dumps(body).encode()
    try:
        if parts.scheme == "https":
            ctx = ssl.create_default_context(cafile=ep.ca_file)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            if not ep.verify_tls:
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(host, port, timeout=ep.connect_timeout,
                                                                           context=ctx)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=ep.connect_timeout)
        conn.connect()
    except (OSError, ssl.SSLError) as exc:
        res.detail = f"connect: {type(exc).__name__}"
        return res
    try:
        return _exchange(conn, ep, path, payload, headers, res, api, cancel_after_chunks)
    finally:
        conn.close()


def _exchange(conn, ep: Endpoint, path: str, payload: bytes, headers: dict, res: RequestResult,
              api: str, cancel_after_chunks: int | None = None) -> RequestResult:
    conn.sock.settimeout(ep.read_timeout)
    deadline = time.perf_counter_ns() + int(ep.total_timeout * 1e9)
    res.send_ns = t0 = time.perf_counter_ns()
    try:
        conn.request("POST", path, body=payload, headers=headers)
        resp = conn.getresponse()
    except socket.timeout:
        res.outcome, res.detail = "timeout", "no response headers within the read timeout"
        return res
    except (OSError, http.client.HTTPException) as exc:
        res.outcome, res.detail = "connect_error", f"request: {type(exc).__name__}"
        return res
    res.status = resp.status
    res.retry_after = _retry_after(resp.getheader("Retry-After"))
    if resp.status != 200:
        res.outcome = "http_429" if resp.status == 429 else ("http_4xx" if resp.status < 500 else "http_5xx")
        res.detail = f"HTTP {resp.status}"
        try:
            resp.read(65536)
        except (OSError, http.client.HTTPException):
            pass
        return res
    if not res.stream:
        return _whole(resp, res, t0, api)
    parser = SSEParser()
    usage_tokens = None
    text_parts: list[str] = []
    error: str | None = None
    try:
        while True:
            if time.perf_counter_ns() > deadline:
                res.outcome, res.detail = "timeout", "request exceeded its total timeout"
                return _finish(res, t0, text_parts, usage_tokens)
            chunk = resp.read1(65536)
            now = time.perf_counter_ns()
            events = parser.feed(chunk, now) if chunk else parser.close(now)
            for ev in events:
                if ev.event == "error":
                    error = error or f"error event: {ev.data[:200]}"
                    continue
                data = ev.data.strip()
                if data == "[DONE]":
                    res.done = True
                    res.done_seconds = (ev.arrival_ns - t0) / 1e9
                    continue
                if not data:
                    continue
                try:
                    obj = json.loads(data)
                except ValueError:
                    error = error or "non-JSON data in the stream"
                    continue
                if not isinstance(obj, dict):
                    error = error or "data is not a JSON object"
                    continue
                if obj.get("error"):
                    err = obj["error"]
                    msg = err.get("message") if isinstance(err, dict) else str(err)
                    error = error or f"error in stream: {str(msg)[:200]}"
                    continue
                if res.response_id is None and isinstance(obj.get("id"), str):
                    res.response_id = obj["id"][:128]
                usage = obj.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    usage_tokens = usage["completion_tokens"]
                    if isinstance(usage.get("prompt_tokens"), int):
                        res.prompt_tokens = usage["prompt_tokens"]
                text, carries = _content(obj, api)
                if carries:
                    res.chunk_times.append((ev.arrival_ns - t0) / 1e9)
                    text_parts.append(text)
            if cancel_after_chunks is not None and len(res.chunk_times) >= cancel_after_chunks:
                res.cancelled = True
                res.close_seconds = (time.perf_counter_ns() - t0) / 1e9
                break
            if not chunk:
                res.close_seconds = (now - t0) / 1e9
                break
    except socket.timeout:
        res.outcome, res.detail = "timeout", "the stream stalled (no byte within the read timeout)"
        return _finish(res, t0, text_parts, usage_tokens)
    except (OSError, http.client.HTTPException) as exc:
        res.outcome, res.detail = "stream_error", f"stream broken: {type(exc).__name__}"
        return _finish(res, t0, text_parts, usage_tokens)
    res.comments = parser.comments
    _finish(res, t0, text_parts, usage_tokens)
    if error:
        res.outcome, res.detail = "stream_error", error
    elif not res.chunk_times:
        res.outcome, res.detail = "empty", "the stream carried no content"
    else:
        res.outcome = "success"
        if not res.done:
            res.detail = "stream closed without [DONE]"
    return res


def _finish(res: RequestResult, t0: int, text_parts: list[str], usage_tokens: int | None) -> RequestResult:
    res.text = "".join(text_parts)
    if res.chunk_times:
        res.ttft = res.chunk_times[0]
        res.e2e = res.chunk_times[-1]
        res.gaps = [b - a for a, b in zip(res.chunk_times, res.chunk_times[1:])]
    if usage_tokens is not None:
        res.output_tokens, res.token_count_source = usage_tokens, "usage"
    elif res.chunk_times:
        res.output_tokens, res.token_count_source = len(res.chunk_times), "chunks"
    if res.ttft is not None and res.output_tokens > 1:
        res.itl = (res.e2e - res.ttft) / (res.output_tokens - 1)
    return res


def _whole(resp, res: RequestResult, t0: int, api: str) -> RequestResult:
    try:
        raw = resp.read(16 << 20)
    except socket.timeout:
        res.outcome, res.detail = "timeout", "the response stalled"
        return res
    except (OSError, http.client.HTTPException) as exc:
        res.outcome, res.detail = "stream_error", f"response broken: {type(exc).__name__}"
        return res
    now = time.perf_counter_ns()
    res.e2e = (now - t0) / 1e9
    res.close_seconds = res.e2e
    try:
        obj = json.loads(raw)
    except ValueError:
        res.outcome, res.detail = "stream_error", "response is not JSON"
        return res
    if not isinstance(obj, dict) or obj.get("error"):
        res.outcome, res.detail = "stream_error", "error object in the response"
        return res
    text, carries = _content(obj, api)
    res.text = text
    usage = obj.get("usage") or {}
    if isinstance(usage.get("completion_tokens"), int):
        res.output_tokens, res.token_count_source = usage["completion_tokens"], "usage"
    if not carries:
        res.outcome, res.detail = "empty", "the response carried no content"
        return res
    res.outcome = "success"
    return res
