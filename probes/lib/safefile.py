"""Files a probe or the daemon keeps in the state directory, read and replaced without ever following a link.

The state directory outlives the pod and is the one place another process could plant a link (to a file the
daemon's user can write) or a FIFO (to hang a reader). These two primitives are the only way fleetcanary
reads or replaces a file there: the exporter's core/statefile (which adds counting and logging) and the
probes that keep state of their own (the inference canary's rotation and stability, the SDC goldens) use
them. Probes import nothing of the exporter, so they live here.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def read_raw(path: str | Path, max_bytes: int, follow_links: bool = False) -> tuple[bytes | None, str, str]:
    """(bytes, "", "") of a regular file of at most ``max_bytes``; (None, "", "") when absent; else (None, kind,
    detail) with a kind of KINDS. Never blocks on a FIFO, never follows a link unless ``follow_links`` (a
    config in a Kubernetes ConfigMap is one), never counts or logs: the caller says what it means."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None, "", ""
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, "symlink", "a symbolic link, not followed"
        if e.errno == errno.EISDIR:
            return None, "not_a_file", "a directory"
        return None, "unreadable", e.strerror or str(e)
    except ValueError as e:  # a NUL in the path
        return None, "unreadable", str(e)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not_a_file", "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        if st.st_size > max_bytes:
            return None, "too_large", f"{st.st_size} bytes > {max_bytes}"
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:  # it grew while we read
                return None, "too_large", f"more than {max_bytes} bytes"
            chunks.append(chunk)
        return b"".join(chunks), "", ""
    except OSError as e:
        return None, "unreadable", e.strerror or str(e)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: str | bytes, fsync: bool = True, mode: int = 0o644) -> None:
    """Replace the file in one step without following a link: an exclusive, O_NOFOLLOW temporary beside
    it, written and (by default) fsynced, renamed over the target (a rename replaces a link, it does not
    follow it), then the directory fsynced. OSError propagates; the temporary never stays behind."""
    path = Path(path)
    body = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode)
    except FileExistsError:  # a stale temporary of a dead process with our PID, or something planted
        os.unlink(tmp)       # unlink removes a link itself, never its target
        fd = os.open(tmp, flags, mode)
    try:
        try:
            view = memoryview(body)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        _fsync_dir(path.parent)


def private_dir(path: str | Path) -> bool:
    """Make (0700) or accept a subdirectory of the state directory for a probe's files: True when it is a
    real directory of this user, False (nothing to write into) when something else is in its place, a link
    above all (O_NOFOLLOW guards only a path's last component)."""
    path = Path(path)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
