"""The one reader and writer of the files the daemon keeps in its state directory.

The state directory outlives the pod (overlays/host-state keeps it on the host), so anything in it can be
torn by a power cut, edited by a person, planted by another user, or written by a future or past version.
Reading never raises: a file that is absent is None; one that is not a regular file, too large, not UTF-8,
not JSON, nested past a bound, or (checked by the caller) of the wrong shape is dropped with one log line
and counted in `ERRORS` ({file, kind}), which the daemon publishes as `fleetcanary_state_errors_total`.

Writing never follows a link: the temporary file is created exclusively with O_NOFOLLOW (a planted link or
a stale temporary of another process is removed, never written through), written, fsynced, renamed over
the target, and the directory is fsynced, so a crash leaves the old content or the new one, never half and
never a file elsewhere. Appends (results.jsonl, figures.jsonl) open with O_NOFOLLOW too.

`check_dir` refuses a directory another user could plant files in (group- or world-writable, or owned by
someone else), and `DirLock` keeps a second daemon off a directory the first one holds.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import stat
import threading
from collections import Counter
from pathlib import Path
from typing import Any

# the two primitives every state file goes through (probes/lib: the probes that keep state use them too)
from fleetcanary.probes.lib.safefile import read_raw, write_atomic  # noqa: F401 - write_atomic re-exported

log = logging.getLogger("fleetcanary.state")

MAX_BYTES = 64 << 20     # no state file the daemon writes comes near this; a larger one is junk
MAX_DEPTH = 32           # the deepest state file the daemon writes nests 4 levels
LOCK_FILE = ".lock"

# kind: why a file or a line was set aside (a fixed set: they are label values)
KINDS = ("unreadable", "not_a_file", "symlink", "too_large", "not_utf8", "not_json", "too_deep", "wrong_shape",
         "future")


class Tally:
    """Thread-safe counts by key, read by the collector at each render. Keys become label values, so each is
    checked against a fixed set (``valid``)."""

    def __init__(self, valid) -> None:
        self._valid = valid
        self._lock = threading.Lock()
        self._counts: Counter = Counter()

    def count(self, key, n: int = 1) -> None:
        assert self._valid(key), key
        with self._lock:
            self._counts[key] += n

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._counts)

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()


class _Errors(Tally):
    """Counts of state set aside, by (file, kind)."""

    def __init__(self) -> None:
        super().__init__(lambda key: key[1] in KINDS)

    def count(self, file: str, kind: str, n: int = 1) -> None:  # type: ignore[override]
        super().count((file, kind), n)


ERRORS = _Errors()


def drop(file: str, kind: str, path: str | Path, detail: str, consequence: str, n: int = 1) -> None:
    """Count what was set aside (n things of one kind) and say so in one line."""
    ERRORS.count(file, kind, n)
    log.warning("state %s: %s set aside (%s: %s); %s", file, path, kind, detail, consequence)


def number(value: Any) -> float | None:
    """A finite JSON number as a float; None for anything else (a bool, a string, NaN, Infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:  # an integer too large for a float
        return None
    return f if math.isfinite(f) else None


def lines(raw: bytes, file: str, path: str | Path, consequence: str, max_depth: int = MAX_DEPTH,
          bad: Counter[str] | None = None):
    """(line number, value) of each JSON line of a file's bytes; a line that is not UTF-8, not JSON or too
    deep is counted and logged (one line per file: the first such line and how many), never raised. ``bad``
    gets the counts by kind too, for a caller that keeps its own."""
    found: Counter[str] = Counter()
    first = ""
    for n, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        value, kind, detail = parse_json(line, max_depth)
        if kind:
            found[kind] += 1
            first = first or f"line {n}: {kind}: {detail}"
            continue
        yield n, value
    for kind, k in found.items():
        ERRORS.count(file, kind, k)
    if found:
        log.warning("state %s: %s: %d lines set aside (%s); %s", file, path, sum(found.values()), first, consequence)
        if bad is not None:
            bad.update(found)


def depth(obj: Any, limit: int = MAX_DEPTH) -> int:
    """How deep the containers nest, stopping once past `limit` (no recursion: a hostile file cannot
    exhaust the stack)."""
    deepest = 0
    stack = [(obj, 1)]
    while stack:
        cur, d = stack.pop()
        if isinstance(cur, (list, dict)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((v, d + 1) for v in (cur.values() if isinstance(cur, dict) else cur))
    return deepest


def parse_json(raw: bytes | str, max_depth: int = MAX_DEPTH) -> tuple[Any, str | None, str]:
    """(value, None, "") or (None, kind, detail). Never raises."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return None, "not_utf8", f"byte {e.start}"
    try:
        value = json.loads(raw)
    except RecursionError:
        return None, "too_deep", f"nested past the parser's limit (> {max_depth})"
    except ValueError as e:
        return None, "not_json", str(e).splitlines()[0][:120]
    if depth(value, max_depth) > max_depth:
        return None, "too_deep", f"nested past {max_depth} levels"
    return value, None, ""


def read_bytes(path: str | Path, file: str, consequence: str, max_bytes: int = MAX_BYTES,
               why: list[str] | None = None) -> bytes | None:
    """The file's bytes; None when absent or set aside (counted, one line; its kind appended to `why`).
    Never follows a link."""
    data, kind, detail = read_raw(path, max_bytes)
    if kind:
        drop(file, kind, path, detail, consequence)
        if why is not None:
            why.append(kind)
    return data


def read_json(path: str | Path, file: str, consequence: str, expect: type | tuple[type, ...] = (list, dict),
              max_bytes: int = MAX_BYTES) -> Any:
    """The file's JSON value when it is of type `expect`; None when absent or set aside (counted, one line)."""
    raw = read_bytes(path, file, consequence, max_bytes)
    if raw is None:
        return None
    value, kind, detail = parse_json(raw)
    if kind:
        drop(file, kind, path, detail, consequence)
        return None
    if not isinstance(value, expect):
        drop(file, "wrong_shape", path, f"a JSON {type(value).__name__}, not {_names(expect)}", consequence)
        return None
    return value


def _names(expect) -> str:
    types = expect if isinstance(expect, tuple) else (expect,)
    return " or ".join({list: "a list", dict: "an object"}.get(t, t.__name__) for t in types)


def open_append(path: str | Path, mode: int = 0o644) -> int:
    """A descriptor appending to the file, created if needed, never through a link (OSError ELOOP)."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)


def append(path: str | Path, data: bytes, file: str, mode: int = 0o644) -> int:
    """Append `data` in one write() under O_APPEND, never through a link: a link planted in the file's place
    is counted, removed (unlink removes the link, never its target) and the file made afresh. Returns the
    bytes written: fewer than len(data) on a full disk, and then undone (the file is as it was). OSError
    propagates."""
    path = Path(path)
    try:
        fd = open_append(path, mode)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        drop(file, "symlink", path, "a symbolic link in the file's place, removed, not followed",
             "writing a new file in its place")
        os.unlink(path)
        fd = open_append(path, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device planted in its place: O_NOFOLLOW does not refuse those
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        n = os.write(fd, data)
        if n != len(data):
            os.ftruncate(fd, st.st_size)
        return n
    finally:
        os.close(fd)


class StateDirError(Exception):
    """The state directory cannot be used safely; the message is one line."""


def check_dir(path: str | Path, uid: int | None = None) -> None:
    """Refuse a state directory another user could plant files in: one not owned by this user, or group- or
    world-writable (the sticky bit does not help: the daemon's own names are predictable). A missing
    directory is created 0700. Raises StateDirError."""
    path = Path(path)
    uid = os.geteuid() if uid is None else uid
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise StateDirError(f"state directory {path}: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode):
        raise StateDirError(f"state directory {path}: is a symbolic link; give the real path")
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"state directory {path}: not a directory")
    if st.st_uid != uid and _kubelet_volume(st):
        log.info("state directory %s: a volume Kubernetes handed to this pod (owner root, group %d by fsGroup, "
                 "setgid); only the pod's containers and root reach it", path, st.st_gid)
        return
    if st.st_uid != uid:
        raise StateDirError(f"state directory {path}: owned by uid {st.st_uid}, not this user ({uid}); "
                            f"chown it to {uid}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateDirError(f"state directory {path}: writable by group or others (mode "
                            f"{stat.S_IMODE(st.st_mode):04o}); chmod go-w it")


def _kubelet_volume(st: os.stat_result) -> bool:
    """An emptyDir (or other volume) whose ownership the kubelet set from the pod's fsGroup: owned by root,
    group this process's group, setgid. The kubelet makes it 0777 (2777); its parent,
    /var/lib/kubelet/pods/<uid>/volumes, is root's only, so no other user of the host can plant files in it."""
    return st.st_uid == 0 and os.geteuid() != 0 and st.st_gid in (os.getegid(), *os.getgroups()) \
        and bool(st.st_mode & stat.S_ISGID)


class StateLocked(Exception):
    """Another process holds the state directory; the message is one line."""


class DirLock:
    """An exclusive flock on `<state dir>/.lock`, held for the daemon's life (the kernel drops it when the
    process dies, so a SIGKILLed daemon never leaves a stale lock). The holder's PID is written in the file
    for the message a second daemon prints."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Hold the lock, or StateLocked (one line). The lock is held on a read-only descriptor: a descriptor
        open for writing would keep the state directory's filesystem from being remounted read-only. A
        directory that cannot be written at all (read-only filesystem, no write permission) is not locked:
        no daemon can write in it, so none can overwrite another's state."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
        except OSError as e:
            if e.errno in (errno.EROFS, errno.EACCES):
                log.warning("state directory %s cannot be written (%s); not locked, nothing in it will be kept",
                            self.path.parent, e.strerror or e)
                return
            raise StateLocked(f"state directory lock {self.path}: {e.strerror or e}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = ""
            try:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            except OSError:
                pass
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                who = f" (pid {holder})" if holder.isdigit() else ""
                raise StateLocked(f"state directory {self.path.parent} is in use by another fleetcanary "
                                  f"daemon{who}; one daemon per state directory") from None
            raise StateLocked(f"state directory lock {self.path}: {e.strerror or e}") from None
        try:  # the holder's PID, for the message a second daemon prints; the lock does not depend on it
            wfd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                os.ftruncate(wfd, 0)
                os.pwrite(wfd, f"{os.getpid()}\n".encode(), 0)
            finally:
                os.close(wfd)
        except OSError:
            pass
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
