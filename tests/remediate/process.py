"""A real `fleetcanary remediate` process on 127.0.0.1 (its config, log and audit file in a work directory), and
the way tests hand Alertmanager an alert (POST /api/v2/alerts) and read the controller's metrics."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from tests.support.helpers import StopWaiting, free_port, http_get, metric_value, wait_for

from .conftest import environ


class Remediate:
    def __init__(self, workdir: Path, api, config: dict, identity: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.audit = workdir / "audit.jsonl"
        self.config = workdir / "remediate.yaml"
        cfg = {"listen_address": f"127.0.0.1:{self.port}", "audit_log": str(self.audit), **config}
        cfg["lease"] = {"identity": identity, "namespace": "fleetcanary", **cfg.get("lease", {})}
        self.config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.log = workdir / "remediate.log"
        with open(self.log, "wb") as out:
            cmd = [sys.executable, "-m", "fleetcanary", "remediate", "--config", str(self.config)]
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **environ(api)})
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for(lambda: self._alive() and http_get(self.url + "/healthz", timeout=2)[0] == 200, timeout=60,
                 what=f"fleetcanary remediate {identity} serving")

    def _alive(self) -> bool:
        if self.proc.poll() is not None:
            raise StopWaiting(f"fleetcanary remediate exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        return True

    def metric(self, name: str, **labels) -> float | None:
        code, _, body = http_get(self.url + "/metrics", timeout=5)
        assert code == 200
        return metric_value(body.decode(), name, **labels)

    def post(self, body: bytes, headers: dict | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + "/webhook", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            (self.proc.kill if kill else self.proc.terminate)()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _stamp(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def send(am, alert: dict, resolved: bool = False) -> None:
    """Hand Alertmanager an alert as Prometheus does (firing: ends in the future; resolved: ended now)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    body = [{"labels": alert["labels"], "annotations": alert["annotations"],
             "startsAt": _stamp(now - datetime.timedelta(minutes=5)),
             "endsAt": _stamp(now if resolved else now + datetime.timedelta(hours=1))}]
    req = urllib.request.Request(am.url + "/api/v2/alerts", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def alertmanager_config(*urls: str) -> dict:
    """One receiver, the controller's webhook (every replica's URL), grouped per node as the shipped example."""
    return {"route": {"receiver": "remediate", "group_by": ["alertname", "node"], "group_wait": "1s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "remediate", "webhook_configs": [
                {"url": u + "/webhook", "send_resolved": True, "max_alerts": 0} for u in urls]}]}
