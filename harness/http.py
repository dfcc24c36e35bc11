"""A plain HTTP GET for tests, benchmarks and the harness's servers: the status is returned, not raised."""
from __future__ import annotations

import urllib.error
import urllib.request


def http_get(url: str, timeout: float = 10.0, headers: dict | None = None,
             context=None) -> tuple[int, dict, bytes]:
    """(status, headers, body) of a GET; an HTTP error status is returned, not raised. ``context``: an
    ssl.SSLContext for https."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
