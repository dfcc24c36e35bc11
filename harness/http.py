"""A plain HTTP GET for tests, benchmarks and the harness's servers (the status is returned, not raised), and a
Prometheus-API instant query over it."""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
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


def instant_query(base_url: str, expr: str) -> list[dict]:
    """The result of a Prometheus-API instant query (Prometheus, VictoriaMetrics); an AssertionError that names
    the expression when the server does not answer success."""
    code, _, body = http_get(base_url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    data = json.loads(body)
    if code != 200 or data.get("status") != "success":
        raise AssertionError(f"query {expr!r} failed: {data}")
    return data["data"]["result"]
