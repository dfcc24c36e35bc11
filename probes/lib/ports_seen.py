"""When each RDMA port was last up, kept in the state directory: the node's own memory of which ports it had.

Without an `expected_ports` list the port-down alert pages on a port that is down now and was up within the last
day. The rule once read that from Prometheus (`max_over_time(fleetcanary_rdma_port_up[1d])`, every port's day of
samples each minute: most of the NIC group's evaluation cost at fleet scale); the probe answers it here instead,
from a small file on the host path that a restart or a reboot keeps, and publishes
`fleetcanary_rdma_port_expected 1` for such a port only (a healthy node has none of these series).

The file is rewritten only when a port's time is more than REFRESH seconds old, so a node with every port up
writes it every few minutes, not every run. A wall clock stepped back finds times in its future: they count as
now, so a port stays remembered a day of the new clock, never a year. An unreadable or malformed file is named
(the caller counts it) and starts an empty memory: the next run rewrites it.
"""
from __future__ import annotations

import json
from pathlib import Path

from fleetcanary.probes.lib import safefile

WINDOW = 86400.0       # a port up this recently is one the node has
REFRESH = 300.0        # a port's time is rewritten when older than this
MAX_PORTS = 1024       # entries kept (the newest), so a file cannot grow without bound
MAX_BYTES = 1 << 17
RELPATH = ("nic", "ports_seen_up.json")


def path(state_dir: str) -> Path:
    return Path(state_dir).joinpath(*RELPATH)


def load(state_dir: str) -> tuple[dict[str, float], str]:
    """(port -> last time up, "") or ({}, why) for a file that cannot be used."""
    raw, kind, detail = safefile.read_raw(path(state_dir), MAX_BYTES)
    if raw is None:
        return {}, f"{kind}: {detail}" if kind else ""
    try:
        data = json.loads(raw)
        seen = {str(k): float(v) for k, v in data["ports"].items()}
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        return {}, f"malformed: {type(e).__name__}"
    return {k: v for k, v in seen.items() if v == v}, ""  # NaN never compares: dropped


def _fresh(t: float, now: float) -> bool:
    """Up within the window; a time in the clock's future counts as now."""
    return now - min(t, now) <= WINDOW


def update(seen: dict[str, float], up: list[str], now: float) -> tuple[dict[str, float], bool]:
    """The memory after a run at `now` that found the ports `up` up: (new memory, whether to write it)."""
    out = {k: min(t, now) for k, t in seen.items() if _fresh(t, now)}
    changed = len(out) != len(seen) or any(out[k] != seen[k] for k in out)
    for k in up:
        if k not in out or now - out[k] > REFRESH:
            out[k], changed = now, True
    if len(out) > MAX_PORTS:
        out, changed = dict(sorted(out.items(), key=lambda kv: kv[1])[-MAX_PORTS:]), True
    return out, changed


def recently_up(seen: dict[str, float], port: str, now: float) -> bool:
    t = seen.get(port)
    return t is not None and _fresh(t, now)


def save(state_dir: str, seen: dict[str, float]) -> str:
    """"" or why the file could not be written (never through a link planted in the state directory)."""
    p = path(state_dir)
    try:
        if not safefile.private_dir(p.parent):
            return f"{p.parent} is not a private directory"
        safefile.write_atomic(p, json.dumps({"ports": seen}, sort_keys=True), fsync=False)
    except OSError as e:
        return f"unwritable: {e.strerror or type(e).__name__}"
    return ""
