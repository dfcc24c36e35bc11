"""TLS and basic auth from a web-config file in the Prometheus exporter-toolkit format.

    tls_server_config:
      cert_file: /etc/fleetcanary/tls.crt
      key_file: /etc/fleetcanary/tls.key
      min_version: TLS12                 # TLS12 (default) or TLS13; older is refused
      client_auth_type: RequireAndVerifyClientCert   # optional mTLS
      client_ca_file: /etc/fleetcanary/ca.crt
    basic_auth_users:
      prometheus: $2y$10$...              # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':')
    http_server_config:
      headers: {X-Frame-Options: deny}

Passwords are checked against bcrypt hashes; a successful check is cached (keyed by a
hash of user and password) so a scrape does not pay bcrypt's cost every time; an
unknown user is checked against a dummy hash made at load at the highest cost configured, so an unknown
user costs what a known one does and timing does not reveal user names.
Settings of exporter-toolkit this server cannot honour (Go cipher-suite names, curve
preferences) are refused rather than silently ignored.
"""
from __future__ import annotations

import base64
import hashlib
import os
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fleetcanary.core.textfile import TextFileError, read_text
from fleetcanary.probes.lib import yamltext

TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_OPTIONAL,
               "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL, "RequireAnyClientCert": ssl.CERT_REQUIRED,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
            "prefer_server_cipher_suites"}
UNSUPPORTED_TLS_KEYS = {"cipher_suites", "curve_preferences", "client_allowed_sans", "cert", "key"}
# A valid bcrypt hash of a random string, for a WebConfig built without load(); load() makes its own at the
# configured cost (dummy_hash).
_DUMMY_HASH = b"$2b$10$Ehoga5O/c4m4aMrUy0Hxz..8KygqJzHl2sbEflLNaOIuoCCvvBRCq"


def bcrypt_cost(hashed: bytes) -> int:
    """The cost (log2 rounds) of a bcrypt hash $2b$NN$...."""
    return int(hashed[4:6])


def dummy_hash(users: dict[str, bytes]) -> bytes:
    """A bcrypt hash of random bytes at the highest cost among ``users``' hashes: checking an unknown user
    against it costs what checking the most expensive configured user does."""
    import bcrypt

    cost = max((bcrypt_cost(h) for h in users.values()), default=10)
    return bcrypt.hashpw(base64.b64encode(os.urandom(18)), bcrypt.gensalt(rounds=cost))


class WebConfigError(Exception):
    """A problem with the web-config file; the message is one line and never holds a secret."""


@dataclass
class WebConfig:
    source: str = ""
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    dummy_hash: bytes = _DUMMY_HASH  # unknown users are checked against it (load(): at the configured cost)
    _cache: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check_authorization(self, header: str | None) -> bool:
        """True if basic auth is off, or the Authorization header names a user with the right password."""
        if not self.users:
            return True
        if not header or header[:6].lower() != "basic ":
            return False
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        if not sep:
            return False
        key = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return True
        import bcrypt

        hashed = self.users.get(user)
        try:
            ok = bcrypt.checkpw(password.encode(), hashed if hashed is not None else self.dummy_hash)
        except ValueError:
            ok = False
        ok = ok and hashed is not None
        if ok:
            with self._lock:
                self._cache[key] = True
                while len(self._cache) > 256:
                    self._cache.popitem(last=False)
        return ok


def _file(cfg: dict, key: str, source: str) -> str:
    v = cfg.get(key)
    if not isinstance(v, str) or not v:
        raise WebConfigError(f"{source}: tls_server_config.{key}: required")
    p = Path(v) if Path(v).is_absolute() else Path(source).parent / v
    if not p.is_file():
        raise WebConfigError(f"{source}: tls_server_config.{key}: {p}: no such file")
    return str(p)


def _context(cfg: dict, source: str) -> ssl.SSLContext:
    if not isinstance(cfg, dict):
        raise WebConfigError(f"{source}: tls_server_config: expected a mapping")
    bad = set(cfg) & UNSUPPORTED_TLS_KEYS
    if bad:
        raise WebConfigError(f"{source}: tls_server_config: {', '.join(sorted(bad))} not supported by fleetcanary "
                             "(OpenSSL chooses TLS 1.2 ciphers and curves; TLS 1.3 suites are fixed)")
    unknown = set(cfg) - TLS_KEYS - UNSUPPORTED_TLS_KEYS
    if unknown:
        raise WebConfigError(f"{source}: tls_server_config: unknown key {', '.join(sorted(unknown))}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    lo = cfg.get("min_version", "TLS12")
    if lo in ("TLS10", "TLS11"):
        raise WebConfigError(f"{source}: tls_server_config.min_version: {lo} is below TLS 1.2, "
                             "which fleetcanary refuses")
    if lo not in TLS_VERSIONS:
        raise WebConfigError(f"{source}: tls_server_config.min_version: {lo!r}; use TLS12 or TLS13")
    ctx.minimum_version = TLS_VERSIONS[lo]
    hi = cfg.get("max_version")
    if hi is not None:
        if hi not in TLS_VERSIONS:
            raise WebConfigError(f"{source}: tls_server_config.max_version: {hi!r}; use TLS12 or TLS13")
        ctx.maximum_version = TLS_VERSIONS[hi]
        if ctx.maximum_version < ctx.minimum_version:
            raise WebConfigError(f"{source}: tls_server_config: max_version is below min_version")
    cert, key = _file(cfg, "cert_file", source), _file(cfg, "key_file", source)
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise WebConfigError(f"{source}: tls_server_config: cannot load cert_file/key_file ({exc.reason or exc})") \
            from None
    auth = cfg.get("client_auth_type", "NoClientCert")
    if auth not in CLIENT_AUTH:
        raise WebConfigError(f"{source}: tls_server_config.client_auth_type: {auth!r}; one of {', '.join(CLIENT_AUTH)}")
    ctx.verify_mode = CLIENT_AUTH[auth]
    if auth in ("RequireAndVerifyClientCert", "VerifyClientCertIfGiven") or cfg.get("client_ca_file"):
        ca = _file(cfg, "client_ca_file", source)
        try:
            ctx.load_verify_locations(ca)
        except ssl.SSLError as exc:
            raise WebConfigError(f"{source}: tls_server_config.client_ca_file: {exc.reason or exc}") from None
    ctx.options |= ssl.OP_NO_COMPRESSION
    return ctx


def load(path: str | None) -> WebConfig:
    if not path:
        return WebConfig()
    try:
        data = yamltext.load(read_text(path))
    except TextFileError as exc:
        raise WebConfigError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
    data = data or {}
    if not isinstance(data, dict):
        raise WebConfigError(f"{path}: expected a mapping")
    unknown = set(data) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise WebConfigError(f"{path}: unknown key {', '.join(sorted(unknown))}")
    wc = WebConfig(source=str(path))
    if data.get("tls_server_config") is not None:
        wc.ssl_context = _context(data["tls_server_config"], str(path))
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise WebConfigError(f"{path}: basic_auth_users: expected user: bcrypt-hash pairs")
    for user, hashed in users.items():
        h = str(hashed or "")
        if not (h.startswith(("$2a$", "$2b$", "$2y$")) and len(h) == 60 and h[4:6].isdigit() and h[6] == "$"
                and 4 <= int(h[4:6]) <= 31):
            # never echo the value: it might be a plain-text password by mistake
            raise WebConfigError(f"{path}: basic_auth_users.{user}: not a bcrypt hash (use htpasswd -nBC 10)")
        wc.users[str(user)] = h.replace("$2y$", "$2b$", 1).encode()
    if wc.users:
        wc.dummy_hash = dummy_hash(wc.users)
    http_cfg = data.get("http_server_config") or {}
    if not isinstance(http_cfg, dict) or set(http_cfg) - {"headers", "http2"}:
        raise WebConfigError(f"{path}: http_server_config: supported keys are headers and http2")
    headers = http_cfg.get("headers") or {}
    if not isinstance(headers, dict) or any("\n" in f"{k}{v}" or "\r" in f"{k}{v}" for k, v in headers.items()):
        raise WebConfigError(f"{path}: http_server_config.headers: expected single-line name: value pairs")
    wc.headers = {str(k): str(v) for k, v in headers.items()}
    return wc
