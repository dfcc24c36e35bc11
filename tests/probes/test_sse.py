"""The incremental SSE parser: delimiters, splits, comments, and fuzzing."""
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcanary.probes.lib.sse import SSEParser


def parse(chunks: list[bytes]) -> list[tuple[str, str]]:
    p = SSEParser()
    out = []
    for i, c in enumerate(chunks):
        out += [(e.event, e.data) for e in p.feed(c, i)]
    out += [(e.event, e.data) for e in p.close(len(chunks))]
    return out


STREAM = b'data: {"a":1}\n\n: comment\n\nevent: error\ndata: bad\n\ndata: x\ndata: y\n\ndata: [DONE]\n\n'
EXPECTED = [("message", '{"a":1}'), ("error", "bad"), ("message", "x\ny"), ("message", "[DONE]")]


def test_lf_crlf_and_cr_delimiters_give_the_same_events():
    assert parse([STREAM]) == EXPECTED
    assert parse([STREAM.replace(b"\n", b"\r\n")]) == EXPECTED
    assert parse([STREAM.replace(b"\n", b"\r")]) == EXPECTED


def test_cr_and_lf_split_across_reads_are_one_line_end():
    crlf = STREAM.replace(b"\n", b"\r\n")
    i = crlf.index(b"\r\n")
    assert parse([crlf[: i + 1], crlf[i + 1:]]) == EXPECTED


def test_event_time_is_the_read_that_completed_it():
    p = SSEParser()
    assert p.feed(b"data: hel", 100) == []
    assert p.feed(b"lo\n", 200) == []
    ev = p.feed(b"\ndata: two\n\ndata: three\n\n", 300)
    assert [(e.data, e.arrival_ns) for e in ev] == [("hello", 300), ("two", 300), ("three", 300)]


def test_comments_are_counted_not_dispatched_and_a_bare_event_type_is_kept():
    p = SSEParser()
    assert p.feed(b": ping\n\n:keepalive\n\n", 1) == []
    assert p.comments == 2
    assert [(e.event, e.data) for e in p.feed(b"event: error\n\n", 2)] == [("error", "")]


def test_unterminated_last_event_is_not_dispatched():
    assert parse([b'data: {"a":1}\n\ndata: partial']) == [("message", '{"a":1}')]


def test_invalid_utf8_is_replaced():
    assert parse([b"data: \xff\xfe ok\n\n"]) == [("message", "\ufffd\ufffd ok")]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_fuzz_never_raises_and_is_split_invariant(data, cuts):
    cuts = sorted({c for c in cuts if 0 < c < len(data)})
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    assert parse(pieces) == parse([data])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["message", "error", ""]), st.text(max_size=30).filter(
    lambda s: "\n" not in s and "\r" not in s)), max_size=6), st.sampled_from([b"\n", b"\r\n"]),
    st.integers(min_value=1, max_value=7))
def test_fuzz_roundtrip_of_well_formed_streams(events, nl, step):
    raw = b"".join((b"event: " + e.encode() + nl if e else b"") + b"data: " + d.encode() + nl + nl for e, d in events)
    pieces = [raw[i:i + step] for i in range(0, len(raw), step)]
    assert parse(pieces) == [(e or "message", d) for e, d in events]
