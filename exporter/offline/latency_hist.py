"""A log-bucketed latency histogram that merges exactly (HDR-style).

Every value lands in a bucket of relative width 0.1% (bucket i holds
[LOW * G**i, LOW * G**(i+1)), G = 1.001, LOW = 1 µs); a percentile is the geometric middle
of the bucket holding that rank, so its relative error is under 0.05%. Two histograms
merge by adding their counts, which is exact: the merged percentiles are those of all the
values together, never an average of per-process percentiles. Buckets are sparse (a dict),
so a histogram of a few thousand requests serialises to a few hundred integers.

Written here rather than taken from hdrhistogram (HdrHistogram_py): the same idea (fixed
log-spaced buckets, merge by adding counts) in 60 lines, without a dependency in the
locust workers' image or a C extension in the way.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

LOW = 1e-6
GROWTH = 1.001
_LOG_G = math.log(GROWTH)


class LatencyHistogram:
    __slots__ = ("below", "counts", "n")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.below = 0          # values under LOW (1 µs): reported as 0

    def add(self, v: float) -> None:
        self.n += 1
        if v < LOW:
            self.below += 1
            return
        i = int(math.log(v / LOW) / _LOG_G)
        self.counts[i] = self.counts.get(i, 0) + 1

    def extend(self, values: Iterable[float]) -> LatencyHistogram:
        for v in values:
            self.add(v)
        return self

    def merge(self, other: LatencyHistogram) -> LatencyHistogram:
        for i, c in other.counts.items():
            self.counts[i] = self.counts.get(i, 0) + c
        self.n += other.n
        self.below += other.below
        return self

    def percentile(self, q: float) -> float | None:
        """The value at rank ceil(q * n) (nearest rank), None when empty."""
        if not self.n:
            return None
        rank = max(1, math.ceil(q * self.n))
        seen = self.below
        if seen >= rank:
            return 0.0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                return LOW * GROWTH ** (i + 0.5)
        return LOW * GROWTH ** (max(self.counts) + 0.5)

    def to_json(self) -> dict:
        return {"n": self.n, "below": self.below, "counts": [[i, c] for i, c in sorted(self.counts.items())]}

    @classmethod
    def from_json(cls, d: dict) -> LatencyHistogram:
        h = cls()
        h.n, h.below = int(d["n"]), int(d["below"])
        h.counts = {int(i): int(c) for i, c in d["counts"]}
        return h
