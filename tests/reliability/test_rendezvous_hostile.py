"""A hostile fabric rendezvous (issue 37): real sockets on 127.0.0.1, the host and the guest of
fleetcanary.probes.fabric.rendezvous. Whatever an unauthenticated client sends from the partner's own
address, the host counts it (bad_handshake) and goes on listening, and the real guest still pairs: a hello
replayed on another connection gets no welcome, and 16 silent connections do not keep the guest out."""
from __future__ import annotations

import json
import selectors
import socket
import threading
import time

import pytest

from fleetcanary.probes.base import ProbeError, ProbeSkipped
from fleetcanary.probes.fabric import rendezvous
from tests.probes.test_fabric_rendezvous import SECRET, Window, closed, guest, received, start_host
from tests.support.helpers import free_port

NONCE = "c" * 32


def hello_v1(mac: str) -> bytes:
    """A correct-looking hello of the first protocol (no host nonce), with the given MAC."""
    return json.dumps({"v": 1, "slot": 7, "host": "a", "guest": "b", "nonce": NONCE, "mac": mac},
                      ensure_ascii=False).encode() + b"\n"


def hello_v2(mac: str) -> bytes:
    return json.dumps({"v": 2, "slot": 7, "host": "a", "guest": "b", "nonce": NONCE, "mac": mac},
                      ensure_ascii=False).encode() + b"\n"


def fields(**kw) -> bytes:
    body = {"v": 2, "slot": 7, "host": "a", "guest": "b", "nonce": NONCE, "mac": "0" * 64, **kw}
    return json.dumps(body).encode() + b"\n"


# Each: what an unauthenticated client sends on one connection (without waiting for the host's challenge).
HOSTILE = {
    "a correct-looking hello with a non-ASCII mac": hello_v1("é" * 64),
    "a current hello with a non-ASCII mac": hello_v2("é" * 64),
    "a 1,001-byte line of brackets": b"[" * 1000 + b"\n",
    "a line of braces": b'{"a":' * 200 + b"\n",
    "a line past MAX_LINE without a newline": b"x" * 2000,
    "a line past MAX_LINE with a newline at its end": b"x" * 1500 + b"\n",
    "bytes that are not UTF-8": b"\xff\xfe\x00\x80garbage\n",
    "UTF-8 that is not ASCII": "{\"v\": 2, \"nonce\": \"ñññññññññññññññññññ\"}\n".encode(),
    "a JSON array": b"[1, 2, 3]\n",
    "JSON null": b"null\n",
    "a JSON string": b'"hello"\n',
    "NaN": b"NaN\n",
    "an empty line": b"\n",
    "a slot that is a string": fields(slot="7"),
    "a slot that is true": fields(slot=True, v=2),
    "a version that is true": fields(v=True),
    "a nonce that is a number": fields(nonce=12345678901234567890),
    "a nonce that is not hex": fields(nonce="z" * 32),
    "a nonce that is a list": fields(nonce=[NONCE]),
    "a mac that is a number": fields(mac=0),
    "a mac that is a dict": fields(mac={"a": 1}),
    "a host that is a list": fields(host=["a"]),
    "a mac of the right shape and the wrong value": fields(mac="f" * 64),
    "a hello of the first protocol, correctly signed": hello_v1(rendezvous.mac(SECRET, "hello", 7, "a", "b", NONCE)),
}


def send_and_check(port: int, payload: bytes) -> None:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(payload)
        if not payload.endswith(b"\n"):
            try:
                s.shutdown(socket.SHUT_WR)   # a client that gives up mid-line
            except OSError:                  # the host already closed it (it spoke before the challenge)
                pass
        assert closed(s)                     # no welcome, the connection closed
    finally:
        s.close()


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_bad_hello_is_counted_and_the_real_pair_still_meets(case):
    port = free_port()
    t, box = start_host(port)
    send_and_check(port, HOSTILE[case])
    s = guest(port)
    t.join(10)
    assert "session" in box, box                            # the host did not fail: it went on listening
    h = box["session"]
    assert s.key == h.key
    assert h.rejected["bad_handshake"] == 1, h.rejected
    s.close(), h.close()


def test_every_bad_hello_at_once_is_counted_and_the_pair_meets():
    port = free_port()
    t, box = start_host(port)
    for payload in HOSTILE.values():
        send_and_check(port, payload)
    s = guest(port)
    t.join(10)
    h = box["session"]
    assert s.key == h.key and h.rejected["bad_handshake"] == len(HOSTILE)
    s.close(), h.close()


def capture_hello(secret=SECRET) -> bytes:
    """The hello a real guest of slot 7 sends, recorded by a listener that is not the host (as a
    bystander on the path would record it): the bytes a replay sends."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    box = {}

    def listen():
        c, _ = srv.accept()
        c.sendall(json.dumps({"v": 2, "slot": 7, "nonce": "ab" * 16}).encode() + b"\n")
        c.settimeout(10)
        buf = b""
        while b"\n" not in buf:
            chunk = c.recv(4096)
            if not chunk:
                break
            buf += chunk
        box["hello"] = buf.split(b"\n", 1)[0] + b"\n"
        c.close()
    t = threading.Thread(target=listen, daemon=True)
    t.start()
    with pytest.raises((ProbeError, ProbeSkipped)):
        guest(srv.getsockname()[1], secret=secret, until_s=3.0)
    t.join(10)
    srv.close()
    return box["hello"]


def test_a_replayed_hello_gets_nothing_and_the_real_guest_pairs():
    recorded = capture_hello()
    assert b'"mac"' in recorded
    port = free_port()
    t, box = start_host(port)
    replay = socket.create_connection(("127.0.0.1", port), timeout=10)
    replay.sendall(recorded)
    assert closed(replay)                                    # no welcome: the hello was not for this connection
    replay.close()
    s = guest(port)
    t.join(10)
    h = box["session"]
    assert s.key == h.key                                    # the host's only pairing went to the real guest
    assert h.rejected["bad_handshake"] == 1 and h.rejected["after_pairing"] == 0
    s.close(), h.close()


def test_a_hello_answering_another_connections_challenge_is_refused():
    """A client that reads the challenge of its own connection and sends a hello signed for another
    connection's challenge (the only kind a thief without the secret could have)."""
    port = free_port()
    window = Window(port)
    t, box = start_host(port, until_s=600.0, clock=window)
    first = socket.create_connection(("127.0.0.1", port), timeout=10)
    other_nh = _challenge(first)
    second = socket.create_connection(("127.0.0.1", port), timeout=10)
    _challenge(second)
    second.sendall(json.dumps({"v": 2, "slot": 7, "host": "a", "guest": "b", "nonce": NONCE,
                               "mac": rendezvous.mac(SECRET, "hello", 7, "a", "b", other_nh, NONCE)}).encode()
                   + b"\n")
    assert closed(second)
    window.close()
    t.join(10)
    assert isinstance(box["error"], ProbeSkipped) and "bad_handshake" in box["error"].detail
    first.close(), second.close()


def _challenge(s: socket.socket) -> str:
    buf = b""
    s.settimeout(10)
    while b"\n" not in buf:
        chunk = s.recv(1)
        assert chunk
        buf += chunk
    return json.loads(buf)["nonce"]


def _drain_first_lines(socks, within: float) -> int:
    """Read what the host sends first on each connection (its challenge), for at most ``within`` seconds
    in all; how many sent one. With the host's challenge (every current host) this returns at once."""
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    got, deadline = 0, time.monotonic() + within
    while got < len(socks) and time.monotonic() < deadline:
        for key, _ in sel.select(deadline - time.monotonic()):
            if key.fileobj.recv(4096):
                got += 1
            sel.unregister(key.fileobj)
    sel.close()
    return got


def test_16_silent_connections_from_the_partners_address_do_not_keep_the_guest_out():
    port = free_port()
    t, box = start_host(port, hello_timeout=60.0)            # a silent one would be held for a minute
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(rendezvous.MAX_PENDING)]
    _drain_first_lines(silent, within=3.0)                   # each accepted and waiting (its challenge came)
    s = guest(port, until_s=10.0)                            # pairs well within its window
    t.join(10)
    h = box["session"]
    assert s.key == h.key
    assert h.rejected["silent"] >= 1                         # the oldest silent one made room
    for c in silent:
        c.close()
    s.close(), h.close()


def test_a_guest_of_the_first_protocol_is_closed_unanswered_so_it_skips_instead_of_failing():
    """A rolling upgrade meets old guests: the first protocol's guest sends its hello at once and reads the
    next line as the welcome. The host answers nothing to a connection that spoke before its challenge, so the
    old guest sees the connection closed (it retries, then skips peer_unavailable) and never reads a
    challenge as a welcome without a MAC (a rendezvous_failed failure on every mixed pair)."""
    port = free_port()
    t, box = start_host(port)
    old = socket.create_connection(("127.0.0.1", port), timeout=10)
    old.sendall(hello_v1(rendezvous.mac(SECRET, "hello", 7, "a", "b", NONCE)))
    got = received(old)
    old.close()
    assert got == b"", got                                   # not even a challenge
    s = guest(port)
    t.join(10)
    h = box["session"]
    assert s.key == h.key and h.rejected["bad_handshake"] == 1
    s.close(), h.close()
