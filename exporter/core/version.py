"""Version and build identity.

The commit comes from, in order: FLEETCANARY_GIT_COMMIT (an image or a unit may set it),
the ``_build.json`` the wheel and the sdist carry (written at build time by setup.py),
and, for a development checkout installed in editable mode, ``git rev-parse`` there.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
from importlib import metadata, resources


@functools.lru_cache(maxsize=1)
def version() -> str:
    try:
        return metadata.version("fleetcanary")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    env = os.environ.get("FLEETCANARY_GIT_COMMIT")
    if env:
        return env
    package = resources.files("fleetcanary")
    try:
        built = json.loads((package / "_build.json").read_text())
        if isinstance(built, dict) and built.get("commit"):
            return str(built["commit"])
    except (OSError, ValueError):
        pass
    try:
        with resources.as_file(package) as where:
            out = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"],
                                 capture_output=True, text=True, timeout=5)
        if out.returncode == 0:
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"
