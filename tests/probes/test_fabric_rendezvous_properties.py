"""Property tests of the rendezvous' message parsers (fleetcanary.probes.fabric.rendezvous): any bytes are
a parsed message or nothing, never an exception; a hello is accepted only for its slot, pair, secret and
the host's nonce of its connection; and, over real sockets, whatever bytes a client sends the host, it is
a counted bad_handshake and the real guest still pairs."""
from __future__ import annotations

import json
import socket

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetcanary.probes.fabric import rendezvous
from tests.probes.test_fabric_rendezvous import SECRET, closed, guest, start_host
from tests.support.helpers import free_port

NH, NG = "ab" * 16, "cd" * 16
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=70),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)


def hello(**kw) -> bytes:
    body = {"v": 2, "slot": 7, "host": "a", "guest": "b", "nonce": NG,
            "mac": rendezvous.mac(SECRET, "hello", 7, "a", "b", NH, NG), **kw}
    return json.dumps(body).encode()


def parsers_hold(line: bytes) -> None:
    m = rendezvous.parse_message(line)
    assert m is None or isinstance(m, dict)
    ng = rendezvous.check_hello(line, 7, "a", "b", SECRET, NH)
    assert ng is None or (isinstance(ng, str) and rendezvous.parse_message(line)["nonce"] == ng)
    nh = rendezvous.parse_challenge(line)
    assert nh is None or isinstance(nh, str)
    assert rendezvous.check_welcome(line, 7, "a", "b", SECRET, NG, NH) in (True, False)


@SETTINGS
@given(st.binary(max_size=1100))
def test_any_bytes_parse_or_are_refused_never_raise(line):
    parsers_hold(line)
    # bytes drawn at random never carry a MAC under the secret: never an authenticated hello or welcome
    assert rendezvous.check_hello(line, 7, "a", "b", SECRET, NH) is None
    assert rendezvous.check_welcome(line, 7, "a", "b", SECRET, NG, NH) is False


@SETTINGS
@given(st.dictionaries(st.sampled_from(["v", "slot", "host", "guest", "nonce", "mac", "kind"]), json_values,
                       min_size=1, max_size=3))
def test_a_hello_with_any_field_replaced_is_refused_unless_unchanged(replaced):
    try:
        line = hello(**replaced)
    except ValueError:
        return
    parsers_hold(line)
    got = rendezvous.check_hello(line, 7, "a", "b", SECRET, NH)
    same = all(json.loads(line).get(k) == json.loads(hello()).get(k) for k in ("v", "slot", "host", "guest", "nonce",
                                                                                 "mac"))
    fits = len(line) <= rendezvous.MAX_LINE           # a longer line is refused whatever it says
    assert got == (NG if same and fits and type(json.loads(line)["slot"]) is int
                   and type(json.loads(line)["v"]) is int else None)


@SETTINGS
@given(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=255))
def test_a_hello_with_any_byte_changed_is_refused_or_means_the_same(pos, byte):
    good = hello()
    line = bytearray(good)
    line[pos % len(line)] = byte
    got = rendezvous.check_hello(bytes(line), 7, "a", "b", SECRET, NH)
    assert got is None or rendezvous.parse_message(bytes(line)) == json.loads(good)


def test_a_hello_is_bound_to_its_connections_nonce():
    assert rendezvous.check_hello(hello(), 7, "a", "b", SECRET, NH) == NG
    assert rendezvous.check_hello(hello(), 7, "a", "b", SECRET, "ef" * 16) is None   # another connection
    assert rendezvous.check_hello(hello(), 8, "a", "b", SECRET, NH) is None          # another slot
    assert rendezvous.check_hello(hello(), 7, "a", "b", b"x" * 32, NH) is None       # another secret


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(min_size=1, max_size=1100), min_size=1, max_size=3))
def test_any_bytes_on_the_wire_are_counted_and_the_pair_meets(payloads):
    port = free_port()
    t, box = start_host(port)
    for payload in payloads:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(payload)
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:   # the host already closed it: it spoke before the host's challenge
            pass
        assert closed(s)
        s.close()
    g = guest(port)
    t.join(10)
    h = box["session"]
    assert g.key == h.key and h.rejected["bad_handshake"] == len(payloads)
    g.close(), h.close()
