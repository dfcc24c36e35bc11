import sys
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, stop_all

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def state_dir(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
def start_daemon(tmp_path):
    """start(config, env=None) -> a ready `fleetcanary run` on 127.0.0.1 (tests/support/daemon.py), its files
    in tmp_path/daemon (daemon-2, ... for more); stopped after the test."""
    started: list[Daemon] = []

    def start(config: dict, env: dict | None = None) -> Daemon:
        n = len(started) + 1
        started.append(Daemon(tmp_path / ("daemon" if n == 1 else f"daemon-{n}"), config, env=env))
        return started[-1]

    yield start
    for d in started:  # before the fixtures the test asked for after this one (an API server) go away
        d.stop()


@pytest.fixture(autouse=True)
def _stop_daemons():
    """A test that fails (or forgets) before its daemon's stop() leaves no daemon running."""
    yield
    stop_all()


SMALL_HOST_BW = {"params": {"array_bytes": 8 << 20, "repeats": 3}, "interval_seconds": 30, "timeout_seconds": 20}


@pytest.fixture(autouse=True)
def _test_process_stays_unpatched():
    """Locust imports gevent, which monkey-patches threading for the whole process: every later test's
    threads would become greenlets, and a worker's output drain would block the test run. Locust runs
    in subprocesses only."""
    yield
    assert "gevent" not in sys.modules, "this test imported gevent (locust) into the test process"
