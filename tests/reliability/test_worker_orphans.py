"""Workers die with their daemon: a SIGKILLed daemon leaves no probe process behind (PR_SET_PDEATHSIG on the
worker, and a watchdog in its process group that kills the group when the daemon's life pipe reads EOF), and a
starting daemon kills the process groups of workers an earlier daemon recorded in the state directory whose
leader is still that very process (pid, boot and start time), and nothing else."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import Daemon
from tests.support.helpers import pid_alive, wait_for
from tests.support.reliability import fault_daemon, leaked, pids_in

HANG = {"interval_seconds": 600, "timeout_seconds": 300, "jitter_seconds": 0}  # only the SIGKILL ends the run


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                out.append(int(d))
    return out


def stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def test_a_sigkilled_daemon_leaves_no_worker_behind(tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    d = fault_daemon(tmp_path / "d", {"fork_hang": {**HANG, "params": {"pid_file": str(pid_dir / "fork_hang")}}})
    # the worker, and the child it forked into its group (ignoring SIGTERM, as a stuck rank would)
    wait_for(lambda: len(pids_in(pid_dir)) >= 2 if (pid_dir / "fork_hang").exists() else False, timeout=120,
             interval=0.1, what="the hanging worker and its child to note their PIDs")
    pids = pids_in(pid_dir)
    worker = pids[0]
    pgid = int(stat_fields(worker)[2])
    assert pgid == worker and set(pids) <= set(group_members(pgid))
    members = group_members(pgid)  # the worker, its child, and (checked below) the watchdog
    workers_file = d.state_dir / "workers.json"
    recorded = json.loads(workers_file.read_text()) if workers_file.exists() else None
    d.proc.kill()  # SIGKILL: the daemon gets no chance to kill anything
    d.proc.wait()
    d.stop()
    wait_for(lambda: not leaked(pids) and not group_members(pgid), timeout=30, interval=0.1,
             what="the worker's whole process group to be gone after the daemon's SIGKILL")
    assert len(members) == 3, members
    assert [(e["pid"], e["pgid"]) for e in recorded or ()] == [(worker, worker)]  # what a new daemon would reap


def spawn_group() -> subprocess.Popen:
    """A process group like a worker's: a leader in a session of its own, and a member it forked."""
    p = subprocess.Popen(["sh", "-c", "sleep 600 & exec sleep 600"], start_new_session=True)
    wait_for(lambda: len(group_members(p.pid)) == 2 and b"sleep" in Path(f"/proc/{p.pid}/cmdline").read_bytes(),
             timeout=30, interval=0.05, what="the group's two processes")
    return p


def record(p: subprocess.Popen, start_time: int | None = None) -> dict:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return {"pid": p.pid, "pgid": p.pid, "start_time": start_time or int(stat_fields(p.pid)[19]), "boot_id": boot}


def test_a_new_daemon_kills_the_orphans_recorded_by_a_killed_one(tmp_path):
    orphan, decoy, other_boot = spawn_group(), spawn_group(), spawn_group()
    members = group_members(orphan.pid)
    state = tmp_path / "d" / "state"
    state.mkdir(parents=True, mode=0o755)
    entries = [record(orphan),
               record(decoy, start_time=int(stat_fields(decoy.pid)[19]) + 1),  # the pid was reused since
               {**record(other_boot), "boot_id": "another-boot"},            # recorded before a reboot
               {"pid": "x"}, 7]                                               # junk is counted, not fatal
    (state / "workers.json").write_text(json.dumps(entries))
    try:
        d = Daemon(tmp_path / "d", {"probes": {}})
        wait_for(lambda: not any(pid_alive(m) for m in members), timeout=30, interval=0.1,
                 what="the recorded orphan's group to be killed")
        assert group_members(decoy.pid) and group_members(other_boot.pid)  # not theirs to kill
        # the record is the new daemon's own now (its own workers, if one runs at this moment)
        assert not {e["pid"] for e in json.loads((d.state_dir / "workers.json").read_text())} & {
            orphan.pid, decoy.pid, other_boot.pid}
        assert d.stop() == 0
        assert "Traceback" not in d.log()
    finally:
        for p in (orphan, decoy, other_boot):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    assert orphan.returncode == -signal.SIGKILL and sys.platform.startswith("linux")
