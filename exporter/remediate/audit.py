"""The audit log: one JSON object per line for every decision (an action, a would-be action in dry-run, a
refusal), appended with O_APPEND in a single write, so lines of two writers never interleave and nothing
earlier is ever rewritten. A write that fails is counted and logged; the decision itself stands."""
from __future__ import annotations

import json
import logging
import os
import threading

log = logging.getLogger("fleetcanary.remediate.audit")


class Audit:
    def __init__(self, path: str, on_error=None) -> None:
        self.path = path
        self.on_error = on_error or (lambda: None)
        self._lock = threading.Lock()

    def write(self, record: dict) -> None:
        if not self.path:
            return
        line = (json.dumps(record, sort_keys=True, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
            except OSError as exc:
                log.error("audit log %s: cannot append: %s", self.path, exc.strerror or exc)
                self.on_error()
