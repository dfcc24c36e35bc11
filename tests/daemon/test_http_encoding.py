"""Accept-Encoding, parsed by its grammar (RFC 9110 12.5.3): q-values, `*`, identity;q=0. The header comes from
any client, so the parser has a property test against a model of the rules."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetcanary.daemon.http import accept_encoding_q, wants_gzip

CASES = [
    (None, False), ("", False),
    ("gzip", True), ("GZip", True), ("x-gzip", True), ("gzip, deflate, br", True),
    ("gzip;q=0", False), ("gzip; q=0.000", False), ("gzip;Q=0.0", False),   # the attack: a refused gzip got gzip
    ("gzip;q=0, identity", False), ("deflate, br", False), ("br;q=1, gzip;q=0", False),
    ("*", True), ("*;q=0", False), ("*;q=0, gzip", True), ("gzip;q=0, *", False),
    ("identity;q=0", False), ("gzip, identity;q=0", True), ("gzip;q=0.5", False), ("gzip;q=0.5, identity;q=0.4", True),
    ("gzip;q=1.5", False), ("gzip;q=abc", False), ("gzip;q=", False), ("gzip;q=0.0001", False),  # malformed: absent
    ("identity, gzip;q=0.001", False), ("notgzip", False), ("gzipx", False), (" , ,gzip ,", True),
]


@pytest.mark.parametrize("header,gz", CASES)
def test_wants_gzip(header, gz):
    assert wants_gzip(header) is gz


CODINGS = ["gzip", "x-gzip", "identity", "*", "br", "deflate", "zstd", "compress"]
QVALUES = st.one_of(
    st.none(),
    st.sampled_from(["0", "1", "0.", "1.", "1.0", "1.000", "0.5", "0.001", "0.999", "0.000"]),
    st.builds(lambda d: "0." + d, st.text("0123456789", min_size=1, max_size=3)),
    st.text("0123456789.qQ=-xe ", max_size=6),  # mostly malformed
)
SPACE = st.sampled_from(["", " ", "  ", "\t"])


def model_q(value: str | None) -> float | None:
    """The grammar's qvalue by hand: 0[.ddd] or 1[.000]; None when malformed."""
    if value is None:
        return 1.0
    v = value.strip()
    if v in ("0", "1", "0.") or (v[:2] == "0." and len(v) <= 5 and v[2:].isdigit()):
        return float(v + ("0" if v.endswith(".") else ""))
    if v[:2] == "1." and len(v) <= 5 and set(v[2:]) <= {"0"}:
        return 1.0
    return None


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(CODINGS), st.booleans(), QVALUES, SPACE, SPACE), max_size=6))
def test_wants_gzip_agrees_with_a_model_of_the_rules(elements):
    parts, q = [], {}
    for coding, upper, qvalue, s1, s2 in elements:
        name = coding.upper() if upper else coding
        parts.append(f"{s1}{name}{s2}" + ("" if qvalue is None else f";{s2}q={qvalue}"))
        mq = model_q(qvalue)
        if mq is not None:  # an element with a malformed q-value counts as absent; a later one wins
            q[coding] = mq
    header = ",".join(parts)
    star = q.get("*")
    gz = q.get("gzip", q.get("x-gzip", star if star is not None else 0.0))
    ident = q.get("identity", star if star is not None else 1.0)
    assert accept_encoding_q(header) == q
    assert wants_gzip(header) is (bool(header) and gz > 0 and gz >= ident)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_header_text_is_an_answer_never_an_exception(text):
    assert wants_gzip(text) in (True, False)
    assert all(0.0 <= v <= 1.0 for v in accept_encoding_q(text).values())
