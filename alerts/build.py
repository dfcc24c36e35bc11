#!/usr/bin/env python3
"""Generate the recording and alert rules (alerts/fleetcanary.rules.yml and
alerts/fleetcanary.alerts.yml) from the family table below.

Rules are data: each probe family names its metric, the labels that identify one
measured thing, the labels its peers share, its probe interval, its direction, and
whether it gets self-history rules. The same rule shapes then apply to every family.
`python alerts/build.py` rewrites the files; a test fails when they differ.

Prometheus 2.42 (Debian bookworm): quantile, quantile_over_time, changes, offset,
last_over_time, keep_firing_for (new in 2.42). Nothing experimental. docs/alerting.md
explains each decision; in short:

- Windows of runs, not scrapes. The exporter drops a run's figures once they are older
  than 1.5 intervals (+ the probe's timeout), so every `*_over_time` window holds fresh
  runs only; `changes(m[W]) + 1` counts the distinct runs of one series in its window
  (each run's figure is a new measured float), and a smoothed value exists only with
  MIN_RUNS of them. A sparse window neither makes, clears nor counts as a peer; an alert
  that is firing holds (through its own ALERTS series) while its window is sparse.
- Peer judgement on changes: each series' smoothed value over its own baseline (the
  median of its previous ~3 days on the driver it runs now), against the same change of
  its peers. Persistent per-GPU offsets cancel, so the spread is run noise, not silicon
  spread. Peers share model, pool and driver version (a rolling upgrade splits a pool into
  two cohorts instead of blinding it), and at least MIN_PEERS nodes must report. Until a
  series has a baseline on its new driver (~2 days after an upgrade), its change against the
  previous driver's baseline is judged against its upgraded cohort's. A raw path (the smoothed
  value against the peer median, 10% floor) judges members without any baseline and
  persistent outliers. Every smoothed judgement needs the best of the newest runs to confirm
  it (CONFIRM_INTERVALS, CONFIRM_SHARE).
- A fast path for drops of 20% and more (gate FAST_DROP, below 20% by the per-GPU spread): the best of
  three agreeing runs: FAST_CONFIRMED intervals after the first with the exporter's confirmation run
  among them, at the third scheduled run without one.
- Self-history and driver changes against the same baseline; a long-baseline drift
  rule (the day's median against the best day on the current driver in 14 days).
- Every alert reads recorded series from a group at most as slow as its own evaluation,
  or through last_over_time over a window covering the slower group's interval.

`build(scale=...)` multiplies every group interval, `for`, `keep_firing_for` and covering
window (not the data windows): tests/test_alerts_live.py runs the shipped structure
faster on a real Prometheus.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rules_fabric  # beside this script, as runbooks.py: the cross-node fabric rules
import rules_nic  # RDMA port and Ethernet interface rules

HERE = Path(__file__).resolve().parent

RUNBOOK = "https://github.com/fleetcanary/fleetcanary/blob/main/docs/runbooks.md"
REL_RAW = 0.10        # raw path: at least this far from the peer median
REL_HIST = 0.10       # self-history and driver-change floor (per family override)
K_MAD = 5             # and more than this many median absolute deviations of the peers (raw path, fast path)
# The change path: more MADs. Offsets removed, the peers' spread of changes is run noise alone, which is
# what this gate should scale with; 7 MADs (4.7 sigma for normal noise) keeps heavy-tailed run noise and
# diurnal swings from reaching the floor, and stays under the 2.5% floor where noise is H200-low.
K_MAD_CHANGE = 7
MIN_PEERS = 5         # nodes reporting in the peer group
MIN_RUNS = 5          # distinct fresh runs in a smoothing window
FAST_DROP = 0.15      # the fast path: the newest three runs all this far off. It is there for drops of 20%
                      # and more; at a 20% gate a 20% drop on a GPU 2% above its peers' median (offsets are
                      # +-2%) never fired (the detection benchmark caught 75% of its 20% steps, median 48 min)
FAST_AGREE = 2        # ... and within this many change floors (Family.rel) of each other (a real fault moves a
                      # GPU to a new level; junk runs scatter)
FAST_CONFIRMED = 1.2  # three runs within this many intervals: the run that jumped, the confirmation run the exporter
                      # adds minutes later (daemon/confirm.py), the next scheduled run (its jitter included). Two runs
                      # were not enough: 0.5% junk runs gave the 195-node fleet 4 agreeing junk pairs a week
FAST_UNCONFIRMED = 2.5  # ... or within this many: three scheduled runs at any jitter, for as long as a fault lasts
FAST_RUNS = 3         # the runs the fast path needs in either window
CONFIRM_INTERVALS = 2.5  # the newest runs that must confirm a smoothed judgement: those exported in the last 2.5
                      # probe intervals (the newest 3, with up to 10% jitter per run, sometimes 4)
CONFIRM_RUNS = 3      # ... and at least this many of them, or the window is not confirmed (neither fires nor resolves)
CONFIRM_SHARE = 0.5   # ... the best of them at least this share of the floor worse than the reference. Two junk
                      # runs in a 6-run window move its median; they cannot also make the newest runs all bad
DRIFT = 0.04          # long baseline: the day's median this far off the best day on this driver. At 5% the
                      # day's median reached it 12-36 h after a 1%/day ramp crossed 5% (its half-day lag, the
                      # best day's small upward bias, busy days with too few runs); 4% fires about a day sooner
DRIFT_WINDOW = "14d"
HOLD = "1d"           # a firing peer/history alert holds at most this long while its window is sparse
INTERVALS = {"inventory": 60, "peers": 60, "peers_slow": 900, "daily": 3600}  # group intervals, seconds
BASE_DAYS = 2         # the baseline: the median of this many days of hourly 1-day medians (~3 days of runs)


@dataclass
class Family:
    key: str              # short name used in alert names and runbooks
    title: str            # human words
    metric: str           # raw metric or a recorded one
    level: str            # "gpu" or "node": the first part of recorded names
    entity: tuple[str, ...]   # labels identifying one measured thing (node is always among them)
    peers: tuple[str, ...]    # labels peers share besides model/pool
    interval_minutes: int     # the probe's default interval
    higher_is_better: bool
    join: str             # "gpu_model" (per GPU), "node_model" (per node), "cpu_model", or "pool"
    history: bool = True
    severity: str = "warning"
    alert: str = ""       # CamelCase stem of the alert name
    rel: float = 0.05     # change path floor: at least this far from the peers' median change
    rel_hist: float = REL_HIST
    k_mad: float = K_MAD_CHANGE  # the change path's gate in MADs of the peers' changes
    window: str = ""      # smoothing window; default MIN_RUNS + 0.5 probe intervals
    for_minutes: int = 0  # override the peer alert's `for` (default: 1 probe interval, at least 15 min if under 10)
    fast: bool = True     # a fast path for large drops
    runs_by_changes: bool = True  # False: a recorded, continuously changing figure (no run count)

    def __post_init__(self) -> None:
        if not self.window:
            # MIN_RUNS intervals and half one more: with up to 10% jitter per run, 5 runs always fit (6-7
            # with the run before the window, still exported at its start). A window of 4.5 intervals
            # (5-6 runs) turned the median a run sooner, but on the 195-node detection fleet it added 5
            # false episodes (junk-run pairs weigh more in 5 runs) for 6 minutes of median time to
            # detect that both windows already kept within 4 intervals (docs/detection.md).
            self.window = dur(math.ceil((MIN_RUNS + 0.5) * self.interval_minutes) * 60)

    @property
    def group(self) -> tuple[str, ...]:
        extra = {"gpu_model": ("model", "pool", "driver_version"), "node_model": ("model", "pool", "driver_version"),
                 "cpu_model": ("cpu_model", "pool"), "pool": ("pool",)}[self.join]
        return extra + self.peers

    @property
    def per_driver(self) -> bool:
        """Peers share a driver version, and baselines are per driver: an upgrade starts a new one."""
        return "driver_version" in self.group

    @property
    def slow(self) -> bool:
        """Smoothing windows of days are recorded in a 15-minute group, not every minute."""
        return self.interval_minutes >= 1440

    @property
    def confirmed(self) -> bool:
        """Smoothed judgements need the newest runs to agree (families of discrete runs every few minutes
        to hours; a daily burn's newest runs are days, a recorded p95 has no runs)."""
        return self.runs_by_changes and not self.slow

    @property
    def for_m(self) -> int:
        return self.for_minutes or (self.interval_minutes if self.interval_minutes >= 10 else 15)


def dur(seconds: float) -> str:
    """A PromQL duration: 900 -> 15m, 5400 -> 90m, 86400*5 -> 5d, 30 -> 30s."""
    seconds = max(round(seconds), 1)
    if seconds % 86400 == 0 and seconds >= 2 * 86400:
        return f"{seconds // 86400}d"
    if seconds % 3600 == 0 and seconds >= 6 * 3600:
        return f"{seconds // 3600}h"
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def seconds(d: str) -> int:
    return int(d[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[d[-1]]


FAMILIES = [
    # HBM copy bandwidth is very stable (CV 0.5-0.8% per run on an H200, docs/gpu-validation.md): the change
    # path's 2.5% floor with the 5-MAD gate catches 3% drops where run noise is that low (benchmarks/detection).
    Family("gpu_memory_bandwidth", "GPU memory bandwidth", "fleetcanary_gpu_memory_bandwidth_bytes_per_second", "gpu",
           ("node", "gpu", "direction"), ("direction",), 15, True, "gpu_model", alert="GPUMemoryBandwidth",
           rel=0.025, rel_hist=0.05),
    Family("gpu_p2p_bandwidth", "GPU peer-to-peer bandwidth", "fleetcanary_gpu_p2p_bandwidth_bytes_per_second", "gpu",
           ("node", "src_gpu", "dst_gpu"), ("src_gpu", "dst_gpu"), 60, True, "node_model", alert="GPUP2PBandwidth"),
    # One series per node and a 30-minute interval: 6 MADs, not 7. On the 195-node detection fleet 7 MADs held the
    # median time to detect of its 7-20% steps at 4.8 intervals (144 min), 6 at 3.8 (114 min), both with no false
    # episode; at 5, a diurnal trough fired once. (The GPU family at 5 MADs: 32 false episodes, 12 of them diurnal.)
    Family("collective_bus_bandwidth", "collective bus bandwidth",
           "fleetcanary_collective_bus_bandwidth_bytes_per_second", "node",
           ("node", "collective", "size_bytes", "ranks", "backend"), ("collective", "size_bytes", "ranks", "backend"),
           30, True, "node_model", alert="CollectiveBandwidth", rel=0.04, k_mad=6),
    Family("host_memory_bandwidth", "host memory bandwidth", "fleetcanary_host_memory_bandwidth_bytes_per_second",
           "node", ("node", "op"), ("op",), 10, True, "cpu_model", alert="HostMemoryBandwidth"),
    Family("storage_read", "storage read throughput", "fleetcanary_storage_read_bytes_per_second", "node",
           ("node", "target", "cache"), ("target", "cache"), 30, True, "pool", alert="StorageRead"),
    Family("storage_first_byte", "storage first-byte latency", "fleetcanary_storage_first_byte_seconds", "node",
           ("node", "target", "cache"), ("target", "cache"), 30, False, "pool", alert="StorageFirstByte", rel=0.10),
    # Matmul throughput per GPU and dtype (gpu_compute, every 30 minutes).
    Family("gpu_matmul_throughput", "GPU matrix-multiply throughput", "fleetcanary_gpu_matmul_flops_per_second", "gpu",
           ("node", "gpu", "dtype"), ("dtype",), 30, True, "gpu_model", alert="GPUMatmulThroughput"),
    # Sustained/initial throughput of the daily burn (gpu_sustained): 5 daily runs in its window, recorded every
    # 15 minutes; `for` an hour. No self-history (a week of runs before a history ratio means anything) and no
    # fast path (two daily burns are two days); FleetCanaryGPUThrottlingUnlikePeers judges each burn at once.
    Family("gpu_sustained_ratio", "GPU sustained-over-initial throughput", "fleetcanary_gpu_sustained_throughput_ratio",
           "gpu", ("node", "gpu"), (), 1440, True, "gpu_model", history=False, alert="GPUSustainedThroughput",
           for_minutes=60, fast=False),
    # Training-step time of the canary transformer (train_step, hourly). Lower is better: its alerts fire on a
    # rise and are named ...SlowerThanPeers / ...RiseAfterDriverChange.
    Family("train_step_time", "training step time", "fleetcanary_train_step_seconds", "gpu",
           ("node", "gpu", "dtype"), ("dtype",), 60, False, "gpu_model", alert="TrainStepTime"),
    # A p95 recorded every minute from the canary's histograms over 30 minutes: a continuously changing figure,
    # so its window counts evaluations, not runs. No history and no fast path: it is already a 30-minute
    # aggregate of a shared endpoint, and FleetCanaryInferenceTTFTSLOBreach judges it at any pool size.
    Family("inference_ttft", "inference time to first token (p95)", "node:fleetcanary_inference_ttft_seconds:p95_30m",
           "node", ("node", "target", "model"), ("target", "model"), 1, False, "pool", alert="InferenceTTFT",
           window="30m", rel=0.10, history=False, fast=False, runs_by_changes=False),
]


def rec(name: str, expr: str) -> dict:
    return {"record": name, "expr": " ".join(expr.split())}


def names(f: Family) -> dict[str, str]:
    base = f.metric.split(":")[1] if ":" in f.metric else f.metric
    g = "pool_model" if "model" in f.group else ("pool_cpu_model" if "cpu_model" in f.group else "pool")
    lv = f.level
    return {
        "runs": f"{lv}:{base}:runs{f.window}",
        "smoothed": f"{lv}:{base}:median{f.window}",
        "peer_median": f"{g}:{base}:peer_median",
        "ratio": f"{lv}:{base}:peer_ratio",
        "mad": f"{g}:{base}:peer_ratio_mad",
        "count": f"{g}:{base}:peer_count",
        "median1d": f"{lv}:{base}:median1d",
        "baseline": f"{lv}:{base}:baseline",
        "pre_change_baseline": f"{lv}:{base}:baseline_before_1d",
        "change": f"{lv}:{base}:history_ratio",
        "change_median": f"{g}:{base}:peer_change_median",
        "change_ratio": f"{lv}:{base}:peer_change_ratio",
        "change_mad": f"{g}:{base}:peer_change_mad",
        "change_count": f"{g}:{base}:peer_change_count",
        "recent": f"{lv}:{base}:{'max' if f.higher_is_better else 'min'}_last3runs",
        "confirm": f"{lv}:{base}:{'max' if f.higher_is_better else 'min'}_newest_runs_over_median",
        "prev_baseline": f"{lv}:{base}:baseline_previous_driver",
        "upgrade_change": f"{lv}:{base}:history_ratio_previous_driver",
        "upgrade_median": f"{g}:{base}:peer_upgrade_change_median",
        "upgrade_ratio": f"{lv}:{base}:peer_upgrade_change_ratio",
        "upgrade_mad": f"{g}:{base}:peer_upgrade_change_mad",
        "upgrade_count": f"{g}:{base}:peer_upgrade_change_count",
        "recent_ratio": f"{lv}:{base}:last3runs_peer_ratio",
        "recent_hist_ratio": f"{lv}:{base}:last3runs_history_ratio",
        "pre_change_ratio": f"{lv}:{base}:pre_driver_change_ratio",
        "drift_median1d": f"{lv}:{base}:median1d_same_driver",
        "drift_best": f"{lv}:{base}:best_day_{DRIFT_WINDOW}",
        "drift_ratio": f"{lv}:{base}:drift_ratio",
    }


def info_join(f: Family, inner: str) -> str:
    if f.join == "gpu_model":
        return (f"{inner} * on(node, gpu) group_left(model) node_gpu:fleetcanary_gpu_model:info "
                f"* on(node) group_left(pool, driver_version) node:fleetcanary_pool_driver:info")
    if f.join == "node_model":
        return (f"{inner} * on(node) group_left(model) node:fleetcanary_gpu_model:info "
                f"* on(node) group_left(pool, driver_version) node:fleetcanary_pool_driver:info")
    if f.join == "cpu_model":
        return f"{inner} * on(node) group_left(cpu_model, pool) node:fleetcanary_cpu_model_pool:info"
    return f"{inner} * on(node) group_left(pool) node:fleetcanary_pool:info"


def strip(f: Family) -> str:
    """Labels the join adds, which a raw-labelled series does not have (never one of the entity's)."""
    return {"gpu_model": "model, pool, driver_version", "node_model": "model, pool, driver_version",
            "cpu_model": "cpu_model, pool", "pool": "pool"}[f.join]


class Ctx:
    """Group intervals and covering windows under one scale factor."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.iv = {k: v * scale for k, v in INTERVALS.items()}

    def cover(self, group: str) -> str:
        """A last_over_time window that always holds the newest output of a group evaluated every
        `group` interval, read by a 1-minute reader: that interval plus 5 reader evaluations."""
        return dur(self.iv[group] + 5 * self.iv["peers"])

    def t(self, minutes: float) -> str:
        return dur(minutes * 60 * self.scale) if minutes else "0m"

    def ref(self, f: Family, key: str) -> str:
        """A recorded series of family f as an alert (evaluated every minute) may read it."""
        n = names(f)[key]
        if f.slow and key in ("runs", "smoothed", "peer_median", "ratio", "mad", "count"):
            return f"last_over_time({n}[{self.cover('peers_slow')}])"
        return n


def runs_ok(f: Family, c: Ctx) -> str:
    if not f.runs_by_changes:
        return f"({c.ref(f, 'smoothed')})"
    return f"({c.ref(f, 'runs')} >= {MIN_RUNS})"


def smoothing_rules(f: Family) -> list[dict]:
    n = names(f)
    raw, w = f.metric, f.window
    out = []
    if f.runs_by_changes:
        out.append(rec(n["runs"], f"changes({raw}[{w}]) + 1"))
        out.append(rec(n["smoothed"], info_join(f, f"(quantile_over_time(0.5, {raw}[{w}]) "
                                                   f"and ({n['runs']} >= {MIN_RUNS}))")))
    else:
        out.append(rec(n["smoothed"], info_join(f, f"quantile_over_time(0.5, {raw}[{w}])")))
    if f.confirmed:
        # The best of the newest runs over the window's median, labelled as the smoothed series: a ratio
        # judged on the window, times this, is the same judgement of the newest runs alone.
        fn = "max_over_time" if f.higher_is_better else "min_over_time"
        cw = dur(math.ceil(CONFIRM_INTERVALS * f.interval_minutes) * 60)
        # Three runs at least (CONFIRM_RUNS): as a busy period begins, the newest figures expire one by one, and
        # one low last run alone confirmed a window (3 false peer episodes held through busy periods).
        newest = f"({fn}({raw}[{cw}]) and (changes({raw}[{cw}]) >= {CONFIRM_RUNS - 1}))"
        out.append(rec(n["confirm"], f"{newest} / ignoring({strip(f)}) group_right() {n['smoothed']}"))
    return out


def against_peers(f: Family, value: str, median: str, ratio: str, mad: str, count: str) -> list[dict]:
    """`value` against its peer group: the group's median, each member's ratio to it, the MAD of those
    ratios, and the number of nodes reporting. One shape for the raw, change and upgraded-cohort paths."""
    g = ", ".join(f.group)
    return [
        rec(median, f"quantile by ({g}) (0.5, {value})"),
        rec(ratio, f"{value} / on({g}) group_left() {median}"),
        rec(mad, f"quantile by ({g}) (0.5, abs({ratio} - 1))"),
        rec(count, f"count by ({g}) (count by ({g}, node) ({value}))"),
    ]


def peer_rules(f: Family) -> list[dict]:
    """Raw path: the smoothed value against its peers' median. Peers counted in nodes."""
    n = names(f)
    return against_peers(f, n["smoothed"], n["peer_median"], n["ratio"], n["mad"], n["count"])


def over_baseline(f: Family, c: Ctx, numerator: str) -> str:
    """`numerator` over the series' own baseline on the driver it runs now, read from the hourly group
    through last_over_time over a window that covers that group's interval. group_left(): a one-to-one
    match `ignoring` labels drops them from the result; the peer grouping needs model, pool and driver
    version kept."""
    return (f"{numerator} / {baseline_match(f)} group_left() "
            f"last_over_time({names(f)['baseline']}[{c.cover('daily')}]){not_after_driver_change(f)}")


def change_rules(f: Family, c: Ctx) -> list[dict]:
    """Change path: each series against its own baseline (history_ratio), against its peers' changes.
    The baselines come from the hourly group: read through last_over_time over a window that covers
    that group's interval, never through the 5-minute lookback."""
    n = names(f)
    cover = c.cover("daily")
    out = [rec(n["change"], over_baseline(f, c, n["smoothed"])),
           rec(n["pre_change_ratio"], f"{n['smoothed']} / ignoring({strip(f)}) group_left() "
                                      f"last_over_time({n['pre_change_baseline']}[{cover}])"),
           *against_peers(f, n["change"], n["change_median"], n["change_ratio"], n["change_mad"], n["change_count"])]
    if f.per_driver:
        # Just after a driver upgrade a series has no baseline on its new driver for about 2 days. Until it
        # has one, its change is taken against its baseline on the previous driver, and judged only against
        # the changes of its cohort: the peers on the same new driver that are in the same position, so the
        # driver's own effect, common to the cohort, cancels.
        ent = ", ".join(f.entity)
        out += [rec(n["upgrade_change"], f"({n['smoothed']} unless on({ent}) {n['change']}) / ignoring({strip(f)}) "
                                         f"group_left() last_over_time({n['prev_baseline']}[{cover}])"),
                *against_peers(f, n["upgrade_change"], n["upgrade_median"], n["upgrade_ratio"], n["upgrade_mad"],
                               n["upgrade_count"])]
    return out


def baseline_match(f: Family) -> str:
    """How a smoothed series finds its baseline. Per-driver families match on the driver version too:
    a GPU compares itself with its days on the driver it runs now, or not at all. (Measured on the
    detection fleet: an old-driver baseline made GPUs upgraded late look 3-6% worse than their
    new-driver cohort, and leaving out every node upgraded in the last 3 days lost the faults there.)"""
    return f"ignoring({'model, pool' if f.per_driver else strip(f)})"


def not_after_driver_change(f: Family) -> str:
    """Families whose baseline is not per driver leave out nodes whose driver changed within the
    baseline's span (about 3 days); per-driver baselines need no exclusion."""
    return "" if f.per_driver else " unless on(node) (node:fleetcanary_driver_versions:count3d > 1)"


def fast_rules(f: Family, c: Ctx) -> list[dict]:
    """The best of three or more runs, all agreeing, exported within FAST_CONFIRMED intervals, or within
    FAST_UNCONFIRMED; nothing otherwise. The short window holds three runs, and none from before them, from
    FAST_CONFIRMED intervals after the first of them: the run that jumped, its confirmation run minutes later
    (daemon/confirm.py) and the next scheduled run. Without a confirmation (the GPU busy then, an older
    exporter) it holds three scheduled runs from the third on, about 2 intervals after the first. The
    short window holds three runs only for minutes after each run; the long one carries a steady fault.
    Against the peers' median outright: at 20% no per-GPU offset matters, and no baseline is needed (a
    new node, a node just upgraded). And against its own baseline, for the pools too small to judge by
    peers (FarBelowOwnHistory)."""
    n = names(f)
    g = ", ".join(f.group)
    fn = "max_over_time" if f.higher_is_better else "min_over_time"

    def three_runs(intervals: float) -> str:
        m = f"{f.metric}[{dur(intervals * f.interval_minutes * 60)}]"
        agree = f"(max_over_time({m}) / min_over_time({m}) < {1 + FAST_AGREE * f.rel:g})"
        return f"({fn}({m}) and (changes({m}) >= {FAST_RUNS - 1}) and {agree})"

    best = f"({three_runs(FAST_CONFIRMED)} or {three_runs(FAST_UNCONFIRMED)})"
    out = [rec(n["recent"], info_join(f, best)),
           rec(n["recent_ratio"], f"{n['recent']} / on({g}) group_left() {n['peer_median']}")]
    if f.history:
        out.append(rec(n["recent_hist_ratio"], over_baseline(f, c, n["recent"])))
    return out


def daily_rules(f: Family) -> list[dict]:
    """Hourly: the 1-day median of each series (at least half a day of runs), the baselines built
    from it (cheap: 48 hourly points, not 3 days of scrapes), and the drift rule's best day."""
    n = names(f)
    raw = f.metric
    half_day = max(1440 // max(f.interval_minutes, 1) // 2, MIN_RUNS)
    enough = f"and (changes({raw}[1d]) >= {half_day - 1})" if f.runs_by_changes else ""
    offset = f.window
    best = "max_over_time" if f.higher_is_better else "min_over_time"
    src = n["drift_median1d"] if f.per_driver else n["median1d"]
    return [
        rec(n["median1d"], f"quantile_over_time(0.5, {raw}[1d]) {enough}"),
        # Only days on one driver, labelled with it: a new driver starts a new series (and a new best day,
        # and for per-driver families a new baseline).
        rec(n["drift_median1d"], f"({n['median1d']} unless on(node) (node:fleetcanary_driver_versions:count1d > 1)) "
                                 f"* on(node) group_left(driver_version) node:fleetcanary_driver:info"),
        # ~3 days of runs ending one smoothing window ago: the 1-day medians recorded over 2 days.
        # At least a day of hourly medians behind it: a young baseline is one noisy day. Per driver where
        # peers are: after an upgrade, a day on the new driver and a day of its medians (2 days).
        rec(n["baseline"], f"quantile_over_time(0.5, {src}[{BASE_DAYS}d] offset {offset}) "
                           f"and (count_over_time({src}[{BASE_DAYS}d] offset {offset}) >= 24)"),
        rec(n["pre_change_baseline"], f"quantile_over_time(0.5, {n['median1d']}[{BASE_DAYS}d] offset 1d)"),
    ] + ([
        # The newest baseline each series had on a driver other than the one its node runs now (kept 4 days:
        # a baseline on the new driver takes about 2): the change path's reference until that one exists.
        rec(n["prev_baseline"], f"max without(driver_version) (last_over_time({n['baseline']}[4d]) "
                                f"unless on(node, driver_version) node:fleetcanary_driver:info)"),
    ] if f.per_driver else []) + [
        rec(n["drift_best"], f"{best}({n['drift_median1d']}[{DRIFT_WINDOW}])"),
        rec(n["drift_ratio"], f"{n['drift_median1d']} / {n['drift_best']}"),
    ]


def inventory_rules() -> list[dict]:
    return [
        rec("node_gpu:fleetcanary_gpu_model:info", "max by (node, gpu, model) (fleetcanary_gpu_info)"),
        rec("node:fleetcanary_gpu_model:info", "max by (node, model) (fleetcanary_gpu_info)"),
        rec("node:fleetcanary_pool:info", "max by (node, pool) (fleetcanary_node_info)"),
        # The newest node_info only: a driver upgrade must never leave two versions of one node to join on
        # (the old series can linger for a lookback if it was not marked stale).
        rec("node:fleetcanary_pool_driver:info",
            "count by (node, pool, driver_version) (topk by (node) (1, timestamp(fleetcanary_node_info)))"),
        rec("node:fleetcanary_driver:info", "max by (node, driver_version) (node:fleetcanary_pool_driver:info)"),
        rec("node:fleetcanary_cpu_model_pool:info", "max by (node, cpu_model, pool) (fleetcanary_node_info)"),
        rec("node:fleetcanary_driver_versions:count1d",
            "count by (node) (count by (node, driver_version) (max_over_time(fleetcanary_node_info[1d])))"),
        rec("node:fleetcanary_driver_versions:count3d",
            "count by (node) (count by (node, driver_version) (max_over_time(fleetcanary_node_info[3d])))"),
        rec("node:fleetcanary_inference_ttft_seconds:p95_30m",
            "histogram_quantile(0.95, sum by (node, target, model, le) "
            "(rate(fleetcanary_inference_time_to_first_token_seconds_bucket[30m])))"),
        rec("node:fleetcanary_inference_itl_seconds:p95_30m",
            "histogram_quantile(0.95, sum by (node, target, model, le) "
            "(rate(fleetcanary_inference_inter_token_latency_seconds_bucket[30m])))"),
        rec("node:fleetcanary_inference_errors:ratio_rate15m",
            'sum by (node, target, model) (rate(fleetcanary_inference_requests_total{outcome!="success"}[15m])) '
            "/ sum by (node, target, model) (rate(fleetcanary_inference_requests_total[15m]))"),
        rec("gpu:fleetcanary_gpu_sustained_slowdown_ratio:by_model",
            "fleetcanary_gpu_sustained_slowdown_ratio * on(node, gpu) group_left(model) "
            "node_gpu:fleetcanary_gpu_model:info "
            "* on(node) group_left(pool) node:fleetcanary_pool:info"),
        rec("pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_median",
            "quantile by (model, pool) (0.5, gpu:fleetcanary_gpu_sustained_slowdown_ratio:by_model)"),
        rec("pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_count",
            "count by (model, pool) "
            "(count by (model, pool, node) (gpu:fleetcanary_gpu_sustained_slowdown_ratio:by_model))"),
        rec("node:fleetcanary_gpu_probe_seconds:duty_cycle_1h",
            "sum by (node, gpu) (rate(fleetcanary_gpu_probe_seconds_total[1h]))"),
    ]


def annotations(summary: str, description: str, key: str) -> dict:
    return {"summary": summary, "description": description, "runbook_url": f"{RUNBOOK}#{key.lower()}"}


def entity_words(f: Family) -> str:
    return ", ".join(f"{x} {{{{ $labels.{x} }}}}" for x in f.entity)


def newest_runs_agree(f: Family, ratio: str, floor: float) -> str:
    """` and ...`: the best of the newest runs (the `confirm` series, over the smoothed value, times a ratio
    judged on the smoothed value) is also CONFIRM_SHARE of `floor` worse than the same reference; empty for
    families without it."""
    if not f.confirmed:
        return ""
    worse = f"< {1 - CONFIRM_SHARE * floor:g}" if f.higher_is_better else f"> {1 + CONFIRM_SHARE * floor:g}"
    return f" and ({ratio} * {names(f)['confirm']} {worse})"


def worse_than(f: Family, ratio: str, floor: float, mad: str, count: str, g: str, k: float = K_MAD,
               confirm: bool = False) -> str:
    """`ratio` worse than 1 by `floor` and by k x `mad`, with MIN_PEERS nodes; the value is how far off.
    With `confirm`, the newest runs must agree (newest_runs_agree)."""
    gate = newest_runs_agree(f, ratio, floor) if confirm else ""
    if f.higher_is_better:
        return (f"((1 - {ratio}) > on({g}) group_left() ({k:g} * {mad})) and ({ratio} < {1 - floor:g}) "
                f"and on({g}) ({count} >= {MIN_PEERS}){gate}")
    return (f"(({ratio} - 1) > on({g}) group_left() ({k:g} * {mad})) and ({ratio} > {1 + floor:g}) "
            f"and on({g}) ({count} >= {MIN_PEERS}){gate}")


# Replay metadata for the detection benchmark, which cannot evaluate ALERTS on backfilled data:
# alertname -> {"cond", "runs_ok", "entity", "for_s", "keep_s", "hold_s"}.
_PARTS: dict[str, dict] = {}


def _held(f: Family, name: str, value: str, c: Ctx) -> str:
    """While the window is sparse (fewer than MIN_RUNS runs, or no fresh run at all), a firing alert
    keeps firing with its last value, for at most HOLD: ALERTS carries the alert's labels plus
    alertname, alertstate and the rule's labels. With MIN_RUNS runs back, the condition alone decides."""
    ent = ", ".join(f.entity)
    return (f"(({value}) and ignoring(alertname, alertstate, severity, family) "
            f'ALERTS{{alertname="{name}", alertstate="firing"}}) unless on({ent}) {runs_ok(f, c)}')


def _alert(f: Family, name: str, cond: str, value_held: str | None, for_m: int, keep_m: int, c: Ctx,
           summary: str, description: str, severity: str | None = None) -> dict:
    expr = f"({cond}) or ({_held(f, name, value_held, c)})" if value_held else cond
    _PARTS[name] = {"cond": " ".join(cond.split()), "runs_ok": " ".join(runs_ok(f, c).split()) if value_held else None,
                    "entity": list(f.entity), "for_s": seconds(c.t(for_m)) if for_m else 0,
                    "keep_s": seconds(c.t(keep_m)), "hold_s": seconds(HOLD) if value_held else 0}
    return {"alert": name, "expr": " ".join(expr.split()), "for": c.t(for_m), "keep_firing_for": c.t(keep_m),
            "labels": {"severity": severity or f.severity, "family": f.key},
            "annotations": annotations(summary, description, name)}


def peer_alert(f: Family, c: Ctx | None = None) -> dict:
    c = c or Ctx()
    g = ", ".join(f.group)
    name = f"FleetCanary{f.alert}BelowPeers" if f.higher_is_better else f"FleetCanary{f.alert}SlowerThanPeers"
    n = names(f)
    # (ratio, its MAD, its count, floor, MADs): the change path, the upgraded cohort's, then the raw path
    paths = [("change_ratio", "change_mad", "change_count", f.rel, f.k_mad)] if f.history else []
    if f.history and f.per_driver:
        paths.append(("upgrade_ratio", "upgrade_mad", "upgrade_count", f.rel, f.k_mad))
    conds = [worse_than(f, n[r], floor, n[m], n[k], g, km, confirm=True) for r, m, k, floor, km in paths]
    conds.append(worse_than(f, c.ref(f, "ratio"), REL_RAW, c.ref(f, "mad"), c.ref(f, "count"), g, confirm=True))
    cond = " or ".join(f"({x})" for x in conds) if len(conds) > 1 else conds[0]
    lasts = [f"last_over_time({n[r]}[{HOLD}])" for r, *_ in paths] + [f"last_over_time({n['ratio']}[{HOLD}])"]
    last = f"({' or '.join(lasts)})" if len(lasts) > 1 else lasts[0]
    held = f"1 - {last}" if f.higher_is_better else f"{last} - 1"
    words = "below" if f.higher_is_better else "slower than"
    how = (f"against its own baseline, {f.rel:.1%} or more beyond its peers' change (or {REL_RAW:.0%} from their "
           f"median outright)" if f.history else f"{REL_RAW:.0%} or more from their median")
    return _alert(f, name, cond, held, f.for_m, 2 * f.for_m, c, f"{f.title} {words} its peers",
                  f"{entity_words(f)}: {{{{ $value | humanizePercentage }}}} {words} its peers ({', '.join(f.group)}) "
                  f"{how}, and more than {f.k_mad if f.history else K_MAD:g} MADs of their spread; "
                  f"{MIN_PEERS}+ peer nodes, {MIN_RUNS}+ runs "
                  f"in {f.window}.")


def fast_alert(f: Family, c: Ctx | None = None) -> dict:
    """Large drops: the newest three runs (fast_rules) all FAST_DROP or more off the peers' median (and K_MAD
    MADs), with MIN_PEERS nodes. `for: 0m`: with the exporter's confirmation run it fires FAST_CONFIRMED
    intervals after the first bad run, without it at the third scheduled run; keep_firing_for (2 intervals)
    holds it until the window of FAST_UNCONFIRMED intervals carries it."""
    c = c or Ctx()
    n = names(f)
    g = ", ".join(f.group)
    name = f"FleetCanary{f.alert}{'FarBelowPeers' if f.higher_is_better else 'FarSlowerThanPeers'}"
    cond = worse_than(f, n["recent_ratio"], FAST_DROP, n["mad"], n["count"], g)
    words = "far below" if f.higher_is_better else "far slower than"
    return _alert(f, name, cond, None, 0, 2 * f.interval_minutes, c,
                  f"{f.title} {words} its peers in three runs in a row",
                  f"{entity_words(f)}: the best of its last three runs is {{{{ $value | humanizePercentage }}}} "
                  f"{'below' if f.higher_is_better else 'slower than'} the median of its peers ({', '.join(f.group)}); "
                  f"at least {FAST_DROP:.0%}.", severity="critical")


def fast_history_alert(f: Family, c: Ctx | None = None) -> dict:
    """The fast path where peers cannot judge (fewer than MIN_PEERS nodes report in the group: a small
    pool, or a large one mostly busy): the newest three runs, agreeing, all FAST_DROP or more off the
    series' own baseline (on the driver it runs now). `for: 0m`, as the peer fast path."""
    c = c or Ctx()
    n = names(f)
    g = ", ".join(f.group)
    name = f"FleetCanary{f.alert}{'FarBelowOwnHistory' if f.higher_is_better else 'FarSlowerThanOwnHistory'}"
    worse = f"< {1 - FAST_DROP:g}" if f.higher_is_better else f"> {1 + FAST_DROP:g}"
    cond = f"({n['recent_hist_ratio']} {worse}) unless on({g}) ({n['count']} >= {MIN_PEERS})"
    words = "below" if f.higher_is_better else "slower than"
    return _alert(f, name, cond, None, 0, 2 * f.interval_minutes, c,
                  f"{f.title} far {words} its own history in three runs in a row, with too few peers to compare",
                  f"{entity_words(f)}: the best of its last three runs is {{{{ $value | humanizePercentage }}}} of its "
                  f"median over about the previous 3 days{' on this driver' if f.per_driver else ''} (at least "
                  f"{FAST_DROP:.0%} {'below' if f.higher_is_better else 'above'}); fewer than {MIN_PEERS} peer nodes "
                  f"({', '.join(f.group)}) report, so the peer fast path cannot judge it.", severity="critical")


def history_alerts(f: Family, c: Ctx | None = None) -> list[dict]:
    c = c or Ctx()
    n = names(f)
    reg = f"FleetCanary{f.alert}Regression"
    drv = f"FleetCanary{f.alert}{'Drop' if f.higher_is_better else 'Rise'}AfterDriverChange"
    drift = f"FleetCanary{f.alert}Drift"
    worse = f"< {1 - f.rel_hist:g}" if f.higher_is_better else f"> {1 + f.rel_hist:g}"
    drift_worse = f"< {1 - DRIFT:g}" if f.higher_is_better else f"> {1 + DRIFT:g}"
    for_m = max(2 * f.interval_minutes, 30)
    # as the peer alert, the newest runs must agree (half the floor off the baseline)
    reg_cond = f"({n['change']} {worse}){not_after_driver_change(f)}{newest_runs_agree(f, n['change'], f.rel_hist)}"
    drv_cond = f"({n['pre_change_ratio']} {worse}) and on(node) (node:fleetcanary_driver_versions:count1d > 1)"
    drift_cond = f"last_over_time({n['drift_ratio']}[{c.cover('daily')}]) {drift_worse}"
    lo, hi = ("below", "dropped") if f.higher_is_better else ("above", "rose")
    return [
        _alert(f, reg, reg_cond, f"last_over_time({n['change']}[{HOLD}])", for_m, 2 * for_m, c,
               f"{f.title} {lo} its own history",
               f"{entity_words(f)}: {{{{ $value | humanizePercentage }}}} of its median over about the previous 3 "
               f"days{' on this driver' if f.per_driver else ' (the driver did not change in that time)'}."),
        _alert(f, drv, drv_cond, f"last_over_time({n['pre_change_ratio']}[{HOLD}])", for_m, 2 * for_m, c,
               f"{f.title} {hi} after a driver change",
               f"{entity_words(f)}: {{{{ $value | humanizePercentage }}}} of its median before the driver changed on "
               f"this node in the last day."),
        _alert(f, drift, drift_cond, None, 0, 120, c, f"{f.title} drifted from its best day on this driver",
               f"{entity_words(f)}: its median over the last day is {{{{ $value | humanizePercentage }}}} of its "
               f"best day on driver {{{{ $labels.driver_version }}}} in {DRIFT_WINDOW}: a slow drift of "
               f"{DRIFT:.0%} or more."),
    ]


def hard_alerts() -> list[dict]:
    def a(name, expr, for_, sev, summary, desc, keep=None):
        d = {"alert": name, "expr": " ".join(expr.split()), "for": for_, "labels": {"severity": sev},
             "annotations": annotations(summary, desc, name)}
        if keep:
            d["keep_firing_for"] = keep
        return d

    return [
        a("FleetCanaryProbeFailing",
          'sum by (node, probe) (increase(fleetcanary_probe_runs_total{outcome=~"failure|timeout|crash"}[1h])) >= 3',
          "10m", "warning", "A probe keeps failing",
          "Probe {{ $labels.probe }} on {{ $labels.node }} failed, timed out or crashed {{ $value | humanize }} "
          "times in the last hour."),
        a("FleetCanaryProbeStale",
          "((time() - fleetcanary_probe_last_success_timestamp_seconds) > 3 * fleetcanary_probe_interval_seconds) "
          "and on(node, probe) (fleetcanary_probe_enabled == 1) "
          'unless on(node, probe) (increase(fleetcanary_probe_runs_total{outcome="skipped"}[1h]) > 0)',
          "15m", "warning", "A probe has not succeeded for 3 intervals",
          "Probe {{ $labels.probe }} on {{ $labels.node }} last succeeded {{ $value | humanizeDuration }} ago and "
          "did not skip; its runs fail or do not happen."),
        # Hard failures fire on their first observation.
        a("FleetCanaryGPUsMissing", "fleetcanary_gpus_healthy < fleetcanary_gpus_expected", "0m", "critical",
          "Fewer GPUs than expected", "{{ $labels.node }} has {{ $value }} usable GPUs, fewer than it should."),
        a("FleetCanaryGPULost", "fleetcanary_gpu_lost == 1", "0m", "critical", "A GPU fell off the bus",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} is enumerated but cannot be queried (XID 79 class)."),
        a("FleetCanaryPCIeLinkWidthDegraded", "fleetcanary_gpu_pcie_link_width < fleetcanary_gpu_pcie_link_width_max",
          "0m", "warning", "A GPU's PCIe link is narrower than its maximum",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} runs its PCIe link at x{{ $value }}, below its maximum width."),
        a("FleetCanaryPCIeLinkGenerationDegraded",
          "(fleetcanary_gpu_pcie_link_generation < fleetcanary_gpu_pcie_link_generation_max) "
          'unless on(node, gpu) (fleetcanary_gpu_clock_throttle_active{reason="gpu_idle"} == 1)',
          "30m", "warning", "A busy GPU's PCIe link runs below its maximum generation",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} is at PCIe Gen{{ $value }} while not idle (idle GPUs "
          "lower the generation to save power; those are left out)."),
        a("FleetCanaryNVLinkDown", "fleetcanary_gpu_nvlink_up == 0", "0m", "critical", "An NVLink is down",
          "NVLink {{ $labels.link }} of GPU {{ $labels.gpu }} on {{ $labels.node }} is inactive."),
        a("FleetCanaryGPUCriticalXid", "increase(fleetcanary_gpu_xid_errors_total[15m]) > 0", "0m", "critical",
          "A GPU reported a critical XID", "GPU {{ $labels.gpu }} on {{ $labels.node }} reported XID "
          "{{ $labels.xid }}.", keep="1h"),
        a("FleetCanaryGPUUncorrectableECC",
          'increase(fleetcanary_gpu_ecc_errors_total{type="uncorrected", counter="volatile"}[1h]) > 0', "0m",
          "critical", "Uncorrectable ECC errors on a GPU",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} had {{ $value }} uncorrectable ECC errors in the last hour.",
          keep="1h"),
        a("FleetCanaryGPURowRemapPending", "fleetcanary_gpu_remapped_rows_pending == 1", "5m", "warning",
          "A GPU has a pending row remap", "GPU {{ $labels.gpu }} on {{ $labels.node }} needs a reset to apply a "
          "row remapping."),
        a("FleetCanaryGPURowRemapFailed", "fleetcanary_gpu_remapped_rows_failed == 1", "0m", "critical",
          "A GPU failed a row remap", "GPU {{ $labels.gpu }} on {{ $labels.node }} could not remap a row; it needs "
          "service."),
        a("FleetCanaryCollectiveWrongResult",
          'increase(fleetcanary_probe_failures_total{probe="collectives", reason="wrong_result"}[2h]) > 0', "0m",
          "critical", "A collective returned wrong data",
          "The collectives probe on {{ $labels.node }} found wrong elements in a collective's output.", keep="2h"),
        a("FleetCanaryGPUWrongResult", 'max by (node, gpu) (fleetcanary_gpu_sdc_status{status="mismatch"}) == 1',
          "0m", "critical", "A GPU computed a wrong result (silent data corruption)",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} produced a checksum for the deterministic canary products that "
          "differs from the golden its model's GPUs agreed on.", keep="2h"),
        a("FleetCanaryGPUSDCNoConsensus",
          'max by (node, gpu) (fleetcanary_gpu_sdc_status{status="no_consensus"}) == 1', "0m", "warning",
          "The SDC canary found no majority",
          "The GPUs of {{ $labels.node }} disagree on the canary checksum with no strict majority (or all disagree "
          "with the stored golden); GPU {{ $labels.gpu }} is one of them. Not judged; a person must.", keep="1h"),
        a("FleetCanaryGPUThrottlingUnlikePeers",
          f"(gpu:fleetcanary_gpu_sustained_slowdown_ratio:by_model > 0.05) "
          f"and on(model, pool) (pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_median < 0.01) "
          f"and on(model, pool) (pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_count >= {MIN_PEERS})",
          "10m", "critical", "A GPU throttles under load where its peers do not",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} spent {{ $value | humanizePercentage }} of its sustained burn "
          "in a thermal, power-brake or HW slowdown; the median of its peers (same model and pool) is under 1%."),
        a("FleetCanaryTrainStepLossWrong", "fleetcanary_train_step_loss_check_pass == 0", "0m", "critical",
          "The training-step canary's loss is off its golden",
          "The canary transformer trained on GPU {{ $labels.gpu }} of {{ $labels.node }} ({{ $labels.dtype }}) ended "
          "with a loss outside its tolerance of the golden value.", keep="1h"),
        a("FleetCanaryInferenceErrors", "node:fleetcanary_inference_errors:ratio_rate15m > 0.1", "15m", "warning",
          "Inference canary requests fail",
          "{{ $value | humanizePercentage }} of canary requests from {{ $labels.node }} to {{ $labels.target }} "
          "failed in the last 15 minutes."),
        a("FleetCanaryInferenceTTFTSLOBreach", "node:fleetcanary_inference_ttft_seconds:p95_30m > 2", "15m",
          "warning", "Inference TTFT p95 over its bound",
          "p95 TTFT from {{ $labels.node }} to {{ $labels.target }} is {{ $value | humanizeDuration }} (bound 2 s, "
          "MLPerf's server limit; change it in alerts/build.py)."),
        a("FleetCanaryInferenceITLSLOBreach", "node:fleetcanary_inference_itl_seconds:p95_30m > 0.2", "15m",
          "warning", "Inference ITL p95 over its bound",
          "p95 inter-token latency from {{ $labels.node }} to {{ $labels.target }} is {{ $value | humanizeDuration }} "
          "(bound 200 ms)."),
        a("FleetCanaryInferenceQualityFailing", "fleetcanary_inference_quality_pass == 0", "10m", "critical",
          "An inference endpoint answers a golden prompt wrongly",
          "Check {{ $labels.check }} fails against {{ $labels.target }} (seen from {{ $labels.node }})."),
        a("FleetCanaryInferenceOutputChanged", "fleetcanary_inference_output_stable == 0", "30m", "info",
          "Greedy output changed", "The temperature-0 output of {{ $labels.target }} differs from the first one seen "
          "for this model (a quantization, kernel or sampling change?)."),
        a("FleetCanaryExporterDown", 'up{job="fleetcanary"} == 0', "5m", "warning", "fleetcanary is not scraped",
          "Prometheus cannot scrape fleetcanary on {{ $labels.node }}."),
        a("FleetCanaryConfigReloadFailed", "fleetcanary_config_last_reload_successful == 0", "5m", "warning",
          "fleetcanary kept its old config", "The config reload on {{ $labels.node }} failed; the previous config "
          "keeps running."),
    ]


def build(scale: float = 1.0) -> tuple[dict, dict]:
    """The recording and alerting rules. `scale` multiplies every group interval, `for`,
    `keep_firing_for` and covering window (not the data windows); the shipped files use 1."""
    c = Ctx(scale)
    _PARTS.clear()
    iv = {k: dur(v) for k, v in c.iv.items()}
    fast = [f for f in FAMILIES if not f.slow]
    slow = [f for f in FAMILIES if f.slow]
    recording = {"groups": [
        {"name": "fleetcanary-inventory", "interval": iv["inventory"], "rules": inventory_rules()},
        {"name": "fleetcanary-peers", "interval": iv["peers"],
         "rules": [r for f in fast for r in smoothing_rules(f) + peer_rules(f) + (fast_rules(f, c) if f.fast else [])]
         + [r for f in fast if f.history for r in change_rules(f, c)]},
        {"name": "fleetcanary-peers-slow", "interval": iv["peers_slow"],
         "rules": [r for f in slow for r in smoothing_rules(f) + peer_rules(f)]},
        {"name": "fleetcanary-daily", "interval": iv["daily"],
         "rules": [r for f in FAMILIES if f.history for r in daily_rules(f)]},
        {"name": "fleetcanary-fabric", "interval": iv["inventory"], "rules": rules_fabric.recording_rules()}]}
    hard = hard_alerts()
    for a in hard:
        a["for"] = c.t(seconds(a["for"]) / 60)
        if "keep_firing_for" in a:
            a["keep_firing_for"] = c.t(seconds(a["keep_firing_for"]) / 60)
    alerts = {"groups": [
        {"name": "fleetcanary-hard-failures", "rules": hard},
        {"name": "fleetcanary-peer-outliers",
         "rules": [peer_alert(f, c) for f in FAMILIES] + [fast_alert(f, c) for f in FAMILIES if f.fast]
         + [fast_history_alert(f, c) for f in FAMILIES if f.fast and f.history]},
        {"name": "fleetcanary-regressions", "rules": [a for f in FAMILIES if f.history for a in history_alerts(f, c)]},
        {"name": "fleetcanary-nic", "rules": rules_nic.alert_rules(annotations)},
        {"name": "fleetcanary-fabric-alerts", "rules": rules_fabric.alert_rules(RUNBOOK)}]}
    return recording, alerts


def alert_parts(scale: float = 1.0) -> dict[str, dict]:
    """For replaying the peer, fast and history alerts on backfilled data (benchmarks/detection), which
    cannot evaluate ALERTS: each alert's condition without its hold, the series that say its window has
    enough runs (None: no hold), the labels of the alerted thing, `for`, `keep_firing_for` and the
    longest hold, in seconds."""
    build(scale)
    return {k: dict(v) for k, v in _PARTS.items()}


HEADER = "# Generated by alerts/build.py; do not edit. Change the family table there and rerun it.\n"


def runbooks_markdown() -> str:
    import runbooks as rb

    _, alerts = build()
    out = ["# Runbooks", "", "Generated by alerts/build.py from alerts/runbooks.py; do not edit. One section per "
           "alert: what it means, the first checks, the likely causes.", ""]
    by_family = {f.key: f for f in FAMILIES}
    for group in alerts["groups"]:
        for a in group["rules"]:
            name = a["alert"]
            fam = by_family.get(a["labels"].get("family", ""))
            if name in rb.HARD:
                meaning, checks, causes = rb.HARD[name]
            elif name in rules_nic.RUNBOOKS:
                meaning, checks, causes = rules_nic.RUNBOOKS[name]
            elif name.endswith(("FarBelowPeers", "FarSlowerThanPeers")):
                meaning, checks, causes = rb.fast_text(fam.title, fam.key, not fam.higher_is_better)
            elif name.endswith(("FarBelowOwnHistory", "FarSlowerThanOwnHistory")):
                meaning, checks, causes = rb.fast_history_text(fam.title, fam.key, not fam.higher_is_better)
            elif name.endswith("Drift"):
                meaning, checks, causes = rb.drift_text(fam.title, fam.key, not fam.higher_is_better)
            elif name in rules_fabric.RUNBOOKS:
                meaning, checks, causes = rules_fabric.RUNBOOKS[name]
            elif name.endswith(("DropAfterDriverChange", "RiseAfterDriverChange")):
                meaning, checks, causes = rb.driver_text(fam.title, fam.key, not fam.higher_is_better)
            elif name.endswith("Regression"):
                meaning, checks, causes = rb.regression_text(fam.title, fam.key, not fam.higher_is_better)
            else:
                meaning, checks, causes = rb.peer_text(fam.title, fam.key, not fam.higher_is_better,
                                                         fam.k_mad if fam.history else K_MAD, fam.history)
            out += [f"## {name}", "", f"Severity: {a['labels']['severity']}. Fires after {a.get('for', '0m')}"
                    + (f", keeps firing for {a['keep_firing_for']} after it clears." if a.get("keep_firing_for")
                       else "."), "", f"**What it means.** {meaning}", "", f"**First checks.** {checks}", "",
                    f"**Likely causes.** {causes}", "", f"Expression: `{a['expr']}`", ""]
    return "\n".join(out)


def render(scale: float = 1.0) -> dict[str, str]:
    recording, alerts = build(scale)

    def dump(d: dict) -> str:
        return HEADER + yaml.safe_dump(d, sort_keys=False, width=120)

    return {"fleetcanary.rules.yml": dump(recording), "fleetcanary.alerts.yml": dump(alerts),
            "../docs/runbooks.md": runbooks_markdown()}


def main() -> int:
    for name, text in render().items():
        (HERE / name).write_text(text)
        print(f"wrote alerts/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
