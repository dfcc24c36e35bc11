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


def test_invalid_utf8_stops_the_parser_with_a_reason():
    p = SSEParser()
    assert [e.data for e in p.feed(b"data: fine\n\ndata: \xff\xfe ok\n\ndata: later\n\n", 1)] == ["fine"]
    assert p.error is not None and "UTF-8" in p.error and "'data'" in p.error
    assert p.feed(b"data: more\n\n", 2) == [] and p.close(3) == []


def test_utf8_split_across_reads_is_one_character_and_a_bom_is_dropped():
    raw = "\ufeffdata: h\u00e9llo \u4e16\n\n".encode()
    pieces = [raw[i:i + 1] for i in range(len(raw))]
    assert parse(pieces) == [("message", "h\u00e9llo \u4e16")]


def test_a_line_longer_than_the_bound_is_an_error_not_a_silent_drop():
    p = SSEParser(max_line_bytes=1024)
    assert p.feed(b"data: " + b"x" * 1000 + b"\n\n", 1)[0].data == "x" * 1000
    for i in range(100):  # 100 KiB with no line end, in 1 KiB reads
        assert p.feed(b"y" * 1024, 2 + i) == []
        if p.error:
            break
    assert p.error and "exceeds 1024 bytes" in p.error
    assert i <= 2 and len(p._buf) == 0  # stopped as soon as the bound passed, and let go of the bytes


def test_an_event_of_many_short_data_lines_is_bounded_too():
    p = SSEParser(max_line_bytes=1024)
    p.feed(b"data: 0123456789\n" * 200, 1)
    assert p.error and "event's data exceeds" in p.error


def test_one_long_line_costs_linear_work_in_small_reads():
    """An 8 MiB data line in 64 KiB reads: each byte is scanned once, not once per read."""
    total = 8 << 20
    for limit, expect_error in ((16 << 20, False), (1 << 20, True)):
        p = SSEParser(max_line_bytes=limit)
        body = b"data: " + b"a" * total + b"\n\n"
        events = []
        for i in range(0, len(body), 65536):
            events += p.feed(body[i:i + 65536], i)
        assert (p.error is not None) == expect_error
        assert p.work <= 3 * p.bytes + 64  # linear: the old parser re-scanned the line on every read
        if not expect_error:
            assert len(events) == 1 and len(events[0].data) == total


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([b"data: ", b"x" * 50, b"\r", b"\n", b"\r\n", b":", b"event: e", b"\xff",
                                 b"\xe4\xb8", b"\x96", b"id: 1"]), max_size=60),
       st.integers(min_value=1, max_value=64), st.integers(min_value=16, max_value=256))
def test_fuzz_work_stays_linear_and_the_buffer_bounded(parts, step, limit):
    raw = b"".join(parts)
    p = SSEParser(max_line_bytes=limit)
    peak = 0
    for i in range(0, len(raw), step):
        p.feed(raw[i:i + step], i)
        peak = max(peak, len(p._buf))
    p.close(len(raw))
    assert p.work <= 3 * len(raw) + 8
    assert peak <= limit + 1 + step  # never more than one line's bound plus the read that passed it


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_fuzz_never_raises_and_is_split_invariant(data, cuts):
    cuts = sorted({c for c in cuts if 0 < c < len(data)})
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    assert parse(pieces) == parse([data])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["message", "error", ""]), st.text(max_size=30).filter(
    lambda s: "\n" not in s and "\r" not in s)), max_size=6), st.sampled_from([b"\n", b"\r\n"]),
    st.integers(min_value=1, max_value=7))
def test_fuzz_roundtrip_of_well_formed_streams(events, nl, step):
    raw = b"".join((b"event: " + e.encode() + nl if e else b"") + b"data: " + d.encode() + nl + nl for e, d in events)
    pieces = [raw[i:i + step] for i in range(0, len(raw), step)]
    assert parse(pieces) == [(e or "message", d) for e, d in events]
