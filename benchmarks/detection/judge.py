"""What each node's exporter publishes about its own runs: the exporter's judge, driven run by run.

Every node of the fleet gets the exporter's own figure store (fleetcanary.judge.store.FigureStore,
in a state directory on disk) and exposition (fleetcanary.judge.exposition.families), not a copy of
their arithmetic:

* each successful run (scheduled or confirmation, junk figures included; skipped and failed runs
  are observed too and keep nothing) becomes a RunRecord with the probe's samples, the exporter's
  metric names and labels, and the environment it ran in (driver, GPU model), and goes to
  ``FigureStore.observe`` at its finish time: figures.extract builds the figure/series/gpu keys,
  stats.Series the statistics;
* at every scrape while the exporter is up, ``exposition.families`` renders what the exporter would
  publish at that moment (``fleetcanary_judge_median``, ``_newest``, ``_change{baseline,
  baseline_driver}``, ``_drift``), with the exporter's hold (``freshness.hold_for``: a series' statistics stay
  published for a day after its newest run, so a GPU that is busy keeps them) and its freshness
  (``freshness.fresh_for``: ``_newest`` only while the newest run is fresh, ``_newest_held`` after); the scrape adds
  ``job`` and ``node`` (``instance`` is left out, as for the other series, to keep the backfill small);
* during an exporter outage nothing is published; the exporter restarts by building a new
  FigureStore over the same state directory, as the daemon does (statistics persist: the store is
  on disk). The first run of each probe after an outage restart reports its driver and GPU model as
  "unknown" (a worker that could not read NVML), which the store must replace by the last known
  ones: an exporter restart must never look like a driver change.

Per node the result is one column per published series (its OpenMetrics name and labels) with the
scrape indices it was present at and its values, plus checks of the restart behaviour.
"""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.detection.fleet import BW, COLL, DRIVER_NEW, DRIVER_OLD, Fleet, Node, Profile
from fleetcanary.core.environment import UNKNOWN
from fleetcanary.core.record import RunRecord
from fleetcanary.judge import exposition, freshness
from fleetcanary.judge.store import FigureStore

STAT_FAMILIES = ("fleetcanary_judge_median", "fleetcanary_judge_newest", "fleetcanary_judge_newest_held",
                 "fleetcanary_judge_held_last_run_timestamp_seconds", "fleetcanary_judge_change",
                 "fleetcanary_judge_drift")
COLL_SAMPLE_LABELS = {"collective": "all_reduce", "size_bytes": "1073741824", "ranks": "8", "backend": "nccl"}
DURATION = {"gpu_bandwidth": 30.0, "collectives": 60.0}   # the fleet's run lengths (fleet.py)
CPU_MODEL = "Xeon 8480"


@dataclass
class NodeJudge:
    cols: list[str] = field(default_factory=list)       # 'metric{labels}' as OpenMetrics text (job, node first)
    family: list[str] = field(default_factory=list)     # the metric family of each column
    idx: list[np.ndarray] = field(default_factory=list)  # scrape indices at which the column was published
    vals: list[np.ndarray] = field(default_factory=list)
    checks: dict = field(default_factory=dict)


def _labels_text(node: str, labels: dict[str, str]) -> str:
    return ",".join(['job="fleetcanary"', f'node="{node}"'] + [f'{k}="{v}"' for k, v in labels.items()])


def _samples(probe: str, row: np.ndarray, small_bytes: int = 0) -> list[dict]:
    if probe == "gpu_bandwidth":
        return [{"metric": BW, "labels": {"gpu": str(g), "direction": "d2d"}, "value": float(v)}
                for g, v in enumerate(row) if not math.isnan(v)]
    out = [{"metric": COLL, "labels": dict(COLL_SAMPLE_LABELS), "value": float(row[0])}] \
        if not math.isnan(row[0]) else []
    if small_bytes and len(row) > 1 and not math.isnan(row[1]):  # the small-message series (issue 38)
        out.append({"metric": COLL, "labels": dict(COLL_SAMPLE_LABELS, size_bytes=str(small_bytes)),
                    "value": float(row[1])})
    return out


def node_runs(n: Node) -> list[tuple[float, str, int, np.ndarray]]:
    """The node's runs of both probes in time order: (finish, probe, outcome index, figures)."""
    runs = []
    for probe in ("gpu_bandwidth", "collectives"):
        r = n.runs[probe]
        for i in range(len(r["fin"])):
            runs.append((float(r["fin"][i]), probe, int(r["out"][i]), r["vals"][i]))
    runs.sort(key=lambda x: (x[0], x[1]))
    return runs


def run_record(p: Profile, n: Node, fin: float, probe: str, outcome: str, row: np.ndarray,
               unknown: bool = False) -> RunRecord:
    """The exporter's record of one run: the driver the node ran then (or, `unknown`, none it could read)."""
    drv = DRIVER_NEW if n.upgrade_at is not None and fin >= n.upgrade_at else DRIVER_OLD
    env = {"driver_version": UNKNOWN if unknown else drv, "gpu_model": UNKNOWN if unknown else n.model,
           "cpu_model": CPU_MODEL}
    return RunRecord(probe, outcome, started_at=fin - DURATION[probe], wall_seconds=DURATION[probe],
                     samples=_samples(probe, row, p.coll_small_bytes) if outcome == "success" else [],
                     environment=env)


def judge_node(fleet: Fleet, n: Node, t_scrape: np.ndarray, up: np.ndarray, state_dir: Path,
               unknown_after_restart: bool = True) -> NodeJudge:
    """Drive one node's exporter judge through the fleet's week; see the module docstring."""
    p = fleet.p
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True)
    intervals = {"gpu_bandwidth": (p.bw_interval_s, p.bw_timeout_s),
                 "collectives": (p.coll_interval_s, p.coll_timeout_s)}

    def hold(probe: str) -> float:
        return freshness.hold_for(*intervals[probe])

    def fresh(probe: str) -> float:
        return freshness.fresh_for(*intervals[probe])

    runs = node_runs(n)
    restarts = [(b, n.upgrade_at is not None and a == n.upgrade_at) for a, b in n.outages]  # (time, is upgrade)

    store = FigureStore(str(state_dir))
    cols: dict[str, int] = {}
    fams: list[str] = []
    idx: list[list[int]] = []
    vals: list[list[float]] = []
    checks = {"restarts": 0, "restarts_with_unknown_env": 0, "series_at_restart": 0, "series_changed_by_restart": 0,
              "previous_driver_without_upgrade": 0, "driver_labels": set(), "store_bad_lines": 0,
              "store_write_errors": 0}
    ri, rsi = 0, 0
    unknown_next: set[str] = set()     # probes whose next successful run cannot tell the GPU facts
    dirty, next_expiry = True, -math.inf
    current: list[tuple[int, float]] = []
    for i, t in enumerate(t_scrape.tolist()):
        # exporter restarts and runs up to this scrape
        while ri < len(runs) or rsi < len(restarts):
            t_run = runs[ri][0] if ri < len(runs) else math.inf
            t_rs = restarts[rsi][0] if rsi < len(restarts) else math.inf
            if min(t_run, t_rs) > t:
                break
            if t_rs <= t_run:
                _, upgrade = restarts[rsi]
                rsi += 1
                checks["store_bad_lines"] += store.bad_lines
                checks["store_write_errors"] += store.write_errors
                before = render(store, n, t_rs, hold, fresh)
                store = FigureStore(str(state_dir))   # the restarted exporter reads its state directory
                after = render(store, n, t_rs, hold, fresh)
                checks["restarts"] += 1
                checks["series_at_restart"] += len(before)
                checks["series_changed_by_restart"] += sum(after.get(k) != v for k, v in before.items()) + \
                    len(set(after) - set(before))
                if unknown_after_restart and not upgrade:
                    unknown_next = {"gpu_bandwidth", "collectives"}
                    checks["restarts_with_unknown_env"] += 1
                dirty = True
                continue
            fin, probe, out, row = runs[ri]
            ri += 1
            outcome = ("success", "failure", "skipped")[out]
            unknown = probe in unknown_next and outcome == "success"
            if unknown:
                unknown_next.discard(probe)
            if store.observe(run_record(p, n, fin, probe, outcome, row, unknown)):
                dirty = True
        if not up[i]:
            current = []
            dirty = True
            continue
        if dirty or t > next_expiry:
            current, next_expiry = [], math.inf
            for text, (fam, value, labels) in render(store, n, t, hold, fresh).items():
                c = cols.get(text)
                if c is None:
                    c = cols[text] = len(fams)
                    fams.append(fam)
                    idx.append([])
                    vals.append([])
                current.append((c, value))
                checks["driver_labels"].add(labels["driver_version"])
                if labels.get("baseline") == "previous_driver" and n.upgrade_at is None:
                    checks["previous_driver_without_upgrade"] += 1
            for (figure, _, _), st, _ in store.snapshot():
                probe = "gpu_bandwidth" if figure == "gpu_memory_bandwidth" else "collectives"
                for exp in (st.last + fresh(probe), st.last + hold(probe)):  # turns held, turns stale
                    if exp >= t:
                        next_expiry = min(next_expiry, exp)
            dirty = False
        for c, v in current:
            idx[c].append(i)
            vals[c].append(v)
    checks["store_bad_lines"] += store.bad_lines
    checks["store_write_errors"] += store.write_errors
    checks["driver_labels"] = sorted(checks["driver_labels"])
    shutil.rmtree(state_dir, ignore_errors=True)
    names = list(cols)
    order = sorted(range(len(names)), key=lambda c: names[c])
    return NodeJudge([names[c] for c in order], [fams[c] for c in order],
                     [np.array(idx[c], dtype=np.int32) for c in order],
                     [np.array(vals[c], dtype=np.float64) for c in order], checks)


def render(store: FigureStore, n: Node, t: float, hold, fresh) -> dict[str, tuple[str, float, dict]]:
    """What the exporter's judge publishes at time t: OpenMetrics series text -> (family, value, labels)."""
    out = {}
    for fam in exposition.families(store, {"pool": n.pool}, t, hold, fresh):
        if fam.name not in STAT_FAMILIES:
            continue
        for s in fam.samples:
            out[f"{fam.name}{{{_labels_text(n.name, s.labels)}}}"] = (fam.name, s.value, s.labels)
    return out
