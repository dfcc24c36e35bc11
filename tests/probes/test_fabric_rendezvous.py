"""The authenticated rendezvous in-process: real sockets on loopback, no torch."""
import json
import socket
import threading
import time

import pytest

from fleetcanary.probes.base import ProbeError, ProbeSkipped
from fleetcanary.probes.fabric import rendezvous
from tests.support.helpers import free_port, wait_for

SECRET = b"s3cret-fleet-key-0123456789abcdef"


def start_host(port, until_s=20.0, hello_timeout=10.0, slot=7, expected=("127.0.0.1",), secret=SECRET):
    box = {}

    def run():
        try:
            box["session"] = rendezvous.host("127.0.0.1", port, set(expected), slot, "a", "b", secret,
                                             time.monotonic() + until_s, hello_timeout)
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


def closed(sock) -> bool:
    """The peer closed the connection without a word (EOF, or a reset when our data was unread)."""
    sock.settimeout(10)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


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


def test_a_wrong_secret_is_rejected_and_both_sides_see_no_partner():
    port = free_port()
    t, box = start_host(port, until_s=3.0)
    with pytest.raises(ProbeSkipped) as ei:
        guest(port, secret=b"another-secret-0123456789abcdef!", until_s=2.0)
    assert ei.value.reason == "peer_unavailable"
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
        c.recv(1024)
        c.sendall(json.dumps({"v": 1, "slot": 7, "nonce": "f" * 32, "mac": "0" * 64}).encode() + b"\n")
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
    forged = socket.create_connection(("127.0.0.1", port))
    forged.sendall(json.dumps({"v": 1, "slot": 7, "host": "a", "guest": "b", "nonce": "a" * 32,
                               "mac": rendezvous.mac(b"guessed-secret-000000", "hello", 7, "a", "b", "a" * 32)}).encode()
                   + b"\n")
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
    t, box = start_host(port, until_s=3.0, slot=8)
    with pytest.raises(ProbeSkipped):
        guest(port, slot=7, until_s=2.0)
    t.join(10)
    assert box["error"].reason == "peer_unavailable"


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
