"""A server process the harness started, stopped: SIGTERM, then SIGKILL if it is still there after ``timeout``."""
from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Terminate `proc` (if it still runs) and reap it; kill it when it outlives `timeout` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
