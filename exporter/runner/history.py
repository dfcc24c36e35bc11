"""Results history: every run appended as one JSON line to a bounded, rotating file,
and the one reader of run records from files.

results.jsonl rotates to results.jsonl.1 .. .N (oldest dropped) before a write
would take it over ``max_bytes``. A write that fails (read-only or full state
directory) raises HistoryError; the daemon counts it and keeps serving.

``read`` loads run records from a history file (rotated ones too) or from the output of
`fleetcanary once --json`, either optionally gzip-compressed; compare and report load
results through it.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from fleetcanary.core import statefile
from fleetcanary.core.record import RecordError, RunRecord
from fleetcanary.core.textfile import TextFileError, read_text

FILENAME = "results.jsonl"


class HistoryError(Exception):
    """A history file that cannot be written or read; the message is one line."""


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
            if os.path.lexists(src):  # a rename moves a link itself; nothing is written through one
                os.replace(src, self.path.with_name(f"{FILENAME}.{i + 1}"))
        if os.path.lexists(self.path):
            os.replace(self.path, self.path.with_name(f"{FILENAME}.1"))

    def append(self, run: RunRecord) -> None:
        line = (json.dumps(run.to_json(), allow_nan=False, default=str) + "\n").encode()
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    size = os.lstat(self.path).st_size  # never a link's target
                except FileNotFoundError:
                    size = 0
                if size and size + len(line) > self.max_bytes:
                    self._rotate()
                    size = 0
                # One write() of the whole line under O_APPEND, never through a link (core/statefile: a link
                # planted in its place is removed and counted): a reader never sees half a record from us.
                n = statefile.append(self.path, line, FILENAME)
                if n != len(line):
                    raise HistoryError(f"{self.path}: No space left on device (wrote {n} of {len(line)} bytes; "
                                       "undone)")
            except OSError as exc:
                raise HistoryError(f"{self.path}: {exc.strerror or exc}") from None


def _objects(obj: Any, where: str) -> list[Any]:
    if isinstance(obj, dict) and isinstance(obj.get("runs"), list):
        return obj["runs"]
    if isinstance(obj, dict) and "probe" in obj and "outcome" in obj:
        return [obj]
    raise HistoryError(f"{where}: not a fleetcanary result (expected history lines or `once --json` output)")


def parse(text: str, source: str) -> list[RunRecord]:
    """Run records of one file's text, in file order. A history file whose last line was
    torn (a crash mid-write on a filesystem without atomic appends) keeps every whole line
    before it; any other line that is not a run record is an error naming the line."""
    stripped = text.strip()
    if not stripped:
        raise HistoryError(f"{source}: empty file")
    try:
        entries = [(source, o) for o in _objects(json.loads(stripped), source)]
    except json.JSONDecodeError:
        lines = text.splitlines()
        entries = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entries += [(f"{source}:{n}", o) for o in _objects(json.loads(line), f"{source}:{n}")]
            except json.JSONDecodeError as exc:
                if n == len(lines) and not text.endswith("\n") and entries:
                    break  # the torn last line of an interrupted append
                raise HistoryError(f"{source}:{n}: not JSON ({exc.msg})") from None
    out = []
    for where, obj in entries:
        try:
            out.append(RunRecord.from_json(obj, source=source))
        except RecordError as exc:
            raise HistoryError(f"{where}: not a run record: {exc}") from None
    return out


def read(path: str | os.PathLike) -> list[RunRecord]:
    """Run records of one file, in file order; HistoryError with one line for a bad file."""
    try:
        text = read_text(path)
    except TextFileError as exc:
        raise HistoryError(str(exc)) from None
    return parse(text, str(path))
