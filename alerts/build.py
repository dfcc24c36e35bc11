#!/usr/bin/env python3
"""Generate the recording and alert rules (alerts/fleetcanary.rules.yml, alerts/fleetcanary.alerts.yml).

The node judges itself; the fleet only compares peers (docs/alerting.md). Each exporter keeps its
own runs and publishes, per judged series, statistics over runs (fleetcanary.judge): the median of
its newest 7 runs, the best of its newest 3, its change against its own baseline (the best day on
its driver; after an upgrade also against the previous driver's) and its drift. Every statistic
carries the labels peers share (figure, series, pool, model, driver_version), so these rules need
no joins and no time windows over raw runs:

- per peer group, the median and the median absolute deviation (MAD) of the changes and of the
  levels, and the number of nodes reporting (6 recording rules for every figure at once);
- per figure, alerts that a person reads in one go: the change path (against the peers' changes),
  the level path (against the peers' level: new members and GPUs that were always slow), the fast
  path (the newest runs far below the peers), the own-history paths (regression, drift, the drop
  after a driver change) and the hard failures.

Settings: SETTINGS below, overridden by a YAML file (`python -m alerts.build --settings FILE
--out DIR`, or `fleetcanary rules --settings FILE --out DIR` from an installed package, no
repository needed): label matchers added to every selector (job, cluster), extra labels peers
share, thresholds per figure, the runbook URL pattern, the evaluation interval, and pools that get
their own groups (sharding). Prometheus 2.42 and vmalert 1.79 both load the files unchanged:
no `keep_firing_for` (vmalert 1.79 rejects it; the fast path's figure is held by the exporter, and
the hard failures hold through their windows). Every judged path that can page again holds
through its own ALERTS series (`hold`): once firing, it stays firing while its value is still worse
than half its floor, read with last_over_time over `hold_gap` so that a gap in the figure (an
exporter restart, the first runs on a new driver) does not resolve it either. Without it a steady
fault at a threshold fired again every time noise carried it back over (docs/detection.md, issue
38: a 15% collective drop paged the fast path a median 18.5 times).

`build(scale=...)` multiplies every group interval and `for` (not the data windows):
tests/test_alerts_live.py runs the shipped structure faster on a real Prometheus.
"""
from __future__ import annotations

import argparse
import copy
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import yaml

from fleetcanary.judge import figures as judged
from fleetcanary.judge import stats as judge_stats
from fleetcanary.probes.inference import TTFT_BUCKETS

# installed: fleetcanary.rules; in a checkout: `python -m alerts.build`, the modules beside this file either way
from . import matchers, prometheusrule, rules_coverage, rules_fabric, rules_nic

HERE = Path(__file__).resolve().parent
RATIO = 'printf "%.3f"'  # template format of a ratio (change): 0.943, not humanize's 943m
CURRENT = ", baseline='current_driver'"
# The daily burn's slowdown share with its GPU model and pool (joined where read: no per-GPU record)
SLOWDOWN = ("fleetcanary_gpu_sustained_slowdown_ratio * on(node) group_left(model) node:fleetcanary_gpu_model:info "
            "* on(node) group_left(pool) node:fleetcanary_pool:info")


def runbook_base() -> str:
    """The runbooks of this release (its tag), so a page links to what was true of the rules that sent it; a
    development build (a local version, or none) links to main."""
    from fleetcanary.core.version import version

    v = version()
    ref = f"v{v}" if re.fullmatch(r"\d+\.\d+\.\d+", v) else "main"
    return f"https://github.com/fleetcanary/fleetcanary/blob/{ref}/docs/runbooks.md"


RUNBOOK = runbook_base()
TTFT_POOLED = "node:fleetcanary_inference_ttft_seconds:p95_30m * on(node) group_left(pool) node:fleetcanary_pool:info"
# The MAD's relative standard error for normal data: the normalised MAD's asymptotic variance is 1.36 sigma^2 / n,
# so its standard error is sqrt(1.36) = 1.166 / sqrt(n) of it
MAD_SE = 1.17
GROUP = ("pool", "model", "driver_version", "figure", "series")   # what peers share (plus Settings.peer_labels)
CHANGE_GROUP = ("baseline", "baseline_driver")                     # ... and, for changes, the baseline they divide by


@dataclass(frozen=True)
class FigureRules:
    """One judged figure's alerts (the figure itself: fleetcanary.judge.figures)."""
    key: str
    title: str
    alert: str                # CamelCase stem of the alert names
    interval_minutes: int     # the probe's default interval: `for` of the peer alerts
    higher_is_better: bool = True
    floor: float = 0.05       # change path: at least this far from the peers' median change ...
    k_mad: float = 7          # ... and more than this many MADs of the peers' change ratios
    history_floor: float = 0.10  # regression and driver-change: at least this far from its own baseline
    history: bool = True
    fast: bool = True
    per_driver: bool = True   # the judge keeps its series per GPU driver (fleetcanary.judge.figures: GPU figures)


@dataclass(frozen=True)
class Settings:
    selector: str = ""            # label matchers added to every fleetcanary selector, e.g. 'job="fleetcanary"'
    peer_labels: tuple[str, ...] = ()  # extra labels peers share, e.g. ("cluster",)
    runbook_url: str = RUNBOOK + "#{anchor}"  # {anchor}: the alert name in lower case
    interval: str = "5m"          # the peer groups: the statistics change once per run (10 minutes and more)
    hard_interval: str = "1m"     # hard failures, inventory, NIC and fabric
    min_peers: int = 5            # nodes reporting in a peer group
    level_floor: float = 0.10     # level path: at least this far from the peers' median level ...
    level_k_mad: float = 5        # ... and more than this many MADs of the peers' level ratios (fast path too)
    fast_floor: float = 0.15      # fast path: the best of the newest 3 runs this far below the peers' median level
    drift_floor: float = 0.04     # the day's median this far below the best day
    hold: bool = True             # a firing judged alert holds while its value is still worse than half its floor
                                  # (an ALERTS self-hold; docs/alerting.md, "Hold")
    hold_gap: str = "6h"          # ... and through a gap in its figure this long (last_over_time): an exporter
                                  # restart, a new driver's first 7 runs of a 30-minute probe
    pools: tuple[str, ...] = ()   # pools that get their own peer group (the rest share one)
    nvlink_domain_min_nodes: int = 2  # FleetCanaryNVLinkDomainDegraded: nodes of one NVLink domain with a fault
    coverage_min_share: float = 0.5  # FleetCanaryPoolUnmeasured: fewer of a pool's GPUs than this measured ...
    coverage_intervals: int = 3      # ... by a probe in its last this many intervals
    figures: dict[str, dict] = field(default_factory=dict)  # per figure: floor, k_mad, history_floor, interval_minutes

    def figure(self, f: FigureRules) -> FigureRules:
        return replace(f, **self.figures.get(f.key, {}))


SETTINGS = Settings()

FIGURES = (
    # A 2.5% floor: the fleet's best-measured figure (H200 run noise 0.6%); 5% on its own history.
    FigureRules("gpu_memory_bandwidth", "GPU memory bandwidth", "GPUMemoryBandwidth", 15, floor=0.025,
                history_floor=0.05),
    FigureRules("gpu_p2p_bandwidth", "GPU peer-to-peer bandwidth (slowest link)", "GPUP2PBandwidth", 60),
    # One series per node every 30 minutes leaves its peers' spread wider: 6 MADs. The floor is the GPUs' 2.5%: the
    # gate decides on a noisy series (9-12% on a 1 MiB all-reduce of 3.8% run noise), the floor on a quiet one (a 1
    # GiB all-reduce of 0.8% on H200, where a 4% floor found 1 of 6 3% drops, and 2.5% all 6 with no false episode).
    FigureRules("collective_bus_bandwidth", "collective bus bandwidth", "CollectiveBandwidth", 30, floor=0.025,
                k_mad=6),
    FigureRules("host_memory_bandwidth", "host memory bandwidth", "HostMemoryBandwidth", 10, per_driver=False),
    FigureRules("storage_read", "storage read throughput", "StorageRead", 30, per_driver=False),
    FigureRules("storage_first_byte", "storage first-byte latency", "StorageFirstByte", 30, higher_is_better=False,
                floor=0.10, per_driver=False),
    FigureRules("gpu_matmul_throughput", "GPU matrix-multiply throughput", "GPUMatmulThroughput", 30),
    # The daily burn: the level path only (5 burns are 5 days); FleetCanaryGPUThrottlingUnlikePeers judges each.
    FigureRules("gpu_sustained_ratio", "GPU sustained-over-initial throughput", "GPUSustainedThroughput", 60,
                history=False, fast=False),
    FigureRules("train_step_time", "training step time", "TrainStepTime", 60, higher_is_better=False),
)


# --- helpers -------------------------------------------------------------------------------------------------

def counted(selector: str, window: str) -> str:
    """Counted in the last ``window``: the counter rose, or its series is new there and above zero. An error
    counter's series is often born already counting (the XID counter at its first XID; NVML's volatile ECC
    count when the exporter starts after the error), where increase() sees nothing; a reset after a restart
    is increase()'s part."""
    return f"increase({selector}[{window}]) > 0 or ({selector} > 0 unless {selector} offset {window})"


def counted_value(selector: str, window: str) -> str:
    """How many were counted in the last ``window`` (for a panel): what a series new there has counted, else
    its increase."""
    return f"({selector} unless {selector} offset {window}) or increase({selector}[{window}])"

def dur(seconds: float) -> str:
    seconds = round(seconds)
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n and seconds % n == 0:
            return f"{seconds // n}{unit}"
    return f"{seconds}s"


def seconds(d: str) -> int:
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[u] for n, u in re.findall(r"(\d+)([smhd])", d))


def by(s: Settings, *extra: str) -> str:
    return ", ".join((*s.peer_labels, *GROUP, *extra))


def on(s: Settings, *extra: str) -> str:
    """The labels an alert matches one figure's series and records on: the peer group's but `figure`, which
    both sides' selectors fix."""
    return ", ".join(x for x in (*s.peer_labels, *GROUP, *extra) if x != "figure")


def sel(s: Settings, *matchers: str) -> str:
    """A selector of the exporter's series: the matchers and the deployer's selector (job, cluster)."""
    return "{" + ", ".join(m for m in (*matchers, s.selector) if m) + "}"


def rsel(*matchers: str) -> str:
    """A selector of a recorded peer series: no deployer selector (the records do not carry job)."""
    return "{" + ", ".join(m for m in matchers if m) + "}"


def worse(f: FigureRules, ratio: str) -> str:
    """How far worse than the peers a ratio is: 1 - r for a higher-is-better figure, r - 1 otherwise."""
    return f"(1 - {ratio})" if f.higher_is_better else f"({ratio} - 1)"


def peers_value(s: Settings, f: FigureRules) -> dict:
    """The peers' median figure of the alerted series as a plain number, in the figure's unit: what `fleetcanary
    remediate` compares a confirming run with before it acts on a performance verdict (docs/remediation.md)."""
    return {"peers_value": peer_query(s, "pool:fleetcanary_judge_median:peer_median", f.key, fmt='printf "%g"')}


def annotations(s: Settings, summary: str, description: str, name: str) -> dict:
    return {"summary": summary, "description": description, "runbook_url": s.runbook_url.format(anchor=name.lower())}


def query(metric: str, figure: str, extra: str = "", fmt: str = "humanize") -> str:
    """A template that reads one statistic of the alerted series (vmalert and Prometheus both have `query`)."""
    q = f"{metric}{{node='%s', figure='{figure}', series='%s', gpu='%s'{extra}}}"
    return (f'{{{{ with query (printf "{q}" $labels.node $labels.series $labels.gpu) }}}}'
            f"{{{{ . | first | value | {fmt} }}}}{{{{ else }}}}none{{{{ end }}}}")


def peer_query(s: Settings, metric: str, figure: str, extra: str = "", fmt: str = "humanize") -> str:
    """A template that reads one statistic of the alerted series' peer group (its peer labels included)."""
    labels = [*s.peer_labels, "pool", "model", "driver_version"]
    q = ", ".join(f"{k}='%s'" for k in labels) + f", figure='{figure}', series='%s'{extra}"
    args = " ".join(f"$labels.{k}" for k in [*labels, "series"])
    return (f'{{{{ with query (printf "{metric}{{{q}}}" {args}) }}}}'
            f"{{{{ . | first | value | {fmt} }}}}{{{{ else }}}}none{{{{ end }}}}")


def what(f: FigureRules) -> str:
    gpu = " GPU {{ $labels.gpu }}" if judged.BY_KEY[f.key].gpu else ""
    return f"{f.title} of {{{{ $labels.node }}}}{gpu}" + " ({{ $labels.series }})"


def peers_words() -> str:
    return ("its peers (pool {{ $labels.pool }}, {{ $labels.model }}, driver {{ $labels.driver_version }}, same "
            "series)")


# --- recording rules: per peer group ---------------------------------------------------------------------------
def peer_recording(s: Settings, pool: str) -> list[dict]:
    """Median, MAD and node count of the peers' changes and levels. `pool`: a matcher for a sharded group."""
    out = []
    for stat, extra in (("change", CHANGE_GROUP), ("median", ())):
        g = by(s, *extra)
        src = f"fleetcanary_judge_{stat}{sel(s, pool)}"
        med = f"pool:fleetcanary_judge_{stat}:peer_median"
        nodes = f"pool:fleetcanary_judge_{stat}:peer_nodes"
        out += [
            {"record": med, "expr": f"quantile by ({g}) (0.5, {src})"},
            {"record": nodes, "expr": f"count by ({g}) (count by ({g}, node) ({src}))"},
            {"record": f"pool:fleetcanary_judge_{stat}:peer_mad",
             "expr": f"# the median absolute deviation of the peers' ratios (each member over the peers' median),\n"
                     f"# raised by its own standard error ({MAD_SE:g} / sqrt(members)): a MAD of 5 members' ratios\n"
                     f"# is a spread known to +-52%, and a gate of K such MADs sat under a noisy series' own spread\n"
                     f"# often enough to fire on it; 1.05x with 500 members\n"
                     f"quantile by ({g}) (0.5,\n  abs({src} / on({g}) group_left {med} - 1)\n)\n"
                     f"* on({g}) (1 + {MAD_SE:g} / sqrt(count by ({g}) ({src})))\n"
                     f"# only where at least {s.min_peers} nodes report: an alert that compares with it needs them\n"
                     f"and on({g}) ({nodes} >= {s.min_peers})"},
        ]
    return out


def hold(s: Settings, name: str, value: str, floor: float, what: str, unless: str = "") -> str:
    """The hold branch of a judged alert: while the alert fires, it stays firing as long as `value` (how far the
    node is worse: its change against its own baseline, or its figure against its peers') is past `floor`, half
    the alert's own. `value` reads the node's statistic through ``gap(s, ...)``, its newest sample of the last
    `hold_gap`. Without it a steady fault near a threshold resolves and fires again whenever noise, the peers'
    MAD gate or a gap in the figure moves it across (docs/detection.md, issue 38)."""
    if not s.hold:
        return ""
    on = ", ".join((*s.peer_labels, "node", "gpu", "series", "baseline"))
    return (f"\n# hold: firing, and {what} still worse by {floor:g} (its newest figure of the last {s.hold_gap})\n"
            f"or {value} > {floor:g}\n"
            + (f"  unless {unless}\n" if unless else "")
            + f'  and on({on}) ALERTS{{alertname="{name}", alertstate="firing"}}')


def gap(s: Settings, selector: str) -> str:
    """A node's statistic as a hold reads it: its newest sample of the last `hold_gap` (held through a gap)."""
    return f"last_over_time({selector}[{s.hold_gap}])" if s.hold else selector


def median_words(f: FigureRules) -> str:
    """Runs in the exporter's median of the figure, in words (fleetcanary.judge.stats)."""
    return judge_stats.median_words(judged.BY_KEY[f.key])


# --- alerts ----------------------------------------------------------------------------------------------------
def peer_alert(s: Settings, f: FigureRules, path: str, pool: str, c: Ctx) -> dict:
    """The change path (path=change) or the level path (path=level) of ...BelowPeers / ...SlowerThanPeers."""
    stat, extra, floor, k = (("change", CHANGE_GROUP, f.floor, f.k_mad) if path == "change"
                             else ("median", (), s.level_floor, s.level_k_mad))
    g = on(s, *extra)
    fm = f'figure="{f.key}"'
    ratio = (f"fleetcanary_judge_{stat}{sel(s, fm, pool)}\n"
             f"    / on({g}) group_left pool:fleetcanary_judge_{stat}:peer_median{rsel(fm)}")
    what_ = ("its change against its own baseline (the best day on driver {{ $labels.baseline_driver }}, "
             "baseline={{ $labels.baseline }})" if path == "change" else "its figure")
    expr = (f"# {f.title}: {what_.split(' (', 1)[0]} over the median of its peers'\n"
            f"{worse(f, ratio)}\n"
            f"# worse by the floor and by more than {k:g} MADs of the peers' ratios\n"
            f"  > {floor:g}\n"
            f"#   (the MAD is recorded only where at least {s.min_peers} peer nodes report)\n"
            f"  > on({g}) group_left() ({k:g} * pool:fleetcanary_judge_{stat}:peer_mad{rsel(fm)})")
    if path == "change" and f.fast:
        # Confirmed by its newest runs: its change with its median replaced by the best of its newest 3 runs is
        # worse than the peers' by the floor too. The comparison above is like with like (every node's change is
        # over its median); this asks the node alone, as the fast path does, that all of its newest 3 runs agree,
        # so four heavy-tailed low runs among seven are not a verdict (9 false episodes in a week on the
        # detection fleet's Student-t GPUs without it).
        node = ", ".join((*s.peer_labels, "node", "gpu", "series"))
        confirm = (f"fleetcanary_judge_change{sel(s, fm, pool)}\n"
                   f"      * on({node}) group_left() (fleetcanary_judge_newest{sel(s, fm, pool)} / "
                   f"fleetcanary_judge_median{sel(s, fm, pool)})\n"
                   f"      / on({g}) group_left pool:fleetcanary_judge_{stat}:peer_median{rsel(fm)}")
        expr += (f"\n# confirmed: its change over the best of its newest 3 runs is worse by the floor too\n"
                 f"and on({node}, baseline) {worse(f, confirm)} > {floor:g}")
    word = "slower than" if not f.higher_is_better else "below"
    name = f"FleetCanary{f.alert}{'SlowerThanPeers' if not f.higher_is_better else 'BelowPeers'}"
    # The hold compares what fired, without the MAD gate: against the peers, not its own baseline, whose
    # previous driver's (baseline=previous_driver) carries the new driver's own effect for two weeks.
    held = (f"{gap(s, f'fleetcanary_judge_{stat}' + sel(s, fm, pool))}\n"
            f"    / on({g}) group_left pool:fleetcanary_judge_{stat}:peer_median{rsel(fm)}")
    expr += hold(s, name, worse(f, held), floor / 2,
                 "its change against its peers' median change" if path == "change" else
                 "its figure against its peers' median")
    base = ", baseline='%s', baseline_driver='%s'" if path == "change" else ""
    peer = peer_query(s, f"pool:fleetcanary_judge_{stat}:peer_median", f.key, base,
                      RATIO if path == "change" else "humanize")
    if base:  # the baseline labels of the alerted series
        peer = peer.replace("$labels.series)", "$labels.series $labels.baseline $labels.baseline_driver)")
    desc = (f"The {what(f)} is {{{{ $value | humanizePercentage }}}} {word} {peers_words()}: path {path}, "
            f"{what_}. Figure (median of {median_words(f)}): "
            f"{query('fleetcanary_judge_median', f.key)}; own change "
            f"against its best day: {query('fleetcanary_judge_change', f.key, CURRENT, RATIO)}"
            f"; peers' median {'change' if path == 'change' else 'figure'}: {peer}."
            + (f" (Held: once firing, while its {'change' if path == 'change' else 'figure'} is still worse than "
               f"its peers' by {floor / 2:g}.)" if s.hold else ""))
    return {"alert": name, "expr": expr, "for": c.t(max(f.interval_minutes, 15)),
            "labels": {"severity": "warning", "figure": f.key, "path": path},
            "annotations": annotations(s, f"{f.title} {word} peers", desc, name) | peers_value(s, f)}


def fast_alert(s: Settings, f: FigureRules, pool: str, c: Ctx) -> dict:
    g = on(s)
    fm = f'figure="{f.key}"'
    ratio = (f"fleetcanary_judge_newest{sel(s, fm, pool)}\n"
             f"    / on({g}) group_left pool:fleetcanary_judge_median:peer_median{rsel(fm)}")
    expr = (f"# {f.title}: the best of the newest 3 runs over the peers' median figure\n"
            f"{worse(f, ratio)}\n"
            f"  > {s.fast_floor:g}\n"
            f"  > on({g}) group_left() ({s.level_k_mad:g} * pool:fleetcanary_judge_median:peer_mad{rsel(fm)})")
    word = "far slower than" if not f.higher_is_better else "far below"
    name = f"FleetCanary{f.alert}{'FarSlowerThanPeers' if not f.higher_is_better else 'FarBelowPeers'}"
    # held on its median, so one lucky run of a GPU that is still slow does not resolve the page
    held = (f"{gap(s, 'fleetcanary_judge_median' + sel(s, fm, pool))}\n"
            f"    / on({g}) group_left pool:fleetcanary_judge_median:peer_median{rsel(fm)}")
    expr += hold(s, name, worse(f, held), s.fast_floor / 2, "its median against its peers'")
    desc = (f"The newest 3 runs of the {what(f)} (all of them) are "
            f"{{{{ $value | humanizePercentage }}}} or more {word} the median figure of {peers_words()}: path fast. "
            f"Best of the newest 3: "
            f"{query('fleetcanary_judge_newest', f.key)}; median of {median_words(f)}: "
            f"{query('fleetcanary_judge_median', f.key)}."
            + (f" (Held: once firing, while its median is still worse than its peers' by {s.fast_floor / 2:g}.)"
               if s.hold else ""))
    return {"alert": name, "expr": expr, "for": "0m", "labels": {"severity": "critical", "figure": f.key,
                                                                  "path": "fast"},
            "annotations": annotations(s, f"{f.title} {word} peers", desc, name) | peers_value(s, f)}


def own_alerts(s: Settings, f: FigureRules, pool: str, c: Ctx) -> list[dict]:
    """Against its own history: the fast path where peers are too few, regression, drop after a driver
    change, drift. No peers needed."""
    fm = f'figure="{f.key}"'
    lower = not f.higher_is_better
    cur = "fleetcanary_judge_change" + sel(s, fm, 'baseline="current_driver"', pool)
    prev = "fleetcanary_judge_change" + sel(s, fm, 'baseline="previous_driver"', pool)
    names = {"fast": "FarSlowerThanOwnHistory" if lower else "FarBelowOwnHistory",
             "regression": "Regression", "driver": "RiseAfterDriverChange" if lower else "DropAfterDriverChange",
             "drift": "Drift"}
    out = []
    if f.fast:
        name = f"FleetCanary{f.alert}{names['fast']}"
        peers_judge = f"on({on(s)}) (pool:fleetcanary_judge_median:peer_nodes{rsel(fm)} >= {s.min_peers})"
        out.append({"alert": name, "for": "0m",
                    "expr": f"# {f.title}: its level against its own best day, where peers are too few\n"
                            f"{worse(f, cur)} > {s.fast_floor:g}\n"
                            f"# silent where the peer fast path judges (as many nodes with a median)\n"
                            f"unless {peers_judge}"
                            # silent there once held too: where the peer records came late (a rule group that
                            # evaluated before the peers' group at start), the hold would keep a page the peer
                            # fast path owns
                            + hold(s, name, worse(f, gap(s, cur)), s.fast_floor / 2,
                                   "its change against its own baseline", unless=peers_judge),
                    "labels": {"severity": "critical", "figure": f.key, "path": "own_fast"},
                    "annotations": annotations(
                        s, f"{f.title} far off its own history",
                        f"The {what(f)} is {{{{ $value | humanizePercentage }}}} {'above' if lower else 'below'} its "
                        f"best day on driver {{{{ $labels.baseline_driver }}}}, and fewer than {s.min_peers} peer "
                        f"nodes report in its group: path own_fast. Median of {median_words(f)}: "
                        f"{query('fleetcanary_judge_median', f.key)}.", name)})
    name = f"FleetCanary{f.alert}{names['regression']}"
    out.append({"alert": name, "for": c.t(max(2 * f.interval_minutes, 30)),
                "expr": f"# {f.title}: its level against its own best day on this driver\n"
                        f"{worse(f, cur)} > {f.history_floor:g}"
                        + hold(s, name, worse(f, gap(s, cur)), f.history_floor / 2,
                               "its change against its own baseline"),
                "labels": {"severity": "warning", "figure": f.key, "path": "regression"},
                "annotations": annotations(
                    s, f"{f.title} {'rose' if lower else 'fell'} against its own history",
                    f"The {what(f)} is {{{{ $value | humanizePercentage }}}} {'above' if lower else 'below'} its best "
                    f"day on driver {{{{ $labels.baseline_driver }}}} in the last 14 days: path regression. Median "
                    f"of {median_words(f)}: {query('fleetcanary_judge_median', f.key)}.", name)})
    if f.per_driver:  # a figure without a driver (host memory, storage) has no previous driver's change
        name = f"FleetCanary{f.alert}{names['driver']}"
        out.append({"alert": name, "for": c.t(max(f.interval_minutes, 15)),
                    "expr": f"# {f.title}: its level on the new driver against its best day on the previous "
                            f"one\n{worse(f, prev)} > {f.history_floor:g}"
                            + hold(s, name, worse(f, gap(s, prev)), f.history_floor / 2,
                                   "its change against the previous driver's best day"),
                    "labels": {"severity": "warning", "figure": f.key, "path": "driver_change"},
                    "annotations": annotations(
                        s, f"{f.title} {'rose' if lower else 'dropped'} after a driver change",
                        f"The {what(f)} on driver {{{{ $labels.driver_version }}}} is "
                        f"{{{{ $value | humanizePercentage }}}} {'above' if lower else 'below'} its best day on the "
                        f"previous driver "
                        f"{{{{ $labels.baseline_driver }}}}: path driver_change.", name)})
    name = f"FleetCanary{f.alert}{names['drift']}"
    out.append({"alert": name, "for": c.t(60),
                "expr": f"# {f.title}: the median of its last day of runs against its best day on this driver\n"
                        f"{worse(f, 'fleetcanary_judge_drift' + sel(s, fm, pool))} > {s.drift_floor:g}"
                        + hold(s, name, worse(f, gap(s, 'fleetcanary_judge_drift' + sel(s, fm, pool))),
                               s.drift_floor / 2, "its last day against its best day"),
                "labels": {"severity": "warning", "figure": f.key, "path": "drift"},
                "annotations": annotations(
                    s, f"{f.title} drifted from its best day",
                    f"The {what(f)}: the median of its last day of runs is {{{{ $value | humanizePercentage }}}} "
                    f"{'above' if lower else 'below'} its best day on this driver in the last 14 days: path drift "
                    "(a slow decline).", name)})
    return out


XID_PAGING = "hardware|memory|bus|nvlink"   # the XID classes whose critical codes page on first sight
FABRIC_NOT_READY = "not_started|in_progress|unhealthy|unknown"   # fleetcanary_gpu_info's fabric_state, not ready
NODE_DOMAIN = "node:fleetcanary_nvlink_domain:info"


def in_domain(expr: str) -> str:
    """`expr` (per node and GPU) with the node's NVLink domain as its nvlink_domain label where the node has one
    (NODE_DOMAIN: its GPUs' domain, held for a day after they lose it, so a rack whose fabric went down still
    groups as one); as it is elsewhere."""
    return f"(({expr}) * on(node) group_left(nvlink_domain) ({NODE_DOMAIN} > bool 0)) or on(node, gpu) ({expr})"


def hard_alerts(s: Settings, c: Ctx) -> list[dict]:
    """Hard failures fire on their first observation. Those that hold after the fault clears (an XID, an
    uncorrectable ECC error, a wrong result) do so through a longer window, not keep_firing_for."""
    def a(name, expr, for_, sev, summary, desc):
        return {"alert": name, "expr": " ".join(expr.split()), "for": c.t(seconds(for_) / 60),
                "labels": {"severity": sev}, "annotations": annotations(s, summary, desc, name)}

    return [
        a("FleetCanaryProbeFailing",
          'sum by (node, probe) (increase(fleetcanary_probe_runs_total{outcome=~"failure|timeout|crash"}[1h])) >= 3',
          "10m", "warning", "A probe keeps failing",
          "Probe {{ $labels.probe }} on {{ $labels.node }} failed, timed out or crashed {{ $value | humanize }} "
          "times in the last hour."),
        a("FleetCanaryProbeStale",
          "((time() - fleetcanary_probe_last_success_timestamp_seconds) > 3 * fleetcanary_probe_interval_seconds) "
          'unless on(node, probe) (increase(fleetcanary_probe_runs_total{outcome="skipped"}[1h]) > 0)',
          "15m", "warning", "A probe has not succeeded for 3 intervals",
          "Probe {{ $labels.probe }} on {{ $labels.node }} last succeeded {{ $value | humanizeDuration }} ago and "
          "did not skip; its runs fail or do not happen."),
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
        # per GPU: links present but not active (per link only with gpu_health's per_link); a link NVML cannot read
        # is down. In a multi-node NVLink domain the alert carries the domain, so a rack's are one notification.
        a("FleetCanaryNVLinkDown", in_domain("fleetcanary_gpu_nvlink_links_down > 0"), "0m", "critical",
          "An NVLink is down",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} has {{ $value }} NVLink links down and "
          """{{ with query (printf "fleetcanary_gpu_nvlink_links_up{node='%s', gpu='%s'}" """
          """$labels.node $labels.gpu) }}"""
          "{{ . | first | value }}{{ else }}?{{ end }} active; `nvidia-smi nvlink -s` names the inactive ones."),
        # The NVLink fabric of NVSwitch systems (gpu_health: nvmlDeviceGetGpuFabricInfoV, labels of
        # fleetcanary_gpu_info). Registration takes a minute or two after a boot, a driver load or a fabric
        # manager restart: 5 minutes. Each alert carries the NVLink domain (the GPU's own, else its node's last),
        # and the Alertmanager example groups by it: a rack-wide fault is one page that lists its nodes.
        a("FleetCanaryGPUFabricNotReady",
          in_domain("max by (node, gpu, fabric_state) "
                    f'(fleetcanary_gpu_info{{fabric_state=~"{FABRIC_NOT_READY}"}})'),
          "5m", "critical", "A GPU's NVLink fabric is not ready",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} has NVLink fabric state {{ $labels.fabric_state }} "
          "(unhealthy: registered with an error status or an unhealthy health mask) in NVLink domain "
          "{{ $labels.nvlink_domain }}; its multi-node NVLink traffic fails or is slowed. The gpu_health record "
          "(/results) has the status and health mask."),
        a("FleetCanaryGPUFabricCliqueMismatch",
          # the GPUs whose own domain (gpu_domain) is not their node's (only once the node's is recorded)
          '(max by (node, gpu, gpu_domain) (label_replace(fleetcanary_gpu_info{nvlink_domain!=""}, '
          '"gpu_domain", "$1", "nvlink_domain", "(.+)")) unless on(node, gpu) '
          f"(fleetcanary_gpu_info * on(node, nvlink_domain) group_left() {NODE_DOMAIN})) "
          f"* on(node) group_left(nvlink_domain) ({NODE_DOMAIN} > bool 0)",
          "5m", "critical", "A GPU left its NVLink clique",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} is registered in NVLink domain {{ $labels.gpu_domain }} "
          "(cluster UUID/clique), not in its node's {{ $labels.nvlink_domain }}: it cannot reach its rack's "
          "partition over NVLink. fleetcanary_gpu_info of the node shows each GPU's domain."),
        # A fault across an NVLink domain (a rack's NVLink switch trays, its fabric manager or NMX): one alert for
        # the domain, which the Alertmanager example groups with the per-GPU alerts that name its nodes.
        a("FleetCanaryNVLinkDomainDegraded",
          "count by (nvlink_domain) (max by (node, nvlink_domain) (("
          f'max by (node) (fleetcanary_gpu_info{{fabric_state=~"{FABRIC_NOT_READY}"}}) '
          "or max by (node) (fleetcanary_gpu_nvlink_links_down > 0)) "
          f"* on(node) group_left(nvlink_domain) {NODE_DOMAIN})) >= {s.nvlink_domain_min_nodes}",
          "5m", "critical", "NVLink fabric faults across an NVLink domain",
          "{{ $value }} nodes of NVLink domain {{ $labels.nvlink_domain }} (cluster UUID/clique: a GB200 NVL72 "
          "rack's partition) have GPUs whose NVLink fabric is not ready or whose NVLinks are down: a fault of the "
          "domain (its NVLink switch trays, fabric manager or NVLink management), not of each node. The "
          "notification groups the per-GPU alerts that name the nodes."),
        # XIDs by the catalogue's class (probes/lib/xid_catalogue.yaml, docs/xid-catalogue.md): a critical code of a
        # hardware-side class pages on first sight; driver, thermal and the lesser codes are a warning; an
        # application-class code (13, 31, 43 ...) only through its escalation (one GPU, several processes).
        a("FleetCanaryGPUCriticalXid",
          counted(f'fleetcanary_gpu_xid_errors_total{{class=~"{XID_PAGING}", severity="critical"}}', "75m"),
          "0m", "critical", "A GPU reported a hardware-class XID",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} reported XID {{ $labels.xid }} (class {{ $labels.class }}) "
          "in the last 75 minutes; its meaning and first action: docs/xid-catalogue.md#xid-{{ $labels.xid }}."),
        a("FleetCanaryGPUXidWarning",
          counted('fleetcanary_gpu_xid_errors_total{class!="application", severity="warning"}', "75m")
          + " or "
          + counted(f'fleetcanary_gpu_xid_errors_total{{class!~"{XID_PAGING}|application", severity="critical"}}',
                    "75m"),
          "0m", "warning", "A GPU reported a driver, thermal or lesser XID",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} reported XID {{ $labels.xid }} (class {{ $labels.class }}, "
          "severity {{ $labels.severity }}) in the last 75 minutes; its meaning and first action: "
          "docs/xid-catalogue.md#xid-{{ $labels.xid }}."),
        a("FleetCanaryGPUApplicationXidRepeated", counted("fleetcanary_gpu_xid_escalations_total", "75m"), "0m",
          "critical", "An application-class XID repeats on one GPU across processes",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} logged XID {{ $labels.xid }} from several different "
          "processes within the escalation window (xid.escalate_processes, default 3 in 1 h): the GPU, not a job, "
          "is the common factor; first action: docs/xid-catalogue.md#xid-{{ $labels.xid }}."),
        a("FleetCanaryGPUUncorrectableECC",
          counted('fleetcanary_gpu_ecc_errors_total{type="uncorrected", counter="volatile"}', "2h"), "0m",
          "critical", "Uncorrectable ECC errors on a GPU",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} had {{ $value }} uncorrectable ECC errors in the last 2 hours."),
        a("FleetCanaryGPURowRemapPending", "fleetcanary_gpu_remapped_rows_pending == 1", "5m", "warning",
          "A GPU has a pending row remap", "GPU {{ $labels.gpu }} on {{ $labels.node }} needs a reset to apply a "
          "row remapping."),
        a("FleetCanaryGPURowRemapFailed", "fleetcanary_gpu_remapped_rows_failed == 1", "0m", "critical",
          "A GPU failed a row remap", "GPU {{ $labels.gpu }} on {{ $labels.node }} could not remap a row; it needs "
          "service."),
        a("FleetCanaryCollectiveWrongResult",
          'increase(fleetcanary_probe_failures_total{probe="collectives", reason="wrong_result"}[4h]) > 0', "0m",
          "critical", "A collective returned wrong data",
          "The collectives probe on {{ $labels.node }} found wrong elements in a collective's output in the last "
          "4 hours."),
        a("FleetCanaryGPUWrongResult",
          'max by (node, gpu) (max_over_time(fleetcanary_gpu_sdc_status{status="mismatch"}[2h])) == 1',
          "0m", "critical", "A GPU computed a wrong result (silent data corruption)",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} produced a checksum for the deterministic canary products that "
          "differs from the golden its model's GPUs agreed on (in the last 2 hours)."),
        a("FleetCanaryGPUSDCNoConsensus",
          'max by (node, gpu) (max_over_time(fleetcanary_gpu_sdc_status{status="no_consensus"}[1h])) == 1', "0m",
          "warning", "The SDC canary found no majority",
          "The GPUs of {{ $labels.node }} disagree on the canary checksum with no strict majority (or all disagree "
          "with the stored golden); GPU {{ $labels.gpu }} is one of them. Not judged; a person must."),
        a("FleetCanaryGPUThrottlingUnlikePeers",
          f"(({SLOWDOWN}) > 0.05) "
          f"and on(model, pool) (pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_median < 0.01) "
          f"and on(model, pool) (pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_count >= {s.min_peers})",
          "10m", "critical", "A GPU throttles under load where its peers do not",
          "GPU {{ $labels.gpu }} on {{ $labels.node }} spent {{ $value | humanizePercentage }} of its sustained burn "
          "in a thermal, power-brake or HW slowdown; the median of its peers (same model and pool) is under 1%."),
        a("FleetCanaryTrainStepLossWrong", "min_over_time(fleetcanary_train_step_loss_check_pass[1h]) == 0", "0m",
          "critical", "The training-step canary's loss is off its golden",
          "The canary transformer trained on GPU {{ $labels.gpu }} of {{ $labels.node }} ({{ $labels.dtype }}) ended "
          "with a loss outside its tolerance of the golden value (in the last hour)."),
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
        # 10% over the peers, and past the histogram bucket the peers' p95 lies in: within one bucket the p95 is
        # interpolated (0.05-0.1 s is one bucket), and 2 of 5 healthy demo nodes went pending on that alone
        a("FleetCanaryInferenceTTFTSlowerThanPeers",
          f"({TTFT_POOLED}) / on(pool, target, model) group_left "
          "pool:fleetcanary_inference_ttft_seconds:peer_median_p95_30m > 1.1 "
          f"and on(pool, target, model) (pool:fleetcanary_inference_ttft_seconds:peer_nodes >= {s.min_peers}) "
          f"and ({TTFT_POOLED}) > on(pool, target, model) group_left "
          "pool:fleetcanary_inference_ttft_seconds:peer_median_p95_bucket_bound_30m",
          "30m", "warning", "Inference TTFT p95 slower than peers",
          "p95 TTFT from {{ $labels.node }} to {{ $labels.target }} is {{ $value | humanize }} times the median of the "
          "pool's nodes calling the same endpoint, and past the histogram bucket theirs lies in (a node-side cause: "
          "its network path, its client)."),
        a("FleetCanaryInferenceQualityFailing", "fleetcanary_inference_quality_pass == 0", "10m", "critical",
          "An inference endpoint answers a golden prompt wrongly",
          "Check {{ $labels.check }} fails against {{ $labels.target }} (seen from {{ $labels.node }})."),
        a("FleetCanaryInferenceOutputChanged", "fleetcanary_inference_output_stable == 0", "30m", "info",
          "Greedy output changed", "The temperature-0 output of {{ $labels.target }} differs from the first one seen "
          "for this model (a quantization, kernel or sampling change?)."),
        # torch's CUDA needs a newer driver than the node's (the cuda image: CUDA 13.0, R580+): every CUDA probe
        # skips driver_too_old. Any probe's skip counts, a series born counting too (counted()): no zero per probe.
        a("FleetCanaryCUDAProbesDriverTooOld",
          "max by (node) ("
          + counted('fleetcanary_probe_skips_total{reason="driver_too_old"}', "2h")
          + ") * on(node) group_left(driver_version, cuda_driver_version) "
          "max by (node, driver_version, cuda_driver_version) (fleetcanary_node_info)",
          "0m", "warning", "The GPU probes cannot run: the driver is older than the image's CUDA",
          "The CUDA probes on {{ $labels.node }} skip (driver_too_old): its driver {{ $labels.driver_version }} runs "
          "CUDA {{ $labels.cuda_driver_version }}, older than the torch of its image needs. Run the cuda12 image "
          "(tag <version>-cuda12: drivers from R525) on this node, or upgrade the driver to R580 or newer for the "
          "cuda image (docs/image.md)."),
        a("FleetCanaryExporterDown", "up{" + (s.selector or 'job="fleetcanary"') + "} == 0",
          "5m", "warning", "fleetcanary is not scraped",
          "Prometheus cannot scrape fleetcanary on {{ $labels.node }}."),
        a("FleetCanaryConfigReloadFailed", "fleetcanary_config_last_reload_successful == 0", "5m", "warning",
          "fleetcanary kept its old config", "The config reload on {{ $labels.node }} failed; the previous config "
          "keeps running."),
    ]


def inventory_rules() -> list[dict]:
    def rec(name, expr):
        return {"record": name, "expr": " ".join(expr.split())}

    ttft = "node:fleetcanary_inference_ttft_seconds:p95_30m"
    return [
        # one per node (a node's GPUs share a model; a mixed node reports each model): 8 fewer series per node
        rec("node:fleetcanary_gpu_model:info", "max by (node, model) (fleetcanary_gpu_info)"),
        rec("node:fleetcanary_pool:info", "max by (node, pool) (fleetcanary_node_info)"),
        # The node's NVLink domain (<cluster UUID>/<clique>: GB200 NVL72, a rack's partition): the one most of its
        # GPUs registered in (value: how many), kept for a day after none has (a fabric down, a driver reload), so
        # the alerts of a rack-wide fault still carry it. Nodes without a multi-node NVLink fabric have none.
        # One series per node whatever happened within the day (two domains held: the larger), so the alerts'
        # group_left never meets two.
        rec(NODE_DOMAIN, 'topk by (node) (1, count by (node, nvlink_domain) (fleetcanary_gpu_info{nvlink_domain!=""}) '
                         f"or on(node) last_over_time({NODE_DOMAIN}[1d]))"),
        rec(ttft, "histogram_quantile(0.95, sum by (node, target, model, le) "
                  "(rate(fleetcanary_inference_time_to_first_token_seconds_bucket[30m])))"),
        rec("node:fleetcanary_inference_itl_seconds:p95_30m",
            "histogram_quantile(0.95, sum by (node, target, model, le) "
            "(rate(fleetcanary_inference_inter_token_latency_seconds_bucket[30m])))"),
        rec("node:fleetcanary_inference_errors:ratio_rate15m",
            'sum by (node, target, model) (rate(fleetcanary_inference_requests_total{outcome!="success"}[15m])) '
            "/ sum by (node, target, model) (rate(fleetcanary_inference_requests_total[15m]))"),
        rec("pool:fleetcanary_inference_ttft_seconds:peer_median_p95_30m",
            f"quantile by (pool, target, model) (0.5, {ttft} * on(node) group_left(pool) node:fleetcanary_pool:info)"),
        rec("pool:fleetcanary_inference_ttft_seconds:peer_nodes",
            f"count by (pool, target, model) ({ttft} * on(node) group_left(pool) node:fleetcanary_pool:info)"),
        # the upper bound of the TTFT histogram bucket the peers' median p95 lies in (the first bound at or above)
        rec("pool:fleetcanary_inference_ttft_seconds:peer_median_p95_bucket_bound_30m",
            " or ".join(f"(pool:fleetcanary_inference_ttft_seconds:peer_median_p95_30m <= {b}) * 0 + {b}"
                        for b in TTFT_BUCKETS)),
        # the daily burn's slowdown share per pool and model (joined inline: no per-GPU recorded series)
        rec("pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_median",
            f"quantile by (model, pool) (0.5, {SLOWDOWN})"),
        rec("pool_model:fleetcanary_gpu_sustained_slowdown_ratio:peer_count",
            f"count by (model, pool) (count by (model, pool, node) ({SLOWDOWN}))"),
    ]


# --- assembly --------------------------------------------------------------------------------------------------
class Ctx:
    """Time scaling for tests: group intervals and `for` multiplied by `scale` (data windows unchanged)."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def t(self, minutes: float) -> str:
        return dur(minutes * 60 * self.scale)

    def iv(self, d: str) -> str:
        return dur(seconds(d) * self.scale)


def pool_shards(s: Settings) -> list[tuple[str, str]]:
    """(group suffix, pool matcher): one group per listed pool and one for the rest; one group when none."""
    if not s.pools:
        return [("", "")]
    # a regex inside a PromQL string: re.escape's backslashes doubled (a bare '\-' is an invalid string escape)
    listed = "|".join(re.escape(p).replace("\\", "\\\\") for p in s.pools)
    return [(f"-{p}", f'pool="{p}"') for p in s.pools] + [("-other-pools", f'pool!~"{listed}"')]


METRIC = re.compile(r"\b(fleetcanary_[a-zA-Z0-9_]+)(\{[^}]*\})?(?![a-zA-Z0-9_:])")


def with_selector(expr: str, selector: str) -> str:
    """Add the deployer's matchers to every raw fleetcanary_ selector of a hand-written expression."""
    if not selector:
        return expr

    def add(m: re.Match) -> str:
        if m.group(2):
            inner = m.group(2)[1:-1].strip()
            return f"{m.group(1)}{{{inner + ', ' if inner else ''}{selector}}}"
        return f"{m.group(1)}{{{selector}}}"

    return METRIC.sub(add, expr)


def build(scale: float = 1.0, settings: Settings = SETTINGS) -> tuple[dict, dict]:
    s, c = settings, Ctx(scale)
    figures = [s.figure(f) for f in FIGURES]
    peer_groups, alert_groups = [], []
    for suffix, pool in pool_shards(s):
        rules = peer_recording(s, pool)
        for f in figures:
            if f.history:
                rules.append(peer_alert(s, f, "change", pool, c))
            rules.append(peer_alert(s, f, "level", pool, c))
            if f.fast:
                rules.append(fast_alert(s, f, pool, c))
        own = [a for f in figures if f.history for a in own_alerts(s, f, pool, c)]
        if suffix:  # a shard label keeps the same rule in two groups distinct (promtool lints duplicates)
            rules = [dict(r, labels={**r.get("labels", {}), "shard": suffix[1:]}) for r in rules]
            own = [dict(r, labels={**r["labels"], "shard": suffix[1:]}) for r in own]
        peer_groups.append({"name": f"fleetcanary-peers{suffix}", "interval": c.iv(s.interval), "rules": rules})
        alert_groups.append({"name": f"fleetcanary-own-history{suffix}", "interval": c.iv(s.interval), "rules": own})
    hard = [dict(a, expr=with_selector(a["expr"], s.selector)) for a in hard_alerts(s, c)]
    inventory = [dict(r, expr=with_selector(r["expr"], s.selector)) for r in inventory_rules()]
    nic = [dict(a, expr=with_selector(a["expr"], s.selector), **{"for": c.t(seconds(a["for"]) / 60)})
           for a in rules_nic.alert_rules(lambda su, de, na: annotations(s, su, de, na))]
    fabric_rec = [dict(r, expr=with_selector(r["expr"], s.selector)) for r in rules_fabric.recording_rules()]
    fabric = [dict(a, expr=with_selector(a["expr"], s.selector), **{"for": c.t(seconds(a["for"]) / 60)})
              for a in rules_fabric.alert_rules(lambda su, de, na: annotations(s, su, de, na))]
    coverage_rec = [dict(r, expr=with_selector(r["expr"], s.selector)) for r in rules_coverage.recording_rules()]
    coverage = [dict(a, expr=with_selector(a["expr"], s.selector))
                for a in rules_coverage.alert_rules(lambda su, de, na: annotations(s, su, de, na),
                                                    s.coverage_min_share, s.coverage_intervals, c.t(30))]
    hi = c.iv(s.hard_interval)
    recording = {"groups": [{"name": "fleetcanary-inventory", "interval": hi, "rules": inventory},
                            {"name": "fleetcanary-fabric", "interval": hi, "rules": fabric_rec},
                            {"name": "fleetcanary-coverage", "interval": c.iv(s.interval), "rules": coverage_rec}]}
    alerts = {"groups": [{"name": "fleetcanary-hard-failures", "interval": hi, "rules": hard},
                         *peer_groups, *alert_groups,
                         {"name": "fleetcanary-nic", "interval": hi, "rules": nic},
                         {"name": "fleetcanary-fabric-alerts", "interval": hi, "rules": fabric},
                         {"name": "fleetcanary-coverage-alerts", "interval": c.iv(s.interval), "rules": coverage}]}
    return recording, alerts


def load_settings(path: str | None) -> Settings:
    """SETTINGS with the YAML file's keys over it; unknown keys are an error (one line)."""
    if not path:
        return SETTINGS
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"rules settings {path}: {str(exc).splitlines()[0]}") from None
    known = {f.name for f in fields(Settings)}
    if not isinstance(data, dict):
        raise SystemExit(f"rules settings {path}: not a mapping of settings")
    if set(data) - known:
        raise SystemExit(f"rules settings {path}: unknown keys {sorted(set(data) - known)}; "
                         f"known: {', '.join(sorted(known))}")
    for key, value in data.items():
        default = getattr(SETTINGS, key)
        if isinstance(default, tuple):
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise SystemExit(f"rules settings {path}: {key} must be a list of names, not {value!r}")
            data[key] = tuple(value)
        elif isinstance(default, dict):
            if not isinstance(value, dict):
                raise SystemExit(f"rules settings {path}: {key} must be a mapping, not {value!r}")
        elif not isinstance(value, type(default)) and not (
                isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool)):
            raise SystemExit(f"rules settings {path}: {key} must be a {type(default).__name__}, not {value!r}")
    if "selector" in data:
        try:
            matchers.parse(data["selector"])
        except ValueError as exc:
            raise SystemExit(f"rules settings {path}: selector {data['selector']!r}: {exc}") from None
    bad = [n for n in data.get("peer_labels", ()) if not matchers.NAME.fullmatch(n)]
    if bad:
        raise SystemExit(f"rules settings {path}: peer_labels: not label names: {bad}")
    for key in ("interval", "hard_interval", "hold_gap"):
        if key in data and not re.fullmatch(r"(\d+[smhd])+", data[key]):
            raise SystemExit(f"rules settings {path}: {key} must be a duration such as 5m or 6h, not {data[key]!r}")
    figures = {f.key: f for f in FIGURES}
    unknown = set(data.get("figures", {})) - set(figures)
    if unknown:
        raise SystemExit(f"rules settings {path}: unknown figures {sorted(unknown)}; known: {', '.join(figures)}")
    settable = {"floor", "k_mad", "history_floor", "interval_minutes"}
    for key, over in data.get("figures", {}).items():
        if not isinstance(over, dict) or set(over) - settable:
            raise SystemExit(f"rules settings {path}: figures.{key} may set {', '.join(sorted(settable))}, "
                             f"not {sorted(set(over) - settable) if isinstance(over, dict) else over!r}")
        for k, v in over.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise SystemExit(f"rules settings {path}: figures.{key}.{k} must be a non-negative number, not {v!r}")
    return replace(SETTINGS, **copy.deepcopy(data))


HEADER = ("# Generated by alerts/build.py (or `fleetcanary rules`); do not edit. Change its settings and rerun it.\n")


class _Literal(str):
    pass


def _literal(dumper, data):
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")


yaml.add_representer(_Literal, _literal, Dumper=yaml.SafeDumper)


def dump(d: dict) -> str:
    def lit(x):
        if isinstance(x, dict):
            return {k: (_Literal(v) if k == "expr" and "\n" in v else lit(v)) for k, v in x.items()}
        if isinstance(x, list):
            return [lit(v) for v in x]
        return x

    return HEADER + yaml.safe_dump(lit(d), sort_keys=False, width=120)


def render(scale: float = 1.0, settings: Settings = SETTINGS) -> dict[str, str]:
    recording, alerts = build(scale, settings)
    return {"fleetcanary.rules.yml": dump(recording), "fleetcanary.alerts.yml": dump(alerts)}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--settings", metavar="FILE",
                    help="a YAML file of settings over the defaults (docs/alerting.md, 'Settings')")
    ap.add_argument("--out", metavar="DIR", help="where to write the rules, created if missing (default: the "
                    "current directory; beside this script when run from a checkout)")
    ap.add_argument("--format", choices=("rules", "prometheusrule"), default="rules",
                    help="rules: Prometheus rule files (fleetcanary.rules.yml, fleetcanary.alerts.yml); "
                    "prometheusrule: Prometheus Operator objects (fleetcanary.prometheusrule.yaml), packed so none "
                    "passes client-side apply's 256 KiB annotation limit")
    ap.add_argument("--labels", metavar="K=V,...", default="",
                    help="prometheusrule: labels of the objects, e.g. release=kube-prometheus-stack (its "
                    "default ruleSelector matches the release label)")
    ap.add_argument("--name", default="fleetcanary", help="prometheusrule: the objects' name (numbered if several)")
    ap.add_argument("--namespace", default="", help="prometheusrule: their namespace (default: none set)")
    ap.add_argument("--promtool", metavar="PATH", default="",
                    help="promtool to check the rules with before anything is written (default: promtool on "
                    "PATH; without one the rules are written unchecked, and it says so)")


def promtool_check(texts: dict[str, str], promtool: str) -> str | None:
    """promtool's first complaint about the rendered rule files, or None when it accepts them."""
    with tempfile.TemporaryDirectory(prefix="fleetcanary-rules-") as tmp:
        paths = []
        for name, text in texts.items():
            (Path(tmp) / name).write_text(text)
            paths.append(str(Path(tmp) / name))
        try:
            r = subprocess.run([promtool, "check", "rules", *paths], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"promtool could not run: {exc}"
    if r.returncode == 0:
        return None
    lines = [ln.strip() for ln in (r.stderr + r.stdout).splitlines() if ln.strip() and "SUCCESS" not in ln]
    bad = [ln for ln in lines if "FAILED" not in ln and not ln.startswith("Checking")]
    return (bad or lines or [f"exit {r.returncode}"])[0].replace(tmp + "/", "")


def main(args: argparse.Namespace | list[str] | None = None) -> int:
    """`python -m alerts.build [--settings FILE] [--out DIR]`, or `fleetcanary rules ...` when installed."""
    if not isinstance(args, argparse.Namespace):
        ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        add_arguments(ap)
        args = ap.parse_args(args)
    checkout = (HERE.parent / "pyproject.toml").is_file()
    out = Path(args.out) if args.out else (HERE if checkout else Path("."))
    fmt = getattr(args, "format", "rules")
    try:
        settings = load_settings(args.settings)
        texts = render(settings=settings)
        promtool = getattr(args, "promtool", "") or shutil.which("promtool") or ""
        if promtool:
            problem = promtool_check(texts, promtool)
            if problem:
                raise SystemExit(f"promtool rejects the rules these settings make, nothing written: {problem}")
        else:
            print("fleetcanary rules: promtool not found: the rules are written unchecked", file=sys.stderr)
        if fmt == "prometheusrule":
            try:
                labels = prometheusrule.parse_labels(getattr(args, "labels", ""))
                groups = [g for t in texts.values() for g in yaml.safe_load(t)["groups"]]
                objs = prometheusrule.objects(groups, args.name, args.namespace, labels)
            except ValueError as exc:
                raise SystemExit(str(exc)) from None
            texts = {"fleetcanary.prometheusrule.yaml":
                     HEADER + yaml.safe_dump_all(objs, sort_keys=False, width=120)}
        out.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (out / name).write_text(text)
            print(f"wrote {out / name}")
    except SystemExit as exc:
        print(f"fleetcanary rules: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"fleetcanary rules: cannot write to {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if checkout and fmt == "rules" and out.resolve() == HERE.resolve() and not args.settings:
        from . import runbooks

        (HERE.parent / "docs/runbooks.md").write_text(runbooks.markdown(build()[1], FIGURES))
        print("wrote docs/runbooks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
