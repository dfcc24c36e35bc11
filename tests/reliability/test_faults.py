"""Faults: every misbehaving probe ends classified, the daemon keeps serving, nothing of the probe remains."""
import subprocess
import threading

from tests.support.helpers import http_get, wait_for
from tests.support.helpers import metric_value as value
from tests.support.mounts import tmpfs
from tests.support.reliability import fault_daemon, leaked, memory_cgroup, pids_in, runs_of
from tests.support.timeline import hang_deadline, self_ending_deadline

FAULTS = {
    # probe: (expected outcome, crash reason or None)
    "hang": ("timeout", None),
    "ignore_term": ("timeout", None),
    "abort": ("crash", "killed_by_signal"),
    "raises": ("crash", "exception"),
    "garbage": ("crash", "bad_result"),
    "flood": ("success", None),
}


class Scraper:
    """Scrapes /metrics in a loop and keeps every failure."""

    def __init__(self, url: str) -> None:
        self.url, self.failures, self.count = url, [], 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            code, _, body = http_get(self.url + "/metrics", timeout=10)
            self.count += 1
            if code != 200 or b"fleetcanary_build_info" not in body:
                self.failures.append(code)

    def stop(self):
        self._stop.set()
        self._t.join(timeout=15)


def test_every_fault_is_classified_and_the_daemon_keeps_serving(tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    # A fault that ends on its own must reach its fault before its deadline to be classified as that
    # fault, not as a timeout: that deadline only bounds a hang and is sized from a worker start-up
    # measured now. The hanging ones are killed at a deadline they reach running (5x the start-up).
    deadlines = {n: hang_deadline(tmp_path) if outcome == "timeout" else self_ending_deadline(tmp_path)
                 for n, (outcome, _) in FAULTS.items()}
    probes = {n: {"interval_seconds": deadlines[n] + 2, "timeout_seconds": deadlines[n], "jitter_seconds": 0,
                  "params": {"pid_file": str(pid_dir / n)}} for n in FAULTS}
    d = fault_daemon(tmp_path, probes)
    scraper = Scraper(d.url)
    try:
        def each_twice():
            text = d.metrics()
            ok = all((value(text, "fleetcanary_probe_runs_total", probe=n, outcome=o) or 0) >= 2
                     for n, (o, _) in FAULTS.items())
            # and a worker of each fault that notes its PID got that far at least once (on a loaded machine a
            # worker may start slower than the hang deadline sized at the test's start: that run is a timeout
            # too, but leaves no PID to check for leaks)
            noted = all((pid_dir / n).exists() for n in ("hang", "ignore_term", "abort"))
            return text if ok and noted and scraper.count >= 20 else None  # and scraped throughout, however slowly
        text = wait_for(each_twice, timeout=300, interval=0.5,
                        what="every fault probe classified twice, each hanging worker's PID noted, and 20 scrapes")
    finally:
        scraper.stop()
        rc = d.stop()
    assert rc == 0
    assert scraper.failures == []
    for n, (_, reason) in FAULTS.items():
        if reason:
            assert value(text, "fleetcanary_probe_crashes_total", probe=n, reason=reason) >= 2, n
    assert value(text, "fleetcanary_probe_success", probe="flood") == 1.0
    pids = pids_in(pid_dir)
    assert len(pids) >= 3
    # each was SIGKILLed (group sweep) before its run was recorded; 30 s only bounds what the kernel cannot end
    wait_for(lambda: not leaked(pids), timeout=30, what="no probe process left")
    assert "Traceback" not in d.log()


def test_an_oom_killed_probe_is_classified_and_the_daemon_survives(tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    with memory_cgroup(384 << 20) as procs:
        # hog ends when the OOM killer ends it: its deadline only bounds a hang (filling 384 MiB on a loaded
        # machine must not make it a timeout), sized from a worker start-up measured now
        deadline = self_ending_deadline(tmp_path, floor=10.0)
        d = fault_daemon(tmp_path, {"hog": {"interval_seconds": deadline + 2, "timeout_seconds": deadline,
                                            "jitter_seconds": 0, "params": {"pid_file": str(pid_dir / "hog")}}},
                         cgroup_procs=procs)
        try:
            def two_oom_kills() -> str | None:
                text = d.metrics()
                return text if (value(text, "fleetcanary_probe_crashes_total", probe="hog",
                                      reason="oom_killed") or 0) >= 2 else None

            text = wait_for(two_oom_kills, timeout=120, interval=0.5, what="two OOM kills classified")
            assert d.proc.poll() is None, "the daemon itself was killed"
            assert value(text, "fleetcanary_probe_success", probe="hog") == 0.0
            assert http_get(d.url + "/healthz")[0] == 200
        finally:
            rc = d.stop()
    assert rc == 0
    pids = pids_in(pid_dir)
    assert len(pids) >= 2 and not leaked(pids)
    assert "oom_killed" in d.log()


def test_state_dir_full_or_read_only_is_counted_and_survived(tmp_path):
    state = tmp_path / "state"
    with tmpfs(state, "size=1m,mode=0700"):  # a tmpfs is 1777 by default: a state directory others could write
        d = fault_daemon(tmp_path, {"quick": {"interval_seconds": 1, "timeout_seconds": 0.9, "jitter_seconds": 0}},
                        extra={"state_dir": str(state)})
        try:
            def runs():
                return runs_of(d.metrics(), "quick")
            wait_for(lambda: runs() >= 2, timeout=30, what="history being written")
            # no error yet: no series (the exporter's own error counters appear once above 0)
            assert value(d.metrics(), "fleetcanary_history_write_errors_total") is None
            # full: a file takes what is left
            subprocess.run(["dd", "if=/dev/zero", f"of={state}/filler", "bs=64k", "count=100"],
                           capture_output=True)
            n = runs()
            wait_for(lambda: (value(d.metrics(), "fleetcanary_history_write_errors_total") or 0) >= 2
                     and runs() >= n + 2, timeout=30, what="write errors counted while probes keep running")
            (state / "filler").unlink()
            # read-only
            r = subprocess.run(["mount", "-o", "remount,ro", str(state)], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            errors = value(d.metrics(), "fleetcanary_history_write_errors_total")
            n = runs()
            wait_for(lambda: value(d.metrics(), "fleetcanary_history_write_errors_total") >= errors + 2
                     and runs() >= n + 2, timeout=30, what="read-only errors counted while probes keep running")
            assert http_get(d.url + "/healthz")[0] == 200 and http_get(d.url + "/readyz")[0] == 200
        finally:
            rc = d.stop()
            subprocess.run(["mount", "-o", "remount,rw", str(state)], capture_output=True)
    assert rc == 0
    log = d.log()
    assert "Traceback" not in log and "results history" in log
    assert "No space left" in log and "Read-only file system" in log
