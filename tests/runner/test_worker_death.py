"""A worker started by a parent that is already gone exits at once (the PR_SET_PDEATHSIG race: the signal is only
armed once the worker runs, so it checks getppid() afterwards), and one without a daemon's environment runs as
before."""
import json
import os
import subprocess
import time

from fleetcanary.probes.lib.spawn import module_command
from fleetcanary.runner import job
from tests.support.fault_probes import FAULT_PROBES
from tests.support.helpers import probe_ctx

PARENT_PID_ENV = "FLEETCANARY_PARENT_PID"  # runner.job.PARENT_PID_ENV, spelled out: the contract with the worker


def run_worker(tmp_path, extra_env: dict) -> tuple[int, bytes]:
    j = job.build("ok", FAULT_PROBES["ok"], {}, probe_ctx(tmp_path), collect_gpu_facts=False)
    j["context"]["deadline_monotonic"] = time.monotonic() + 120  # as run_isolated sets it
    r, w = os.pipe()
    try:
        p = subprocess.Popen(module_command(job.WORKER_MODULE), stdin=subprocess.PIPE, pass_fds=(w,),
                             env={**os.environ, job.RESULT_FD_ENV: str(w), **extra_env}, start_new_session=True)
        os.close(w)
        p.communicate(json.dumps(j).encode(), timeout=120)
        with os.fdopen(r, "rb") as f:
            return p.returncode, f.read()
    finally:
        try:
            os.close(w)
        except OSError:
            pass


def test_a_worker_whose_parent_is_already_gone_exits_without_running(tmp_path):
    not_parent = os.getppid()  # alive, but not the worker's parent: as if the daemon died and it was re-parented
    code, result = run_worker(tmp_path, {PARENT_PID_ENV: str(not_parent)})
    assert (code, result) == (1, b"")


def test_a_worker_of_a_live_parent_runs(tmp_path):
    code, result = run_worker(tmp_path, {PARENT_PID_ENV: str(os.getpid())})
    assert code == 0 and json.loads(result)["outcome"] == "success"
