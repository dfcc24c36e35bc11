"""The data files fleetcanary ships, found through importlib.resources.

Installed from a wheel they are package data under site-packages; in a development
checkout (editable install) the same names resolve to alerts/ and dashboards/json/.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

RULE_FILES = ("fleetcanary.rules.yml", "fleetcanary.alerts.yml")
ALERTMANAGER_EXAMPLE = "alertmanager.example.yml"


@contextlib.contextmanager
def rule_files() -> Iterator[list[Path]]:
    """The recording and alert rule files as real paths (Prometheus reads them), while open."""
    with resources.as_file(resources.files("fleetcanary.rules")) as base:
        paths = [Path(base) / name for name in RULE_FILES]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"rule files missing from this installation: {', '.join(missing)}")
        yield paths


@contextlib.contextmanager
def dashboards_dir() -> Iterator[Path]:
    """The folder of the generated Grafana dashboards (*.json), while open."""
    with resources.as_file(resources.files("fleetcanary.dashboards") / "json") as base:
        yield Path(base)


def alertmanager_example() -> str:
    """The example Alertmanager config (routes, inhibit rules) shipped beside the rules."""
    return (resources.files("fleetcanary.rules") / ALERTMANAGER_EXAMPLE).read_text()
