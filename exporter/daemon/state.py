"""The daemon's state: what the exporter publishes, as plain data, updated once per finished run.

Each update re-renders the exposition (``collector.render``) and swaps the cached
bytes in one reference assignment, so a scrape never waits on a probe and never
sees a half-applied result.

The store holds the lock and renders; each part of what it keeps has its own module:
samples checked against the probe's declared specs (daemon/intake.py: an undeclared
metric or wrong label names is dropped and counted, label values are bounded in length,
so a buggy probe cannot break the exposition), the runs' outcomes (daemon/outcomes.py),
which GPUs were measured when (daemon/coverage.py).

Figures are exported only while they are fresh (judge/freshness.py: a probe's gauges from a
run are dropped once they are older than FRESH_INTERVALS of its interval plus its timeout,
checked on every scrape, ``expire``). A skipped run keeps the previous figures only until
then; after that the series disappear, Prometheus writes staleness markers, and the rules'
``*_over_time`` windows hold samples of fresh runs only (docs/alerting.md, "Windows of runs").
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

from fleetcanary.core import environment as envmod
from fleetcanary.core.record import RunRecord
from fleetcanary.daemon import intake, outcomes
from fleetcanary.daemon.collector import render
from fleetcanary.daemon.coverage import Coverage
from fleetcanary.daemon.intake import MAX_LABEL_VALUE, Histogram, LabelKey
from fleetcanary.daemon.outcomes import TENANT_REASONS, ProbeState
from fleetcanary.judge import figures as figmod
from fleetcanary.judge import freshness
from fleetcanary.judge.store import FigureStore
from fleetcanary.probes.base import Probe

# the names other modules import from here
__all__ = ["MAX_LABEL_VALUE", "TENANT_REASONS", "Histogram", "LabelKey", "ProbeState", "ResultStore"]


class ResultStore:
    def __init__(self, probes: dict[str, type[Probe]], enabled: list[str], judge: FigureStore | None = None) -> None:
        self._lock = threading.Lock()
        self.judge = judge  # the node's judged figures and their statistics (fleetcanary.judge)
        self.judge_rendered_at = 0.0
        self.probes = probes
        self.enabled = list(enabled)
        self.freshness = freshness.Freshness()  # each probe's interval and timeout: how long its runs count
        self.state: dict[str, ProbeState] = {n: ProbeState() for n in probes}
        self.counters: dict[str, dict[LabelKey, float]] = defaultdict(dict)
        self.histograms: dict[str, dict[LabelKey, Histogram]] = defaultdict(dict)
        self.gpu_seconds: dict[str, float] = defaultdict(float)
        self.covered = Coverage()  # when each GPU was last measured; daemon/state_files.py keeps it
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

    @property
    def intervals(self) -> dict[str, float]:
        return self.freshness.intervals

    @property
    def timeouts(self) -> dict[str, float]:
        return self.freshness.timeouts

    @property
    def last_measured(self) -> dict[tuple[str, str], float]:
        """Coverage: (gpu, probe) -> unix time a successful run of the invasive probe last measured the GPU
        (gpu "" for a probe measured per node)."""
        return self.covered.last_measured

    # --- updates ---------------------------------------------------------------
    def add_counter(self, probe: str, metric: str, labels: dict[str, str], value: float) -> bool:
        """Add to one of a probe's counters from outside its runs (the continuous XID watch feeds gpu_health's).
        False when the probe, metric or labels do not match its spec."""
        if probe not in self.probes or value < 0:
            return False
        checked = intake.check(self.probes[probe], {"metric": metric, "labels": labels, "value": value})
        if checked is None or self.probes[probe].spec(checked[0]).type != "counter":
            return False
        name, key, v = checked
        with self._lock:
            self.counters[name][key] = self.counters[name].get(key, 0.0) + v
        self.rerender()
        return True

    def apply(self, out: RunRecord) -> bool:
        """Take a finished run. True when it measured GPUs (the coverage moved)."""
        with self._lock:
            st = self.state.setdefault(out.probe, ProbeState())
            outcomes.count(st, out)
            if out.outcome in ("success", "failure") and out.samples:
                # A failed run may carry what it measured (which target failed, a quality
                # check at 0): published with the failure.
                st.gauges, invalid = intake.take(self.probes[out.probe], out.samples, self.counters, self.histograms)
                st.invalid_samples += invalid
                st.gauges_at = out.finished_at
            elif out.outcome in ("failure", "timeout", "crash"):
                # Values of a broken run are not results; a stale number would mislead alerts.
                st.gauges = {}
                st.gauges_at = None
            for gpu, secs in out.gpu_seconds.items():
                self.gpu_seconds[gpu[:16]] += secs
            covered = self.covered.observe(self.probes.get(out.probe), out)
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
        """Drop figures older than their freshness bound (judge/freshness.py: FRESH_INTERVALS x the probe's
        interval + its timeout); re-render when any went. Called before each scrape is served. A probe
        without a known interval keeps its figures. True if something was dropped."""
        now = time.time() if now is None else now
        with self._lock:
            dropped = False
            for name, st in self.state.items():
                if st.gauges and st.gauges_at is not None and self.freshness.expired(name, now - st.gauges_at):
                    st.gauges = {}
                    st.gauges_at = None
                    dropped = True
            if self.judge is not None and any(
                    freshness.hold_ended(st.last, self.judge_hold(figmod.BY_KEY[k[0]].probe),
                                         since=self.judge_rendered_at, now=now)
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
                self.freshness.intervals = dict(intervals)
            if timeouts is not None:
                self.freshness.timeouts = dict(timeouts)
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
        return self.freshness.fresh(probe)

    def judge_hold(self, probe: str) -> float:
        """How long a judged series' statistics stay published after the probe's newest run."""
        return self.freshness.hold(probe)

    def rerender(self) -> None:
        with self._lock:
            self.judge_rendered_at = time.time()
            data = render(self)
            self.exposition = data
            self.version += 1

    def restore_coverage(self, entries: list, now: float | None = None, drop=None) -> int:
        """Coverage kept in the state directory (daemon/coverage.py, Coverage.restore). The number restored."""
        now = time.time() if now is None else now
        with self._lock:
            kept = self.covered.restore(entries, self.probes, now, drop)
        self.rerender()
        return kept

    def dump_coverage(self) -> list:
        with self._lock:
            return self.covered.dump()

    # --- reads ------------------------------------------------------------------
    def coverage(self) -> list[tuple[str, str, float]]:
        """(gpu, probe, unix time of its last fresh run or 0) for each enabled invasive probe and each GPU the
        node has (daemon/coverage.py, Coverage.rows)."""
        return self.covered.rows(self.enabled, self.probes, self.node_environment)

    def node_labels(self) -> dict[str, str]:
        labels = envmod.stable_labels(self.node_environment) if self.node_environment else \
            dict.fromkeys(envmod.STABLE_FIELDS, envmod.UNKNOWN)
        labels.update(self.node_extra_labels)
        return labels

    def latest_records(self) -> dict[str, Any]:
        """/results: the last run record of each probe that has run."""
        with self._lock:
            return {name: st.last.to_json() for name, st in self.state.items() if st.last is not None}
