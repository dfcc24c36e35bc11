"""A real fleetcanary daemon as a subprocess, for tests: the one way tests start, read and stop one.

    d = Daemon(tmp_path / "d", {"probes": {...}})                     # `python -m fleetcanary run` on 127.0.0.1
    d = Daemon(workdir, cfg, module="tests.support.fault_daemon")      # the same daemon with the fault probes
    d = Daemon(workdir, cfg, host=node.ip, port=9835, wrap=lambda argv: net.exec_argv(node, argv),
               new_session=True, isolated=True)                        # inside a network namespace
    d.metrics(); d.results(); d.history(); d.log(); d.rewrite(probes={...}); d.stop()

The config file is written from a dict (``state_dir`` and the listen address filled in unless the dict
says otherwise), output goes to a log file, and the constructor returns once /readyz answers 200, or
fails with the log's tail if the process exits first or the deadline passes. A daemon is in RUNNING
until stopped; tests/conftest.py stops what a test left running (a failed assertion, an exception
before the test's own stop).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from .helpers import StopWaiting, free_port, http_get, wait_for

ROOT = Path(__file__).resolve().parents[2]

# The deadline for a daemon to answer /readyz. A start takes about 0.5 s on a quiet 2-core machine (measured:
# 0.4-0.6 s from Popen to ready); beside two CPU burners and other xdist workers, a process gets a fraction of
# a core and may read its imports from a cold page cache, which costs tens of seconds at worst. 120 s is over
# 200 starts: only a hang reaches it. It bounds a hang; it is not a timing assertion.
READY_TIMEOUT_S = 120.0
# SIGTERM to exit: the daemon stops its scheduler and kills its workers' groups (worker_kill_grace_seconds,
# 1-5 s in tests) before it exits; 30 s covers that under load. Then SIGKILL.
STOP_TIMEOUT_S = 30.0

RUNNING: list[Daemon] = []


class Daemon:
    """`python -m MODULE run --config FILE [ARGS]` (MODULE: fleetcanary, or one that runs the same Daemon
    class, e.g. tests.support.fault_daemon), its files in ``workdir``.

    host, port      where it listens (port: a free one on 127.0.0.1 unless given)
    wrap            argv -> argv, e.g. `ip netns exec NS` or a shell that joins a cgroup and execs; the
                    wrapper must exec, so that the Popen's pid is the daemon's
    env             added to the test's environment
    args            more command-line arguments (--web.config.file FILE)
    isolated        python -I: only the installed package, never the test tree or the working directory
    new_session     its own session and process group; a SIGKILL at stop() then goes to the whole group
    ssl_context     the client context for an https listener (readiness and the helpers use it)
    ready           wait for /readyz in the constructor (False: call wait_ready() later)
    registered      in RUNNING, stopped after the test that started it; False for a daemon that outlives a
                    test, whose owner stops it (a module-scoped NamespaceNet's close())
    """

    def __init__(self, workdir: Path, config: dict | None = None, *, module: str = "fleetcanary",
                 host: str = "127.0.0.1", port: int | None = None,
                 wrap: Callable[[list[str]], list[str]] | None = None, env: dict | None = None,
                 args: Sequence[str] = (), isolated: bool = False, new_session: bool = False,
                 cwd: Path | None = None, ssl_context=None, ready: bool = True,
                 ready_timeout: float = READY_TIMEOUT_S, registered: bool = True) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host, self.port = host, port or free_port()
        server = {"listen_address": f"{host}:{self.port}", **(config or {}).get("server", {})}  # merged
        self.config = {"state_dir": str(self.workdir / "state"), **(config or {}), "server": server}
        self.state_dir = Path(self.config["state_dir"])
        self.config_path = self.workdir / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(self.config))
        self.log_path = self.workdir / "daemon.log"
        self.ssl_context = ssl_context
        self.url = f"{'https' if ssl_context is not None else 'http'}://{host}:{self.port}"
        self.new_session = new_session
        argv = [sys.executable, *(["-I"] if isolated else []), "-u", "-m", module, "run",
                "--config", str(self.config_path), *args]
        # appended: a daemon restarted in the same workdir keeps the first log; the daemon keeps its own descriptor
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(wrap(argv) if wrap else argv, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=cwd or ROOT, env={**os.environ, **(env or {})},
                                         start_new_session=new_session)
        if registered:
            RUNNING.append(self)
        if ready:
            try:
                self.wait_ready(ready_timeout)
            except BaseException:
                self.stop()
                raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def get(self, path: str, timeout: float = 10.0, headers: dict | None = None) -> tuple[int, dict, bytes]:
        return http_get(self.url + path, timeout=timeout, headers=headers, context=self.ssl_context)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise StopWaiting(f"the daemon at {self.url} exited {self.proc.returncode} before it was ready; "
                                  f"log:\n{self.log()[-3000:]}")
            return self.get("/readyz", timeout=2)[0] == 200
        try:
            wait_for(ready, timeout=timeout, interval=0.1, what=f"the daemon at {self.url} to be ready")
        except StopWaiting:
            raise
        except AssertionError as exc:
            raise AssertionError(f"{exc}; log:\n{self.log()[-3000:]}") from None

    def metrics(self) -> str:
        code, _, body = self.get("/metrics")
        assert code == 200, f"/metrics answered {code}: {body[:200]!r}"
        return body.decode()

    def results(self) -> dict:
        """GET /results: the latest record of each probe."""
        code, _, body = self.get("/results")
        assert code == 200, f"/results answered {code}: {body[:200]!r}"
        return json.loads(body)

    def history(self) -> list[dict]:
        """Every run the daemon appended to its results.jsonl (the current file; tests keep it small)."""
        p = self.state_dir / "results.jsonl"
        if not p.exists():
            return []
        out = []
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line being written right now
                pass
        return out

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def rewrite(self, probes: dict | None = None, **settings) -> None:
        """Change probes' sections and top-level settings in the config file (the daemon reads it on SIGHUP)."""
        self.config.update(settings)
        if probes:
            self.config["probes"] = {**self.config.get("probes", {}), **probes}
        self.config_path.write_text(yaml.safe_dump(self.config))

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then SIGKILL (to its process group when it has its own) after ``timeout``; the exit status."""
        if self in RUNNING:
            RUNNING.remove(self)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                if self.new_session:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                else:
                    self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def stop_all(timeout: float = 10.0) -> None:
    """Stop every daemon a test left running (tests/conftest.py, after each test)."""
    while RUNNING:
        RUNNING[0].stop(timeout=timeout)  # stop() takes it out of RUNNING
