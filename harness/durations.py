"""Prometheus durations ("30s", "1h30m", "500ms") as seconds: the one parser tests and benchmarks share."""
from __future__ import annotations

import re

UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def seconds(d: str | float | None) -> float:
    """Seconds in a Prometheus duration; a number is taken as seconds already, None as 0."""
    if d is None:
        return 0.0
    if isinstance(d, (int, float)):
        return float(d)
    return sum(int(n) * UNITS[u] for n, u in _PART.findall(d))
