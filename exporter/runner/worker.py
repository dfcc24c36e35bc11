"""The worker: runs one probe in a child process and writes its result as JSON.

Started by ``fleetcanary.runner.isolation`` as ``python -I -m fleetcanary.runner.worker``
in a new process group. The job arrives as JSON on stdin; the run record goes to the
file descriptor in FLEETCANARY_RESULT_FD, so nothing a probe prints can corrupt it.
stdout and stderr are drained by the parent and only their tail is kept.

This is the only place where torch, NVML and network targets are touched.
"""
from __future__ import annotations

import ctypes
import importlib
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

from fleetcanary.core import environment
from fleetcanary.core.record import RunRecord
from fleetcanary.probes.base import ProbeContext, ProbeError, ProbeSkipped, ProbeTimeout
from fleetcanary.probes.lib.redact import redact_url
from fleetcanary.runner.job import PARENT_PID_ENV, RESULT_FD_ENV, WATCH_FD_ENV

PR_SET_PDEATHSIG = 1


def _load_class(path: str):
    module, _, qual = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


SECRET_KEYS = ("password", "secret", "api_key", "apikey", "token", "authorization")


def redact(v: Any, key: str = "") -> Any:
    if isinstance(v, dict):
        if key == "headers":
            return {str(k): "<redacted>" for k in v}
        return {str(k): redact(x, str(k)) for k, x in v.items()}
    if isinstance(v, list):
        return [redact(x, key) for x in v]
    if isinstance(v, str) and key.lower() in SECRET_KEYS:
        return "<redacted>"
    if isinstance(v, str):
        return redact_url(v)  # a base_url's user:password@, a presigned URL's signature
    return v


def _samples(result) -> list[dict[str, Any]]:
    return [{"metric": s.metric, "labels": s.labels, "value": s.value} for s in result.samples]


def execute(job: dict[str, Any]) -> RunRecord:
    t0 = time.monotonic()
    throttle_before = environment.cpu_throttling()
    run = RunRecord(probe=job["name"], outcome="crash", node=job["context"].get("node_name", ""))
    for path in job.get("import_path") or ():
        if path not in sys.path:  # a probe class from outside the package (tests register their own)
            sys.path.append(path)
    cls = _load_class(job["class"])
    probe = cls()
    config = cls.Config.model_validate(job.get("params", {}))
    ctx = ProbeContext(**job["context"])
    try:
        result = probe.run(config, ctx)
        run.outcome = "success"
        run.samples = _samples(result)
        run.result = result.to_dict()
    except ProbeSkipped as exc:
        run.outcome, run.reason, run.detail = "skipped", exc.reason, exc.detail
    except ProbeTimeout as exc:
        run.outcome, run.reason, run.detail = "timeout", exc.reason, exc.detail or str(exc)
    except ProbeError as exc:
        run.outcome = "failure"
        run.reason = exc.reason if exc.reason in cls.all_failure_reasons() else "other"
        run.detail = exc.detail or str(exc)
        if exc.result is not None:
            run.samples = _samples(exc.result)
            run.result = exc.result.to_dict()
    except Exception as exc:  # noqa: BLE001 - a probe bug is classified as a crash, never raised
        run.outcome, run.reason, run.detail = "crash", "exception", f"{type(exc).__name__}: {exc}"
        traceback.print_exc(limit=8)  # into the output tail the runner keeps
    run.probe_seconds = time.monotonic() - t0
    # The settings the run used, so results say what they measured and `compare` can refuse
    # incomparable pairs; header values and anything named like a secret are redacted.
    run.result["config"] = redact(config.model_dump(mode="json"))
    # URLs recorded anywhere else (parameters, touched, extra, an error's detail) lose their secrets too.
    run.result = redact(run.result)
    run.detail = redact_url(run.detail)
    env = environment.collect(with_gpu=job.get("collect_gpu_facts", True))
    env.update(environment.throttling_delta(throttle_before, environment.cpu_throttling()))
    run.environment = env
    return run


def die_with_parent() -> int | None:
    """The worker and its whole process group never outlive the daemon, even one killed by SIGKILL.

    PR_SET_PDEATHSIG kills this process when its parent goes; getppid() is checked after it is set, for a
    parent that went before. That signal reaches this process only, so a watchdog forked into our process
    group (rank subprocesses of collectives live here too) waits on the daemon's life pipe and kills the
    whole group at its EOF: only the daemon holds the write end. Outside a daemon (no env) nothing is done.
    Returns the watchdog's pid, for `end_watchdog`."""
    parent = os.environ.pop(PARENT_PID_ENV, None)
    watch = os.environ.pop(WATCH_FD_ENV, None)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if parent and parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)  # the daemon went before the death signal was set
    if not (watch and watch.isdigit()):
        return None
    fd = int(watch)
    pid = os.fork()
    if pid != 0:
        os.close(fd)  # only the watchdog holds it
        return pid
    try:  # the watchdog: nothing but the pipe open (no pipe of the daemon's is held by it)
        null = os.open(os.devnull, os.O_RDWR)
        for std in (0, 1, 2):
            os.dup2(null, std)
        os.closerange(3, fd)
        os.closerange(fd + 1, 1 << 20)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a group SIGTERM at the deadline is for the probe
        while True:
            try:
                if not os.read(fd, 1):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)


def end_watchdog(pid: int | None) -> None:
    """A worker that finished ends and reaps its own watchdog: left to the group sweep, the watchdog would be
    re-parented to the daemon (a subreaper) and linger there as a zombie until the next run's reap."""
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def main() -> int:
    watchdog = die_with_parent()
    # Under memory pressure the kernel should kill a probe worker, never the daemon that serves
    # /metrics: raising our own OOM score needs no privilege.
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    fd = int(os.environ[RESULT_FD_ENV])
    job = json.load(sys.stdin)
    data = json.dumps(execute(job).to_json(with_samples=True), allow_nan=False).encode()
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    # The result is complete: skip interpreter teardown (torch, gloo and CUDA atexit hooks can take
    # seconds on a busy node and push a finished run past its deadline). The runner sweeps the
    # process group after the leader exits, so nothing forked by the probe outlives it.
    sys.stdout.flush()
    sys.stderr.flush()
    end_watchdog(watchdog)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
