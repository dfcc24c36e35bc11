"""Probes that misbehave on purpose, for isolation and reliability tests.

Each records the PIDs it creates in ``pid_file`` so a test can check that none is left.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from fleetcanary.probes.base import MetricSpec, Probe, ProbeConfig, ProbeResult, Sample


class FaultConfig(ProbeConfig):
    pid_file: str = Field("", description="append PIDs here")
    mode: str = Field("ok", description="what to do")


def _note(cfg: FaultConfig, pid: int) -> None:
    if cfg.pid_file:
        with open(cfg.pid_file, "a") as f:
            f.write(f"{pid}\n")


class _Fault(Probe):
    Config = FaultConfig
    default_interval_seconds = 4.0
    default_timeout_seconds = 1.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("fleetcanary_test_fault_value", "gauge", "test value", "ratio", ("mode",)),
    )


class Hang(_Fault):
    name = "hang"

    def run(self, config, ctx):
        _note(config, os.getpid())
        while True:
            time.sleep(60)


class IgnoreTerm(_Fault):
    name = "ignore_term"

    def run(self, config, ctx):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _note(config, os.getpid())
        while True:
            time.sleep(60)


class Abort(_Fault):
    name = "abort"

    def run(self, config, ctx):
        _note(config, os.getpid())
        os.abort()


class ForkHang(_Fault):
    name = "fork_hang"

    def run(self, config, ctx):
        _note(config, os.getpid())
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _note(config, os.getpid())
            while True:
                time.sleep(60)
        while True:
            time.sleep(60)


class EscapeSession(_Fault):
    """Forks a child that leaves the process group (setsid), then returns a result."""

    name = "escape_session"

    def run(self, config, ctx):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.setsid()
            _note(config, os.getpid())
            os.write(w, b"x")  # noted: the run may end (the test reads the PID file once it has)
            os.close(w)
            while True:
                time.sleep(60)
        os.close(w)
        os.read(r, 1)
        os.close(r)
        return ProbeResult(samples=[Sample("fleetcanary_test_fault_value", {"mode": "escape"}, 1.0)])


class Ok(_Fault):
    name = "ok"

    def run(self, config, ctx):
        return ProbeResult(samples=[Sample("fleetcanary_test_fault_value", {"mode": "ok"}, 1.0)])


class Flood(_Fault):
    """Writes far more output than the parent keeps, then succeeds."""

    name = "flood"

    def run(self, config, ctx):
        chunk = "x" * 65535 + "\n"
        for _ in range(512):  # 32 MiB
            sys.stdout.write(chunk)
        sys.stdout.flush()
        return ProbeResult(samples=[Sample("fleetcanary_test_fault_value", {"mode": "flood"}, 1.0)])


class Garbage(_Fault):
    """Writes garbage to the result descriptor instead of a result."""

    name = "garbage"

    def run(self, config, ctx):
        fd = int(os.environ["FLEETCANARY_RESULT_FD"])
        os.write(fd, b"\x00\xffnot json at all{")
        os._exit(0)


class BadSamples(_Fault):
    """Returns undeclared metrics and wrong labels beside one good sample."""

    name = "bad_samples"

    def run(self, config, ctx):
        return ProbeResult(samples=[
            Sample("fleetcanary_test_fault_value", {"mode": "good"}, 1.0),
            Sample("fleetcanary_not_declared", {}, 1.0),
            Sample("fleetcanary_test_fault_value", {"wrong": "x"}, 1.0),
        ])


class Raises(_Fault):
    name = "raises"

    def run(self, config, ctx):
        # mode "ok" (the default): the plain message; any other mode is carried in it (a URL, for the redaction tests)
        raise RuntimeError("probe bug" if config.mode == "ok" else f"probe bug: {config.mode}")


class Hog(_Fault):
    """Touches memory page by page until the kernel's OOM killer ends it (run it under a memory limit)."""

    name = "hog"

    def run(self, config, ctx):
        _note(config, os.getpid())
        held = []
        for _ in range(64):  # at most 4 GiB, so a missing limit cannot take the machine down
            block = bytearray(64 << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            held.append(block)
        return ProbeResult(samples=[Sample("fleetcanary_test_fault_value", {"mode": "hog"}, float(len(held)))])


class Quick(_Fault):
    """Succeeds at once with a varying value: the soak's steady load."""

    name = "quick"
    default_interval_seconds = 1.0
    default_timeout_seconds = 0.9

    def run(self, config, ctx):
        return ProbeResult(samples=[Sample("fleetcanary_test_fault_value", {"mode": config.mode}, time.time() % 1)])


class LevelConfig(ProbeConfig):
    value_file: str = Field("", description="the figure each run reports, read from this file")


class Level(Probe):
    """A probe whose figure a test sets by writing a file; each run appends a "time value" line to
    ``<value_file>.runs``. Its figure is one the alerts' fast path would judge (confirm_metrics)."""
    name = "level"
    Config = LevelConfig
    default_interval_seconds = 4.0
    default_timeout_seconds = 2.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("fleetcanary_test_level", "gauge", "test figure", "ratio", ("series",)),
    )
    confirm_metrics = ("fleetcanary_test_level",)

    def run(self, config, ctx):
        value = float(Path(config.value_file).read_text())
        with open(config.value_file + ".runs", "a") as f:
            f.write(f"{time.time()} {value}\n")
        return ProbeResult(samples=[Sample("fleetcanary_test_level", {"series": "a"}, value),
                                    Sample("fleetcanary_test_level", {"series": "b"}, 1.0)])


FAULT_PROBES = {c.name: c for c in (Hang, IgnoreTerm, Abort, ForkHang, EscapeSession, Ok, Flood, Garbage,
                                    BadSamples, Raises, Hog, Quick, Level)}
