"""Worker isolation: each probe run is a child process in its own process group.

At the deadline the whole group gets SIGTERM, then SIGKILL after a grace period.
When the worker's leader exits on its own, the group is still swept with SIGKILL
(before the leader is reaped, so its PID, which is the group ID, cannot be reused),
which removes any grandchild it left behind. A hung driver call, a stalled
collective, a segfault or an OOM kill therefore ends as ``timeout`` or ``crash``
and the daemon goes on.

Workers die with the daemon, even a SIGKILLed one: each sets PR_SET_PDEATHSIG first thing (worker.py),
and each holds the read end of a pipe whose only write end the daemon holds; a watchdog process in the
worker's group sees EOF when the daemon is gone and kills the whole group (rank subprocesses included).
The daemon also records each live worker (pid = pgid, its /proc start time, the boot) in the state
directory; a starting daemon kills the groups of recorded workers whose leader is still that process.

Output is drained by threads: the result pipe is read up to MAX_RESULT_BYTES, and
stdout/stderr keep only a tail, so a probe that floods its output costs bounded
memory and no disk.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from fleetcanary.core import statefile
from fleetcanary.core.record import CRASH_REASONS, OUTCOMES, RunRecord
from fleetcanary.probes.lib.redact import redact_url
from fleetcanary.probes.lib.spawn import module_command
from fleetcanary.runner.job import PARENT_PID_ENV, RESULT_FD_ENV, WATCH_FD_ENV, WORKER_MODULE

log = logging.getLogger("fleetcanary.runner")
MAX_RESULT_BYTES = 32 << 20
OUTPUT_TAIL_BYTES = 4096
WORKERS_FILE = "workers.json"  # the live workers, in the state directory (track_workers)
__all__ = ["CRASH_REASONS", "OUTCOMES", "WORKERS_FILE", "become_subreaper", "kill_all_workers", "reap_orphans",
           "reap_recorded_workers", "run_isolated", "track_workers"]


@functools.lru_cache(maxsize=1)
def _oom_counter_file() -> str | None:
    """The file holding this process's memory-cgroup OOM-kill count, found once: cgroup v2
    memory.events (hierarchical) or v1 memory.oom_control (kernel 4.13+)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [ln.rstrip("\n").split(":", 2) for ln in f]
    except OSError:
        return None
    candidates = []
    for hid, controllers, path in (x for x in lines if len(x) == 3):
        if "memory" in controllers.split(","):
            candidates.append(f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.oom_control")
        elif hid == "0" and controllers == "":
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                candidates.append(f"{root}{path.rstrip('/')}/memory.events")
    return next((c for c in candidates if _read_oom_kill(c) is not None), None)


def _read_oom_kill(path: str) -> int | None:
    try:
        with open(path) as f:
            for ln in f:
                k, _, v = ln.partition(" ")
                if k == "oom_kill":
                    return int(v)
    except (OSError, ValueError):
        return None
    return None


def oom_kills() -> int | None:
    """OOM kills counted in this process's memory cgroup; None where unreadable."""
    path = _oom_counter_file()
    return _read_oom_kill(path) if path else None


_live_lock = threading.Lock()
_live_groups: set[int] = set()


_subreaper = False
_reap_everything = False


def become_subreaper(reap_everything: bool = False) -> bool:
    """Make this process the reaper of its orphaned descendants (Linux PR_SET_CHILD_SUBREAPER).

    Then a probe's grandchild that escaped its process group (setsid, double fork) or
    outlived its killed parent is re-parented to us instead of to PID 1, and
    ``reap_orphans`` kills and reaps it. In a container where PID 1 does not reap,
    this also keeps zombies from piling up.

    reap_everything: every child that is not a live worker is a leftover (true for the
    daemon and `once`, which start no other processes). Otherwise only children outside
    our own session are: workers and what they fork run in sessions of their own, while an
    embedding program's ordinary children (a test's fixtures) share ours and are left alone."""
    global _subreaper, _reap_everything  # noqa: PLW0603 - a process-wide kernel setting, set once at start-up
    _reap_everything = reap_everything
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper = libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        _subreaper = False
    return _subreaper


def _children_of_self() -> list[int]:
    me = os.getpid()
    out = []
    try:
        text = Path(f"/proc/{me}/task/{me}/children").read_text()
        return [int(p) for p in text.split()]
    except OSError:
        pass
    for entry in os.listdir("/proc"):  # kernels without the children file
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[1] == str(me):
                out.append(int(entry))
    return out


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, ...); None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def reap_orphans() -> int:
    """Kill and reap our children that are not live workers: re-parented leftovers of
    finished probes. Never blocks; a process stuck in the kernel is retried next time."""
    if not _subreaper:
        return 0
    n = 0
    with _live_lock:
        live = set(_live_groups)
        own_session = os.getsid(0)
        for pid in _children_of_self():
            if pid in live:
                continue
            if not _reap_everything:
                try:
                    if os.getsid(pid) == own_session:
                        continue
                except ProcessLookupError:
                    continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    n += 1
            except ChildProcessError:
                pass
    return n


def _group_of(pid: int) -> int | None:
    fields = _stat(pid)
    try:
        return int(fields[2]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def _reap_group(pgid: int, bound_seconds: float = 2.0) -> None:
    """Reap the swept group's members that were re-parented to us (a worker killed at its deadline leaves
    its watchdog and forked children here): SIGKILL reaches them asynchronously, so one pass can come before
    they exit and leave a zombie until the next run. Polled for at most `bound_seconds` in this run's own
    thread; then, as ever, the next reap takes what is left."""
    deadline = time.monotonic() + bound_seconds
    while True:
        reap_orphans()
        if not _subreaper or not any(_group_of(p) == pgid for p in _children_of_self()):
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.005)


def live_worker_groups() -> set[int]:
    with _live_lock:
        return set(_live_groups)


def kill_all_workers(grace_seconds: float) -> None:
    """SIGTERM every live worker group, then SIGKILL what is left after the grace period.

    The threads running those workers then see them exit and finish on their own."""
    groups = live_worker_groups()
    for pgid in groups:
        _killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while live_worker_groups() & groups and time.monotonic() < deadline:
        time.sleep(0.05)
    for pgid in live_worker_groups() & groups:
        _killpg(pgid, signal.SIGKILL)


class _Drain(threading.Thread):
    """Reads a pipe to EOF; keeps the head up to ``limit`` or only a tail."""

    def __init__(self, fd: int, limit: int, keep_tail: bool) -> None:
        super().__init__(daemon=True)
        self.fd, self.limit, self.keep_tail = fd, limit, keep_tail
        self.data = bytearray()
        self.total = 0

    def run(self) -> None:
        try:
            while True:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    break
                self.total += len(chunk)
                if self.keep_tail:
                    self.data += chunk
                    if len(self.data) > self.limit:
                        del self.data[: len(self.data) - self.limit]
                elif len(self.data) < self.limit:
                    self.data += chunk[: self.limit - len(self.data)]
        except OSError:
            pass
        finally:
            os.close(self.fd)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_exit_no_reap(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait until the leader has exited, without reaping it. True if it exited."""
    deadline = time.monotonic() + max(timeout, 0.0)
    pidfd, poller = None, None
    try:
        pidfd = os.pidfd_open(proc.pid)
        poller = select.poll()  # not select.select: that fails on a descriptor numbered 1024 or more
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):
        pass
    try:
        while True:
            try:
                info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return True
            if info is not None:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if poller is not None:
                poller.poll(max(1, int(remaining * 1000) + 1))
            else:  # pre-5.3 kernels: poll the child's state
                time.sleep(min(0.05, remaining))
    finally:
        if pidfd is not None:
            os.close(pidfd)


_life_lock = threading.Lock()
_life_pipe: tuple[int, int] | None = None


def _life_read_fd() -> int:
    """The read end of this process's life pipe, made once. Only this process holds the write end (os.pipe
    makes both close-on-exec; workers get the read end alone), so it reads EOF once this process is gone."""
    global _life_pipe  # noqa: PLW0603 - one pipe for the process's lifetime
    with _life_lock:
        if _life_pipe is None:
            _life_pipe = os.pipe()
        return _life_pipe[0]


# --- the live workers, recorded in the state directory ------------------------------------------------------
_registry_path: str | None = None
_registry: dict[int, dict[str, Any]] = {}


@functools.cache
def _boot_id() -> str:
    """This boot's id (it cannot change under a running process)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _proc_start(pid: int) -> tuple[int, int] | None:
    """(start time in clock ticks since boot, process group) of a live process; None when gone or a zombie."""
    fields = _stat(pid)
    if fields is None:
        return None
    try:
        if fields[0] in ("Z", "X"):
            return None
        return int(fields[19]), int(fields[2])
    except (IndexError, ValueError):
        return None


def _save_registry() -> None:
    if _registry_path is None:
        return
    try:  # no fsync: after a power cut no worker is left to reap
        statefile.write_atomic(_registry_path, json.dumps(list(_registry.values())), fsync=False)
    except OSError as exc:
        log.warning("cannot record the live workers in %s: %s", _registry_path, exc)


def track_workers(state_dir: str) -> int:
    """At daemon start: kill what an earlier daemon's recorded workers left (reap_recorded_workers), then
    record every worker from now on in ``state_dir``/workers.json. Returns the groups killed."""
    global _registry_path  # noqa: PLW0603 - the daemon's one state directory
    path = os.path.join(state_dir, WORKERS_FILE)
    killed = reap_recorded_workers(path)
    try:
        os.makedirs(state_dir, mode=0o755, exist_ok=True)
    except OSError as exc:
        log.warning("cannot make the state directory %s: %s", state_dir, exc)
    with _live_lock:
        _registry_path = path
        _save_registry()
    return killed


def reap_recorded_workers(path: str) -> int:
    """SIGKILL the process group of each worker recorded in ``path`` whose leader is still that process (the
    same pid, boot and /proc start time, and still its group's leader): orphans of a daemon that died
    without killing them. A recorded pid now used by another process is left alone. The groups killed."""
    entries = statefile.read_json(path, WORKERS_FILE, "orphaned workers of an earlier daemon are not reaped",
                                  expect=list)
    boot, killed = _boot_id(), 0
    for e in entries or ():
        try:
            pid, pgid, start, e_boot = int(e["pid"]), int(e["pgid"]), int(e["start_time"]), str(e["boot_id"])
        except (TypeError, KeyError, ValueError):
            statefile.drop(WORKERS_FILE, "wrong_shape", path, "an entry without pid, pgid, start_time, boot_id",
                           "that entry's worker is not reaped")
            continue
        if pid <= 1 or pgid <= 1 or pid == os.getpid() or e_boot != boot:
            continue
        if _proc_start(pid) != (start, pgid):
            continue
        log.warning("killing the process group %d of worker %d, left running by an earlier daemon", pgid, pid)
        _killpg(pgid, signal.SIGKILL)
        killed += 1
    return killed


def _register(proc: subprocess.Popen) -> None:
    """Called with _live_lock held."""
    if _registry_path is None:
        return
    facts = _proc_start(proc.pid)
    if facts is None:
        return
    _registry[proc.pid] = {"pid": proc.pid, "pgid": proc.pid, "start_time": facts[0], "boot_id": _boot_id()}
    _save_registry()


def _unregister(pid: int) -> None:
    """Called with _live_lock held."""
    if _registry.pop(pid, None) is not None:
        _save_registry()


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


def run_isolated(job: dict[str, Any], timeout_seconds: float, kill_grace_seconds: float = 2.0,
                 env: dict[str, str] | None = None) -> RunRecord:
    """Run one job (runner.job.build) in a worker; its run record, whatever happens to it."""
    name = job["name"]
    node = job["context"].get("node_name", "")
    started = time.time()
    t0 = time.monotonic()
    job = {**job, "context": {**job["context"], "deadline_monotonic": t0 + timeout_seconds}}
    data = json.dumps(job).encode()
    ooms_before = oom_kills()
    fds: list[int] = []
    _live_lock.acquire()  # reap_orphans must not see this child before it is registered
    try:  # out of descriptors or memory (EMFILE, ENFILE, ENOMEM, EAGAIN): a classified crash, never raised
        watch = _life_read_fd()
        r_res, w_res = os.pipe()
        fds += (r_res, w_res)
        r_out, w_out = os.pipe()
        fds += (r_out, w_out)
        proc = subprocess.Popen(
            module_command(WORKER_MODULE),
            stdin=subprocess.PIPE, stdout=w_out, stderr=w_out, pass_fds=(w_res, watch),
            env=worker_env({RESULT_FD_ENV: str(w_res), WATCH_FD_ENV: str(watch), PARENT_PID_ENV: str(os.getpid()),
                            **(env or {})}),
            start_new_session=True, close_fds=True,
        )
    except OSError as exc:
        _live_lock.release()
        for fd in fds:
            os.close(fd)
        return RunRecord(name, "crash", "spawn_failed", f"{type(exc).__name__}: {exc}"[:300], node=node,
                         started_at=started)
    _live_groups.add(proc.pid)
    try:
        _register(proc)
    finally:
        _live_lock.release()
    os.close(w_res)
    os.close(w_out)
    res_drain = _Drain(r_res, MAX_RESULT_BYTES + 1, keep_tail=False)
    out_drain = _Drain(r_out, OUTPUT_TAIL_BYTES, keep_tail=True)
    res_drain.start()
    out_drain.start()
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass

    timed_out = not _wait_exit_no_reap(proc, timeout_seconds)
    pgid = proc.pid
    if timed_out:
        _killpg(pgid, signal.SIGTERM)
        if not _wait_exit_no_reap(proc, kill_grace_seconds):
            _killpg(pgid, signal.SIGKILL)
            _wait_exit_no_reap(proc, 30.0)
    # Sweep anything left in the group (a child the probe forked) while the leader,
    # still unreaped, keeps the group ID from being reused.
    _killpg(pgid, signal.SIGKILL)
    status = proc.wait()
    with _live_lock:
        _live_groups.discard(pgid)
        _unregister(pgid)
    _reap_group(pgid)
    # Grandchildren that held our pipes are dead now; the drains reach EOF.
    res_drain.join(timeout=5)
    out_drain.join(timeout=5)
    seen = dict(node=node, started_at=started, wall_seconds=time.monotonic() - t0, exit_status=status,
                output_tail=redact_url(bytes(out_drain.data).decode("utf-8", "replace")))

    def crash(reason: str, detail: str) -> RunRecord:
        return RunRecord(name, "crash", reason, detail, **seen)

    if timed_out:
        return RunRecord(name, "timeout", "deadline", f"no result within {timeout_seconds:g}s", **seen)
    raw = bytes(res_drain.data)
    if status < 0 and not raw:
        try:
            signame = signal.Signals(-status).name
        except ValueError:
            signame = str(-status)
        ooms_after = oom_kills() if status == -signal.SIGKILL else None
        if ooms_before is not None and ooms_after is not None and ooms_after > ooms_before:
            return crash("oom_killed", "worker killed by the OOM killer (memory limit of the exporter's cgroup); "
                         "lower the probe's sizes or raise the limit")
        return crash("killed_by_signal", f"worker killed by {signame}")
    if len(raw) > MAX_RESULT_BYTES:
        return crash("result_too_large", f"result over {MAX_RESULT_BYTES} bytes")
    if not raw:
        return crash("exit_nonzero" if status else "bad_result", f"worker exited {status} without a result")
    try:
        run = RunRecord.from_json(json.loads(raw))
    except (ValueError, UnicodeDecodeError) as exc:  # RecordError is a ValueError
        return crash("bad_result", f"unreadable worker result: {exc}"[:200])
    if run.probe != name:
        return crash("bad_result", f"the worker answered for probe {run.probe!r}"[:200])
    run.detail = run.detail[:2000]
    for key, value in seen.items():
        setattr(run, key, value)
    return run
