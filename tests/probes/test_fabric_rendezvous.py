"""The authenticated rendezvous in-process: real sockets on loopback, no torch.

A host's meeting window is a time; where a test needs it to end, it ends it (``Window``: the host's
clock) once what the host had to see has happened, instead of waiting for a wall-clock window that a
slow machine could let pass before the hello arrived."""
import json
import socket
import threading
import time

import pytest

from fleetcanary.probes.base import ProbeError, ProbeSkipped
from fleetcanary.probes.fabric import rendezvous
from tests.support.helpers import free_port, wait_for

SECRET = b"s3cret-fleet-key-0123456789abcdef"


class Window:
    """A host's clock: the monotonic clock until ``close()``, then far past any window. The host reads
    its clock when a connection or data arrives; ``close()`` connects once (a bare connection, which the
    host does not count) so that it reads it at once."""

    def __init__(self, port: int) -> None:
        self.port, self.closed = port, False

    def __call__(self) -> float:
        return time.monotonic() + (1e9 if self.closed else 0.0)

    def close(self) -> None:
        self.closed = True
        socket.create_connection(("127.0.0.1", self.port), timeout=10).close()


def start_host(port, until_s=20.0, hello_timeout=10.0, slot=7, expected=("127.0.0.1",), secret=SECRET,
               clock=time.monotonic):
    box = {}

    def run():
        try:
            box["session"] = rendezvous.host("127.0.0.1", port, set(expected), slot, "a", "b", secret,
                                             clock() + until_s, hello_timeout, clock=clock)
        except (ProbeSkipped, ProbeError) as exc:
            box["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_for(lambda: _listening(port), timeout=10, what="the host to listen")
    return t, box


def _listening(port) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def received(sock) -> bytes:
    """All the host sent until it closed the connection (EOF, or a reset when our data was unread)."""
    sock.settimeout(10)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    return got


def closed(sock) -> bool:
    """The host closed the connection without a welcome: all it sent, if anything, was its challenge (a nonce,
    no MAC)."""
    return all("mac" not in json.loads(line) for line in received(sock).splitlines() if line)


def guest(port, secret=SECRET, slot=7, until_s=10.0):
    return rendezvous.guest(("127.0.0.1", port), "127.0.0.1", slot, "b", "a", secret, time.monotonic() + until_s, 5.0)


def test_both_sides_prove_the_secret_and_share_a_session():
    port = free_port()
    t, box = start_host(port)
    s = guest(port)
    t.join(10)
    h = box["session"]
    assert s.key == h.key and s.store_prefix == h.store_prefix
    h.send("store", port=1234)
    assert s.recv("store", time.monotonic() + 5) == {"port": 1234}
    s.close(), h.close()


def challenge(s) -> str:
    """The host's nonce, the first line it sends on a connection."""
    buf = b""
    s.settimeout(10)
    while b"\n" not in buf:
        chunk = s.recv(1)
        assert chunk, "the host closed the connection before its challenge"
        buf += chunk
    return json.loads(buf)["nonce"]


def hello(port, slot=7, secret=SECRET):
    """A guest's hello for the pair (a, b) on this connection (its challenge answered), sent by hand; the
    open connection."""
    s = socket.create_connection(("127.0.0.1", port))
    nh = challenge(s)
    s.sendall(json.dumps({"v": 2, "slot": slot, "host": "a", "guest": "b", "nonce": "c" * 32,
                          "mac": rendezvous.mac(secret, "hello", slot, "a", "b", nh, "c" * 32)}).encode() + b"\n")
    return s


def test_a_wrong_secret_is_rejected_and_both_sides_see_no_partner():
    port = free_port()
    window = Window(port)
    t, box = start_host(port, until_s=600.0, clock=window)
    # The guest's window is its own and short: whatever it saw of the host, it met no partner.
    with pytest.raises(ProbeSkipped) as ei:
        guest(port, secret=b"another-secret-0123456789abcdef!", until_s=0.5)
    assert ei.value.reason == "peer_unavailable"
    # The host closes a hello under another secret at once (once it counted it); then its window ends.
    wrong = hello(port, secret=b"another-secret-0123456789abcdef!")
    assert closed(wrong)
    window.close()
    t.join(10)
    err = box["error"]
    assert isinstance(err, ProbeSkipped) and err.reason == "peer_unavailable"
    assert "bad_handshake" in err.detail
    for text in (str(err), str(ei.value)):
        assert SECRET.decode() not in text and "another-secret" not in text


def test_a_listener_without_the_secret_is_not_trusted():
    """A rogue listener on the host's port answers with a welcome it cannot sign."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def rogue():
        c, _ = srv.accept()
        c.sendall(json.dumps({"v": 2, "slot": 7, "nonce": "f" * 32}).encode() + b"\n")
        c.recv(1024)
        c.sendall(json.dumps({"v": 2, "slot": 7, "nonce": "f" * 32, "mac": "0" * 64}).encode() + b"\n")
        c.close()
    threading.Thread(target=rogue, daemon=True).start()
    with pytest.raises(ProbeError) as ei:
        guest(port)
    assert ei.value.reason == "rendezvous_failed"
    srv.close()


def test_strays_neither_join_nor_stall_the_pair():
    port = free_port()
    t, box = start_host(port, hello_timeout=60.0)
    silent = socket.create_connection(("127.0.0.1", port))              # says nothing, stays open
    garbage = socket.create_connection(("127.0.0.1", port))
    garbage.sendall(b"\x00\xffGET / HTTP/1.0\r\n\r\n" * 100)
    forged = hello(port, secret=b"guessed-secret-000000")
    other = socket.socket()
    other.bind(("127.0.0.2", 0))                                          # not the partner's address
    other.connect(("127.0.0.1", port))
    assert closed(forged) and closed(garbage) and closed(other)          # closed, no welcome
    s = guest(port)
    t.join(10)
    h = box["session"]
    assert s.key == h.key
    # The silent stray was still pending when the partner joined: it did not hold the host up
    # until its 60 s hello timeout ran out (it was never counted as timed out).
    assert h.rejected["silent"] == 0
    assert h.rejected["bad_handshake"] == 2 and h.rejected["unexpected_address"] == 1
    assert closed(silent)   # dropped when the host stopped listening
    for c in (silent, garbage, forged, other):
        c.close()
    s.close(), h.close()


def test_a_hello_for_another_slot_is_refused():
    port = free_port()
    window = Window(port)
    t, box = start_host(port, until_s=600.0, slot=8, clock=window)
    with pytest.raises(ProbeSkipped):
        guest(port, slot=7, until_s=0.5)
    old = hello(port, slot=7)               # the right secret, the wrong slot: closed like garbage
    assert closed(old)
    window.close()
    t.join(10)
    assert box["error"].reason == "peer_unavailable" and "bad_handshake" in box["error"].detail


def test_the_secret_comes_from_a_file_or_the_environment(tmp_path):
    f = tmp_path / "secret"
    f.write_text("x" * 8)
    with pytest.raises(ProbeError) as ei:
        rendezvous.load_secret(str(f))
    assert ei.value.reason == "secret_invalid" and "x" * 8 not in str(ei.value)
    f.write_text(SECRET.decode() + "\n")
    assert rendezvous.load_secret(str(f)) == SECRET
    with pytest.raises(ProbeSkipped) as es:
        rendezvous.load_secret("", environ={})
    assert es.value.reason == "not_configured"
    assert rendezvous.load_secret("", environ={"FLEETCANARY_FABRIC_SECRET": SECRET.decode()}) == SECRET
    with pytest.raises(ProbeError) as em:
        rendezvous.load_secret(str(tmp_path / "missing"))
    assert em.value.reason == "secret_invalid"
