"""Worker isolation: every misbehaving probe ends classified, killed at its deadline (then the kill
grace), and leaves no process behind.

A hanging worker's kill is judged on its own timeline (tests/support/timeline.py): the deadline the
runner gave it, when it started, when SIGTERM reached each of its processes, when the run returned. The
bounds are physics and order only: a signal never reaches a process before the deadline, nor after the run
returned; a worker that ignores SIGTERM is not gone before the deadline plus the grace; the exit status says
which signal ended it. How promptly the runner acts is not judged here (a start-up delay measured at one
moment does not bound a wake-up at another on a loaded machine: two stress runs showed it); the deadline is
sized from a start-up measured now, so a loaded machine gets the room it needs and a quiet one runs these
tests in seconds."""
import signal

import pytest

from fleetcanary.runner.isolation import MAX_RESULT_BYTES, OUTPUT_TAIL_BYTES, become_subreaper
from tests.support.fault_probes import FAULT_PROBES
from tests.support.helpers import pid_alive, run_job, wait_for
from tests.support.timeline import hang_deadline, run_timeline

# The kill grace: how long a SIGTERM handler has to run before SIGKILL. It only bounds a wake-up on a loaded
# machine (the hang modes return as soon as their handler ran); ignore_term waits it out in full.
GRACE = 3.0
# A probe that ends on its own (abort, raise, garbage, flood, escape): its deadline only bounds a hang.
# It must reach its fault to be classified as that fault, however long a loaded machine takes to start it.
SELF_ENDING_DEADLINE = 60.0


@pytest.fixture(scope="module")
def deadline(tmp_path_factory):
    return hang_deadline(tmp_path_factory.mktemp("start-up"))


def run_fault(tmp_path, name, timeout=SELF_ENDING_DEADLINE):
    pid_file = tmp_path / f"{name}.pids"
    out = run_job(FAULT_PROBES[name], {"pid_file": str(pid_file)}, tmp_path, timeout, GRACE, name=name)
    pids = [int(x) for x in pid_file.read_text().split()] if pid_file.exists() else []
    return out, pids


def assert_no_process_left(pids):
    assert pids, "the probe recorded no PID; the test would prove nothing"
    # SIGKILL was sent before the run returned; 30 s only bounds a process the kernel cannot end
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=30, what=f"processes {pids} to be gone")


def killed_run(tmp_path, mode, deadline, processes):
    """A timeline run whose worker (and child) were running before the deadline: every kill assertion needs
    that. A load spike since the deadline was measured may start them later: then again, deadline x2."""
    for attempt in range(3):
        out, ev, before, after = run_timeline(tmp_path, mode, deadline, GRACE, tag=f"-{attempt}")
        starts = [e for e in ev if e["event"] == "start"]
        if len(starts) == processes and all(e["t"] < e["deadline"] for e in starts):
            return out, ev, before, after, deadline
        deadline *= 2
    raise AssertionError(f"{mode}: the worker never started before its deadline (last {deadline / 2:.0f} s)")


@pytest.mark.parametrize("mode,processes,status", [
    ("hang", 1, -signal.SIGTERM),
    ("ignore_term", 1, -signal.SIGKILL),
    ("fork_hang", 2, -signal.SIGTERM),
])
def test_a_hanging_probe_is_killed_at_its_deadline_and_leaves_nothing(tmp_path, deadline, mode, processes, status):
    out, ev, before, after, timeout = killed_run(tmp_path, mode, deadline, processes)
    assert (out.outcome, out.reason, out.exit_status) == ("timeout", "deadline", status), out
    start = ev[0]
    due = start["deadline"]
    spawned = due - timeout
    assert before <= spawned <= start["t"]  # the deadline counts from the spawn
    delay = start["t"] - spawned              # this worker's start-up: the scheduling delay of the moment
    pids = {e["pid"] for e in ev if e["event"] == "start"}
    terms = {e["pid"]: e["t"] for e in ev if e["event"] == "term"}
    assert set(terms) == pids, f"SIGTERM reached {sorted(terms)} of the group {sorted(pids)}"
    for pid, t in terms.items():
        assert due <= t <= after, (f"SIGTERM reached {pid} {t - due:+.3f} s from its deadline, the run returned "
                                   f"{after - due:+.3f} s from it (the worker took {delay:.3f} s to start)")
    # gone no earlier than physics allows (ignore_term: only the SIGKILL after the grace ends it)
    assert after >= due + (GRACE if mode == "ignore_term" else 0.0)
    assert_no_process_left(sorted(pids))


def test_abort_is_a_crash_and_leaves_nothing(tmp_path):
    out, pids = run_fault(tmp_path, "abort")
    assert (out.outcome, out.reason) == ("crash", "killed_by_signal"), out
    assert_no_process_left(pids)


def test_abort_reports_the_signal(tmp_path):
    out, _ = run_fault(tmp_path, "abort")
    assert "SIGABRT" in out.detail


def test_child_that_leaves_the_process_group_is_reaped_by_the_subreaper(tmp_path):
    assert become_subreaper() is True
    out, pids = run_fault(tmp_path, "escape_session")
    assert out.outcome == "success"
    assert_no_process_left(pids)


def test_output_flood_is_bounded(tmp_path):
    out, _ = run_fault(tmp_path, "flood")
    assert out.outcome == "success"
    assert 0 < len(out.output_tail) <= OUTPUT_TAIL_BYTES
    assert out.samples == [{"metric": "fleetcanary_test_fault_value", "labels": {"mode": "flood"}, "value": 1.0}]


def test_garbage_result_is_a_crash_not_an_exception(tmp_path):
    out, _ = run_fault(tmp_path, "garbage")
    assert (out.outcome, out.reason) == ("crash", "bad_result")


def test_probe_exception_is_a_crash_with_its_type(tmp_path):
    out, _ = run_fault(tmp_path, "raises")
    assert (out.outcome, out.reason) == ("crash", "exception")
    assert out.detail == "RuntimeError: probe bug"


def test_result_limit_is_large_enough_for_real_records():
    assert MAX_RESULT_BYTES >= 16 << 20


def test_a_worker_gets_only_the_import_path_an_out_of_package_probe_needs():
    """Our own probes: nothing beyond the installation (workers start with python -I). A test's
    probe class: the folder above its top-level package, and nothing else of ours."""
    from pathlib import Path

    from fleetcanary.probes import PROBES
    from fleetcanary.runner import job

    assert all(job.import_path(cls) == [] for cls in PROBES.values())
    root = Path(__file__).resolve().parents[2]
    assert job.import_path(FAULT_PROBES["hang"]) == [str(root)]
    built = job.build("hang", FAULT_PROBES["hang"], {}, {"node_name": "n"})
    assert built["class"] == "tests.support.fault_probes:Hang" and built["import_path"] == [str(root)]
