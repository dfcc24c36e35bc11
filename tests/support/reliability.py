"""Reliability test helpers: the fault daemon as a subprocess, /proc facts, a memory cgroup."""
from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from fleetcanary.probes import PROBES
from tests.support.daemon import Daemon
from tests.support.fault_probes import FAULT_PROBES
from tests.support.helpers import pid_alive, unavailable, wait_for

FULL = os.environ.get("FLEETCANARY_SOAK") == "full"


def scaled(short, full):
    """The shortened value under `make test`, the full one under `make soak`."""
    return full if FULL else short


def fault_daemon(tmp: Path, probes: dict, extra: dict | None = None, cgroup_procs: str | None = None,
                 env: dict | None = None) -> Daemon:
    """`fleetcanary run` with the fault probes (tests/support/fault_daemon.py) on 127.0.0.1, its files in
    ``tmp``; only the probes named in ``probes`` run. ``cgroup_procs``: the daemon joins that cgroup first."""
    config = {"worker_kill_grace_seconds": 1.0,
              # only the probes the test names run (the fault probes are enabled by default)
              "probes": {**{n: {"enabled": False} for n in (*PROBES, *FAULT_PROBES)}, **probes},
              **(extra or {})}
    wrap = None
    if cgroup_procs:
        def wrap(argv):
            return ["sh", "-c", f'echo $$ > "{cgroup_procs}" && exec "$0" "$@"', *argv]
    return Daemon(tmp, config, module="tests.support.fault_daemon", wrap=wrap, env=env)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def children(pid: int) -> dict[int, str]:
    """Direct children of pid: pid -> state letter."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            out[int(d)] = fields[0]
    return out


def pids_in(pid_dir: Path) -> list[int]:
    return [int(x) for f in pid_dir.iterdir() for x in f.read_text().split()]


def leaked(pids: list[int]) -> list[int]:
    """The recorded probe PIDs still running as fleetcanary workers. Over thousands of runs the kernel reuses
    PIDs, so a live PID alone proves nothing: it must also still be a worker (or a child forked from one)."""
    out = []
    for p in pids:
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if pid_alive(p) and b"fleetcanary.runner.worker" in cmd:
            out.append(p)
    return out


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int):
    """A memory cgroup with a hard limit (v1 or v2); yields its cgroup.procs path."""
    name = f"fleetcanary-test-{uuid.uuid4().hex[:8]}"
    v1 = Path("/sys/fs/cgroup/memory")
    v2 = Path("/sys/fs/cgroup")
    if (v1 / "memory.limit_in_bytes").exists():
        path, limit_file = v1 / name, "memory.limit_in_bytes"
    elif (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.subtree_control").read_text():
        path, limit_file = v2 / name, "memory.max"
    else:
        unavailable("no writable memory cgroup (v1 memory controller or v2 with memory delegated)")
    try:
        path.mkdir()
        (path / limit_file).write_text(str(limit_bytes))
        if (path / "memory.swappiness").exists():
            (path / "memory.swappiness").write_text("0")
    except OSError as exc:
        unavailable(f"cannot create a memory cgroup: {exc}")
    try:
        yield str(path / "cgroup.procs")
    finally:
        def empty():
            try:
                return not (path / "cgroup.procs").read_text().strip()
            except OSError:
                return True
        wait_for(empty, timeout=30, interval=0.2, what="the test cgroup to empty")
        with contextlib.suppress(OSError):
            path.rmdir()


def runs_of(text: str, probe: str) -> float:
    """Runs of a probe, whatever their outcome: how often the daemon ran it, not how fast the machine is."""
    from tests.support.helpers import metric_value

    return sum(metric_value(text, "fleetcanary_probe_runs_total", probe=probe, outcome=o) or 0
               for o in ("success", "failure", "timeout", "crash", "skipped"))
