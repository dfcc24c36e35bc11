"""Every run the scheduler starts ends as a counted run outcome, whatever fails on the daemon's side: no worker
could be started (out of descriptors: spawn_failed), or the daemon's own code raised (internal). Before, the
exception went up into APScheduler's log and the run left no record and no metric."""
import errno
import json

import pytest
import yaml

from fleetcanary.core import config as configmod
from fleetcanary.daemon import service
from fleetcanary.daemon.service import Daemon
from tests.conftest import SMALL_HOST_BW
from tests.support.helpers import free_port
from tests.support.helpers import metric_value as value


@pytest.fixture
def daemon(tmp_path):
    cfg = {"state_dir": str(tmp_path), "server": {"listen_address": f"127.0.0.1:{free_port()}"},
           "probes": {"host_memory_bandwidth": SMALL_HOST_BW}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    d = Daemon(configmod.load(p, env={}), config_path=str(p))
    yield d
    d.server.stop()


FAILURES = [  # what failed, the crash reason it must be counted as
    (OSError(errno.EMFILE, "Too many open files"), "spawn_failed"),
    (OSError(errno.ENOMEM, "Cannot allocate memory"), "spawn_failed"),
    (OSError(errno.EAGAIN, "Resource temporarily unavailable"), "spawn_failed"),
    (ValueError("filedescriptor out of range in select()"), "internal"),  # the attack's error
    (RuntimeError("can't start new thread"), "internal"),
    (KeyError("gpu"), "internal"),
]


@pytest.mark.parametrize("exc,reason", FAILURES, ids=[r + ":" + type(e).__name__ for e, r in FAILURES])
def test_a_daemon_side_failure_is_a_counted_crash(daemon, tmp_path, monkeypatch, exc, reason):
    def broken(*args, **kwargs):
        raise exc
    monkeypatch.setattr(service, "run_isolated", broken)
    out = daemon.run_probe("host_memory_bandwidth")
    assert (out.outcome, out.reason) == ("crash", reason)
    assert type(exc).__name__ in out.detail
    text = daemon.store.exposition.decode()
    assert value(text, "fleetcanary_probe_runs_total", probe="host_memory_bandwidth", outcome="crash") == 1
    assert value(text, "fleetcanary_probe_crashes_total", probe="host_memory_bandwidth", reason=reason) == 1
    rows = [json.loads(ln) for ln in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["outcome"], r["reason"]) for r in rows] == [("crash", reason)]  # in the history too


def test_a_failure_after_the_run_is_counted_too(daemon, monkeypatch):
    """The worker ran; charging its GPU seconds failed: still one counted crash, not a gap."""
    def broken(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(daemon, "_charge", broken)
    out = daemon.run_probe("host_memory_bandwidth")
    assert (out.outcome, out.reason) == ("crash", "internal")
    assert out.exit_status == 0  # the worker itself had finished
    assert value(daemon.store.exposition.decode(), "fleetcanary_probe_crashes_total",
                 probe="host_memory_bandwidth", reason="internal") == 1


def test_a_failure_storing_the_record_is_counted_as_internal(daemon, monkeypatch):
    real, calls = daemon.store.apply, []

    def apply(out):
        calls.append(out.outcome)
        if len(calls) == 1:
            raise TypeError("a record the store cannot take")
        return real(out)
    monkeypatch.setattr(daemon.store, "apply", apply)
    out = daemon.run_probe("host_memory_bandwidth")
    assert out.outcome == "success" and calls == ["success", "crash"]
    assert value(daemon.store.exposition.decode(), "fleetcanary_probe_crashes_total",
                 probe="host_memory_bandwidth", reason="internal") == 1


def test_a_failure_after_the_record_is_stored_does_not_count_the_run_twice(daemon, monkeypatch):
    def broken(out):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(daemon.history, "append", broken)
    out = daemon.run_probe("host_memory_bandwidth")
    assert out.outcome == "success"
    text = daemon.store.exposition.decode()
    assert value(text, "fleetcanary_probe_runs_total", probe="host_memory_bandwidth", outcome="success") == 1
    assert value(text, "fleetcanary_probe_runs_total", probe="host_memory_bandwidth", outcome="crash") is None
