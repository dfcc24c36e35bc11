"""A hanging probe that writes its own timeline, and deadlines sized from what this machine measures now.

The ``timeline`` probe appends one JSON line per event to ``log_file``: ``start`` when the worker begins to
run it (with the deadline the runner gave it, ProbeContext.deadline_monotonic), ``term`` when SIGTERM
arrives. CLOCK_MONOTONIC is one clock for every process of the machine, so a test puts these beside its
own readings and bounds what the runner did by what happened, not by constants:

- physics, two-sided only where it holds: a signal never arrives before the deadline; a process that
  ignores SIGTERM is not gone before the deadline plus the kill grace;
- no promptness bar: how soon after the deadline the runner acts is load-bound (a start-up delay measured at
  one moment did not bound a wake-up at another in stress runs); it is the benchmarks' business. The measured
  start-up only sizes deadlines (hang_deadline, self_ending_deadline), so a loaded machine gets room.

Modes: ``hang`` dies of SIGTERM; ``ignore_term`` ignores it (SIGKILL after the grace ends it); ``fork_hang``
dies of SIGTERM (once its child has noted the signal too) but leaves a child that ignores it (the group sweep's
SIGKILL ends it).
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from fleetcanary.probes.base import MetricSpec, Probe, ProbeConfig, ProbeResult, Sample


class TimelineConfig(ProbeConfig):
    log_file: str = Field("", description="append one JSON line per event here")
    mode: str = Field("hang", description="hang, ignore_term or fork_hang; ok returns at once")


def _note(path: str, event: str, **extra) -> None:
    line = json.dumps({"event": event, "pid": os.getpid(), "t": time.monotonic(), **extra}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write under O_APPEND: lines of several processes never mix
    finally:
        os.close(fd)


class Timeline(Probe):
    name = "timeline"
    Config = TimelineConfig
    default_interval_seconds = 4.0
    default_timeout_seconds = 1.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("fleetcanary_test_fault_value", "gauge", "test value", "ratio", ("mode",)),
    )

    def run(self, config, ctx):
        log = config.log_file
        _note(log, "start", deadline=ctx.deadline_monotonic)
        if config.mode == "ok":
            return ProbeResult(samples=[Sample("fleetcanary_test_fault_value", {"mode": "ok"}, 1.0)])

        def noted(die: bool, processes: int = 1):
            def handler(signum, frame):
                _note(log, "term")
                # fork_hang: the group's SIGTERM reached the child too, but the runner sweeps the group with SIGKILL
                # as soon as this leader is gone, which can beat the child's handler to the log on a loaded machine.
                # The leader dies only once every process has noted its SIGTERM, so the test sees each signal; if one
                # never comes, the kill grace's SIGKILL ends this wait and the exit status says so.
                while sum(e["event"] == "term" for e in events(log)) < processes:
                    time.sleep(0.005)
                if die:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    os.kill(os.getpid(), signal.SIGTERM)
            return handler

        if config.mode == "fork_hang" and os.fork() == 0:
            signal.signal(signal.SIGTERM, noted(die=False))
            _note(log, "start", deadline=ctx.deadline_monotonic)
            while True:
                time.sleep(60)
        signal.signal(signal.SIGTERM, noted(die=config.mode != "ignore_term",
                                            processes=2 if config.mode == "fork_hang" else 1))
        while True:
            time.sleep(60)


def events(path: Path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines()] if Path(path).exists() else []


def run_timeline(tmp_path: Path, mode: str, timeout: float, grace: float, tag: str = "") -> tuple:
    """One timeline run in a real isolated worker: (run record, events, test's monotonic before, after)."""
    from tests.support.helpers import run_job

    log = tmp_path / f"timeline-{mode}{tag}.jsonl"
    log.unlink(missing_ok=True)
    before = time.monotonic()
    out = run_job(Timeline, {"log_file": str(log), "mode": mode}, tmp_path, timeout, grace, name=mode)
    after = time.monotonic()
    return out, events(log), before, after


def start_delay(tmp_path: Path) -> float:
    """Seconds from a worker's spawn to its first line of probe code, measured now (an ``ok`` run)."""
    out, ev, _, _ = run_timeline(tmp_path, "ok", 600.0, 1.0, tag="-measure")
    assert out.outcome == "success", out
    start = ev[0]
    return start["t"] - (start["deadline"] - 600.0)


def hang_deadline(tmp_path: Path) -> float:
    """A deadline a hanging worker reaches running, not still starting: 5x its measured start-up, at least
    2 s. Sized from this machine now, so a quiet machine runs the hang tests in seconds and a loaded one
    gets the room it needs."""
    return max(2.0, 5.0 * start_delay(tmp_path))


def self_ending_deadline(tmp_path: Path, floor: float = 8.0) -> float:
    """A deadline for a probe that ends on its own (it crashes, returns, floods, is OOM-killed): it only bounds
    a hang, and the run must reach its fault before it to be classified as that fault. 20x a worker's
    start-up measured now, at least ``floor``: a loaded machine gets the room it needs."""
    return max(floor, 20.0 * start_delay(tmp_path))
