"""The LLM client against a hostile server that writes exact bytes on a raw socket: every lying
stream of issue 18, each with the outcome a careful client gives it."""
import gzip
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetcanary.probes.lib import llm_client
from tests.support.llm import RawHTTPServer, chunked, sse_chunk, sse_usage

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
GOOD = [sse_chunk("Hello"), sse_chunk(" world"), sse_chunk("", "stop"), sse_usage(2), b"data: [DONE]\n\n"]


def gz_stream(events: list[bytes]) -> list[bytes]:
    """gzip with a sync flush after each event, as a compressing proxy streams it."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [z.compress(e) + z.flush(zlib.Z_SYNC_FLUSH) for e in events]
    out[-1] += z.flush()
    return out


def deflate_stream(events: list[bytes], raw: bool) -> list[bytes]:
    z = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS if raw else zlib.MAX_WBITS)
    out = [z.compress(e) + z.flush(zlib.Z_SYNC_FLUSH) for e in events]
    out[-1] += z.flush()
    return out


def ask(srv: RawHTTPServer, stream: bool = True, **ep) -> llm_client.RequestResult:
    e = llm_client.Endpoint(srv.base, **{"read_timeout": 5, **ep})
    return llm_client.request(e, llm_client.build_body("chat", "m", "p", 8, stream))


@pytest.fixture
def raw():
    s = RawHTTPServer()
    yield s
    s.close()


CASES = {
    # name: (reply bytes, expected outcome, a word the detail must hold)
    "proper stream": ([SSE_HEAD + b"\r\n", *chunked(*GOOD)], "success", ""),
    "finish_reason but no usage and no [DONE]": ([SSE_HEAD + b"\r\n", *chunked(*GOOD[:3])], "success",
                                                 "without [DONE]"),
    "gzip stream": ([SSE_HEAD + b"Content-Encoding: gzip\r\n\r\n", *chunked(*gz_stream(GOOD))], "success", ""),
    "deflate (zlib) stream": ([SSE_HEAD + b"Content-Encoding: deflate\r\n\r\n",
                               *chunked(*deflate_stream(GOOD, raw=False))], "success", ""),
    "deflate (raw) stream": ([SSE_HEAD + b"Content-Encoding: deflate\r\n\r\n",
                              *chunked(*deflate_stream(GOOD, raw=True))], "success", ""),
    "brotli is refused": ([SSE_HEAD + b"Content-Encoding: br\r\n\r\n", *chunked(b"\x1b\x00garbage")],
                          "stream_error", "Content-Encoding"),
    "corrupt gzip": ([SSE_HEAD + b"Content-Encoding: gzip\r\n\r\n", *chunked(b"\x1f\x8b\x08\x00not gzip at all")],
                     "stream_error", "corrupt gzip"),
    "200 text/html, no SSE": ([b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 27\r\n\r\n"
                               b"<html>gateway error</html>\n"], "stream_error", "text/html"),
    "200 without Content-Type": ([b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"], "stream_error", "Content-Type"),
    "invalid UTF-8 in a data line": ([SSE_HEAD + b"\r\n", *chunked(sse_chunk("ok"), b'data: {"choices":[{"delta":'
                                      b'{"content":"\xff\xfe"}}]}\n\n', *GOOD[2:])], "stream_error", "UTF-8"),
    "8 MiB data line with no delimiter": ([SSE_HEAD + b"\r\n", *chunked(sse_chunk("ok"), b"data: " + b"A" * (8 << 20),
                                           *GOOD[2:])], "stream_error", "exceeds"),
    "closed early: no finish_reason, usage or [DONE]": ([b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                                         b"Connection: close\r\n\r\n", sse_chunk("Hel"),
                                                         sse_chunk("lo")], "truncated", "after 2 content chunks"),
    "closed inside a chunk": ([SSE_HEAD + b"\r\n", *chunked(sse_chunk("Hel"))[:1], b"ff\r\ndata: {\"cho"],
                              "truncated", "closed"),
    "closed before any byte of the body": ([SSE_HEAD + b"Connection: close\r\n\r\n"], "truncated", "closed"),
    "malformed status line": ([b"HTTP/1.1 two hundred\r\n\r\n"], "stream_error", "status line"),
    "a redirect is not an answer": ([b"HTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n"],
                                    "stream_error", "HTTP 302"),
    "204 is not an answer": ([b"HTTP/1.1 204 No Content\r\n\r\n"], "stream_error", "HTTP 204"),
    "429 with Retry-After": ([b"HTTP/1.1 429 Too Many\r\nRetry-After: 7\r\nContent-Length: 2\r\n\r\n{}"],
                             "http_429", "429"),
    "role-only stream": ([SSE_HEAD + b"\r\n", *chunked(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n',
                                                         sse_chunk("", "stop"), b"data: [DONE]\n\n")], "empty", ""),
    "error event": ([SSE_HEAD + b"\r\n", *chunked(sse_chunk("a"), b"event: error\ndata: overloaded\n\n")],
                    "stream_error", "overloaded"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_hostile_stream_gets_its_outcome(raw, name):
    reply, outcome, word = CASES[name]
    raw.reply = reply
    r = ask(raw)
    assert r.outcome == outcome, (r.outcome, r.detail)
    assert word in r.detail
    if outcome == "success":
        assert r.text == "Hello world" and r.ttft is not None and r.finish_reason == "stop"
    if name == "gzip stream":
        assert r.content_encoding == "gzip" and r.token_count_source == "usage" and r.output_tokens == 2
    if name == "429 with Retry-After":
        assert r.retry_after == 7


def test_non_streaming_answers_are_checked_too(raw):
    body = (b'{"id":"x","choices":[{"message":{"role":"assistant","content":"42"},"finish_reason":"stop"}],'
            b'"usage":{"completion_tokens":1}}')
    gz = gzip.compress(body)
    raw.reply = [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(gz) + gz]
    r = ask(raw, stream=False)
    assert (r.outcome, r.text, r.output_tokens) == ("success", "42", 1)
    raw.reply = [b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 5\r\n\r\n<html"]
    r = ask(raw, stream=False)
    assert r.outcome == "stream_error" and "not JSON" in r.detail
    raw.reply = [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                 + body[:20]]
    r = ask(raw, stream=False)
    assert r.outcome == "truncated", r.detail


def test_a_stall_ends_at_the_total_timeout_not_the_read_timeout(raw):
    raw.reply = [SSE_HEAD + b"\r\n", *chunked(sse_chunk("a"), sse_chunk("b"), sse_chunk("c"))[:3], RawHTTPServer.HOLD]
    r = ask(raw, read_timeout=30, total_timeout=0.6)
    assert r.outcome == "timeout" and "total timeout" in r.detail
    assert len(r.chunk_times) == 3 and r.close_seconds is None


def test_the_line_bound_is_configurable(raw):
    raw.reply = [SSE_HEAD + b"\r\n", *chunked(sse_chunk("x" * 5000), *GOOD[2:])]
    assert ask(raw).outcome == "success"
    r = ask(raw, max_line_bytes=4096)
    assert r.outcome == "stream_error" and "4096" in r.detail


def test_the_token_never_reaches_a_result(raw):
    raw.reply = [b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n"]
    r = ask(raw, token="sk-secret-abcdef")
    assert r.outcome == "http_4xx" and "sk-secret" not in repr(r.record())


EVENT_PARTS = [sse_chunk("hi"), sse_chunk("", "stop"), sse_usage(1), b"data: [DONE]\n\n", b": ping\n\n",
               b"event: error\n\n", b"data: nope\n\n", b"\r\n", b"data: \xff\n\n", b"data: {}\n\n", b"\r",
               b'data: {"choices":[{"delta":null}]}\n\n']


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(EVENT_PARTS) | st.binary(max_size=40), max_size=10),
       st.sampled_from(["identity", "gzip", "close"]))
def test_fuzz_hostile_bytes_always_end_in_a_bounded_outcome(raw, parts, framing):
    if framing == "gzip":
        body = chunked(*gz_stream(parts or [b""]))
        head = SSE_HEAD + b"Content-Encoding: gzip\r\n\r\n"
    elif framing == "close":
        body = parts
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    else:
        body = chunked(*parts)
        head = SSE_HEAD + b"\r\n"
    raw.reply = [head, *body]
    r = ask(raw)
    assert r.outcome in llm_client.OUTCOMES and r.outcome != "timeout"
    ended = any(p in parts for p in EVENT_PARTS[1:4])
    if r.outcome == "success":
        assert ended and r.chunk_times
