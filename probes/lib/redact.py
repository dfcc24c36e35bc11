"""Secrets in URLs never leave a run: ``redact_url`` hides the userinfo of every URL and the value of every
secret-looking query parameter in a URL or in any text that carries URLs (an error message, a traceback, a
log line). Every place that records a URL (a result's config and parameters, error details, the output tail,
logs) passes it through here, so /results, results.jsonl and the logs never show a key.

    http://user:PASS@host/v1?api_key=K&x=1  ->  http://<redacted>@host/v1?api_key=<redacted>&x=1
"""
from __future__ import annotations

import re

REDACTED = "<redacted>"

# Query parameter names whose values are credentials (case-insensitive), and name endings that mark one
# (client_secret, private_token, x-api-key, X-Amz-Credential, sp_sig ...).
SECRET_PARAMS = frozenset({
    "key", "api_key", "apikey", "api-key", "token", "access_token", "refresh_token", "id_token", "auth",
    "authorization", "sig", "signature", "x-amz-signature", "x-amz-credential", "x-amz-security-token",
    "x-goog-signature", "x-goog-credential", "password", "passwd", "pwd", "pass", "secret", "client_secret",
    "credential", "credentials", "session", "sessionid", "code", "sas", "se_token",
})
SECRET_ENDINGS = ("key", "token", "secret", "password", "passwd", "signature", "credential", "sig")

# scheme://userinfo@ : the userinfo ends at the last @ before the path, query or fragment (a raw @ in a
# password included)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#\s'\"<>]*@")
# ?name=value, &name=value, ;name=value (in a URL or a logged query string)
_PARAM = re.compile(r"([?&;])([^=&#?;\s'\"<>]{1,128})=([^&#;\s'\"<>]*)")


def _secret_name(name: str) -> bool:
    n = name.lower()
    return n in SECRET_PARAMS or n.endswith(SECRET_ENDINGS)


def _param(m: re.Match) -> str:
    sep, name, value = m.group(1), m.group(2), m.group(3)
    if not value or value == REDACTED or not _secret_name(name):
        return m.group(0)
    return f"{sep}{name}={REDACTED}"


def redact_url(text: str) -> str:
    """``text`` (a URL, or any text with URLs in it) with URL userinfo and secret query values replaced by
    <redacted>. Text without either comes back unchanged."""
    if not isinstance(text, str) or ("@" not in text and "=" not in text):
        return text
    text = _USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    return _PARAM.sub(_param, text)
