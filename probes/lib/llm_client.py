"""One request to an OpenAI-compatible endpoint, timed the way the canary defines it.

Definitions (timestamps are perf_counter_ns taken as each read returns; "send" is the moment
the request, built beforehand, is handed to the socket in one write):
- TTFT: send to the first chunk carrying non-empty content, reasoning content or tool
  calls. Role-only and empty chunks do not count.
- E2E: send to the last content chunk. The [DONE] marker and the stream's close are
  recorded separately (done_seconds, close_seconds).
- ITL: (E2E - TTFT) / (N - 1), N from usage.completion_tokens when the server sends
  it, else the number of content chunks; ``token_count_source`` says which.
- Raw gaps between content chunks are kept.

Outcomes are a bounded set (quality_fail is decided by the caller); ``OUTCOME_DOCS``
says what produces each. A careful client's checks, each with its outcome:
- the status line: 200 is the only answer parsed; 429, other 4xx and 5xx are counted
  as such; any other status (1xx, 2xx other than 200, 3xx) and a malformed status line
  are ``stream_error``;
- Content-Type: a streaming answer must be ``text/event-stream``, a non-streaming one
  JSON; anything else (an HTML error page with status 200) is ``stream_error``;
- Content-Encoding: gzip, x-gzip and deflate are decoded (the request asks for
  identity, but a proxy may compress anyway); any other coding is ``stream_error``;
- the SSE parser is strict (probes/lib/sse.py): invalid UTF-8 or a line or event over
  ``max_line_bytes`` is ``stream_error`` with the reason;
- a stream that closes with no finish_reason, no usage and no [DONE] is
  ``truncated``: the answer may be cut anywhere, so its figures are not trusted;
- deadlines: ``total_timeout`` bounds the whole request, every read included (each
  read waits at most the smaller of ``read_timeout`` and the time left).
Retry-After is recorded. The bearer token goes only into the Authorization header:
never into a result, an error detail or a log line.
"""
from __future__ import annotations

import http.client
import itertools
import json
import ssl
import time
import zlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from fleetcanary.probes.lib.sse import DEFAULT_MAX_LINE_BYTES, SSEParser

# Every outcome a request can have, with what produces it (docs/metrics.md shows this table).
OUTCOME_DOCS: dict[str, str] = {
    "success": "a 200 answer with content that ended properly ([DONE], a finish_reason or usage; or a request the "
               "client cancelled on purpose)",
    "http_4xx": "status 400-499 other than 429 (a bad request, a wrong token, an unknown model)",
    "http_429": "status 429 (rate limited); Retry-After is recorded",
    "http_5xx": "status 500-599; Retry-After is recorded",
    "connect_error": "no connection: refused, unreachable, DNS or TLS handshake failure, or the connection broke "
                     "before any response",
    "timeout": "no response headers, or a stream silent for the read timeout, or the request's share of the "
               "probe's deadline ran out",
    "stream_error": "a malformed or lying answer: a status other than 200/4xx/5xx, a malformed status line, a "
                    "Content-Type that is not text/event-stream (streaming) or JSON, an unsupported "
                    "Content-Encoding, invalid UTF-8, a line or event over the line bound, non-JSON data, an "
                    "error event or an error object in the stream, or a broken connection after the end",
    "empty": "a proper answer that carried no content (role-only or empty chunks)",
    "truncated": "the connection closed before any end of answer: no finish_reason, no usage and no [DONE]",
    "quality_fail": "a golden prompt answered, but not with the expected answer",
}
OUTCOMES = tuple(OUTCOME_DOCS)


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
    total_timeout: float = 120.0        # whole request, every read included
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES  # longest SSE line or event accepted


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
    finish_reason: str | None = None
    content_encoding: str | None = None

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
               "Accept-Encoding": "identity", **ep.headers}
    if ep.token:
        headers["Authorization"] = f"Bearer {ep.token}"
    payload = json.dumps(body).encode()
    start_ns = time.perf_counter_ns()
    deadline = start_ns + int(ep.total_timeout * 1e9)
    try:
        connect_timeout = max(min(ep.connect_timeout, ep.total_timeout), 0.001)
        if parts.scheme == "https":
            ctx = ssl.create_default_context(cafile=ep.ca_file)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            if not ep.verify_tls:
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(host, port, timeout=connect_timeout,
                                                                           context=ctx)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=connect_timeout)
        conn.connect()
    except TimeoutError:
        res.outcome, res.detail = "timeout", "connect: no connection within the connect timeout"
        return res
    except (OSError, ssl.SSLError) as exc:
        res.detail = f"connect: {type(exc).__name__}"
        return res
    try:
        return _exchange(conn, ep, path, payload, headers, res, api, cancel_after_chunks, deadline)
    finally:
        conn.close()


def _left(deadline: int) -> float:
    return (deadline - time.perf_counter_ns()) / 1e9


class _Decoder:
    """Content-Encoding: identity, gzip/x-gzip or deflate (zlib, or raw as some servers send it).
    Output is produced in bounded pieces, so a compression bomb meets the parser's line bound
    instead of filling memory."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._z = None
        self._raw_tried = False
        if coding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif coding == "deflate":
            self._z = zlib.decompressobj(zlib.MAX_WBITS)

    def pieces(self, data: bytes, final: bool = False):
        if self._z is None:
            if data:
                yield data
            return
        try:
            buf = data
            while True:
                out = self._z.decompress(buf, 1 << 16)
                if out:
                    yield out
                buf = self._z.unconsumed_tail
                if not buf:
                    break
            if final:
                tail = self._z.flush()
                if tail:
                    yield tail
        except zlib.error:
            if self.coding == "deflate" and not self._raw_tried:
                # "deflate" sent as raw DEFLATE without the zlib header: retry once that way
                self._raw_tried = True
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                yield from self.pieces(data, final)
                return
            raise


_DECODABLE = ("", "identity", "gzip", "x-gzip", "deflate")


def _media_type(resp) -> str:
    return (resp.getheader("Content-Type") or "").split(";", 1)[0].strip().lower()


def _exchange(conn, ep: Endpoint, path: str, payload: bytes, headers: dict, res: RequestResult,
              api: str, cancel_after_chunks: int | None, deadline: int) -> RequestResult:
    # the socket itself: http.client drops conn.sock when the answer says Connection: close
    sock = conn.sock
    try:
        sock.settimeout(max(min(ep.read_timeout, _left(deadline)), 0.001))
        # The request head is built before the clock starts (putrequest/putheader only buffer; on a
        # busy 2-core machine building it took ~0.2 ms, which conn.request() put inside every TTFT);
        # endheaders() then sends head and body in one write, and the clock starts just before it.
        conn.putrequest("POST", path, skip_accept_encoding="accept-encoding" in {k.lower() for k in headers})
        for k, v in headers.items():
            conn.putheader(k, v)
        if "content-length" not in {k.lower() for k in headers}:
            conn.putheader("Content-Length", str(len(payload)))
        res.send_ns = t0 = time.perf_counter_ns()
        conn.endheaders(payload)
        resp = conn.getresponse()
    except TimeoutError:
        res.outcome, res.detail = "timeout", "no response headers within the read timeout"
        return res
    except http.client.BadStatusLine as exc:
        res.outcome = "stream_error" if not isinstance(exc, http.client.RemoteDisconnected) else "connect_error"
        res.detail = "malformed status line" if res.outcome == "stream_error" else "request: RemoteDisconnected"
        return res
    except (http.client.LineTooLong, http.client.HTTPException) as exc:
        res.outcome, res.detail = "stream_error", f"malformed response head: {type(exc).__name__}"
        return res
    except OSError as exc:
        res.outcome, res.detail = "connect_error", f"request: {type(exc).__name__}"
        return res
    res.status = resp.status
    res.retry_after = _retry_after(resp.getheader("Retry-After"))
    if resp.status != 200:
        if resp.status == 429:
            res.outcome = "http_429"
        elif 400 <= resp.status < 500:
            res.outcome = "http_4xx"
        elif 500 <= resp.status < 600:
            res.outcome = "http_5xx"
        else:
            res.outcome = "stream_error"
        res.detail = f"HTTP {resp.status}" + ("" if res.outcome != "stream_error" else ": not an answer")
        try:
            resp.read(65536)
        except (OSError, http.client.HTTPException):
            pass
        return res
    coding = (resp.getheader("Content-Encoding") or "").strip().lower()
    res.content_encoding = coding or None
    if coding not in _DECODABLE:
        res.outcome, res.detail = "stream_error", f"unsupported Content-Encoding {coding[:32]!r}"
        return res
    media = _media_type(resp)
    if not res.stream:
        if media != "application/json" and not media.endswith("+json"):
            res.outcome, res.detail = "stream_error", f"Content-Type {media[:64]!r}, not JSON"
            return res
        return _whole(sock, resp, res, t0, api, _Decoder(coding), deadline, ep)
    if media != "text/event-stream":
        res.outcome, res.detail = "stream_error", f"Content-Type {media[:64]!r}, not text/event-stream"
        return res
    decoder = _Decoder(coding)
    parser = SSEParser(ep.max_line_bytes)
    usage_tokens = None
    text_parts: list[str] = []
    error: str | None = None
    truncated_read = False
    try:
        while True:
            left = _left(deadline)
            if left <= 0:
                res.outcome, res.detail = "timeout", "request exceeded its total timeout"
                return _finish(res, t0, text_parts, usage_tokens)
            sock.settimeout(max(min(ep.read_timeout, left), 0.001))
            try:
                chunk = resp.read1(65536)
            except http.client.IncompleteRead:
                chunk, truncated_read = b"", True  # the connection closed inside a chunk
            now = time.perf_counter_ns()
            try:
                events = [ev for piece in decoder.pieces(chunk, final=not chunk) for ev in parser.feed(piece, now)]
            except zlib.error:
                error = error or f"corrupt {decoder.coding} body"
                res.close_seconds = (now - t0) / 1e9
                break
            if not chunk:
                events += parser.close(now)
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
                fr = _finish_reason(obj)
                if fr:
                    res.finish_reason = fr
                text, carries = _content(obj, api)
                if carries:
                    res.chunk_times.append((ev.arrival_ns - t0) / 1e9)
                    text_parts.append(text)
            if parser.error:
                error = error or f"SSE: {parser.error}"
                res.close_seconds = (now - t0) / 1e9
                break
            if cancel_after_chunks is not None and len(res.chunk_times) >= cancel_after_chunks:
                res.cancelled = True
                res.close_seconds = (time.perf_counter_ns() - t0) / 1e9
                break
            if not chunk:
                res.close_seconds = (now - t0) / 1e9
                break
    except TimeoutError:
        res.outcome = "timeout"
        res.detail = "the stream stalled (no byte within the read timeout)" if _left(deadline) > 0.001 else \
            "request exceeded its total timeout"
        return _finish(res, t0, text_parts, usage_tokens)
    except (OSError, http.client.HTTPException) as exc:
        ended = res.done or res.finish_reason is not None or usage_tokens is not None
        res.outcome = "stream_error" if ended else "truncated"
        res.detail = f"stream broken: {type(exc).__name__}"
        return _finish(res, t0, text_parts, usage_tokens)
    res.comments = parser.comments
    _finish(res, t0, text_parts, usage_tokens)
    ended = res.done or res.finish_reason is not None or usage_tokens is not None
    if error:
        res.outcome, res.detail = "stream_error", error
    elif res.cancelled:
        res.outcome = "success"
    elif not ended:
        res.outcome = "truncated"
        res.detail = "the connection closed " + ("inside a chunk " if truncated_read else "") + \
            "with no finish_reason, no usage and no [DONE]" + (f" after {len(res.chunk_times)} content chunks"
                                                                if res.chunk_times else "")
    elif not res.chunk_times:
        res.outcome, res.detail = "empty", "the stream carried no content"
    else:
        res.outcome = "success"
        if not res.done:
            res.detail = "stream closed without [DONE]"
    return res


def _finish_reason(obj: dict[str, Any]) -> str | None:
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        fr = choices[0].get("finish_reason")
        if isinstance(fr, str) and fr:
            return fr[:32]
    return None


def _finish(res: RequestResult, t0: int, text_parts: list[str], usage_tokens: int | None) -> RequestResult:
    res.text = "".join(text_parts)
    if res.chunk_times:
        res.ttft = res.chunk_times[0]
        res.e2e = res.chunk_times[-1]
        res.gaps = [b - a for a, b in itertools.pairwise(res.chunk_times)]
    if usage_tokens is not None:
        res.output_tokens, res.token_count_source = usage_tokens, "usage"
    elif res.chunk_times:
        res.output_tokens, res.token_count_source = len(res.chunk_times), "chunks"
    if res.ttft is not None and res.output_tokens > 1:
        res.itl = (res.e2e - res.ttft) / (res.output_tokens - 1)
    return res


WHOLE_LIMIT = 16 << 20


def _whole(sock, resp, res: RequestResult, t0: int, api: str, decoder: _Decoder, deadline: int,
           ep: Endpoint) -> RequestResult:
    raw = bytearray()
    try:
        while True:
            left = _left(deadline)
            if left <= 0:
                res.outcome, res.detail = "timeout", "request exceeded its total timeout"
                return res
            sock.settimeout(max(min(ep.read_timeout, left), 0.001))
            chunk = resp.read1(65536)
            for piece in decoder.pieces(chunk, final=not chunk):
                raw += piece
            if len(raw) > WHOLE_LIMIT:
                res.outcome, res.detail = "stream_error", f"response larger than {WHOLE_LIMIT} bytes"
                return res
            if not chunk:
                break
    except TimeoutError:
        res.outcome, res.detail = "timeout", "the response stalled"
        return res
    except http.client.IncompleteRead:
        res.outcome, res.detail = "truncated", "the connection closed before the whole response"
        return res
    except zlib.error:
        res.outcome, res.detail = "stream_error", f"corrupt {decoder.coding} body"
        return res
    except (OSError, http.client.HTTPException) as exc:
        res.outcome, res.detail = "stream_error", f"response broken: {type(exc).__name__}"
        return res
    now = time.perf_counter_ns()
    res.e2e = (now - t0) / 1e9
    res.close_seconds = res.e2e
    try:
        obj = json.loads(bytes(raw).decode("utf-8"))
    except UnicodeDecodeError:
        res.outcome, res.detail = "stream_error", "response is not UTF-8"
        return res
    except ValueError:
        res.outcome, res.detail = ("truncated", "the response ends inside its JSON") if raw and \
            raw.lstrip()[:1] == b"{" and not raw.rstrip().endswith(b"}") else ("stream_error", "response is not JSON")
        return res
    if not isinstance(obj, dict) or obj.get("error"):
        res.outcome, res.detail = "stream_error", "error object in the response"
        return res
    text, carries = _content(obj, api)
    res.text = text
    res.finish_reason = _finish_reason(obj)
    usage = obj.get("usage") or {}
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        res.output_tokens, res.token_count_source = usage["completion_tokens"], "usage"
    if not carries:
        res.outcome, res.detail = "empty", "the response carried no content"
        return res
    res.outcome = "success"
    return res
