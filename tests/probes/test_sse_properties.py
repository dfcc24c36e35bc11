"""SSE parser properties (issue 37), beside the fuzz tests of test_sse.py: any bytes, in any reads, under any
line bound, never raise (the parser's one declared failure is ``error`` set, after which it returns nothing),
and well-formed streams of every shape the spec allows round-trip event for event."""
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcanary.probes.lib.sse import SSEParser

NEWLINES = [b"\n", b"\r\n", b"\r"]


def feed_all(p: SSEParser, raw: bytes, cuts: list[int]):
    cuts = sorted({c for c in cuts if 0 < c < len(raw)})
    out = []
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(raw)], strict=True)):
        out += p.feed(raw[a:b], i)
    return out + p.close(len(cuts) + 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40), st.sampled_from(
    [b"data:", b"data: ", b"event:", b"id:", b"id: \x00", b"retry: x", b":", b"\r", b"\n", b"\r\n", b"\xef\xbb\xbf",
     b"\xff", b"\xc3", b"\xa9", b"x" * 70])), max_size=50),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=10), st.integers(min_value=16, max_value=128))
def test_any_bytes_never_raise_and_an_error_is_final(parts, cuts, limit):
    raw = b"".join(parts)
    p = SSEParser(max_line_bytes=limit)
    events = feed_all(p, raw, cuts)
    for e in events:
        assert isinstance(e.data, str) and isinstance(e.event, str) and e.event
        assert len(e.data.encode()) <= limit
    if p.error is not None:
        assert isinstance(p.error, str) and p.error
        assert p.feed(b"data: more\n\n", 99) == [] and p.close(100) == []
    else:
        assert p.bytes == len(raw)  # every byte read (after an error the parser stops reading)


FIELD_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x00"), max_size=20)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["", "message", "error", "delta"]),
                          st.lists(FIELD_TEXT, min_size=1, max_size=3), st.one_of(st.none(), FIELD_TEXT)),
                max_size=6),
       st.sampled_from(NEWLINES), st.booleans(), st.booleans(), st.lists(st.integers(0, 600), max_size=8))
def test_well_formed_events_round_trip(events, nl, comments, bom, cuts):
    raw = b"\xef\xbb\xbf" if bom else b""
    for name, data_lines, ident in events:
        if comments:
            raw += b": keep-alive" + nl
        if name:
            raw += b"event: " + name.encode() + nl
        if ident is not None:
            raw += b"id: " + ident.encode() + nl
        for line in data_lines:
            raw += b"data: " + line.encode() + nl
        raw += nl
    p = SSEParser()
    got = [(e.event, e.data, e.id) for e in feed_all(p, raw, cuts)]
    want, last_id = [], None
    for name, data_lines, ident in events:
        last_id = ident if ident is not None else last_id  # the last event ID persists, per the spec
        want.append((name or "message", "\n".join(data_lines), last_id))
    assert p.error is None and got == want
    assert p.comments == (len(events) if comments else 0)
