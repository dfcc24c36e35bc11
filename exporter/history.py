"""Results history: every run appended as one JSON line to a bounded, rotating file.

results.jsonl rotates to results.jsonl.1 .. .N (oldest dropped) before a write
would take it over ``max_bytes``. A write that fails (read-only or full state
directory) raises HistoryError; the daemon counts it and keeps serving.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

FILENAME = "results.jsonl"


class HistoryError(Exception):
    pass


class History:
    def __init__(self, state_dir: str, max_bytes: int, backups: int) -> None:
        self.path = Path(state_dir) / FILENAME
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()

    def _rotate(self) -> None:
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
            return
        for i in range(self.backups - 1, 0, -1):
            src = self.path.with_name(f"{FILENAME}.{i}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{FILENAME}.{i + 1}"))
        if self.path.exists():
            os.replace(self.path, self.path.with_name(f"{FILENAME}.1"))

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, allow_nan=False, default=str) + "\n").encode()
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                size = self.path.stat().st_size if self.path.exists() else 0
                if size and size + len(line) > self.max_bytes:
                    self._rotate()
                    size = 0
                # One write() of the whole line under O_APPEND: a reader never sees half a record
                # from us, and a failed write leaves the file as it was before it.
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    n = os.write(fd, line)
                    if n != len(line):
                        os.ftruncate(fd, size)
                        raise HistoryError(f"{self.path}: No space left on device (wrote {n} of {len(line)} bytes; "
                                           "undone)")
                finally:
                    os.close(fd)
            except OSError as exc:
                raise HistoryError(f"{self.path}: {exc.strerror or exc}") from None


def read(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of one history file, oldest first; lines that do not parse are skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out
