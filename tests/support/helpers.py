"""Test helpers: required binaries (a skip, or a failure under CI=true), HTTP, probe jobs; polling with a
deadline and free ports are harness/'s, re-exported here."""
from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

from harness.http import http_get  # noqa: F401 - the tests' HTTP GET, shared with harness's servers
from harness.poll import StopWaiting, wait_for  # noqa: F401 - the tests' way to wait, shared with benchmarks/
from harness.ports import free_port  # noqa: F401 - the tests' free port, shared with benchmarks/


def require_binary(name: str) -> str:
    """The binary's path. Missing: fail under CI=true, skip otherwise."""
    path = shutil.which(name)
    if not path:
        unavailable(f"{name} is not installed (Debian package; `make test` installs it as root)")
    return path


TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".tools", "bin")


def require_tool(name: str) -> str:
    """A tool with no Debian package (helm), pinned and verified into .tools/bin by `make tools`; else PATH.
    Missing: fail under CI=true, skip otherwise."""
    path = os.path.join(TOOLS, name)
    if os.access(path, os.X_OK):
        return path
    path = shutil.which(name)
    if not path:
        unavailable(f"{name} is not installed (`make tools` fetches the pinned, verified build into .tools/bin)")
    return path


def unavailable(msg: str) -> NoReturn:
    """Something a test needs is missing: fail under CI=true (CI must run everything), skip otherwise."""
    if os.environ.get("CI") == "true":
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg, allow_module_level=True)


def metric_value(text: str, name: str, **labels) -> float | None:
    """The first sample called `name` (e.g. fleetcanary_probe_runs_total) whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


def probe_ctx(state_dir, node_name: str = "t") -> dict:
    """A ProbeContext for a worker (less the deadline, which the runner sets)."""
    return {"node_name": node_name, "state_dir": str(state_dir), "gpu": {}, "kube": {}}


def run_job(cls, params: dict, state_dir, timeout_seconds: float, kill_grace_seconds: float = 2.0,
            env: dict | None = None, collect_gpu_facts: bool = False, name: str | None = None):
    """Run one probe class in a real isolated worker, as the daemon does; its RunRecord."""
    from fleetcanary.runner import job
    from fleetcanary.runner.isolation import run_isolated

    j = job.build(name or cls.name, cls, params, probe_ctx(state_dir), collect_gpu_facts=collect_gpu_facts)
    return run_isolated(j, timeout_seconds, kill_grace_seconds, env=env)
