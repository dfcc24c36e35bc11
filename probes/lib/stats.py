"""The statistics every figure and every tool uses: one dispersion, one percentile.

Imports nothing of fleetcanary, so the probe contract (base.py) and the exporter's
core (which re-exports these) share the same definitions.
"""
from __future__ import annotations

import math
import statistics


def dispersion(values: list[float]) -> dict[str, float]:
    """Median and robust dispersion of repeats: MAD, CV (sample standard deviation over the
    mean), min, max, mean, count."""
    if not values:
        raise ValueError("no values")
    med = statistics.median(values)
    mad = statistics.median([abs(v - med) for v in values])
    mean = statistics.fmean(values)
    stdev = statistics.stdev(values) if len(values) > 1 else 0.0
    cv = stdev / mean if mean else 0.0
    return {
        "median": med,
        "mad": mad,
        "cv": cv,
        "min": min(values),
        "max": max(values),
        "mean": mean,
        "n": float(len(values)),
    }


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) with linear interpolation between closest ranks (numpy's default);
    None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
