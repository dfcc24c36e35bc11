"""POST /confirm on a real `fleetcanary run` process: off by default, behind basic auth, rate-limited, bad bodies
refused with one line and a count, and an accepted request runs the probe exactly once and says so at
GET /confirm/ID (daemon/requests.py)."""
from __future__ import annotations

import base64
import json
import urllib.request

import bcrypt
import pytest
import yaml

from fleetcanary.daemon import requests as requestsmod
from tests.support.helpers import metric_value, wait_for

PROBE = "host_memory_bandwidth"
# an hour between scheduled runs: only the first scheduled run and the requested one happen during a test;
# the per-probe limit is then the 300 s confirm_delay_seconds
HOST_BW = {"params": {"array_bytes": 8 << 20, "repeats": 3}, "interval_seconds": 3600, "timeout_seconds": 60}
USER, PASSWORD = "remediate", "s3cret-pw"


def auth(user: str = USER, password: str = PASSWORD) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def post(d, body: bytes, headers: dict | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(d.url + "/confirm", data=body, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture
def web_config(tmp_path):
    path = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    path.write_text(yaml.safe_dump({"basic_auth_users": {USER: hashed}}))
    return str(path)



def test_confirm_is_off_by_default(start_daemon):
    d = start_daemon({"probes": {PROBE: HOST_BW}})
    code, headers, _ = post(d, json.dumps({"probe": PROBE}).encode())
    assert code == 405 and headers["Allow"] == "GET, HEAD"
    assert d.get("/confirm/0123456789abcdef")[0] == 404
    assert metric_value(d.metrics(), "fleetcanary_confirm_requests_total") is None


def test_a_request_needs_credentials_is_rate_limited_and_runs_the_probe_once(start_daemon, web_config):
    d = start_daemon({"probes": {PROBE: HOST_BW}, "server": {"confirm_requests": True,
                                                             "web_config_file": web_config}})

    def metrics() -> str:
        code, _, body = d.get("/metrics", headers=auth())
        assert code == 200
        return body.decode()

    wait_for(lambda: metric_value(metrics(), "fleetcanary_probe_runs_total", probe=PROBE, outcome="success") == 1,
             timeout=60, what="the first scheduled run")
    body = json.dumps({"figure": "host_memory_bandwidth"}).encode()

    code, headers, _ = post(d, body)
    assert code == 401 and "Basic" in headers["WWW-Authenticate"]
    assert post(d, body, auth(password="wrong"))[0] == 401

    code, headers, raw = post(d, body, auth())
    assert code == 202, raw
    answer = json.loads(raw)
    assert answer["probe"] == PROBE and answer["state"] == "pending"
    assert answer["earliest_finish"] == pytest.approx(answer["requested_at"] + 60)
    assert headers["Location"] == f"/confirm/{answer['id']}"

    code, headers, raw = post(d, json.dumps({"probe": PROBE}).encode(), auth())
    assert code == 429 and int(headers["Retry-After"]) > 0 and b"one request per 300 s" in raw

    def done():
        code, _, raw = d.get(f"/confirm/{answer['id']}", headers=auth())
        assert code == 200
        status = json.loads(raw)
        return status if status["state"] == "done" else None
    status = wait_for(done, timeout=60, what="the requested run")
    run = status["run"]
    assert run["outcome"] == "success" and run["trigger"] == "requested"
    assert run["started_at"] >= answer["requested_at"]
    assert {f["series"] for f in run["figures"]} == {"copy", "triad"} and all(f["value"] > 0 for f in run["figures"])
    assert all(f["figure"] == "host_memory_bandwidth" for f in run["figures"])

    text = metrics()
    assert metric_value(text, "fleetcanary_probe_runs_total", probe=PROBE, outcome="success") == 2
    assert metric_value(text, "fleetcanary_confirm_requests_total", outcome="accepted") == 1
    assert metric_value(text, "fleetcanary_confirm_requests_total", outcome="unauthorized") == 2
    assert metric_value(text, "fleetcanary_confirm_requests_total", outcome="rate_limited") == 1
    requested = [h for h in d.history() if h["probe"] == PROBE and h.get("trigger") == "requested"]
    assert len(requested) == 1, "one request, one run"
    assert PASSWORD not in d.log()


@pytest.mark.parametrize("body, code, words", [
    (b"{not json", 400, "not JSON"),
    (b"[1]", 400, "a JSON object is wanted"),
    (json.dumps({"probe": PROBE, "extra": 1}).encode(), 400, "unknown field(s): extra"),
    (json.dumps({"figure": "nope"}).encode(), 400, "'nope' is not a judged figure"),
    (json.dumps({"probe": "gpu_p2p"}).encode(), 400, "not enabled on this node"),
    (json.dumps({"probe": PROBE, "gpu": "../1"}).encode(), 400, "gpu must be a GPU index"),
    (b"x" * (requestsmod.MAX_BODY + 1), 413, "over the 4096-byte cap"),
])
def test_a_bad_body_is_one_line_and_a_count(start_daemon, body, code, words):
    d = start_daemon({"probes": {PROBE: HOST_BW, "gpu_p2p": {"enabled": False}},
                      "server": {"confirm_requests": True}})
    got, _, raw = post(d, body)
    assert got == code and words in raw.decode() and raw.decode().count("\n") == 1
    outcome = "too_large" if code == 413 else "bad_request"
    assert metric_value(d.metrics(), "fleetcanary_confirm_requests_total", outcome=outcome) == 1
    assert "Traceback" not in d.log()
    assert [line for line in d.log().splitlines() if "POST /confirm" in line and words[:20] in line]
