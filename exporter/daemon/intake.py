"""Sample intake: a run's metric samples checked against its probe's declared specs and taken into the
exporter's gauges, counters and histograms.

An undeclared metric, wrong label names or a value that is no number is dropped and counted (the caller
adds the count to fleetcanary_probe_invalid_samples_total); label values are cut to MAX_LABEL_VALUE
characters, so a buggy probe cannot break the exposition. Plain functions over plain data: the store
(daemon/state.py) holds its lock around them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetcanary.probes.base import Probe

MAX_LABEL_VALUE = 128
LabelKey = tuple[tuple[str, str], ...]


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int]
    total: float = 0.0
    count: int = 0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
        self.total += v
        self.count += 1


def check(cls: type[Probe], sample: dict[str, Any]) -> tuple[str, LabelKey, float] | None:
    """(metric name, label key in the spec's order, value) of a sample the probe declares; None otherwise."""
    try:
        spec = cls.spec(str(sample["metric"]))
        labels = sample.get("labels") or {}
        if set(labels) != set(spec.labels):
            return None
        value = float(sample["value"])
    except (KeyError, TypeError, ValueError):
        return None
    key = tuple((k, str(labels[k])[:MAX_LABEL_VALUE]) for k in spec.labels)
    return spec.name, key, value


def take(cls: type[Probe], samples: list[dict[str, Any]], counters: dict[str, dict[LabelKey, float]],
         histograms: dict[str, dict[LabelKey, Histogram]]) -> tuple[dict[str, dict[LabelKey, float]], int]:
    """One run's samples: its gauges (returned: they replace the probe's last ones), counters added into
    ``counters`` (a cumulative one set), histogram observations into ``histograms`` (defaultdicts of dict).
    Returns (gauges, the number of samples dropped)."""
    gauges: dict[str, dict[LabelKey, float]] = {}
    invalid = 0
    for s in samples:
        checked = check(cls, s)
        if checked is None:
            invalid += 1
            continue
        name, key, value = checked
        mtype = cls.spec(name).type
        if mtype == "gauge":
            gauges.setdefault(name, {})[key] = value
        elif mtype == "counter":
            if value < 0:
                invalid += 1
                continue
            if cls.spec(name).cumulative:
                counters[name][key] = value
            else:
                counters[name][key] = counters[name].get(key, 0.0) + value
        else:
            buckets = cls.spec(name).buckets or ()
            h = histograms[name].get(key)
            if h is None:
                h = histograms[name][key] = Histogram(buckets, [0] * len(buckets))
            h.observe(value)
    return gauges, invalid
