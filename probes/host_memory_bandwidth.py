"""STREAM-style host memory bandwidth: copy and triad on all cores.

Byte counting follows STREAM: copy (a = b) moves 2 x 8 bytes per element (one
read, one write); triad (a = b + s*c) moves 3 x 8 bytes (two reads, one write).
Write-allocate traffic is not counted, as in STREAM.

The arrays are sized from the last-level cache (at least 4x the total LLC, as
STREAM's rules ask) and split into one contiguous slice per thread. numpy releases
the GIL inside ufuncs, so the threads copy in parallel. Triad runs block by block
over cache-sized pieces, so its two ufunc passes (multiply, then add) re-read the
block from cache rather than memory; the memory traffic is STREAM's 24 bytes per
element. numpy has no fused triad; a C extension would be the alternative, and the
block loop keeps this dependency-free with a measured overhead of a few percent.
"""
from __future__ import annotations

import glob
import os
import threading
import time
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from fleetcanary.probes.base import (
    Figure,
    MetricSpec,
    Probe,
    ProbeConfig,
    ProbeContext,
    ProbeError,
    ProbeResult,
    figure_sample,
)

METRIC = "fleetcanary_host_memory_bandwidth_bytes_per_second"
ELEMENT_BYTES = 8
BLOCK_ELEMENTS = 32 * 1024  # 256 KiB of float64: fits a per-core L2 on current server CPUs


def last_level_cache_bytes() -> int:
    """Total last-level cache on the machine, from sysfs (0 when unknown)."""
    best_level, per_id = 0, {}
    for idx in glob.glob("/sys/devices/system/cpu/cpu*/cache/index*"):
        try:
            level = int(Path(idx, "level").read_text())
            ctype = Path(idx, "type").read_text().strip()
            if ctype == "Instruction":
                continue
            size_txt = Path(idx, "size").read_text().strip()
            shared = Path(idx, "shared_cpu_list").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size_txt[-1:], 1)
        size = int(size_txt.rstrip("KMG")) * mult
        if level > best_level:
            best_level, per_id = level, {}
        if level == best_level:
            per_id[shared] = size  # one entry per distinct cache instance
    return sum(per_id.values())


class Config(ProbeConfig):
    array_bytes: int = Field(
        0, ge=0,
        description="Bytes per array (three arrays are used). 0 = auto: 4x the total "
        "last-level cache, at least 64 MiB, at most max_array_bytes.")
    max_array_bytes: int = Field(1 << 30, gt=0, description="Upper bound for the auto size, bytes per array.")
    threads: int = Field(0, ge=0, description="Worker threads. 0 = one per usable CPU.")
    warmup: int = Field(1, ge=0, le=20, description="Untimed warm-up passes per operation.")
    repeats: int = Field(5, ge=1, le=100, description="Timed passes per operation; the median is published.")
    scalar: float = Field(3.0, description="Triad scalar s in a = b + s*c.")


class HostMemoryBandwidth(Probe):
    name = "host_memory_bandwidth"
    Config = Config
    failure_reasons = ("verification_failed", "allocation_failed")
    default_interval_seconds = 600.0
    default_timeout_seconds = 120.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(
            METRIC, "gauge",
            "Host memory bandwidth from the last scheduled STREAM-style run, median of the "
            "timed repeats. copy counts 16 bytes per element (read + write), triad 24 "
            "(two reads + one write), as STREAM does.",
            "bytes_per_second", ("op",)),
    )

    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        import numpy as np

        threads = config.threads or len(os.sched_getaffinity(0))
        llc = last_level_cache_bytes()
        size = config.array_bytes or min(max(4 * llc, 64 << 20), config.max_array_bytes)
        n = max(size // ELEMENT_BYTES, threads * BLOCK_ELEMENTS)
        try:
            a = np.empty(n, dtype=np.float64)
            b = np.empty(n, dtype=np.float64)
            c = np.empty(n, dtype=np.float64)
        except MemoryError as exc:
            raise ProbeError("allocation_failed", f"3 x {n * ELEMENT_BYTES} bytes") from exc

        bounds = [(i * n // threads, (i + 1) * n // threads) for i in range(threads)]
        s = config.scalar

        # First touch from the thread that will use each slice, so pages land on its NUMA node.
        def init(lo: int, hi: int) -> None:
            a[lo:hi] = 1.0
            b[lo:hi] = 2.0
            c[lo:hi] = 0.5

        def copy(lo: int, hi: int) -> None:
            np.copyto(a[lo:hi], b[lo:hi])

        def triad(lo: int, hi: int) -> None:
            for j in range(lo, hi, BLOCK_ELEMENTS):
                k = min(j + BLOCK_ELEMENTS, hi)
                blk = a[j:k]
                np.multiply(c[j:k], s, out=blk)
                np.add(blk, b[j:k], out=blk)

        pool = _ThreadTeam(threads)
        try:
            pool.run(init, bounds)
            results: dict[str, list[float]] = {}
            for op, fn, nbytes in (("copy", copy, 2 * ELEMENT_BYTES * n),
                                   ("triad", triad, 3 * ELEMENT_BYTES * n)):
                for _ in range(config.warmup):
                    pool.run(fn, bounds)
                times = []
                for _ in range(config.repeats):
                    t0 = time.perf_counter()
                    pool.run(fn, bounds)
                    times.append(time.perf_counter() - t0)
                results[op] = [nbytes / t for t in times]
                if op == "copy" and not (a[0] == 2.0 and a[-1] == 2.0):
                    raise ProbeError("verification_failed", "copy result differs from source")
            expected = 2.0 + s * 0.5
            if not (a[0] == expected and a[n // 2] == expected and a[-1] == expected):
                raise ProbeError("verification_failed", "triad result is wrong")
        finally:
            pool.close()

        res = ProbeResult(parameters={
            "array_bytes": n * ELEMENT_BYTES, "arrays": 3, "threads": threads,
            "last_level_cache_bytes": llc, "warmup": config.warmup, "repeats": config.repeats,
            "array_to_llc_ratio": (n * ELEMENT_BYTES / llc) if llc else None,
            "byte_counting": "STREAM: copy 16 B/element, triad 24 B/element",
        })
        for op, bw in results.items():
            fig = Figure(op, "bytes_per_second", bw, {"op": op})
            res.figures.append(fig)
            res.samples.append(figure_sample(fig, METRIC))
        return res


class _ThreadTeam:
    """A fixed team of threads that run one function over slices, with a barrier.

    Written here rather than with concurrent.futures so that every timed pass starts
    all threads together and ends when the last one finishes, without per-pass
    thread creation or queueing costs inside the timed region.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._start = threading.Barrier(n + 1)
        self._done = threading.Barrier(n + 1)
        self._fn = None
        self._bounds: list[tuple[int, int]] = []
        self._errors: list[BaseException] = []
        self._stop = False
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def _loop(self, i: int) -> None:
        while True:
            self._start.wait()
            if self._stop:
                return
            try:
                self._fn(*self._bounds[i])
            except BaseException as exc:  # noqa: BLE001 - reported to the caller after the barrier
                self._errors.append(exc)
            self._done.wait()

    def run(self, fn, bounds) -> None:
        self._fn, self._bounds = fn, bounds
        self._start.wait()
        self._done.wait()
        if self._errors:
            raise self._errors[0]

    def close(self) -> None:
        self._stop = True
        try:
            self._start.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass
