"""Confirmation runs: a few extra runs soon after a run whose figure jumped, while the figure holds.

The judge publishes per series the median of its newest 7 runs (5 for a quiet series), and the
fleet's alerts fire when that median turns: on the fourth bad run of 7. At one run per interval a
fault waits about four intervals for it (a 7% GPU memory bandwidth step: 3.3 intervals on the
detection fleet). A suspicion brings those runs within minutes instead: a run in which one of its
probe's fast-path gauges (judge/figures.confirm_metrics) moved by its threshold or more, either
way, from the median of that series' previous HISTORY figures starts a suspicion and asks for a confirmation run
``confirm_delay_seconds`` later; each confirmation whose figure still differs by the threshold from
the median the suspicion started from (not from the newest runs', which by then hold the bad runs)
asks for the next, up to ``confirm_runs`` (3: with the jumped run, the four bad runs that turn a
median of 7 come within about a quarter of an hour; at a 15-minute interval the next scheduled run
comes before the third confirmation, which the scheduler then drops, and is the fourth itself).
A confirmation that agrees with the old figure ends the suspicion, so a junk run (a job that
started during the probe, a noisy neighbour) costs one extra run; so does a failed or skipped
confirmation (the GPU busy, the budget spent: run_once runs it within the GPU budget like any run).
Any other run ends a suspicion too, or starts a fresh one if it jumped itself. The same runs serve
the alerts' fast path, the best of the newest three runs (fleetcanary_judge_newest): three bad runs
minutes apart, which two junk runs in a row cannot fake.

The threshold of a series is ``confirm_change`` or NOISE_K times the series' own run-to-run noise,
whichever is larger: the noise from its last NOISE_HISTORY figures, as the judge measures it
(judge/stats.run_noise: the robust spread of successive runs relative to their median), once there
are NOISE_MIN_RUNS. A 1 MiB all-reduce with 4% run noise would ask for a confirmation on every third
run at a fixed 5%; at 3 x 4% it asks on a real 20% drop and rarely on a wiggle, while a GPU with
0.6-1.3% noise still confirms a 5% drop. A series needs HISTORY figures before it can ask (a new
exporter's first runs never do). Nagios users know the pattern as a soft state and its retry
interval.
"""
from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from dataclasses import dataclass, field

from fleetcanary.core.record import RunRecord
from fleetcanary.judge.stats import NOISE_MIN_RUNS, run_noise

HISTORY = 3                 # previous figures of a series whose median a new figure is compared with
NOISE_HISTORY = 16          # figures of a series its run-to-run noise is measured from
NOISE_K = 3                 # a series' threshold is at least this many times its run-to-run noise
SERIES_LIMIT = 4096         # series remembered per probe (a probe with more only checks the first ones)

Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class _Suspicion:
    refs: dict[Key, tuple[float, float]] = field(default_factory=dict)  # series -> (its reference, threshold)
    asked: int = 0                                                      # confirmation runs asked for so far


def _name(key: Key) -> str:
    return f"{key[0]}{{{','.join(f'{k}={v}' for k, v in key[1])}}}"


def threshold(past, change: float) -> float:
    """A series' threshold: ``change``, or NOISE_K times its run-to-run noise over ``past`` (oldest first)
    when that is larger and there are NOISE_MIN_RUNS figures to measure it."""
    values = list(past)
    if len(values) < NOISE_MIN_RUNS or statistics.median(values) <= 0:
        return change
    return max(change, NOISE_K * (run_noise(values) or 0.0))


class Confirmer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, dict[Key, deque[float]]] = {}
        self._chains: dict[str, _Suspicion] = {}

    def jumped(self, out: RunRecord, metrics: tuple[str, ...], change: float, runs: int) -> str:
        """Record the figures of a run and say why it asks for a confirmation run ("" if it does not).
        A successful run other than a confirmation (trigger "schedule", "opportunistic") starts a suspicion
        when a series jumped, replacing one in progress, and ends the one in progress otherwise; a confirmation
        continues its suspicion while a remembered series still differs from its reference, up to ``runs``
        confirmations. Anything else ends it. ``change`` 0 or ``runs`` 0: never asks."""
        with self._lock:
            chain = self._chains.pop(out.probe, None)
            if out.outcome != "success" or not metrics:
                return ""
            figures = self._record(out, metrics)
            if change <= 0 or runs <= 0:
                return ""
            if out.trigger == "confirmation":
                return self._continue(out.probe, chain, figures, runs) if chain is not None else ""
            return self._start(out.probe, figures, change, runs)

    def _record(self, out: RunRecord, metrics: tuple[str, ...]) -> list[tuple[Key, float, list[float]]]:
        """Each finite figure of the run's judged series with the series' figures before it (oldest first);
        the figure is then remembered."""
        seen = self._seen.setdefault(out.probe, {})
        figures = []
        for s in out.samples:
            name = s.get("metric")
            if name not in metrics:
                continue
            try:
                value = float(s["value"])
            except (KeyError, TypeError, ValueError):
                continue
            if not math.isfinite(value):
                continue
            key = (name, tuple(sorted((str(k), str(v)) for k, v in (s.get("labels") or {}).items())))
            past = seen.get(key)
            if past is None:
                if len(seen) >= SERIES_LIMIT:
                    continue
                past = seen[key] = deque(maxlen=NOISE_HISTORY)
            figures.append((key, value, list(past)))
            past.append(value)
        return figures

    def _start(self, probe: str, figures, change: float, runs: int) -> str:
        chain, why = _Suspicion(), ""
        for key, value, past in figures:
            if len(past) < HISTORY:
                continue
            ref = statistics.median(past[-HISTORY:])
            if ref <= 0 or abs(value / ref - 1.0) < change:  # below confirm_change: below any threshold
                continue
            limit = threshold(past, change)
            if abs(value / ref - 1.0) >= limit:
                chain.refs[key] = (ref, limit)
                why = why or (f"{_name(key)} {value / ref - 1.0:+.0%} against the median of its last {HISTORY} "
                              f"runs (threshold {limit:.0%})")
        if not chain.refs:
            return ""
        chain.asked = 1
        self._chains[probe] = chain
        return f"{why}; confirmation 1 of {runs}"

    def _continue(self, probe: str, chain: _Suspicion, figures, runs: int) -> str:
        if chain.asked >= runs:
            return ""
        for key, value, _ in figures:
            if key not in chain.refs:
                continue
            ref, limit = chain.refs[key]
            if abs(value / ref - 1.0) >= limit:
                chain.asked += 1
                self._chains[probe] = chain
                return (f"{_name(key)} {value / ref - 1.0:+.0%} against the median of its last {HISTORY} runs "
                        f"before the suspicion (threshold {limit:.0%}); confirmation {chain.asked} of {runs}")
        return ""
