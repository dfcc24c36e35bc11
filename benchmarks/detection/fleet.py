"""The synthetic fleet of the detection benchmark, and what Prometheus would have scraped from it.

A fleet of nodes (8 GPUs each) in pools of one GPU model, observed for some days:

* probe runs on the exporter's schedule: gpu_bandwidth every 15 min and collectives every 30 min,
  each run at interval + up to 10% jitter, the first one within 10 s of an exporter start;
* a run is skipped while its node is busy (a job holds the GPUs for hours), fails at random
  (rarely), or succeeds with a figure per GPU (per node for the collective);
* a figure is base(model) x (1 + persistent offset of the GPU, uniform +-2%) x (1 + the node's
  own diurnal swing) x run noise (Student-t or normal) x the injected faults x the driver's
  effect; rare junk runs land at 30-70% of it;
* faults with a known ground truth: steps of 3-20% (GPU memory bandwidth per GPU, collective bus
  bandwidth per node), a 1%/day ramp, an intermittent 10% for 2 h in every 6, a GPU lost off
  the bus, a PCIe x8 downtrain; and events that must not fire peer/history alerts: busy
  periods, exporter outages of 1-3 h, junk runs, a rolling driver upgrade across one pool.

Scrapes (every `scrape_s` seconds, each node at its own offset) carry what the exporter publishes
then: the judge's statistics (judge.py drives the exporter's own figure store and exposition with
these runs) and the series the hard-failure alerts read (`up`, the probe counters from 0 at each
exporter start, the last success, intervals, GPU health and PCIe width); during an outage nothing but
`up == 0` is recorded. `exported()` keeps the exporter's raw-figure rules (a run's figures until the
next run or 1.5 intervals + the timeout; a failed run clears them) for the counters and timestamps;
the raw figures themselves are no longer written (the v3 rules read the judge's statistics).

OpenMetrics backfill cannot write staleness markers: a series that disappears is simply absent
from the following scrapes, so a query sees its last sample for up to the 5-minute lookback,
where a live Prometheus would stop at the next scrape (at most one scrape interval later).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fleetcanary.core.config import ProbeEntryBase

DAY = 86400
HOUR = 3600
BW = "fleetcanary_gpu_memory_bandwidth_bytes_per_second"
COLL = "fleetcanary_collective_bus_bandwidth_bytes_per_second"
MODELS = {"H100": (2.9e12, 3.6e11), "H200": (4.1e12, 3.7e11), "B200": (6.8e12, 6.5e11)}  # (HBM d2d, busbw)
DRIVER_OLD, DRIVER_NEW = "550.90.07", "570.124.06"
# pools: (share of the fleet's nodes, model); the last three are below the 5-node peer minimum
POOLS = [("a", 60, "H100"), ("b", 40, "H200"), ("c", 30, "B200"), ("d", 25, "H100"), ("e", 20, "H200"),
         ("f", 10, "B200"), ("g", 4, "H100"), ("h", 3, "H200"), ("i", 3, "B200")]
COLL_LABELS = 'collective="all_reduce",size_bytes="1073741824",ranks="8",backend="nccl"'
COLL_SMALL_SHARE = 0.02  # a small-message all-reduce's bus bandwidth against the 1 GiB one's (latency-bound)
OUTCOMES = ("success", "failure", "skipped")  # timeout and crash stay 0 here; the rules only sum them with failure


def rules_floors() -> dict:
    """The shipped rules' fast-path and level-path floors (alerts/build.py SETTINGS), not a copy of them."""
    from alerts.build import SETTINGS
    return {"fast_floor": float(SETTINGS.fast_floor), "level_floor": float(SETTINGS.level_floor)}


@dataclass
class Profile:
    """Everything a fleet is made from; `run.py` exposes each field as a flag."""
    name: str = "default"
    nodes: int = 195
    days: float = 7.0
    seed: int = 1
    scrape_s: int = 240          # below the 5-minute lookback; 120 doubles the backfill's cost (docs/detection.md)
    bw_interval_s: int = 900
    coll_interval_s: int = 1800
    fresh_intervals: float = 1.5  # figures are dropped once older than this many intervals + the probe's timeout
    bw_timeout_s: int = 120
    coll_timeout_s: int = 180
    noise: str = "t"              # "t" (Student-t, heavy tails) or "normal"
    noise_df: float = 3.0
    bw_noise: float = 0.01        # the scale of a run's noise (the sigma for normal noise)
    coll_noise: float = 0.015
    offset: float = 0.02          # persistent per-GPU (and per-node collective) offset: uniform +-this
    diurnal_max: float = 0.015    # each node's diurnal amplitude: uniform 0..this, its own phase
    junk: float = 0.005           # share of figures that are junk (30-70% of the value)
    # the exporter's confirmation runs (daemon/confirm.py): a run whose figure moved confirm_change (or 3x the
    # series' own run noise) from the median of its last 3 gets a run confirm_delay_s after it, and each that
    # still confirms it another, up to confirm_runs; 0: none. The defaults are the exporter's own
    confirm_change: float = ProbeEntryBase.model_fields["confirm_change"].default
    confirm_runs: int = ProbeEntryBase.model_fields["confirm_runs"].default
    confirm_delay_s: int = int(ProbeEntryBase.model_fields["confirm_delay_seconds"].default)
    fail: float = 0.003           # share of runs that fail
    busy_per_day: float = 1.0     # busy periods per node and day (invasive probes skip)
    busy_hours: tuple = (2.0, 10.0)
    # the share of time each node is busy (0: busy_per_day as given). Busy periods start at random (Poisson)
    # and overlapping ones merge, so a share s needs -ln(1 - s) / mean length periods a day
    busy_share: float = 0.0
    # Busy fleets (issue 27): 1 = tenants' jobs hold 1, 2, 4 or 8 GPUs of a node (equally likely, on aligned
    # blocks), busy_share is then the share of GPU time held; 0 = whole-node busy periods as above
    busy_jobs: int = 0
    # 1 = the kubelet's per-GPU allocation (deploy/overlays/gpu-allocation): GPU memory bandwidth measures the
    # free GPUs of a partly held node; the collective (a different series on fewer GPUs) needs all 8 free.
    # 0 = the node-wide check: any GPU held skips the node
    per_gpu_gate: int = 0
    # 1 = opportunistic runs (with per_gpu_gate): when a job ends, a due probe runs 2 s later (the daemon's
    # due_invasive: last run skipped for a tenant, no success within the interval, or a freed GPU not measured
    # within it), unless its next scheduled run comes first
    opportunistic: int = 0
    outages: int = 12             # exporter outages of 1-3 h on distinct nodes
    outage_hours: tuple = (1.0, 3.0)
    upgrade_pool: str = "a"
    upgrade_start_day: float = 4.0
    upgrade_days: float = 1.5
    upgrade_drop: float = 0.06    # what the new driver costs the upgraded GPUs (both families)
    upgrade_restart_min: float = 15.0
    steps: tuple = (0.03, 0.05, 0.07, 0.10, 0.20)
    per_step: int = 30            # GPUs per step size (GPU memory bandwidth)
    coll_per_step: int = 6        # nodes per step size (collective bus bandwidth)
    step_days: tuple = (3.2, 6.2)  # when steps start
    ramps: int = 10
    ramp_per_day: float = 0.01
    intermittent: int = 10
    intermittent_drop: float = 0.10
    lost: int = 2
    downtrain: int = 2
    # GPU memory bandwidth steps that last to the end of the fleet (a week with --days 9.75): placed from their
    # own random stream on GPUs without another fault, outside the small pools, so the rest of the fleet is the same
    week_faults: int = 0
    week_fault_size: float = 0.05
    week_fault_day: float = 2.5
    # Rules and alerts are evaluated from this day on (every fault but the ramp starts later); the raw
    # series start at day 0, so every window (3 days for the history baselines) is full of data by then.
    # It spares a third of the rule backfill, most of which is 3-day windows.
    eval_from_day: float = 2.5
    # Issue 38: the cases the benchmark lacked (all off by default, so earlier result files stay comparable).
    # coll_small_bytes > 0: every collective run also measures an all_reduce of this many bytes (a second series
    # per node, e.g. 1048576), with its own run noise coll_small_noise (a scale, as coll_noise), its own per-node
    # offset, and the collective faults; drawn from its own random stream, so the 1 GiB series stays as it was
    coll_small_bytes: int = 0
    coll_small_noise: float = 0.03
    # the collectives' noise kind: "" as `noise`, or "t" / "normal" (heavy tails on collectives as on GPUs)
    coll_noise_kind: str = ""
    # collective drops equal to the fast path's threshold (the rules' settings: alerts/build.py fast_floor),
    # on this many nodes outside the small pools, from held_day to the end (own random stream)
    coll_fast_steps: int = 0
    coll_fast_step_size: float = 0.0   # 0: the rules' fast_floor
    # GPU memory bandwidth steps equal to the level path's floor (alerts/build.py level_floor), held from
    # held_day to the end, on this many GPUs without another fault, outside the small pools
    level_steps: int = 0
    level_step_size: float = 0.0      # 0: the rules' level_floor
    held_day: float = 2.6

    def __post_init__(self) -> None:
        if (self.coll_fast_steps and not self.coll_fast_step_size) or (self.level_steps and not self.level_step_size):
            floors = rules_floors()
            if self.coll_fast_steps and not self.coll_fast_step_size:
                self.coll_fast_step_size = floors["fast_floor"]
            if self.level_steps and not self.level_step_size:
                self.level_step_size = floors["level_floor"]

    @classmethod
    def h200(cls, **kw) -> Profile:
        """The same fleet with H200-like run noise: normal, 0.6%, no heavy tails."""
        return cls(name="h200", noise="normal", bw_noise=0.006, coll_noise=0.006, **kw)


@dataclass
class Event:
    kind: str                 # step, ramp, intermittent, driver, lost, downtrain, outage
    family: str               # gpu_memory_bandwidth, collective_bus_bandwidth, gpu_lost, pcie, exporter
    node: str
    gpu: str | None
    start: float              # when it begins
    size: float = 0.0
    end: float | None = None  # None: to the end
    detect_from: float | None = None  # the first degraded run (ramp: the first run past 5%)

    @property
    def label(self) -> str:
        if self.kind == "step":
            return f"step {self.size:.0%}"
        if self.kind == "held":
            return f"held {self.size:.0%}"
        return f"week {self.size:.0%}" if self.kind == "week" else self.kind


@dataclass
class Node:
    name: str
    pool: str
    model: str
    idx: int
    scrape_off: float
    amp: float
    phase: float
    gpu_off: np.ndarray
    coll_off: float
    outages: list = field(default_factory=list)   # [(a, b)]
    busy: list = field(default_factory=list)      # [(a, b)]: any GPU held (the node-wide check's view)
    gpu_busy: list = field(default_factory=list)  # per GPU: [(a, b)] (busy_jobs; else each is `busy`)
    upgrade_at: float | None = None
    runs: dict = field(default_factory=dict)      # probe -> dict of arrays
    junk: dict = field(default_factory=dict)      # "gpu N" / "node" -> list of run times


def _pool_sizes(n: int) -> list[int]:
    """The pool sizes for n nodes: POOLS at 195, else the large pools scaled, the three small ones kept small."""
    sizes = [s for _, s, _ in POOLS]
    if n == sum(sizes):
        return sizes
    big = sum(sizes[:-3])
    out = [max(5, round(s * (n - 10) / big)) for s in sizes[:-3]] + sizes[-3:]
    out[0] += n - sum(out)
    if out[0] < 10:
        raise SystemExit(f"detection: {n} nodes is too few for the pool layout (at least 60)")
    return out


class Fleet:
    def __init__(self, p: Profile, start: int) -> None:
        self.p = p
        self.start = start
        self.end = start + int(p.days * DAY)
        rng = np.random.default_rng(p.seed)
        self.rng = rng
        self.nodes: list[Node] = []
        for (pool, _, model), size in zip(POOLS, _pool_sizes(p.nodes), strict=True):
            for _ in range(size):
                i = len(self.nodes)
                self.nodes.append(Node(f"node-{i:03d}", pool, model, i, float(rng.uniform(0, p.scrape_s)),
                                       float(rng.uniform(0, p.diurnal_max)), float(rng.uniform(0, 2 * math.pi)),
                                       rng.uniform(-p.offset, p.offset, 8), float(rng.uniform(-p.offset, p.offset))))
        self.pool_size = {pool: sum(1 for n in self.nodes if n.pool == pool) for pool, _, _ in POOLS}
        self.by_name = {n.name: n for n in self.nodes}
        self.events: list[Event] = []
        self._place_events(rng)
        self.srng = np.random.default_rng([p.seed, 13])  # the small-message collective's draws (coll_small_bytes)
        self.small_off = self.srng.uniform(-p.offset, p.offset, len(self.nodes))
        for n in self.nodes:
            self._busy(n, rng)
            n.runs["gpu_bandwidth"] = self._runs(n, p.bw_interval_s, 30.0, rng) | {"timeout": p.bw_timeout_s}
            n.runs["collectives"] = self._runs(n, p.coll_interval_s, 60.0, rng, "collectives") | \
                {"timeout": p.coll_timeout_s}
        self._values(rng)
        self._opportunistic(np.random.default_rng([p.seed, 11]))  # its own stream, as the confirmations
        self._confirmations(np.random.default_rng([p.seed, 7]))  # its own stream: the scheduled runs stay as they were
        self._first_degraded_runs()

    # ------------------------------------------------------------------ ground truth
    def _place_events(self, rng) -> None:
        p, t0 = self.p, self.start
        gpus = [(n.name, str(g)) for n in self.nodes for g in range(8)]
        order = list(rng.permutation(len(gpus)))

        def take(k: int) -> list[tuple[str, str]]:  # distinct GPUs, no two faults on one
            return [gpus[order.pop()] for _ in range(k)]

        def d(a: float, b: float) -> float:
            return t0 + float(rng.uniform(a, b)) * DAY

        for size in p.steps:
            for node, gpu in take(p.per_step):
                self.events.append(Event("step", "gpu_memory_bandwidth", node, gpu, d(*p.step_days), size))
        for node, gpu in take(p.ramps):
            self.events.append(Event("ramp", "gpu_memory_bandwidth", node, gpu, d(0.0, 0.5), p.ramp_per_day))
        for node, gpu in take(p.intermittent):
            self.events.append(Event("intermittent", "gpu_memory_bandwidth", node, gpu, d(3.5, 3.75),
                                     p.intermittent_drop))
        for k, (node, gpu) in enumerate(take(p.lost)):
            self.events.append(Event("lost", "gpu_lost", node, gpu, d(3.0 + 2.0 * k, 3.1 + 2.0 * k)))
        for k, (node, gpu) in enumerate(take(p.downtrain)):
            self.events.append(Event("downtrain", "pcie", node, gpu, d(3.0 + 2.5 * k, 3.1 + 2.5 * k)))
        node_order = list(rng.permutation(len(self.nodes)))
        for size in p.steps:
            for _ in range(p.coll_per_step):
                n = self.nodes[node_order.pop()]
                self.events.append(Event("step", "collective_bus_bandwidth", n.name, None, d(*p.step_days), size))
        # the rolling upgrade: each node of the pool at its own time over upgrade_days, a short restart each
        up = [n for n in self.nodes if n.pool == p.upgrade_pool]
        for n in up:
            n.upgrade_at = t0 + (p.upgrade_start_day + float(rng.uniform(0, p.upgrade_days))) * DAY
            n.outages.append((n.upgrade_at, n.upgrade_at + p.upgrade_restart_min * 60))
            self.events.append(Event("restart", "exporter", n.name, None, n.upgrade_at, end=n.outages[-1][1]))
            for g in range(8):
                self.events.append(Event("driver", "gpu_memory_bandwidth", n.name, str(g), n.upgrade_at,
                                         p.upgrade_drop))
            self.events.append(Event("driver", "collective_bus_bandwidth", n.name, None, n.upgrade_at, p.upgrade_drop))
        # exporter outages on distinct nodes (not in the upgrading pool, so causes stay apart)
        cand = [n for n in self.nodes if n.pool != p.upgrade_pool]
        for i in rng.permutation(len(cand))[:p.outages]:
            n = cand[i]
            a = d(p.eval_from_day + 0.5, p.days - 0.5)
            n.outages.append((a, a + float(rng.uniform(*p.outage_hours)) * HOUR))
            self.events.append(Event("outage", "exporter", n.name, None, a, end=n.outages[-1][1]))
        for n in self.nodes:
            n.outages.sort()
        if p.week_faults:
            wrng = np.random.default_rng([p.seed, 11])
            hit = {(e.node, e.gpu) for e in self.events if e.gpu is not None}
            free = [g for g in gpus if g not in hit and self.pool_size[self.by_name[g[0]].pool] >= 5]
            for k in wrng.permutation(len(free))[:p.week_faults]:
                node, gpu = free[k]
                self.events.append(Event("week", "gpu_memory_bandwidth", node, gpu,
                                         t0 + float(wrng.uniform(p.week_fault_day, p.week_fault_day + 0.1)) * DAY,
                                         p.week_fault_size))
        self._place_held(t0)
        self.fault = {}  # (node, gpu|None, family) -> [events]
        for e in self.events:
            self.fault.setdefault((e.node, e.gpu, e.family), []).append(e)

    def _place_held(self, t0: float) -> None:
        """Issue 38's held faults, from their own random stream on GPUs / nodes without another fault, outside
        the small pools: GPU steps equal to the level path's floor and collective drops equal to the fast
        path's threshold, each from held_day (+ up to 0.2 days) to the end."""
        p = self.p
        if not (p.level_steps or p.coll_fast_steps):
            return
        hrng = np.random.default_rng([p.seed, 17])
        big = [n for n in self.nodes if self.pool_size[n.pool] >= 5 and n.pool != p.upgrade_pool]
        if p.level_steps:
            hit = {(e.node, e.gpu) for e in self.events if e.gpu is not None}
            free = [(n.name, str(g)) for n in big for g in range(8) if (n.name, str(g)) not in hit]
            for k in hrng.permutation(len(free))[:p.level_steps]:
                node, gpu = free[k]
                self.events.append(Event("held", "gpu_memory_bandwidth", node, gpu,
                                         t0 + float(hrng.uniform(p.held_day, p.held_day + 0.2)) * DAY,
                                         p.level_step_size))
        if p.coll_fast_steps:
            hit = {e.node for e in self.events if e.family == "collective_bus_bandwidth"}
            free = [n.name for n in big if n.name not in hit]
            for k in hrng.permutation(len(free))[:p.coll_fast_steps]:
                self.events.append(Event("held", "collective_bus_bandwidth", free[k], None,
                                         t0 + float(hrng.uniform(p.held_day, p.held_day + 0.2)) * DAY,
                                         p.coll_fast_step_size))

    @staticmethod
    def _merge(iv) -> list[tuple]:
        merged: list[list[float]] = []
        for a, b in sorted(iv):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return [tuple(x) for x in merged]

    def _jobs(self, n: Node, rng) -> None:
        """Tenants' jobs of 1, 2, 4 or 8 GPUs on aligned blocks, Poisson starts, busy_hours long; per-GPU
        arrivals tuned so that each GPU is held busy_share of the time (overlapping jobs on a GPU merge)."""
        mean_h, sizes = sum(self.p.busy_hours) / 2, (1, 2, 4, 8)
        per_gpu_day = -math.log(1 - self.p.busy_share) / mean_h * 24
        per_node_day = per_gpu_day * 8 / (sum(sizes) / len(sizes))
        k = rng.poisson(per_node_day * self.p.days)
        starts = self.start + rng.uniform(0, self.p.days * DAY, k)
        size = rng.choice(sizes, k)
        block = rng.integers(0, 8, k)
        length = rng.uniform(*self.p.busy_hours, k) * HOUR
        per_gpu: list[list] = [[] for _ in range(8)]
        for a, sz, bl, ln in zip(starts.tolist(), size.tolist(), block.tolist(), length.tolist(), strict=True):
            first = (bl // sz) * sz
            for g in range(first, first + sz):
                per_gpu[g].append((a, a + ln))
        n.gpu_busy = [self._merge(iv) for iv in per_gpu]
        n.busy = self._merge([x for iv in n.gpu_busy for x in iv])

    def held(self, n: Node, probe: str, t: float) -> tuple[bool, np.ndarray]:
        """At a run's start: whether it skips (outcome 2) and which GPUs it leaves out (tenants hold them)."""
        if self.p.busy_jobs and self.p.per_gpu_gate and probe == "gpu_bandwidth":
            h = np.array([self._inside(t, iv) for iv in n.gpu_busy])
            return bool(h.all()), h
        skip = self._inside(t, n.busy)
        return skip, np.full(8, skip)

    def _busy(self, n: Node, rng) -> None:
        if self.p.busy_jobs:
            self._jobs(n, rng)
            return
        per_day = self.p.busy_per_day
        if self.p.busy_share > 0:
            mean_h = sum(self.p.busy_hours) / 2
            per_day = -math.log(1 - self.p.busy_share) / mean_h * 24
        k = rng.poisson(per_day * self.p.days)
        iv = sorted((a, a + float(rng.uniform(*self.p.busy_hours)) * HOUR)
                    for a in (self.start + rng.uniform(0, self.p.days * DAY, k)).tolist())
        n.busy = self._merge(iv)
        n.gpu_busy = [n.busy] * 8

    @staticmethod
    def _inside(t: float, ivs) -> bool:
        return any(a <= t < b for a, b in ivs)

    def _runs(self, n: Node, interval: float, dur: float, rng, probe: str = "gpu_bandwidth") -> dict:
        """The probe's runs on this node: finish times, outcomes (0 success, 1 failure, 2 skipped) and the GPUs
        each left out for a tenant."""
        fin, out, held = [], [], []
        sched = self.start + float(rng.uniform(0, 10))
        oi = 0
        while sched < self.end:
            t = sched + float(rng.uniform(0, 0.1 * interval))
            while oi < len(n.outages) and n.outages[oi][1] <= t:
                oi += 1
            if oi < len(n.outages) and n.outages[oi][0] <= t + dur:
                # the exporter is down: no runs; it restarts empty and runs its first within 10 s
                sched = n.outages[oi][1] + float(rng.uniform(0, 10))
                oi += 1
                continue
            fin.append(t + dur)
            if self.p.busy_jobs:  # one draw a run whatever the gate, so both gates see the same runs
                failed = rng.random() < self.p.fail
                skip, h = self.held(n, probe, t)
                out.append(2 if skip else (1 if failed else 0))
                held.append(h)
            else:
                out.append(2 if self._inside(t, n.busy) else (1 if rng.random() < self.p.fail else 0))
                held.append(np.full(8, out[-1] == 2))
            sched += interval
        return {"fin": np.array(fin), "out": np.array(out, dtype=np.int8), "interval": interval,
                "held": np.array(held, dtype=bool).reshape(len(fin), 8), "trigger": np.zeros(len(fin), dtype=np.int8)}

    # ------------------------------------------------------------------ figures
    def _noise(self, rng, scale: float, size, kind: str = "") -> np.ndarray:
        if (kind or self.p.noise) == "t":
            return 1 + scale * rng.standard_t(self.p.noise_df, size)
        return 1 + scale * rng.standard_normal(size)

    def degradation(self, node: str, gpu: str | None, family: str, t: np.ndarray) -> np.ndarray:
        f = np.ones_like(t)
        for e in self.fault.get((node, gpu, family), []):
            if e.kind in ("step", "driver", "week", "held"):
                f *= np.where(t >= e.start, 1 - e.size, 1.0)
            elif e.kind == "ramp":
                f *= 1 - e.size * np.clip((t - e.start) / DAY, 0, None)
            elif e.kind == "intermittent":
                ph = (t - e.start) % (6 * HOUR)
                f *= np.where((t >= e.start) & (ph < 2 * HOUR), 1 - e.size, 1.0)
        return f

    def _figures(self, n: Node, probe: str, t: np.ndarray, out: np.ndarray, rng) -> np.ndarray:
        """The figures of runs finishing at `t` (rows) per GPU, or per node for the collective (columns);
        NaN where the run did not succeed. Junk runs are noted in n.junk."""
        p = self.p
        base_bw, base_coll = MODELS[n.model]
        diur = 1 + n.amp * np.sin(2 * math.pi * t / DAY + n.phase)
        if probe == "gpu_bandwidth":
            vals = np.empty((len(t), 8))
            for g in range(8):
                v = base_bw * (1 + n.gpu_off[g]) * diur * self._noise(rng, p.bw_noise, len(t))
                v *= self.degradation(n.name, str(g), "gpu_memory_bandwidth", t)
                junk = rng.random(len(t)) < p.junk
                v[junk] *= rng.uniform(0.3, 0.7, int(junk.sum()))
                n.junk.setdefault(str(g), []).extend(t[junk & (out == 0)].tolist())
                for e in self.fault.get((n.name, str(g), "gpu_lost"), []):
                    v[t >= e.start] = np.nan
                vals[:, g] = v
        else:
            deg = self.degradation(n.name, None, "collective_bus_bandwidth", t)
            v = base_coll * (1 + n.coll_off) * diur * self._noise(rng, p.coll_noise, len(t), p.coll_noise_kind) * deg
            junk = rng.random(len(t)) < p.junk
            v[junk] *= rng.uniform(0.3, 0.7, int(junk.sum()))
            n.junk.setdefault("node", []).extend(t[junk & (out == 0)].tolist())
            vals = v[:, None]
            if p.coll_small_bytes:  # the small-message series: its own stream, so the 1 GiB one is unchanged
                s = self.srng
                w = base_coll * COLL_SMALL_SHARE * (1 + self.small_off[n.idx]) * diur * \
                    np.maximum(self._noise(s, p.coll_small_noise, len(t), p.coll_noise_kind), 0.3) * deg
                junk = s.random(len(t)) < p.junk
                w[junk] *= s.uniform(0.3, 0.7, int(junk.sum()))
                n.junk.setdefault("node", []).extend(t[junk & (out == 0)].tolist())
                vals = np.column_stack([v, w])
        vals[out != 0] = np.nan
        return vals

    def _values(self, rng) -> None:
        for n in self.nodes:
            for probe in ("gpu_bandwidth", "collectives"):
                r = n.runs[probe]
                r["vals"] = self._figures(n, probe, r["fin"], r["out"], rng)
                if probe == "gpu_bandwidth":
                    r["vals"][r["held"]] = np.nan  # GPUs a tenant held: not measured by that run
                r["confirmation"] = np.zeros(len(r["fin"]), dtype=bool)

    def _confirmations(self, rng) -> None:
        """The exporter's confirmation runs, decided by the exporter's own rule (daemon/confirm.py, Confirmer) as
        the daemon would: every run of the node's exporter goes through one Confirmer (a new one at each exporter
        start); a successful run that starts a suspicion gets a run confirm_delay_s after it, and each confirmation
        that still confirms it the next, confirm_delay_s after the previous one, up to confirm_runs. A
        confirmation is left out when the next run or an outage would start before it ends (the daemon drops a
        confirmation a scheduled run came before, and that run ends or restarts the suspicion); it skips while
        its node is busy and fails at the usual rate, and either ends the chain (the daemon asks for no more).
        Its figures are drawn like any run's (junk included)."""
        from fleetcanary.core.record import RunRecord
        from fleetcanary.daemon.confirm import Confirmer

        p = self.p
        if p.confirm_change <= 0 or p.confirm_runs <= 0:
            return
        outcome = {0: "success", 1: "failure", 2: "skipped"}

        def jumped(seen: Confirmer, probe: str, row, o: int, trigger: str) -> str:
            return seen.jumped(RunRecord(probe, outcome[int(o)], trigger=trigger, samples=[
                {"metric": probe, "labels": {"col": str(g)}, "value": float(v)} for g, v in enumerate(row)]),
                (probe,), p.confirm_change, p.confirm_runs)

        for n in self.nodes:
            starts = [b for _, b in n.outages]  # the exporter starts again, with an empty Confirmer
            for probe, dur in (("gpu_bandwidth", 30.0), ("collectives", 60.0)):
                r = n.runs[probe]
                fin, out, vals = r["fin"], r["out"], r["vals"]
                seen, life = Confirmer(), 0
                extra = []  # (finish, outcome, figures, GPUs held)
                for i in range(len(fin)):
                    k = int(np.searchsorted(starts, fin[i], side="right"))
                    if k != life:
                        seen, life = Confirmer(), k
                    if not jumped(seen, probe, vals[i], out[i], "schedule"):
                        continue
                    nxt = min(fin[i + 1] - dur if i + 1 < len(fin) else self.end, self.end)
                    last = fin[i]
                    while True:
                        start = last + p.confirm_delay_s
                        if start + dur >= nxt or any(a <= start + dur and start < b for a, b in n.outages):
                            break
                        skip, h = self.held(n, probe, start)
                        o = 2 if skip else (1 if rng.random() < p.fail else 0)
                        row = self._figures(n, probe, np.array([start + dur]), np.array([o], dtype=np.int8), rng)
                        if probe == "gpu_bandwidth":
                            row[0][h] = np.nan
                        extra.append((start + dur, o, row[0], h))
                        last = start + dur
                        if not jumped(seen, probe, row[0], o, "confirmation"):
                            break
                if not extra:
                    continue
                t = np.concatenate([fin, [e[0] for e in extra]])
                order = np.argsort(t, kind="stable")
                r["fin"] = t[order]
                r["out"] = np.concatenate([out, np.array([e[1] for e in extra], dtype=np.int8)])[order]
                r["vals"] = np.concatenate([vals, np.array([e[2] for e in extra])])[order]
                r["held"] = np.concatenate([r["held"], np.array([e[3] for e in extra], dtype=bool)])[order]
                r["trigger"] = np.concatenate([r["trigger"], np.ones(len(extra), dtype=np.int8)])[order]
                r["confirmation"] = np.concatenate([r["confirmation"], np.ones(len(extra), dtype=bool)])[order]

    def _opportunistic(self, rng) -> None:
        """Opportunistic runs (Profile.opportunistic): at each end of a tenant's job, a run of each probe that is
        due then (exporter/daemon/service.py, due_invasive) 2 s later, on the GPUs free then, unless a run is in
        progress, the next scheduled run would start before it ends, or the exporter is down."""
        p = self.p
        if not (p.busy_jobs and p.per_gpu_gate and p.opportunistic):
            return
        for n in self.nodes:
            for probe, dur in (("gpu_bandwidth", 30.0), ("collectives", 60.0)):
                r = n.runs[probe]
                iv = r["interval"]
                freed = sorted((b, g) for g, ivs in enumerate(n.gpu_busy) for _, b in ivs) \
                    if probe == "gpu_bandwidth" else sorted((b, None) for _, b in n.busy)
                for b, g in freed:
                    start, end = b + 2.0, b + 2.0 + dur
                    if end >= self.end or any(a <= end and start < z for a, z in n.outages):
                        continue
                    fin, out, held = r["fin"], r["out"], r["held"]
                    k = int(np.searchsorted(fin, start, side="right"))  # runs finished by then: fin[:k]
                    if k < len(fin) and fin[k] - dur <= end:  # one in progress, or the next comes first
                        continue
                    ok = out[:k] == 0
                    last_ok = fin[:k][ok].max() if ok.any() else -math.inf
                    seen = ok & ~held[:k, g] if g is not None else ok
                    last_seen = fin[:k][seen].max() if seen.any() else -math.inf
                    due = (k > 0 and out[k - 1] == 2) or start - last_ok >= iv or start - last_seen >= iv
                    skip, h = self.held(n, probe, start)
                    if not due or skip:
                        continue
                    o = 1 if rng.random() < p.fail else 0
                    row = self._figures(n, probe, np.array([end]), np.array([o], dtype=np.int8), rng)[0]
                    if probe == "gpu_bandwidth":
                        row[h] = np.nan
                    for key, v in (("fin", end), ("out", o), ("vals", row), ("held", h), ("trigger", 2),
                                   ("confirmation", False)):
                        r[key] = np.insert(r[key], k, v, axis=0)

    def _first_degraded_runs(self) -> None:
        for e in self.events:
            n = self.by_name[e.node]
            if e.family == "gpu_memory_bandwidth" or e.family == "collective_bus_bandwidth":
                r = n.runs["gpu_bandwidth" if e.family == "gpu_memory_bandwidth" else "collectives"]
                ok = r["out"] == 0
                if e.family == "gpu_memory_bandwidth" and e.gpu is not None:
                    ok = ok & ~r["held"][:, int(e.gpu)]  # a run that left the GPU to its tenant did not see it
                after = e.start + (0.05 / e.size * DAY if e.kind == "ramp" else 0)
                hits = r["fin"][ok & (r["fin"] >= after)]
                if e.kind == "intermittent":
                    ph = (hits - e.start) % (6 * HOUR)
                    hits = hits[ph < 2 * HOUR]
                e.detect_from = float(hits[0]) if len(hits) else None
            else:
                e.detect_from = e.start

    # ------------------------------------------------------------------ scrapes
    def scrape_times(self, n: Node) -> tuple[np.ndarray, np.ndarray]:
        t = self.start + n.scrape_off + np.arange(0, self.end - self.start - n.scrape_off, self.p.scrape_s)
        t = np.floor(t)
        up = np.ones(len(t), dtype=bool)
        for a, b in n.outages:
            up &= ~((t >= a) & (t < b))
        return t, up

    def exported(self, n: Node, probe: str, t: np.ndarray, up: np.ndarray) -> dict:
        """What the exposition holds at each scrape for one probe: figures (NaN: absent), counters,
        the last success timestamp (NaN: absent)."""
        r = n.runs[probe]
        fin, out = r["fin"], r["out"]
        restart = np.full(len(t), self.start - 1.0)
        for _, b in n.outages:
            restart = np.where(t >= b, b, restart)
        k_all = np.searchsorted(fin, t, side="right") - 1   # the last run finished by the scrape
        ns = np.flatnonzero(out != 2)
        k_ns = np.searchsorted(fin[ns], t, side="right") - 1  # the last run that was not a skip
        # a node whose runs all skipped (held the whole time) has none: every scrape is "no run yet"
        k = np.where(k_ns >= 0, ns[np.clip(k_ns, 0, None)], -1) if len(ns) else np.full(len(t), -1)
        kk = np.clip(k, 0, None)
        max_age = self.p.fresh_intervals * r["interval"] + r["timeout"]
        fresh = (k >= 0) & (out[kk] == 0) & (fin[kk] >= restart) & (t - fin[kk] <= max_age)
        vals = np.where(fresh[:, None], r["vals"][kk], np.nan)
        vals[~up] = np.nan
        res = {"vals": vals}
        # counters since the exporter (re)started
        k_rs = np.searchsorted(fin, restart, side="right") - 1
        for o, name in enumerate(OUTCOMES):
            cum = np.concatenate([[0], np.cumsum(out == o)])
            res[name] = (cum[k_all + 1] - cum[k_rs + 1]).astype(float)
        succ = np.flatnonzero(out == 0)
        k_s = np.searchsorted(fin[succ], t, side="right") - 1
        last = np.where(k_s >= 0, fin[succ][np.clip(k_s, 0, None)], np.nan) if len(succ) else np.full(len(t), np.nan)
        res["last_success"] = np.where(last >= restart, last, np.nan)
        return res

    def prepare_scrapes(self) -> None:
        """Work out what each node's exposition held at each scrape (write_block then only formats)."""
        self._per_node = []
        for n in self.nodes:
            t, up = self.scrape_times(n)
            ex = {pr: self.exported(n, pr, t, up) for pr in n.runs}
            lost_at = {e.gpu: e.start for e in self.fault_list(n.name, "gpu_lost")}
            down_at = {e.gpu: e.start for e in self.fault_list(n.name, "pcie")}
            self._per_node.append((n, t, up, ex, lost_at, down_at))

    def blocks(self, block_s: int = 2 * HOUR) -> list[tuple[int, int]]:
        """2-hour blocks: promtool re-reads its whole input for each block it builds, so one file per
        block keeps the backfill linear."""
        return [(b, min(b + block_s, self.end)) for b in range(self.start, self.end, block_s)]

    def write_block(self, path: Path, b0: int, b1: int) -> None:
        with open(path, "w", buffering=1 << 22) as f:
            self._write_block(f, self._per_node, b0, b1)

    def fault_list(self, node: str, family: str) -> list[Event]:
        return [e for e in self.events if e.node == node and e.family == family]

    def _write_block(self, f, per_node, b0, b1) -> None:
        fam: dict[str, list[str]] = {}

        def put(metric, typ, text):
            if text:
                fam.setdefault(f"{metric}\t{typ}", []).append(text)

        def const(lab, value, ts):
            if not len(ts):
                return ""
            head = f"{lab} {value} "
            return head + ("\n" + head).join(ts) + "\n"

        def series(lab, vals, ts, digits=12):
            m = ~np.isnan(vals)
            if not m.any():
                return ""
            fmt = lab.replace("{", "{{").replace("}", "}}") + f" {{:.{digits}g}} {{}}\n"
            return "".join(map(fmt.format, vals[m].tolist(), ts[m].tolist()))

        for n, t, up, ex, lost_at, down_at in per_node:
            i0, i1 = np.searchsorted(t, [b0, b1])
            if i0 == i1:
                continue
            tb, ub = t[i0:i1], up[i0:i1]
            tsi = tb.astype(np.int64)
            ts_up = tsi[ub].astype(str).tolist()
            # job and instance come from the scrape; only `up` keeps instance (it is the node again), to keep
            # the OpenMetrics text (the backfill's cost) small
            idl = f'job="fleetcanary",node="{n.name}"'
            put("up", "gauge", series(f'up{{job="fleetcanary",instance="{n.name}:9400",node="{n.name}"}}',
                                      ub.astype(float), tsi))
            tup = tb[ub]
            lost_now = {g: tup >= a for g, a in lost_at.items()}
            healthy = 8.0 - sum((m.astype(float) for m in lost_now.values()), np.zeros(len(tup)))
            put("fleetcanary_gpus_healthy", "gauge", series(f"fleetcanary_gpus_healthy{{{idl}}}", healthy, tsi[ub]))
            put("fleetcanary_gpus_expected", "gauge", const(f"fleetcanary_gpus_expected{{{idl}}}", 8, ts_up))
            # Per-GPU health facts (lost, PCIe width) are constant on a healthy node: written only for the
            # nodes with a health fault, to keep the backfill small; the hard-failure rules compare a GPU's
            # own series, so healthy nodes could not change their result.
            health = bool(lost_at or down_at)
            for g in range(8):
                gs = str(g)
                gl = f'{idl},gpu="{gs}"'
                ln = lost_now.get(gs)
                if health:
                    put("fleetcanary_gpu_lost", "gauge", series(
                        f"fleetcanary_gpu_lost{{{gl}}}", ln.astype(float) if ln is not None else 0.0 * tup, tsi[ub]))
                    width = np.where(tup >= down_at[gs], 8.0, 16.0) if gs in down_at else 16.0 + 0 * tup
                    put("fleetcanary_gpu_pcie_link_width", "gauge",
                        series(f"fleetcanary_gpu_pcie_link_width{{{gl}}}", width, tsi[ub]))
                    put("fleetcanary_gpu_pcie_link_width_max", "gauge",
                        const(f"fleetcanary_gpu_pcie_link_width_max{{{gl}}}", 16, ts_up))
            # what the exporter's judge published at each scrape (judge.py): the statistics the rules read
            nj = self.judged[n.name]
            for text, fam_name, ix, vs in zip(nj.cols, nj.family, nj.idx, nj.vals, strict=True):
                j0, j1 = np.searchsorted(ix, [i0, i1])
                if j0 < j1:
                    put(fam_name, "gauge", series(text, vs[j0:j1], t[ix[j0:j1]].astype(np.int64), 10))
            for probe, e in ex.items():
                pl = f'{idl},probe="{probe}"'
                for o in OUTCOMES:
                    put("fleetcanary_probe_runs", "counter",
                        series(f'fleetcanary_probe_runs_total{{{pl},outcome="{o}"}}', np.where(ub, e[o][i0:i1], np.nan),
                               tsi))
                put("fleetcanary_probe_last_success_timestamp_seconds", "gauge",
                    series(f"fleetcanary_probe_last_success_timestamp_seconds{{{pl}}}",
                           np.where(ub, e["last_success"][i0:i1], np.nan), tsi))
                put("fleetcanary_probe_interval_seconds", "gauge",
                    const(f"fleetcanary_probe_interval_seconds{{{pl}}}", int(n.runs[probe]["interval"]), ts_up))
        for key, texts in fam.items():
            metric, typ = key.split("\t")
            f.write(f"# TYPE {metric} {typ}\n")
            f.writelines(texts)
        f.write("# EOF\n")

    @staticmethod
    def _node_info(n: Node, idl: str, drv: str) -> str:
        return (f'fleetcanary_node_info{{{idl},pool="{n.pool}",driver_version="{drv}",cpu_model="Xeon 8480",'
                f'gpu_model="{n.model}",gpu_count="8"}}')

    # ------------------------------------------------------------------ facts for attribution
    @property
    def eval_start(self) -> int:
        return self.start + int(self.p.eval_from_day * DAY) // 60 * 60

    def gpu_days(self) -> float:
        """GPU-days of the evaluated span."""
        return len(self.nodes) * 8 * (self.end - self.eval_start) / DAY

    def summary(self) -> dict:
        p = self.p
        def held(ivs) -> float:  # within the fleet's week (a job may run past its end)
            return sum(max(0.0, min(b, self.end) - max(a, self.start)) for a, b in ivs)

        busy = sum(held(n.busy) for n in self.nodes) / (len(self.nodes) * p.days * DAY)
        runs = {pr: sum(len(n.runs[pr]["fin"]) for n in self.nodes) for pr in ("gpu_bandwidth", "collectives")}
        skipped = {pr: int(sum((n.runs[pr]["out"] == 2).sum() for n in self.nodes)) for pr in runs}
        kinds: dict[str, int] = {}
        for e in self.events:
            kinds[f"{e.family} {e.label}"] = kinds.get(f"{e.family} {e.label}", 0) + 1
        return {"nodes": len(self.nodes), "gpus": len(self.nodes) * 8, "days": p.days, "gpu_days": self.gpu_days(),
                "pools": dict(self.pool_size),
                "busy_share": round(busy, 3), "runs": runs, "skipped_runs": skipped,
                "junk_runs": sum(len(v) for n in self.nodes for v in n.junk.values()),
                "confirmation_runs": {pr: int(sum(n.runs[pr]["confirmation"].sum() for n in self.nodes))
                                      for pr in runs},
                # busy fleets: the share of GPU time tenants held, the GPU measurements a run left to them, the
                # opportunistic runs, and the share of (GPU, 15-minute) slots with a fresh measurement
                "gpu_busy_share": round(sum(held(iv) for n in self.nodes for iv in n.gpu_busy)
                                        / (len(self.nodes) * 8 * p.days * DAY), 3),
                "gpu_measurements_left_out": int(sum((n.runs["gpu_bandwidth"]["held"]
                                                      & (n.runs["gpu_bandwidth"]["out"] != 2)[:, None]).sum()
                                                     for n in self.nodes)),
                "opportunistic_runs": {pr: int(sum((n.runs[pr]["trigger"] == 2).sum() for n in self.nodes))
                                       for pr in runs},
                "events": kinds}
