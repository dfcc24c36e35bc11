"""Confirming runs: before a rule with ``confirm: true`` acts on a performance verdict, the node's exporter runs the
probe again (POST /confirm, fleetcanary.daemon.requests) and the controller acts only if that fresh run is still
past the rule's floor against the peers' value the alert carried (docs/remediation.md, "Confirming runs").

The rule, exactly: the fresh run's value X of the alert's figure, series and GPU (labels figure, series, gpu),
the peers' value Y (the alert annotation ``confirm.peers_annotation``, a number in the figure's unit), and the
figure's direction (fleetcanary.judge.figures): worse = 1 - X/Y for a higher-is-better figure, X/Y - 1
otherwise; confirmed when worse > the rule's confirm_floor. A run that measured no such value (skipped: the GPU
busy; failed) confirms nothing."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import requests

from fleetcanary.judge import figures as figmod

from .config import Confirm
from .webhook import Alert

OUTCOMES = ("confirmed", "not_confirmed", "timeout", "error", "cancelled")


class Failed(Exception):
    """One line: why no confirmation could be asked for or read (never the credentials)."""


@dataclass
class Pending:
    node: str
    alert: Alert
    rule: str
    url: str
    request_id: str
    asked_at: float        # controller wall clock
    deadline: float
    next_poll: float
    figure: figmod.Figure
    peers: float


def peers_value(alert: Alert, annotation: str) -> float:
    raw = alert.annotations.get(annotation, "")
    try:
        value = float(raw)
    except ValueError:
        raise Failed(f"the alert carries no peers' value (annotation {annotation} {raw[:40]!r} is not a number)") \
            from None
    if not math.isfinite(value) or value <= 0:
        raise Failed(f"the peers' value {raw[:40]!r} (annotation {annotation}) is not a positive number")
    return value


def figure_of(alert: Alert) -> figmod.Figure:
    fig = figmod.BY_KEY.get(alert.labels.get("figure", ""))
    if fig is None:
        raise Failed(f"the alert names no judged figure (figure={alert.labels.get('figure', '')[:60]!r})")
    return fig


def url_for(cfg: Confirm, alert: Alert, node: str) -> str:
    instance = alert.labels.get("instance", "")
    if "{instance}" in cfg.url_pattern and not instance:
        raise Failed("the alert has no instance label to reach the exporter by (confirm.url_pattern)")
    return cfg.url_pattern.format(instance=instance, node=node).rstrip("/")


def worse(fig: figmod.Figure, value: float, peers: float) -> float:
    """How much worse than the peers' value: 1 - X/Y (higher is better), X/Y - 1 otherwise."""
    return 1.0 - value / peers if fig.higher_is_better else value / peers - 1.0


class Client:
    """The exporter's POST /confirm and GET /confirm/ID."""

    def __init__(self, cfg: Confirm) -> None:
        self.cfg = cfg

    def _auth(self):
        if not self.cfg.username:
            return None
        try:
            with open(self.cfg.password_file, encoding="utf-8") as f:
                return self.cfg.username, f.read().strip()
        except OSError as exc:
            raise Failed(f"confirm.password_file cannot be read: {exc.strerror or type(exc).__name__}") from None

    def _call(self, method: str, url: str, **kw) -> requests.Response:
        try:
            return requests.request(method, url, auth=self._auth(), timeout=self.cfg.timeout_seconds,
                                    verify=self.cfg.ca_file or True, allow_redirects=False, **kw)
        except requests.RequestException as exc:
            raise Failed(f"{method} {url}: {type(exc).__name__}") from None

    def ask(self, url: str, fig: figmod.Figure, gpu: str) -> dict:
        body = {"figure": fig.key, **({"gpu": gpu} if gpu else {})}
        r = self._call("POST", url + "/confirm", json=body)
        if r.status_code != 202:
            raise Failed(f"POST {url}/confirm answered {r.status_code}: {r.text.strip()[:160]}")
        return _json(r, url)

    def status(self, url: str, request_id: str) -> dict:
        r = self._call("GET", f"{url}/confirm/{request_id}")
        if r.status_code != 200:
            raise Failed(f"GET {url}/confirm/{request_id} answered {r.status_code}")
        return _json(r, url)


def _json(r: requests.Response, url: str) -> dict:
    try:
        data = json.loads(r.content[:65536])
    except ValueError:
        raise Failed(f"{url}/confirm: the answer is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("id"), str):
        raise Failed(f"{url}/confirm: the answer is not a request")
    return data


def fresh_value(run: dict, fig: figmod.Figure, series: str, gpu: str) -> float | None:
    """The run's value of the alert's series (None when it measured none: a skip, a failure)."""
    for f in run.get("figures") or []:
        if not isinstance(f, dict) or f.get("figure") != fig.key:
            continue
        if (not series or f.get("series") == series) and (not gpu or f.get("gpu") == gpu):
            v = f.get("value")
            if isinstance(v, (int, float)) and math.isfinite(v):
                return float(v)
    return None
