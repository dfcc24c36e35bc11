"""The live workers recorded in the state directory (workers.json), and what a starting daemon does with an
earlier daemon's record: it kills a recorded group only while its leader is still that very process (pid, boot
and /proc start time), never a reused pid, and bad content of any kind is counted, never raised."""
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from fleetcanary.core import statefile
from fleetcanary.runner import isolation
from tests.support.fault_probes import FAULT_PROBES
from tests.support.helpers import pid_alive, run_job, wait_for


def start_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def boot() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.fixture
def group():
    procs = []

    def start() -> subprocess.Popen:
        p = subprocess.Popen(["sleep", "600"], start_new_session=True)
        procs.append(p)
        return p
    yield start
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_only_the_recorded_leader_itself_is_killed(tmp_path, group):
    live, reused = group(), group()
    path = tmp_path / "workers.json"
    path.write_text(json.dumps([
        {"pid": live.pid, "pgid": live.pid, "start_time": start_of(live.pid), "boot_id": boot()},
        {"pid": reused.pid, "pgid": reused.pid, "start_time": start_of(reused.pid) - 1, "boot_id": boot()},
        {"pid": os.getpid(), "pgid": os.getpgid(0), "start_time": start_of(os.getpid()), "boot_id": boot()},
        {"pid": 1, "pgid": 1, "start_time": start_of(1), "boot_id": boot()},
    ]))
    assert isolation.reap_recorded_workers(str(path)) == 1
    assert live.wait(timeout=30) == -signal.SIGKILL
    assert pid_alive(reused.pid) and pid_alive(os.getpid())


@pytest.mark.parametrize("content,kind", [
    (b"\x00\xff not json", "not_utf8"), (b"{not json", "not_json"), (b'{"pid": 1}', "wrong_shape"),
    (b'[{"pid": "x"}, 7, null]', "wrong_shape"), (b"[" * 100 + b"]" * 100, "too_deep"),
])
def test_bad_content_is_counted_never_raised(tmp_path, content, kind):
    path = tmp_path / "workers.json"
    path.write_bytes(content)
    before = statefile.ERRORS.snapshot().get((isolation.WORKERS_FILE, kind), 0)
    assert isolation.reap_recorded_workers(str(path)) == 0
    assert statefile.ERRORS.snapshot().get((isolation.WORKERS_FILE, kind), 0) > before


def test_a_planted_link_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("[]")
    (tmp_path / "workers.json").symlink_to(target)
    assert isolation.reap_recorded_workers(str(tmp_path / "workers.json")) == 0


def test_a_running_worker_is_recorded_and_unrecorded_when_it_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(isolation, "_registry_path", None)
    monkeypatch.setattr(isolation, "_registry", {})
    state = tmp_path / "state"
    assert isolation.track_workers(str(state)) == 0
    pid_file = tmp_path / "pid"
    out = {}
    t = threading.Thread(target=lambda: out.update(run=run_job(FAULT_PROBES["hang"], {"pid_file": str(pid_file)},
                                                               tmp_path, timeout_seconds=60, kill_grace_seconds=1)))
    t.start()
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=60, interval=0.05,
                 what="the hanging worker's pid")
        worker = int(pid_file.read_text().split()[0])
        recorded = json.loads((state / "workers.json").read_text())
        assert [(e["pid"], e["pgid"], e["start_time"], e["boot_id"]) for e in recorded] == [
            (worker, worker, start_of(worker), boot())]
        os.killpg(worker, signal.SIGKILL)
    finally:
        t.join(timeout=60)
    assert out["run"].outcome == "crash"
    assert json.loads((state / "workers.json").read_text()) == []
    monkeypatch.setattr(isolation, "_registry_path", None)
