"""Version and build identity."""
from __future__ import annotations

import functools
import os
import subprocess
from importlib import metadata
from pathlib import Path


@functools.lru_cache(maxsize=1)
def version() -> str:
    try:
        return metadata.version("fleetcanary")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit this code came from: FLEETCANARY_GIT_COMMIT (set at image build), else git."""
    env = os.environ.get("FLEETCANARY_GIT_COMMIT")
    if env:
        return env
    root = Path(__file__).resolve().parent.parent
    if (root / ".git").exists():
        try:
            out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                                 capture_output=True, text=True, timeout=5)
            if out.returncode == 0:
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return "unknown"
