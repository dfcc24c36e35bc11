"""SIGTERM ends every worker's process group in bounded time; SIGHUP under scrape load keeps serving."""
import signal
import threading
import time

import pytest

from tests.support.helpers import http_get, pid_alive, wait_for
from tests.support.helpers import metric_value as value
from tests.support.reliability import fault_daemon, leaked, pids_in, scaled


def test_sigterm_with_workers_running_ends_every_group_promptly(tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    probes = {n: {"interval_seconds": 120, "timeout_seconds": 100, "jitter_seconds": 0,
                  "params": {"pid_file": str(pid_dir / n)}} for n in ("hang", "ignore_term", "fork_hang")}
    d = fault_daemon(tmp_path, probes, extra={"worker_kill_grace_seconds": 2.0})
    wait_for(lambda: len(pids_in(pid_dir)) >= 4, timeout=120, what="the long-running workers and a forked child")
    pids = pids_in(pid_dir)
    assert all(pid_alive(p) for p in pids)
    t0 = time.monotonic()
    rc = d.stop(timeout=90)
    took = time.monotonic() - t0
    assert rc == 0
    # Not before the kill grace (ignore_term ignores SIGTERM: only the SIGKILL after 2 s ends it), and before
    # the workers' own deadline (100 s): the shutdown ended them, not their deadline. Both bounds are physics.
    assert 2.0 <= took < 100.0, f"stop took {took:.1f}s with a 2 s kill grace and 100 s deadlines"
    assert leaked(pids) == []
    log = d.log()
    assert log.count("stopped by the shutdown") == 3 and "Traceback" not in log
    assert "WARNING" not in log.split("stopping", 1)[1], "a shutdown kill is not a probe crash"


@pytest.mark.slow
def test_sighup_reload_under_scrape_load_keeps_serving(tmp_path):
    d = fault_daemon(tmp_path, {"quick": {"interval_seconds": 1, "timeout_seconds": 0.9}})
    failures, count, stop = [], [0], threading.Event()

    def scrape():
        while not stop.is_set():
            code, _, body = http_get(d.url + "/metrics", timeout=10)
            count[0] += 1
            if code != 200 or (not body.rstrip().endswith(b"0") and b"# EOF" not in body and not body):
                failures.append(code)

    threads = [threading.Thread(target=scrape, daemon=True) for _ in range(16)]
    for t in threads:
        t.start()
    wait_for(lambda: count[0] >= len(threads), timeout=60, what="the scrapers under way")
    reloads = scaled(10, 100)
    try:
        for i in range(reloads):
            # alternate two valid configs so every reload really changes something
            d.rewrite({"quick": {"interval_seconds": 1 + (i % 2), "timeout_seconds": 0.9}})
            before = value(d.metrics(), "fleetcanary_config_reloads_total", result="success") or 0
            scraped = count[0]
            d.proc.send_signal(signal.SIGHUP)
            # the reload is done, and scrapes went on meanwhile (however slowly this machine serves them)
            wait_for(lambda before=before, scraped=scraped: (value(d.metrics(), "fleetcanary_config_reloads_total",
                                                                   result="success") or 0) > before
                     and count[0] > scraped, timeout=60, what=f"reload {i + 1} under scrapes")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)
    text = d.metrics()
    assert d.stop() == 0
    assert failures == []
    assert value(text, "fleetcanary_config_reloads_total", result="success") == reloads
    assert value(text, "fleetcanary_config_reloads_total", result="failure") is None  # a result once above 0
    assert value(text, "fleetcanary_probe_interval_seconds", probe="quick") in (1.0, 2.0)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stop_signals_exit_zero(tmp_path, sig):
    d = fault_daemon(tmp_path, {"quick": {"interval_seconds": 1, "timeout_seconds": 0.9}})
    d.proc.send_signal(sig)
    assert d.proc.wait(timeout=60) == 0  # bounds a hang
    d.stop()
