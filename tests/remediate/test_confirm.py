"""Confirming runs (issue 39 part 4): an in-process controller on a fake clock against the Kubernetes API stand-in
and a real `fleetcanary run` daemon serving POST /confirm behind basic auth. The daemon's probe is the host memory
bandwidth (a real run on this CPU); the alert's peers' value decides which side of the floor the fresh run lands:
a thousand times the node's figure confirms a verdict, a thousandth of it does not."""
from __future__ import annotations

import json
from typing import ClassVar

import bcrypt
import pytest
import yaml

from tests.support.helpers import metric_value, wait_for
from tests.support.servers import JsonHandler, ServerThread

from .conftest import FakeClock, alert, controller, payload, quarantined, resolved

PROBE = "host_memory_bandwidth"
# jitter 0: the hour's one scheduled run comes at the start, never after the requested run (whose figure the
# tests read back from /results)
HOST_BW = {"params": {"array_bytes": 8 << 20, "repeats": 3}, "interval_seconds": 3600, "timeout_seconds": 60,
           "jitter_seconds": 0}
USER, PASSWORD = "remediate", "confirm-pw-0451"
ALERT = "FleetCanaryHostMemoryBandwidthFarBelowPeers"
RULES = [{"name": "slow-host", "match": {"alertnames": [ALERT]}, "confirm": True, "confirm_floor": 0.15,
          "actions": {"labels": {"fleetcanary.io/health": "degraded"}, "taint": {"effect": "PreferNoSchedule"}},
          "min_hold_seconds": 600}]


def metrics(c) -> str:
    from prometheus_client import generate_latest

    return generate_latest(c.metrics.registry).decode()


@pytest.fixture
def exporter(start_daemon, tmp_path):
    """A real daemon with POST /confirm on, behind basic auth; the password file the controller reads."""
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {
        USER: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}}))
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    d = start_daemon({"probes": {PROBE: HOST_BW}, "server": {"confirm_requests": True, "web_config_file": str(web)}})
    d.password_file = secret
    return d


def slow_alert(d, peers: float, **over) -> dict:
    a = alert("gpu-1", ALERT, severity="critical", figure="host_memory_bandwidth", series="triad", path="fast",
              instance=f"127.0.0.1:{d.port}" if d is not None else "127.0.0.1:1", **over)
    a["annotations"]["peers_value"] = repr(peers)
    return a


def confirming(api, clock, d, **over):
    cfg = {"url_pattern": "http://{instance}", "username": USER, "password_file": str(d.password_file),
           "poll_seconds": 10, "deadline_seconds": 1e7} | over.pop("confirm", {})  # the wait_for bounds it
    return controller(api, clock, rules=RULES, confirm=cfg, **over)


def settle(c, clock, step: float = 10.0) -> None:
    """Tick (the fake clock moving one poll period each time) until nothing is pending."""
    def done():
        clock.advance(step)
        c.tick()
        return not c._pending
    wait_for(done, timeout=120, interval=0.05, what="the confirming run to be judged")


def figure(d) -> float:
    """The node's own triad figure, from its latest run (for the Event's numbers)."""
    code, _, body = d.get("/results", headers={"Authorization": _basic()})
    assert code == 200
    return next(f["median"] for f in json.loads(body)[PROBE]["result"]["figures"] if f["name"] == "triad")


def _basic() -> str:
    import base64

    return "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def test_a_confirmed_verdict_quarantines_and_the_event_says_so(api, exporter, caplog):
    clock = FakeClock()
    c = confirming(api, clock, exporter)
    a = slow_alert(exporter, peers=1e15)     # peers a thousand times and more above any host's bandwidth
    assert c.handle(payload(a)) == "accepted"
    assert not quarantined(api, "gpu-1"), "nothing happens before the fresh run"
    assert [e["reason"] for e in api.events] == ["ConfirmRequested"]
    assert f"http://127.0.0.1:{exporter.port}" in api.events[0]["message"]
    assert c.handle(payload(a)) == "accepted" and len(c._pending) == 1, "a repeat notification asks nothing more"

    settle(c, clock)
    assert quarantined(api, "gpu-1")
    n = api.nodes["gpu-1"]
    assert n["metadata"]["labels"]["fleetcanary.io/health"] == "degraded"
    assert [e["reason"] for e in api.events] == ["ConfirmRequested", "Quarantined"]
    msg = api.events[1]["message"]
    assert msg.startswith("confirmed by a fresh run at ") and "against peers' 1e+15" in msg
    value = float(msg.split(": ", 1)[1].split(" against", 1)[0])
    assert value == pytest.approx(figure(exporter), rel=1e-3), "X is the fresh run's own figure"
    text = metrics(c)
    assert metric_value(text, "fleetcanary_remediate_confirmations_total", outcome="confirmed") == 1
    assert metric_value(text, "fleetcanary_remediate_actions_total", action="quarantine") == 1
    requested = [h for h in exporter.history() if h["probe"] == PROBE and h.get("trigger") == "requested"]
    assert len(requested) == 1, "one fresh run, asked once"
    assert PASSWORD not in caplog.text and PASSWORD not in json.dumps(api.events)
    assert api.invalid == []


def test_an_unconfirmed_verdict_does_nothing_but_say_so(api, exporter):
    clock = FakeClock()
    c = confirming(api, clock, exporter)
    c.handle(payload(slow_alert(exporter, peers=1.0)))   # the node far above its "peers": within the floor
    settle(c, clock)
    assert not quarantined(api, "gpu-1") and api.node_patches == []
    assert [e["reason"] for e in api.events] == ["ConfirmRequested", "NotConfirmed"]
    assert "not confirmed by a fresh run at" in api.events[1]["message"] and "no action" in api.events[1]["message"]
    assert metric_value(metrics(c), "fleetcanary_remediate_confirmations_total", outcome="not_confirmed") == 1
    assert metric_value(metrics(c), "fleetcanary_remediate_actions_total", action="quarantine") is None


def test_a_wrong_password_is_a_counted_error_not_an_action(api, exporter, tmp_path, caplog):
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password")
    clock = FakeClock()
    c = confirming(api, clock, exporter, confirm={"password_file": str(wrong)})
    c.handle(payload(slow_alert(exporter, peers=1e15)))
    assert not c._pending and api.node_patches == []
    assert [e["reason"] for e in api.events] == ["ConfirmRequested", "NotConfirmed"]
    assert "answered 401" in api.events[1]["message"]
    assert metric_value(metrics(c), "fleetcanary_remediate_confirmations_total", outcome="error") == 1
    code, _, body = exporter.get("/metrics", headers={"Authorization": _basic()})
    assert code == 200
    assert metric_value(body.decode(), "fleetcanary_confirm_requests_total", outcome="unauthorized") == 1
    assert "not-the-password" not in caplog.text


def test_a_resolve_while_pending_cancels_it(api, exporter):
    clock = FakeClock()
    c = confirming(api, clock, exporter)
    a = slow_alert(exporter, peers=1e15)
    c.handle(payload(a))
    c.handle(payload(resolved(a)))
    assert not c._pending
    for _ in range(5):                      # the fresh run ends meanwhile; nothing acts on it
        clock.advance(10)
        c.tick()
    assert not quarantined(api, "gpu-1") and api.node_patches == []
    assert [e["reason"] for e in api.events] == ["ConfirmRequested", "NotConfirmed"]
    assert "resolved while its confirming run was pending" in api.events[1]["message"]
    assert metric_value(metrics(c), "fleetcanary_remediate_confirmations_total", outcome="cancelled") == 1


class _NeverRuns(JsonHandler):
    """An exporter that takes the request and never runs it (its GPUs held, a claim that is never placed)."""
    asked: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.asked.append(self.path)
        self._reply(202, {"id": "feedfacecafe0001", "state": "pending"})

    def do_GET(self) -> None:
        self.asked.append(self.path)
        self._reply(200, {"id": "feedfacecafe0001", "state": "pending"})


def test_no_fresh_run_by_the_deadline_is_a_timeout_not_an_action(api, tmp_path):
    _NeverRuns.asked = []
    with ServerThread(_NeverRuns) as srv:
        clock = FakeClock()
        c = controller(api, clock, rules=RULES, confirm={"poll_seconds": 10, "deadline_seconds": 60})
        a = alert("gpu-1", ALERT, figure="host_memory_bandwidth", series="triad", instance=srv.address)
        a["annotations"]["peers_value"] = "1e15"
        c.handle(payload(a))
        for _ in range(5):
            clock.advance(10)
            c.tick()
        assert c._pending, "still waiting within the deadline"
        clock.advance(20)
        c.tick()
    assert not c._pending and api.node_patches == []
    assert [e["reason"] for e in api.events] == ["ConfirmRequested", "NotConfirmed"]
    assert "timeout: no fresh run by" in api.events[1]["message"]
    assert _NeverRuns.asked[0] == "/confirm" and set(_NeverRuns.asked[1:]) == {"/confirm/feedfacecafe0001"}
    assert metric_value(metrics(c), "fleetcanary_remediate_confirmations_total", outcome="timeout") == 1


def test_an_alert_without_the_peers_value_asks_nothing(api):
    clock = FakeClock()
    c = controller(api, clock, rules=RULES)
    a = alert("gpu-1", ALERT, figure="host_memory_bandwidth", series="triad", instance="127.0.0.1:1")
    c.handle(payload(a))
    assert api.node_patches == [] and [e["reason"] for e in api.events] == ["NotConfirmed"]
    assert "no peers' value (annotation peers_value" in api.events[0]["message"]
    assert metric_value(metrics(c), "fleetcanary_remediate_confirmations_total", outcome="error") == 1


def test_dry_run_confirms_and_only_says_what_it_would_do(api, exporter):
    clock = FakeClock()
    c = confirming(api, clock, exporter, dry_run=True)
    c.handle(payload(slow_alert(exporter, peers=1e15)))
    settle(c, clock)
    assert api.node_patches == []
    assert [e["reason"] for e in api.events] == ["ConfirmRequested", "WouldQuarantine"]
    assert "confirmed by a fresh run at" in api.events[1]["message"]
