"""Local services the demos start and wait for: a free loopback address, readiness, a JSON GET, a clean stop, and
the rule files their fast mode loads."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import yaml

from fleetcanary.probes.lib import yamltext


def free_address(hostport: str) -> str:
    """The address asked for if it can be bound, else any free port on the same host (port 0: any)."""
    host, _, port = hostport.rpartition(":")
    host = host or "127.0.0.1"
    with socket.socket() as s:
        try:
            s.bind((host, int(port)))
        except OSError:
            s.bind((host, 0))
        return f"{host}:{s.getsockname()[1]}"


def ready(url: str, deadline: float, proc: subprocess.Popen) -> bool:
    """True once ``url`` answers 200; False when ``proc`` exits or the monotonic ``deadline`` passes."""
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def rule_groups(hostport: str) -> list[str]:
    """The rule groups Prometheus reports loaded (its /api/v1/rules), as it says, not as we hope; [] when it
    does not answer."""
    try:
        return [g["name"] for g in get_json(f"http://{hostport}/api/v1/rules")["data"]["groups"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def stop(proc: subprocess.Popen | None) -> None:
    """SIGTERM, 30 s to end, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


FAST_INTERVAL = "2s"  # the demos' --fast: scrape, evaluate and every rule group's interval


def fast_rule_files(rule_files: list[Path], into: Path) -> list[Path]:
    """Copies of the shipped rule files whose groups all evaluate every FAST_INTERVAL, for the demos' --fast: a group's
    own interval (1m for the inventory and the hard failures, 15m for the peers' spread) overrides Prometheus's
    global one, so the fleet overview, whose panels join on the inventory's records, stayed empty for up to a
    minute, and a hard fault paged up to a minute late. The windows and `for` durations are the shipped ones."""
    into.mkdir(parents=True, exist_ok=True)
    out = []
    for path in rule_files:
        doc = yamltext.load(path.read_text())
        for group in doc.get("groups", []):
            group["interval"] = FAST_INTERVAL
        copy = into / path.name
        copy.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(copy)
    return out
