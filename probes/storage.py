"""File storage: first byte and sequential read (cold and hot), 4 KiB random-read
latency, write and fsync, a small-files pass, and a checkpoint save and restore, per
configured target directory (local NVMe, a PVC, an NFS mount).

Cold reads evict the probe's own file from the page cache with
posix_fadvise(DONTNEED) after fsync, or read with O_DIRECT (``cold_method``), so
nothing but this file is affected. The probe works only inside
``TARGET/.fleetcanary/NODE/`` and removes it at the end of every run; a run killed
half-way leaves files there, which the next run removes first.

First byte: open() to the first ``first_byte_bytes`` returned. Throughput: the whole
file read sequentially in ``read_block_bytes`` blocks. Checkpoint save: chunks written
to a temporary name, fsync, atomic rename, fsync of the directory: the time a
training job blocks on a synchronous save. Restore: the checkpoint read back cold.
"""
from __future__ import annotations

import errno
import mmap
import os
import random
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleetcanary.probes.base import (
    Figure,
    MetricSpec,
    Probe,
    ProbeConfig,
    ProbeContext,
    ProbeError,
    ProbeResult,
    ProbeSkipped,
    Sample,
)

P = "fleetcanary_storage_"
WORKDIR = ".fleetcanary"
FAILURE_REASONS = ("path_missing", "permission_denied", "read_only", "no_space", "io_error", "verification_failed")


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(..., pattern=r"^[a-zA-Z0-9_.:-]{1,64}$", description="Label value for this target.")
    path: str = Field(..., description="A directory on the storage to test; the probe works in PATH/.fleetcanary/.")
    file_bytes: int = Field(256 << 20, ge=1 << 20, le=64 << 30, description="Size of the sequential-read file, bytes.")
    read_block_bytes: int = Field(1 << 20, ge=4096, le=64 << 20, description="Sequential read block size, bytes.")
    first_byte_bytes: int = Field(4096, ge=1, le=1 << 20, description="Bytes of the first read (first byte).")
    random_reads: int = Field(256, ge=0, le=100_000, description="4 KiB random reads for the latency figure.")
    small_files: int = Field(200, ge=0, le=100_000, description="Files in the small-files pass.")
    small_file_bytes: int = Field(4096, ge=1, le=1 << 20, description="Bytes per small file.")
    checkpoint_bytes: int = Field(256 << 20, ge=0, le=256 << 30, description="Checkpoint size, bytes; 0 skips it.")
    checkpoint_chunk_bytes: int = Field(16 << 20, ge=4096, le=1 << 30, description="Checkpoint write chunk, bytes.")
    min_free_bytes: int = Field(1 << 30, ge=0, description="Refuse to run (skip low_disk_space) below this free space "
                                "plus what the run writes.")
    cold_method: Literal["fadvise", "direct"] = Field(
        "fadvise", description="fadvise: evict the file with posix_fadvise(DONTNEED); direct: O_DIRECT reads "
        "(falls back to fadvise where the filesystem refuses O_DIRECT).")

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not os.path.isabs(v):
            raise ValueError("must be an absolute path")
        return v


class Config(ProbeConfig):
    targets: tuple[Target, ...] = Field((), description="Directories to test. None configured: the probe skips.")
    repeats: int = Field(3, ge=1, le=50, description="Repeats of each read measurement; the median is published.")


def classify(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT:
        return "path_missing"
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM):
        return "permission_denied"
    if exc.errno == errno.EROFS:
        return "read_only"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no_space"
    return "io_error"


class Storage(Probe):
    name = "storage"
    needs_targets = True
    Config = Config
    failure_reasons = FAILURE_REASONS
    default_interval_seconds = 1800.0
    default_timeout_seconds = 300.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(P + "first_byte_seconds", "gauge", "open() to the first block returned, median of the repeats; "
                   "cache=cold after evicting the file, hot when it is cached.", "seconds", ("target", "cache")),
        MetricSpec(P + "read_bytes_per_second", "gauge", "Sequential read throughput of the probe's file, median.",
                   "bytes_per_second", ("target", "cache")),
        MetricSpec(P + "random_read_seconds", "gauge", "4 KiB random read latency on the cold file, median.",
                   "seconds", ("target",)),
        MetricSpec(P + "write_bytes_per_second", "gauge", "Sequential write throughput including the final fsync.",
                   "bytes_per_second", ("target",)),
        MetricSpec(P + "fsync_seconds", "gauge", "fsync() of the freshly written file.", "seconds", ("target",)),
        MetricSpec(P + "checkpoint_save_seconds", "gauge", "Checkpoint save: chunked write, fsync, atomic rename, "
                   "directory fsync: the time a job blocks.", "seconds", ("target",)),
        MetricSpec(P + "checkpoint_restore_seconds", "gauge", "Checkpoint read back cold.", "seconds", ("target",)),
        MetricSpec(P + "metadata_ops_per_second", "gauge", "Small-files pass: create (write), stat, read and unlink "
                   "operations per second.", "ops_per_second", ("target", "op")),
        MetricSpec(P + "success", "gauge", "1 if every pass on the target succeeded in the last run.", "boolean",
                   ("target",)),
        MetricSpec(P + "failures_total", "counter", "Failed target passes by reason: path_missing, permission_denied, "
                   "read_only, no_space, io_error, verification_failed.", "total", ("target", "reason")),
    )

    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        if not config.targets:
            raise ProbeSkipped("not_configured", "no storage targets")
        res = ProbeResult(parameters={"repeats": config.repeats}, touched={"paths": []})
        previous = signal.signal(signal.SIGTERM, _unwind)  # at the deadline, `finally` still cleans up
        try:
            return self._targets(config, ctx, res)
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _targets(self, config: Config, ctx: ProbeContext, res: ProbeResult) -> ProbeResult:
        failures = {}
        for t in config.targets:
            node = _safe(ctx.node_name or socket.gethostname())
            work = Path(t.path) / WORKDIR / node
            res.touched["paths"].append(str(work))
            try:
                figures = self._target(t, work, config.repeats)
            except ProbeSkipped:
                raise
            except ProbeError as exc:
                failures[t.name] = (exc.reason, exc.detail)
            except OSError as exc:
                failures[t.name] = (classify(exc), f"{exc.strerror or exc} ({exc.filename or t.path})")
            else:
                for metric, labels, fig in figures:
                    fig.labels = {"target": t.name, **labels}
                    res.figures.append(fig)
                    res.samples.append(Sample(P + metric, fig.labels, fig.median))
            finally:
                shutil.rmtree(work, ignore_errors=True)
                _remove_if_empty(work.parent)
            res.samples.append(Sample(P + "success", {"target": t.name}, 0.0 if t.name in failures else 1.0))
            if t.name in failures:
                res.samples.append(Sample(P + "failures_total", {"target": t.name, "reason": failures[t.name][0]}, 1))
        res.extra["failures"] = {k: {"reason": r, "detail": d} for k, (r, d) in failures.items()}
        if failures and len(failures) == len(config.targets):
            name, (reason, detail) = next(iter(failures.items()))
            raise ProbeError(reason, f"{name}: {detail}", result=res)
        return res

    # ------------------------------------------------------------------ one target
    def _target(self, t: Target, work: Path, repeats: int) -> list[tuple[str, dict, Figure]]:
        base = Path(t.path)
        if not base.is_dir():
            raise FileNotFoundError(errno.ENOENT, "target directory does not exist", str(base))
        if work.exists():
            shutil.rmtree(work)  # leftovers of a run that was killed
        st = os.statvfs(base)
        free = st.f_bavail * st.f_frsize
        needed = t.file_bytes + t.checkpoint_bytes + t.small_files * max(t.small_file_bytes, 4096)
        if free < t.min_free_bytes + needed:
            raise ProbeSkipped("low_disk_space", f"{t.name}: {free} bytes free, need {t.min_free_bytes + needed}")
        work.mkdir(parents=True, exist_ok=True)
        out: list[tuple[str, dict, Figure]] = []
        data_file = work / "seq.bin"

        t0 = time.perf_counter()
        fsync_s = _write_file(data_file, t.file_bytes, t.checkpoint_chunk_bytes)
        write_s = time.perf_counter() - t0
        out.append(("write_bytes_per_second", {}, Figure("write", "bytes_per_second", [t.file_bytes / write_s])))
        out.append(("fsync_seconds", {}, Figure("fsync", "seconds", [fsync_s], higher_is_better=False)))

        for cache in ("cold", "hot"):
            fbs, bws = [], []
            if cache == "hot":
                _read_file(data_file, t.read_block_bytes, t.first_byte_bytes, direct=False)  # warm the cache
            for _ in range(repeats):
                direct = cache == "cold" and t.cold_method == "direct"
                if cache == "cold" and not direct:
                    _evict(data_file)
                fb, total_s, n = _read_file(data_file, t.read_block_bytes, t.first_byte_bytes, direct=direct)
                if n != t.file_bytes:
                    raise ProbeError("verification_failed", f"read {n} of {t.file_bytes} bytes")
                fbs.append(fb)
                bws.append(n / total_s)
            out.append(("first_byte_seconds", {"cache": cache},
                        Figure(f"first_byte_{cache}", "seconds", fbs, higher_is_better=False)))
            out.append(("read_bytes_per_second", {"cache": cache}, Figure(f"read_{cache}", "bytes_per_second", bws)))

        if t.random_reads:
            direct = t.cold_method == "direct"
            if not direct:
                _evict(data_file)
            lat = _random_reads(data_file, t.file_bytes, t.random_reads, direct)
            out.append(("random_read_seconds", {}, Figure("random_read_4k", "seconds", lat, higher_is_better=False)))

        if t.small_files:
            rates = _small_files(work / "small", t.small_files, t.small_file_bytes)
            for op, rate in rates.items():
                out.append(("metadata_ops_per_second", {"op": op}, Figure(f"small_files_{op}", "ops_per_second",
                                                                          [rate])))
        if t.checkpoint_bytes:
            save_s, restore_s = _checkpoint(work, t.checkpoint_bytes, t.checkpoint_chunk_bytes, t.read_block_bytes)
            out.append(("checkpoint_save_seconds", {}, Figure("checkpoint_save", "seconds", [save_s],
                                                              higher_is_better=False)))
            out.append(("checkpoint_restore_seconds", {}, Figure("checkpoint_restore", "seconds", [restore_s],
                                                                 higher_is_better=False)))
        data_file.unlink()
        return out


# ---------------------------------------------------------------------- helpers
def _unwind(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64] or "node"


def _remove_if_empty(p: Path) -> None:
    try:
        p.rmdir()
    except OSError:
        pass


def _random_block(n: int) -> bytes:
    # Incompressible data: a compressing or deduplicating filesystem must store every byte.
    return os.urandom(n)


def _write_file(path: Path, size: int, chunk: int) -> float:
    """Write ``size`` bytes, fsync; returns the fsync time."""
    block = _random_block(min(chunk, size))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = size
        while left:
            n = os.write(fd, block[: min(len(block), left)])
            left -= n
        t0 = time.perf_counter()
        os.fsync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _open_direct(path: Path) -> tuple[int, bool]:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT), True
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        _evict(path)  # the filesystem refuses O_DIRECT (tmpfs, some FUSE): evict instead
        return os.open(path, os.O_RDONLY), False


def _read_file(path: Path, block: int, first: int, direct: bool) -> tuple[float, float, int]:
    """(first byte seconds, total seconds, bytes read) for one sequential read."""
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT requires
    first = -(-first // 4096) * 4096 if direct else first
    try:
        t0 = time.perf_counter()
        if direct:
            fd, direct = _open_direct(path)
        else:
            fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            with memoryview(buf) as view, view[:min(first, block)] as head:
                n = os.readv(fd, [head])
                t_first = time.perf_counter() - t0
                total = n
                while True:
                    n = os.readv(fd, [view])
                    if n <= 0:
                        break
                    total += n
            return t_first, time.perf_counter() - t0, total
        finally:
            os.close(fd)
    finally:
        buf.close()


def _random_reads(path: Path, size: int, count: int, direct: bool) -> list[float]:
    buf = mmap.mmap(-1, 4096)
    rng = random.Random(0x5EED)
    fd, direct = _open_direct(path) if direct else (os.open(path, os.O_RDONLY), False)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        blocks = size // 4096
        out = []
        for _ in range(count):
            off = rng.randrange(blocks) * 4096
            t0 = time.perf_counter()
            os.preadv(fd, [buf], off)
            out.append(time.perf_counter() - t0)
        return out
    finally:
        os.close(fd)
        buf.close()


def _small_files(d: Path, count: int, size: int) -> dict[str, float]:
    d.mkdir()
    payload = _random_block(size)
    names = [d / f"f{i:06d}" for i in range(count)]
    rates = {}
    t0 = time.perf_counter()
    for p in names:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, payload)
        os.close(fd)
    rates["create"] = count / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for p in names:
        os.stat(p)
    rates["stat"] = count / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for p in names:
        with open(p, "rb") as f:
            if len(f.read()) != size:
                raise ProbeError("verification_failed", f"{p.name} is short")
    rates["read"] = count / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for p in names:
        os.unlink(p)
    rates["unlink"] = count / (time.perf_counter() - t0)
    d.rmdir()
    return rates


def _checkpoint(work: Path, size: int, chunk: int, read_block: int) -> tuple[float, float]:
    tmp, final = work / "ckpt.tmp", work / "ckpt.bin"
    block = _random_block(min(chunk, size))
    t0 = time.perf_counter()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = size
        while left:
            left -= os.write(fd, block[: min(len(block), left)])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    dfd = os.open(work, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    save = time.perf_counter() - t0
    _evict(final)
    _, restore, n = _read_file(final, read_block, read_block, direct=False)
    if n != size:
        raise ProbeError("verification_failed", f"checkpoint read back {n} of {size} bytes")
    final.unlink()
    return save, restore
