"""Starting a module of this package in a fresh interpreter.

Isolated mode (``-I``) keeps the working directory, PYTHONPATH and the user's
site-packages off the child's import path: a stray ``probes/`` or ``fleetcanary/``
folder where the daemon happens to run cannot shadow the installed package, and
the child imports exactly the installation its parent runs from. ``-I`` also ignores
PYTHONUNBUFFERED, so ``-u`` keeps the child's output unbuffered: a worker killed at its
deadline still leaves what it printed in the output tail.
"""
from __future__ import annotations

import sys


def module_command(module: str) -> list[str]:
    return [sys.executable, "-I", "-u", "-m", module]
