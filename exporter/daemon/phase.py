"""No herd: each node runs each invasive GPU probe at its own point of the probe's interval.

A rollout restarts every exporter of a fleet within minutes, and before this every probe's first run
came within seconds of the daemon's start: the daily 20-second full-power burn on every idle GPU of
the fleet in the same minute. Now an invasive probe's runs sit on a grid of its interval on the wall
clock, shifted by a phase drawn from the node (sha256 of a per-node seed and the probe's name), so
a fleet's runs spread evenly over the interval, and a restart keeps each node's slot: the daily burn
of a node that ran it an hour ago waits for its slot tomorrow instead of running again.

The seed is the node's name where the config has one; otherwise a random one made once and kept in
the state directory (`phase.json`), so a reimaged node simply draws a new slot.
"""
from __future__ import annotations

import hashlib
import json
import logging
import secrets
from pathlib import Path

from fleetcanary.core import statefile

log = logging.getLogger("fleetcanary.phase")
FILE = "phase.json"


def seed(state_dir: str, node_name: str) -> str:
    """The node's phase seed: its name, or the random seed kept in the state directory."""
    if node_name:
        return node_name
    path = Path(state_dir) / FILE
    # read through core/statefile: never raises, never follows a link; what is set aside is counted
    kept = statefile.read_json(path, FILE, "drawing a new seed", expect=dict)
    if kept is not None:
        value = kept.get("seed")
        if isinstance(value, str) and 0 < len(value) <= 256:
            return value
        statefile.drop(FILE, "wrong_shape", path, "no seed string in it", "drawing a new seed")
    new = secrets.token_hex(16)
    try:
        statefile.write_atomic(path, json.dumps({"seed": new}))
    except OSError as e:  # a read-only state directory: the phase holds until the next restart
        log.warning("phase: cannot keep the seed in %s: %s", path, e)
    return new


def fraction(node_seed: str, probe: str) -> float:
    """Where in its interval this node runs this probe, in [0, 1)."""
    h = hashlib.sha256(f"{node_seed}\0{probe}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0 ** 64


def first_delay(now: float, interval: float, frac: float) -> float:
    """Seconds from `now` (unix time) to the node's next slot: the times t with (t - frac x interval) a multiple
    of the interval."""
    return (frac * interval - now) % interval
