"""The authenticated rendezvous of a pair: who may join, before any torch store opens.

The host (the lower-ordered name) listens on its member address and port from when its
run is ready until the meeting deadline; the guest connects from its own member address.
Both prove they hold the fleet secret and mean this slot, this pair and this connection:

  host  -> guest  {"v": 2, "slot", "nonce": Nh}                 on every accepted connection, a fresh Nh, sent
                                                                 after CHALLENGE_AFTER_SECONDS of quiet
  guest -> host   {"v": 2, "slot", "host", "guest", "nonce": Ng, "mac": HMAC(K, hello|slot|host|guest|Nh|Ng)}
  host  -> guest  {"v": 2, "slot", "nonce": Nh, "mac": HMAC(K, welcome|slot|host|guest|Ng|Nh)}

The hello's MAC covers the host's nonce of that connection, so a hello recorded on the wire and
replayed (on another connection, within its slot) fails authentication like garbage: it cannot take
the host's only pairing. Version 1 (a hello without the host's nonce) is refused: a version-1 guest speaks
first, so the host, which waits a quarter second before its challenge, closes such a connection without a
word; the old guest retries and skips (peer_unavailable) rather than failing on every mixed pair of a
rolling upgrade. A version-2 guest meeting a version-1 host waits for a challenge that never comes: a skip.

Each message is one JSON line of at most MAX_LINE ASCII bytes. Later messages on the same
connection (the store's port) carry a MAC under the session key HMAC(K, session|...|Ng|Nh),
so they are bound to this meeting. The torch store itself lies behind a prefix derived from
the session key: a stray client that finds its port can read or write none of the pair's keys.

Unexpected clients cannot join or stall: connections from other addresses are closed at
accept, every connection is read without blocking (a selector), one that sends nothing is
dropped after ``handshake_timeout``, and when MAX_PENDING connections are waiting the oldest is
dropped (counted silent) to make room, so strays from the partner's own address cannot keep the
partner out. Whatever bytes arrive (not ASCII, an over-long line, deep brackets, JSON of the wrong
types, a wrong MAC) are parsed by functions that never raise: the connection is counted as
bad_handshake and closed at once, and the host goes on listening until the first authenticated
hello or the meeting deadline, whatever strays do. The secret never leaves this module: errors and
counts name what was wrong, never a MAC or the key.

The hand-rolled handshake is small on purpose: TLS-PSK needs OpenSSL builds and Python
3.13+, and a PAKE or TLS with certificates would need a CA per fleet; an HMAC over fresh
nonces from both sides is enough for mutual proof of the secret without sending it.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import selectors
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

from fleetcanary.probes.base import ProbeError, ProbeSkipped
from fleetcanary.probes.fabric.spec import MIN_SECRET_BYTES, PROTOCOL, SECRET_ENV

MAX_LINE = 1024
MAX_PENDING = 16
# A version-1 guest (before this release) speaks first: its hello arrives at once after the connection. The
# host sends its challenge only after this quiet, so a rolling upgrade's old guest that spoke first is closed
# without a word (it retries, then skips peer_unavailable) instead of reading the challenge as a bad welcome
# and failing rendezvous_failed on every mixed pair until the rollout ends.
CHALLENGE_AFTER_SECONDS = 0.25
CONNECT_RETRY_SECONDS = 0.2


def load_secret(secret_file: str, environ=os.environ) -> bytes:
    """The fleet secret: not set -> skip not_configured; unreadable or too short -> a failure
    that names the file and the rule, never the content."""
    if secret_file:
        try:
            with open(secret_file, "rb") as f:
                value = f.read(4096).strip()
        except OSError as exc:
            raise ProbeError("secret_invalid", f"cannot read secret_file {secret_file}: {exc.strerror}") from None
        where = f"secret_file {secret_file}"
    else:
        raw = environ.get(SECRET_ENV, "")
        if not raw:
            raise ProbeSkipped("not_configured", f"no fabric secret: set secret_file or {SECRET_ENV}")
        value = raw.strip().encode()
        where = SECRET_ENV
    if len(value) < MIN_SECRET_BYTES:
        raise ProbeError("secret_invalid", f"the fabric secret in {where} is shorter than {MIN_SECRET_BYTES} bytes")
    return value


def mac(key: bytes, *parts) -> str:
    return hmac.new(key, "|".join((PROTOCOL,) + tuple(str(p) for p in parts)).encode(), hashlib.sha256).hexdigest()


VERSION = 2
_HEX = frozenset("0123456789abcdef")


def parse_message(line) -> dict | None:
    """One line as a JSON object, or None: not bytes, longer than MAX_LINE, not ASCII, not JSON, nested
    past the parser's limit, or not an object. Never raises."""
    if not isinstance(line, (bytes, bytearray)) or len(line) > MAX_LINE:
        return None
    try:
        m = json.loads(bytes(line).decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return m if isinstance(m, dict) else None


def _is_int(v, want: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v == want


def _nonce(v) -> str | None:
    return v if isinstance(v, str) and 16 <= len(v) <= 64 and set(v) <= _HEX else None


def _mac_ok(got, want: str) -> bool:
    """A MAC compared in constant time; anything but 64 lowercase hex characters is simply wrong."""
    return isinstance(got, str) and len(got) == 64 and set(got) <= _HEX and hmac.compare_digest(
        got.encode("ascii"), want.encode("ascii"))


def parse_challenge(line) -> str | None:
    """The host's nonce from its first line on a connection, or None. Never raises."""
    m = parse_message(line)
    return _nonce(m.get("nonce")) if m is not None and _is_int(m.get("v"), VERSION) else None


def check_hello(line, slot: int, host: str, guest: str, secret: bytes, nh: str) -> str | None:
    """The guest's nonce when the line is a hello for this slot, pair and connection (the host's nonce
    ``nh``) with a valid MAC; else None. Never raises."""
    m = parse_message(line)
    if m is None:
        return None
    ng = _nonce(m.get("nonce"))
    if ng is None or not (_is_int(m.get("v"), VERSION) and _is_int(m.get("slot"), slot)
                          and m.get("host") == host and m.get("guest") == guest):
        return None
    return ng if _mac_ok(m.get("mac"), mac(secret, "hello", slot, host, guest, nh, ng)) else None


def check_welcome(line, slot: int, host: str, guest: str, secret: bytes, ng: str, nh: str) -> bool:
    """Whether the line is the host's welcome for this slot, pair and both nonces. Never raises."""
    m = parse_message(line)
    return (m is not None and _is_int(m.get("v"), VERSION) and _is_int(m.get("slot"), slot)
            and m.get("nonce") == nh and _mac_ok(m.get("mac"), mac(secret, "welcome", slot, host, guest, ng, nh)))


@dataclass
class Session:
    sock: socket.socket
    slot: int
    host: str
    guest: str
    key: bytes                     # the session key; never recorded
    peer_ip: str
    handshake_seconds: float
    rejected: Counter = field(default_factory=Counter)

    @property
    def store_prefix(self) -> str:
        return "fc-fabric-" + mac(self.key, "store")[:32] + "/"

    def send(self, kind: str, **fields) -> None:
        body = {"kind": kind, **fields}
        body["mac"] = mac(self.key, kind, json.dumps(fields, sort_keys=True))
        self.sock.sendall(json.dumps(body).encode() + b"\n")

    def recv(self, kind: str, until: float) -> dict:
        """The next message, which must be ``kind`` with a valid MAC, by monotonic ``until``."""
        line = _read_line(self.sock, until)
        if line is None:
            raise TimeoutError(f"no {kind} message from the partner in time")
        body = parse_message(line)
        if body is None or body.get("kind") != kind or "mac" not in body:
            raise ProbeError("rendezvous_failed", f"the partner's {kind} message is malformed")
        got = body.pop("mac")
        fields = {k: v for k, v in body.items() if k != "kind"}
        if not _mac_ok(got, mac(self.key, kind, json.dumps(fields, sort_keys=True))):
            raise ProbeError("rendezvous_failed", f"the partner's {kind} message failed authentication")
        return fields

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _session_key(secret: bytes, slot: int, host: str, guest: str, ng: str, nh: str) -> bytes:
    return hmac.new(secret, f"{PROTOCOL}|session|{slot}|{host}|{guest}|{ng}|{nh}".encode(), hashlib.sha256).digest()


def _read_line(sock: socket.socket, until: float) -> bytes | None:
    buf = b""
    while b"\n" not in buf:
        left = until - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            chunk = sock.recv(MAX_LINE)
        except TimeoutError:
            return None
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
        if len(buf) > MAX_LINE:
            return None
    return buf.split(b"\n", 1)[0]


def _family(ip: str) -> int:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


# ------------------------------------------------------------------------------ host
def host(bind_ip: str, port: int, expected_ips: set[str], slot: int, me: str, partner: str, secret: bytes,
         until: float, hello_timeout: float, clock=time.monotonic) -> Session:
    """Listen until monotonic ``until`` for the partner's valid hello; the session, or
    ProbeSkipped("peer_unavailable") when none came (strays counted in the detail).

    ``clock``: the monotonic clock ``until`` and the hello timeouts are read on (tests end the window
    when they choose; the clock is read again whenever a connection or data arrives or a wait ends)."""
    t0 = clock()
    rejected: Counter = Counter()
    lsock = socket.socket(_family(bind_ip), socket.SOCK_STREAM)
    sel = selectors.DefaultSelector()
    pending: dict[socket.socket, _Pending] = {}   # oldest first
    won: Session | None = None
    try:
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            lsock.bind((bind_ip, port))
        except OSError as exc:
            raise ProbeError("rendezvous_failed", f"cannot listen on {bind_ip}:{port}: {exc.strerror}") from None
        lsock.listen(MAX_PENDING)
        lsock.setblocking(False)
        sel.register(lsock, selectors.EVENT_READ)
        while won is None:
            now = clock()
            for s in [s for s, p in pending.items() if p.deadline <= now]:
                rejected["silent"] += 1
                _drop(sel, pending, s)
            for s in [s for s, p in pending.items() if p.challenge_at is not None and p.challenge_at <= now]:
                _challenge(sel, pending, s, slot, rejected)
            if now >= until:
                break
            wake = min([until] + [p.deadline for p in pending.values()]
                       + [p.challenge_at for p in pending.values() if p.challenge_at is not None])
            for key, _ in sel.select(max(0.0, wake - now)):
                if key.fileobj is lsock:
                    _accept(lsock, sel, pending, expected_ips, rejected, hello_timeout, clock, slot)
                    continue
                s = key.fileobj
                if s not in pending:   # made room for a newer connection in this same round
                    continue
                try:
                    chunk = s.recv(MAX_LINE)
                except OSError:
                    chunk = b""
                if not chunk:   # closed by the client; a bare connect (a port check) is not counted
                    if pending[s].buffer:
                        rejected["bad_handshake"] += 1
                    _drop(sel, pending, s)
                    continue
                if pending[s].challenge_at is not None:
                    # it spoke before our challenge: a version-1 guest (or a stray); closed without a word, so
                    # an old guest of a rolling upgrade retries and skips instead of failing
                    rejected["bad_handshake"] += 1
                    _drop(sel, pending, s)
                    continue
                pending[s].buffer += chunk
                if b"\n" not in pending[s].buffer:
                    if len(pending[s].buffer) > MAX_LINE:
                        rejected["bad_handshake"] += 1
                        _drop(sel, pending, s)
                    continue
                line = pending[s].buffer.split(b"\n", 1)[0]
                nh = pending[s].nonce
                ng = check_hello(line, slot, me, partner, secret, nh)
                if ng is None:
                    rejected["bad_handshake"] += 1
                    _drop(sel, pending, s)
                    continue
                sel.unregister(s)
                peer_ip = pending.pop(s).ip
                s.setblocking(True)
                s.settimeout(max(0.1, until - clock()))
                try:
                    s.sendall(json.dumps({"v": VERSION, "slot": slot, "nonce": nh,
                                          "mac": mac(secret, "welcome", slot, me, partner, ng, nh)}).encode() + b"\n")
                except OSError:
                    rejected["bad_handshake"] += 1
                    s.close()
                    continue
                won = Session(s, slot, me, partner, _session_key(secret, slot, me, partner, ng, nh), peer_ip,
                              clock() - t0, rejected)
                break
    finally:
        for s in list(pending):
            _drop(sel, pending, s)
        if won is not None:
            _refuse_backlog(lsock, expected_ips, rejected)
        sel.close()
        lsock.close()
    if won is None:
        strays = f"; refused {sum(rejected.values())} other connection(s): {dict(rejected)}" if rejected else ""
        raise ProbeSkipped("peer_unavailable", f"{partner} did not join within the meeting window{strays}")
    return won


def _accept(lsock, sel, pending, expected_ips, rejected, hello_timeout, clock, slot: int) -> None:
    while True:
        try:
            s, addr = lsock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        ip = addr[0]
        ip = ip.removeprefix("::ffff:")
        if ip not in expected_ips:
            rejected["unexpected_address"] += 1
            s.close()
            continue
        if len(pending) >= MAX_PENDING:
            # The oldest waiting connection makes room (counted silent): strays from the partner's own
            # address cannot keep the partner's connection out until their hello timeout.
            rejected["silent"] += 1
            _drop(sel, pending, next(iter(pending)))
        try:
            s.setblocking(False)
        except OSError:
            s.close()
            continue
        now = clock()
        pending[s] = _Pending(now + hello_timeout, ip, secrets.token_hex(16), now + CHALLENGE_AFTER_SECONDS)
        sel.register(s, selectors.EVENT_READ)


@dataclass
class _Pending:
    """A connection the host waits on for its hello."""
    deadline: float             # the hello must have come by then (monotonic)
    ip: str
    nonce: str                  # the host's fresh nonce for this connection (its challenge)
    challenge_at: float | None  # when to send the challenge; None once sent
    buffer: bytes = b""


def _challenge(sel, pending, s, slot: int, rejected: Counter) -> None:
    """Send the connection's challenge (its fresh host nonce) once it stayed quiet for CHALLENGE_AFTER_SECONDS.
    Bytes already waiting (the host's loop came late) mean it spoke first: closed unanswered, as in the loop."""
    entry = pending[s]
    try:
        first = s.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        first = None
    except OSError:
        first = b""
    if first is not None:
        if first:
            rejected["bad_handshake"] += 1
        _drop(sel, pending, s)
        return
    try:
        s.send(json.dumps({"v": VERSION, "slot": slot, "nonce": entry.nonce}).encode() + b"\n")
    except OSError:   # gone already (or a full buffer on a fresh connection): nothing to wait for
        _drop(sel, pending, s)
        return
    entry.challenge_at = None


def _refuse_backlog(lsock, expected_ips, rejected) -> None:
    """Connections the kernel completed while the partner's hello was checked: counted before the
    listener closes (closing resets them unseen), from elsewhere as unexpected, the rest as late."""
    while True:
        try:
            s, addr = lsock.accept()
        except OSError:
            return
        ip = addr[0].removeprefix("::ffff:")
        rejected["unexpected_address" if ip not in expected_ips else "after_pairing"] += 1
        s.close()


def _drop(sel, pending, s) -> None:
    pending.pop(s, None)
    try:
        sel.unregister(s)
    except (KeyError, ValueError):
        pass
    s.close()


# ------------------------------------------------------------------------------ guest
def guest(host_addr: tuple[str, int], source_ip: str, slot: int, me: str, partner: str, secret: bytes,
          until: float, hello_timeout: float) -> Session:
    """Connect to the partner (retrying while refused) until monotonic ``until``; the session
    once the host proved the secret, else ProbeSkipped("peer_unavailable")."""
    t0 = time.monotonic()
    last = "no connection"
    while time.monotonic() < until:
        left = until - time.monotonic()
        try:
            s = socket.create_connection(host_addr, timeout=min(max(left, 0.05), 2.0), source_address=(source_ip, 0))
        except OSError as exc:
            last = f"connect: {exc.strerror or type(exc).__name__}"
            time.sleep(min(CONNECT_RETRY_SECONDS, max(0.0, until - time.monotonic())))
            continue
        try:
            s.settimeout(min(hello_timeout, max(0.05, until - time.monotonic())))
            challenge = _read_line(s, min(until, time.monotonic() + hello_timeout))
            nh = parse_challenge(challenge) if challenge is not None else None
            if nh is None:
                s.close()
                last = "the host sent no challenge (closed, busy, or not this protocol)"
                time.sleep(min(CONNECT_RETRY_SECONDS, max(0.0, until - time.monotonic())))
                continue
            ng = secrets.token_hex(16)
            s.sendall(json.dumps({"v": VERSION, "slot": slot, "host": partner, "guest": me, "nonce": ng,
                                  "mac": mac(secret, "hello", slot, partner, me, nh, ng)}).encode() + b"\n")
        except OSError as exc:
            s.close()
            last = f"send: {exc.strerror or type(exc).__name__}"
            continue
        line = _read_line(s, min(until, time.monotonic() + hello_timeout))
        if line is None:
            s.close()
            last = "the host closed the connection or did not answer"
            time.sleep(min(CONNECT_RETRY_SECONDS, max(0.0, until - time.monotonic())))
            continue
        if not check_welcome(line, slot, partner, me, secret, ng, nh):
            s.close()
            raise ProbeError("rendezvous_failed", f"the listener at {host_addr[0]}:{host_addr[1]} did not prove "
                             "the fleet secret (a different secret, or not the partner)")
        return Session(s, slot, partner, me, _session_key(secret, slot, partner, me, ng, nh), host_addr[0],
                       time.monotonic() - t0)
    raise ProbeSkipped("peer_unavailable", f"{partner} at {host_addr[0]}:{host_addr[1]} was not ready within the "
                       f"meeting window ({last})")
