"""Worker isolation: every misbehaving probe ends classified, within its deadline plus
the kill grace, and leaves no process behind."""
import time

import pytest

from fleetcanary.runner.isolation import MAX_RESULT_BYTES, OUTPUT_TAIL_BYTES, become_subreaper
from tests.support.fault_probes import FAULT_PROBES
from tests.support.helpers import pid_alive, run_job, wait_for

DEADLINE = 8.0  # covers a worker's start-up on a busy 2-core machine (load average 16 seen): it must write its PIDs first
GRACE = 1.0


def run_fault(tmp_path, name, timeout=DEADLINE):
    pid_file = tmp_path / f"{name}.pids"
    out = run_job(FAULT_PROBES[name], {"pid_file": str(pid_file)}, tmp_path, timeout, GRACE, name=name)
    pids = [int(x) for x in pid_file.read_text().split()] if pid_file.exists() else []
    return out, pids


def assert_no_process_left(pids):
    assert pids, "the probe recorded no PID; the test would prove nothing"
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=5, what=f"processes {pids} to be gone")


@pytest.mark.parametrize("name,outcome,reason", [
    ("hang", "timeout", "deadline"),
    ("ignore_term", "timeout", "deadline"),
    ("abort", "crash", "killed_by_signal"),
    ("fork_hang", "timeout", "deadline"),
])
def test_misbehaving_probe_is_killed_within_deadline_and_leaves_nothing(tmp_path, name, outcome, reason):
    # abort must reach os.abort() to be a crash: its deadline covers a worker's start-up on a loaded machine
    deadline = DEADLINE
    t0 = time.monotonic()
    out, pids = run_fault(tmp_path, name, timeout=deadline)
    elapsed = time.monotonic() - t0
    assert (out.outcome, out.reason) == (outcome, reason), out
    assert elapsed < deadline + 2.0 + 1.0, f"{name} took {elapsed:.2f}s"  # deadline + 2 s (+1 s worker start-up)
    assert_no_process_left(pids)
    if name == "fork_hang":
        assert len(pids) == 2  # the worker and the child it forked


def test_abort_reports_the_signal(tmp_path):
    out, _ = run_fault(tmp_path, "abort")
    assert "SIGABRT" in out.detail


def test_child_that_leaves_the_process_group_is_reaped_by_the_subreaper(tmp_path):
    assert become_subreaper() is True
    out, pids = run_fault(tmp_path, "escape_session", timeout=5)
    assert out.outcome == "success"
    assert_no_process_left(pids)


def test_output_flood_is_bounded(tmp_path):
    out, _ = run_fault(tmp_path, "flood", timeout=20)
    assert out.outcome == "success"
    assert 0 < len(out.output_tail) <= OUTPUT_TAIL_BYTES
    assert out.samples == [{"metric": "fleetcanary_test_fault_value", "labels": {"mode": "flood"}, "value": 1.0}]


def test_garbage_result_is_a_crash_not_an_exception(tmp_path):
    out, _ = run_fault(tmp_path, "garbage", timeout=10)
    assert (out.outcome, out.reason) == ("crash", "bad_result")


def test_probe_exception_is_a_crash_with_its_type(tmp_path):
    out, _ = run_fault(tmp_path, "raises", timeout=10)
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
