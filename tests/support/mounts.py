"""Small tmpfs mounts for storage failure tests (read-only, no inodes). Needs root."""
import contextlib
import os
import subprocess

from .helpers import unavailable


@contextlib.contextmanager
def tmpfs(path, options: str):
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        msg = f"cannot mount tmpfs ({r.stderr.strip()}); these tests need root"
        unavailable(msg)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
