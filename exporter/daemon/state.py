"""The daemon's state: what the exporter publishes, as plain data, updated once per finished run.

Each update re-renders the exposition (``collector.render``) and swaps the cached
bytes in one reference assignment, so a scrape never waits on a probe and never
sees a half-applied result.

Samples from a worker are checked against the probe's declared metric specs: an
undeclared metric or wrong label names is dropped and counted, and label values
are bounded in length, so a buggy probe cannot break the exposition.

Figures are exported only while they are fresh: a probe's gauges from a run are dropped
once they are older than FRESH_INTERVALS of its interval (checked on every scrape,
``expire``). A skipped run keeps the previous figures only until then; after that the
series disappear, Prometheus writes staleness markers, and the rules' ``*_over_time``
windows hold samples of fresh runs only (docs/alerting.md, "Windows of runs").
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from fleetcanary.core import environment as envmod
from fleetcanary.core import statefile
from fleetcanary.core.record import OUTCOMES, RunRecord
from fleetcanary.daemon.collector import render
from fleetcanary.judge import figures as figmod
from fleetcanary.judge.exposition import hold_for
from fleetcanary.judge.store import FigureStore
from fleetcanary.probes.base import Probe

MAX_LABEL_VALUE = 128
COVERAGE_SKEW_SECONDS = 600.0  # a kept coverage time further past the wall clock than this is from a stepped clock
# A run's figures stay exported for this many probe intervals, plus the probe's timeout, after
# the run finished: the next run is due after one interval (+ up to 10% jitter by default) and
# may take up to its timeout, or wait behind another exclusive GPU probe; half an interval more
# absorbs that.
FRESH_INTERVALS = 1.5
# Skip reasons that mean a tenant holds the GPUs: what opportunistic runs and claims answer.
TENANT_REASONS = ("gpu_allocated", "gpu_busy", "gpu_mps")
LabelKey = tuple[tuple[str, str], ...]


@dataclass
class ProbeState:
    last: RunRecord | None = None
    verdict: RunRecord | None = None  # the last run that was not skipped: what probe_success says
    runs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    skips: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    crashes: dict[str, int] = field(default_factory=dict)
    last_run_ts: float | None = None
    last_success_ts: float | None = None
    gauges: dict[str, dict[LabelKey, float]] = field(default_factory=dict)
    gauges_at: float | None = None  # finished_at of the run that produced `gauges`
    invalid_samples: int = 0
    confirmations: int = 0  # runs the daemon added to confirm a jump (daemon/confirm.py)

    @property
    def skipped_for_tenant(self) -> bool:
        """The last run skipped because a tenant holds the GPUs."""
        return self.last is not None and self.last.outcome == "skipped" and self.last.reason in TENANT_REASONS


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


def measured(cls: type[Probe] | None, out: RunRecord) -> list[tuple[str, str]]:
    """The (gpu, probe) pairs a successful run of an invasive probe measured: the GPUs it spent GPU time on
    (its gate's free GPUs), or ("", probe) for a probe measured per node (Probe.coverage)."""
    if cls is None or cls.exclusive != "gpu":
        return []
    if cls.coverage == "node":
        return [("", out.probe)]
    return [(g[:16], out.probe) for g in out.gpu_seconds if g.isdigit()]


class ResultStore:
    def __init__(self, probes: dict[str, type[Probe]], enabled: list[str], judge: FigureStore | None = None) -> None:
        self._lock = threading.Lock()
        self.judge = judge  # the node's judged figures and their statistics (fleetcanary.judge)
        self.judge_rendered_at = 0.0
        self.probes = probes
        self.enabled = list(enabled)
        self.intervals: dict[str, float] = {}
        self.timeouts: dict[str, float] = {}
        self.state: dict[str, ProbeState] = {n: ProbeState() for n in probes}
        self.counters: dict[str, dict[LabelKey, float]] = defaultdict(dict)
        self.histograms: dict[str, dict[LabelKey, Histogram]] = defaultdict(dict)
        self.gpu_seconds: dict[str, float] = defaultdict(float)
        # coverage: (gpu, probe) -> unix time a successful run of the invasive probe last measured the GPU
        # (gpu "" for a probe measured per node); daemon/service.py keeps it in the state directory
        self.last_measured: dict[tuple[str, str], float] = {}
        self.node_environment: dict[str, Any] = {}
        self.node_extra_labels: dict[str, str] = {}
        self.kube = None  # daemon.kube.Snapshot when the Kubernetes integration runs
        # hard faults at the edge (daemon/hard_faults.py): GPU index -> (state, reason), and the node's
        self.health_gpus: dict[str, tuple[str, str]] = {}
        self.health_node: tuple[str, str] | None = None
        self.kube_condition_type = ""
        self.config_reload_ok = 1
        self.config_reload_ts = time.time()
        self.config_reloads: dict[str, int] = {"success": 0, "failure": 0}
        self.history_write_errors = 0
        self.clock_jumps = 0
        self.exposition: bytes = b""
        self.version = 0

    # --- updates ---------------------------------------------------------------
    def _checked(self, probe: str, sample: dict[str, Any]) -> tuple[str, LabelKey, float] | None:
        cls = self.probes[probe]
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

    def add_counter(self, probe: str, metric: str, labels: dict[str, str], value: float) -> bool:
        """Add to one of a probe's counters from outside its runs (the continuous XID watch feeds gpu_health's).
        False when the probe, metric or labels do not match its spec."""
        if probe not in self.probes or value < 0:
            return False
        checked = self._checked(probe, {"metric": metric, "labels": labels, "value": value})
        if checked is None or self.probes[probe].spec(checked[0]).type != "counter":
            return False
        name, key, v = checked
        with self._lock:
            self.counters[name][key] = self.counters[name].get(key, 0.0) + v
        self.rerender()
        return True

    def apply(self, out: RunRecord) -> bool:
        """Take a finished run. True when it measured GPUs (the coverage moved)."""
        covered = []
        with self._lock:
            st = self.state.setdefault(out.probe, ProbeState())
            st.last = out
            if out.outcome != "skipped":
                st.verdict = out
            st.runs[out.outcome] = st.runs.get(out.outcome, 0) + 1
            st.last_run_ts = out.finished_at
            if out.trigger == "confirmation":
                st.confirmations += 1
            if out.outcome == "skipped":
                st.skips[out.reason] = st.skips.get(out.reason, 0) + 1
            elif out.outcome == "failure":
                st.failures[out.reason] = st.failures.get(out.reason, 0) + 1
            elif out.outcome == "crash":
                st.crashes[out.reason] = st.crashes.get(out.reason, 0) + 1
            if out.outcome == "success":
                st.last_success_ts = st.last_run_ts
            if out.outcome in ("success", "failure") and out.samples:
                # A failed run may carry what it measured (which target failed, a quality
                # check at 0): published with the failure.
                gauges: dict[str, dict[LabelKey, float]] = {}
                cls = self.probes[out.probe]
                for s in out.samples:
                    checked = self._checked(out.probe, s)
                    if checked is None:
                        st.invalid_samples += 1
                        continue
                    name, key, value = checked
                    mtype = cls.spec(name).type
                    if mtype == "gauge":
                        gauges.setdefault(name, {})[key] = value
                    elif mtype == "counter":
                        if value < 0:
                            st.invalid_samples += 1
                            continue
                        if cls.spec(name).cumulative:
                            self.counters[name][key] = value
                        else:
                            self.counters[name][key] = self.counters[name].get(key, 0.0) + value
                    else:
                        buckets = cls.spec(name).buckets or ()
                        h = self.histograms[name].get(key)
                        if h is None:
                            h = self.histograms[name][key] = Histogram(buckets, [0] * len(buckets))
                        h.observe(value)
                st.gauges = gauges
                st.gauges_at = out.finished_at
            elif out.outcome in ("failure", "timeout", "crash"):
                # Values of a broken run are not results; a stale number would mislead alerts.
                st.gauges = {}
                st.gauges_at = None
            for gpu, secs in out.gpu_seconds.items():
                self.gpu_seconds[gpu[:16]] += secs
            if out.ok:
                covered = measured(self.probes.get(out.probe), out)
                for key in covered:
                    self.last_measured[key] = max(self.last_measured.get(key, 0.0), out.finished_at)
            if out.environment:
                # A fact the run could not tell (no NVML in that worker) keeps the last known one.
                known = {k: v for k, v in self.node_environment.items() if v != envmod.UNKNOWN}
                self.node_environment = {**known, **{k: v for k, v in out.environment.items()
                                                      if v != envmod.UNKNOWN or k not in known}}
        if self.judge is not None:
            self.judge.observe(out)
        self.rerender()
        return bool(covered)

    def expire(self, now: float | None = None) -> bool:
        """Drop figures older than their freshness bound (FRESH_INTERVALS x the probe's
        interval + its timeout); re-render when any went. Called before each scrape is served. A probe
        without a known interval keeps its figures. True if something was dropped."""
        now = time.time() if now is None else now
        with self._lock:
            dropped = False
            for name, st in self.state.items():
                interval = self.intervals.get(name)
                if st.gauges and st.gauges_at is not None and interval and \
                        now - st.gauges_at > FRESH_INTERVALS * interval + self.timeouts.get(name, 0.0):
                    st.gauges = {}
                    st.gauges_at = None
                    dropped = True
            if self.judge is not None and any(
                    self.judge_rendered_at <= st.last + self.judge_hold(figmod.BY_KEY[k[0]].probe) < now
                    for k, st, _ in self.judge.snapshot()):
                dropped = True  # a judged series passed its hold
        if dropped:
            self.rerender()
        return dropped

    def set_config_reload(self, ok: bool) -> None:
        with self._lock:
            self.config_reload_ok = 1 if ok else 0
            self.config_reloads["success" if ok else "failure"] += 1
            if ok:
                self.config_reload_ts = time.time()
        self.rerender()

    def set_enabled(self, enabled: list[str], intervals: dict[str, float] | None = None,
                    timeouts: dict[str, float] | None = None) -> None:
        with self._lock:
            self.enabled = list(enabled)
            if intervals is not None:
                self.intervals = dict(intervals)
            if timeouts is not None:
                self.timeouts = dict(timeouts)
        self.rerender()

    def count_clock_jump(self) -> None:
        with self._lock:
            self.clock_jumps += 1
        self.rerender()

    def count_history_error(self) -> None:
        with self._lock:
            self.history_write_errors += 1
        self.rerender()

    def set_node_extra_labels(self, labels: dict[str, str]) -> None:
        with self._lock:
            self.node_extra_labels = {k: str(v)[:MAX_LABEL_VALUE] for k, v in labels.items()}
        self.rerender()

    def set_kube(self, snapshot, condition_type: str, node_extra_labels: dict[str, str]) -> None:
        """The Kubernetes integration's state (daemon.kube.Snapshot) and the node labels it
        feeds, rendered together once."""
        with self._lock:
            self.kube = snapshot
            self.kube_condition_type = condition_type
            self.node_extra_labels = {k: str(v)[:MAX_LABEL_VALUE] for k, v in node_extra_labels.items()}
        self.rerender()

    def set_health(self, gpus: dict[str, tuple[str, str]], node: tuple[str, str]) -> None:
        """The health state per GPU and the node's summary; rendered only when they changed."""
        with self._lock:
            if gpus == self.health_gpus and node == self.health_node:
                return
            self.health_gpus, self.health_node = dict(gpus), node
        self.rerender()

    def set_environment(self, env: dict[str, Any]) -> None:
        with self._lock:
            self.node_environment = env
        self.rerender()

    def judge_fresh(self, probe: str) -> float:
        """How long a probe's newest run counts as fresh (its figures' own bound)."""
        return FRESH_INTERVALS * self.intervals.get(probe, 0.0) + self.timeouts.get(probe, 0.0) \
            if self.intervals.get(probe) else float("inf")

    def judge_hold(self, probe: str) -> float:
        """How long a judged series' statistics stay published after the probe's newest run."""
        return hold_for(self.intervals.get(probe), self.timeouts.get(probe))

    def rerender(self) -> None:
        with self._lock:
            self.judge_rendered_at = time.time()
            data = render(self)
            self.exposition = data
            self.version += 1

    def restore_coverage(self, entries: list, now: float | None = None, drop=None) -> int:
        """Coverage kept in the state directory ([[gpu, probe, unix time], ...]). An entry of the wrong shape
        (not [str, str, finite time > 0]) or stamped past ``now`` by more than COVERAGE_SKEW_SECONDS (a stepped
        clock) is refused and passed to ``drop(kind, detail)`` ("wrong_shape", "future"); one of a probe that
        is not here is let go. The number restored."""
        now = time.time() if now is None else now
        kept = 0
        with self._lock:
            for e in entries:
                shaped = isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and isinstance(e[1], str)
                ts = statefile.number(e[2]) if shaped else None
                if ts is None or ts <= 0:
                    if drop:
                        drop("wrong_shape", f"entry {str(e)[:80]}")
                    continue
                if ts > now + COVERAGE_SKEW_SECONDS:
                    if drop:
                        drop("future", f"entry at {ts:.0f}, {ts - now:.0f} s past this clock")
                    continue
                gpu, probe = e[0][:16], e[1]
                if probe in self.probes:
                    self.last_measured[(gpu, probe)] = max(self.last_measured.get((gpu, probe), 0.0), float(ts))
                    kept += 1
        self.rerender()
        return kept

    def dump_coverage(self) -> list:
        with self._lock:
            return [[g, p, ts] for (g, p), ts in sorted(self.last_measured.items())]

    # --- reads ------------------------------------------------------------------
    def coverage(self) -> list[tuple[str, str, float]]:
        """(gpu, probe, unix time of its last fresh run or 0) for each enabled invasive probe and each GPU the
        node has (the environment's GPUs, and any measured before); a probe measured per node has gpu "" (on a
        node with GPUs). A node without GPUs has none."""
        gpus = {str(g["index"]) for g in self.node_environment.get("gpus") or []
                if isinstance(g, dict) and "index" in g}
        gpus |= {g for g, _ in self.last_measured if g}
        out = []
        for name in self.enabled:
            cls = self.probes.get(name)
            if cls is None or cls.exclusive != "gpu":
                continue
            if cls.coverage == "gpu":
                keys = sorted(gpus, key=lambda x: (len(x), x))
            else:  # per node: on a node with GPUs (a GPU-less node's skips are not a coverage gap)
                keys = [""] if gpus or ("", name) in self.last_measured else []
            for g in keys:
                out.append((g, name, self.last_measured.get((g, name), 0.0)))
        return out

    def node_labels(self) -> dict[str, str]:
        labels = envmod.stable_labels(self.node_environment) if self.node_environment else \
            dict.fromkeys(envmod.STABLE_FIELDS, envmod.UNKNOWN)
        labels.update(self.node_extra_labels)
        return labels

    def latest_records(self) -> dict[str, Any]:
        """/results: the last run record of each probe that has run."""
        with self._lock:
            return {name: st.last.to_json() for name, st in self.state.items() if st.last is not None}
