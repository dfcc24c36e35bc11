"""The own-history paths: each judged series against its own best day, no peers needed.

own_fast (...FarBelowOwnHistory: the fast path where its peer group has too few nodes), regression, the drop
after a driver change (against the previous driver's best day) and drift (its last day against its best day).
Each reads its gap once, how far worse its change (or drift) is than 1, and that gap is its `$value`, also while
its hold keeps it firing.
"""
from __future__ import annotations

from fleetcanary.core.rulesettings import RuleSettings
from fleetcanary.judge import figures as judged
from fleetcanary.rules.common import (
    CURRENT,
    HELD_STAT,
    RATIO,
    Group,
    Shard,
    alert,
    busy_of,
    dur,
    figures,
    gap_of,
    held_records,
    hold,
    interval_minutes,
    on,
    query,
    sel,
    settle,
    spread,
    what,
    worse,
    worst_of,
)


def groups(s: RuleSettings, shards: list[Shard]) -> list[Group]:
    return [Group("alerts", f"fleetcanary-own-history{suffix}", "interval",
                  held_records(s, "own_history", pool, ("change", "own_fast|regression|driver_change", True),
                               ("drift", "drift", False),
                               (HELD_STAT, "regression|driver_change|drift", False))
                  + [a for f in figures(s) if f.history for a in alerts(s, f, pool)], suffix[1:])
            for suffix, pool in shards]


def alerts(s: RuleSettings, f: judged.Figure, pool: str) -> list[dict]:
    fm = f'figure="{f.key}"'
    lower = not f.higher_is_better
    worse_word = "above" if lower else "below"
    cur = "fleetcanary_judge_change" + sel(fm, 'baseline="current_driver"', pool)
    prev = "fleetcanary_judge_change" + sel(fm, 'baseline="previous_driver"', pool)
    drift = "fleetcanary_judge_drift" + sel(fm, pool)
    median = f"Median {query('fleetcanary_judge_median', f.key)}"
    change = query("fleetcanary_judge_change", f.key, CURRENT, RATIO)
    out = []
    if f.fast:
        name = f"FleetCanary{f.alert}{'FarSlowerThanOwnHistory' if lower else 'FarBelowOwnHistory'}"
        nodes = spread(s, "pool:fleetcanary_judge_median:peer_nodes" + sel(fm))
        peers_judge = f"on({on(s)}) ({nodes} >= {s.min_peers})"
        out.append(alert(
            name,
            f"# {f.title}, path own_fast: the gap, how far its change against its own best day is worse than 1,\n"
            f"# where its peers are too few\n"
            f"{worse(f, cur)} > {s.fast_floor:g}\n"
            f"# silent where the peer fast path judges (as many nodes with a median)\n"
            f"unless {peers_judge}"
            # silent there once held too: where the peer records came late (a rule group that evaluated before the
            # peers' group at start), the hold would keep a page the peer fast path owns
            + hold(s, name, worse(f, gap_of(s, cur, "own_history", name)), s.fast_floor / 2, "the gap",
                   unless=peers_judge),
            "0m", {"severity": "critical", "figure": f.key, "path": "own_fast"},
            f"{f.title} far off its own history",
            f"{what(f)} is {{{{ $value | humanizePercentage }}}} {worse_word} its best day on driver "
            f"{{{{ $labels.baseline_driver }}}} (change {change}); fewer than {s.min_peers} peer nodes report. "
            f"{median}. Path own_fast."))
    name = f"FleetCanary{f.alert}Regression"
    out.append(alert(
        name,
        f"# {f.title}, path regression: the gap, how far its change against its own best day on this driver is\n"
        f"# worse than 1\n"
        f"{worse(f, cur)} > {f.history_floor:g}"
        + settled(s, f, name, cur, sel(fm, pool), f.history_floor / 2),
        dur(max(2 * interval_minutes(s, f), 30) * 60), {"severity": "warning", "figure": f.key, "path": "regression"},
        f"{f.title} {'rose' if lower else 'fell'} against its own history",
        f"{what(f)} is {{{{ $value | humanizePercentage }}}} {worse_word} its best day of the last 14 on driver "
        f"{{{{ $labels.baseline_driver }}}} (change {change}). {median}. Path regression."))
    if f.per_driver:  # a figure without a driver (host memory, storage) has no previous driver's change
        name = f"FleetCanary{f.alert}{'RiseAfterDriverChange' if lower else 'DropAfterDriverChange'}"
        out.append(alert(
            name,
            f"# {f.title}, path driver_change: the gap, how far its change on the new driver against its best day\n"
            f"# on the previous one is worse than 1\n"
            f"{worse(f, prev)} > {f.history_floor:g}"
            + settled(s, f, name, prev, sel(fm, pool), f.history_floor / 2),
            dur(max(interval_minutes(s, f), 15) * 60),
            {"severity": "warning", "figure": f.key, "path": "driver_change"},
            f"{f.title} {'rose' if lower else 'dropped'} after a driver change",
            f"{what(f)} on driver {{{{ $labels.driver_version }}}} is {{{{ $value | humanizePercentage }}}} "
            f"{worse_word} its best day on the previous driver {{{{ $labels.baseline_driver }}}}. {median}. "
            "Path driver_change."))
    name = f"FleetCanary{f.alert}Drift"
    out.append(alert(
        name,
        f"# {f.title}, path drift: the gap, how far the median of its last day of runs against its best day on\n"
        f"# this driver is worse than 1\n"
        f"{worse(f, drift)} > {s.drift_floor:g}"
        + settled(s, f, name, drift, sel(fm, pool), s.drift_floor / 2),
        dur(60 * 60), {"severity": "warning", "figure": f.key, "path": "drift"},
        f"{f.title} drifted from its best day",
        f"{what(f)}: its last day of runs is {{{{ $value | humanizePercentage }}}} {worse_word} its best day on "
        f"this driver (a slow {'rise' if lower else 'decline'}). {median}. Path drift."))
    return out


def settled(s: RuleSettings, f: judged.Figure, name: str, stat: str, matchers: str, floor: float) -> str:
    """The hold of an own-history warning: its gap now, held while its worst over the median's runs is past `floor`
    (``settle``) or its series is held (``busy_of``; `matchers`: the figure's and pool's)."""
    worst = settle(s, f)
    return hold(s, name, worse(f, gap_of(s, stat, "own_history", name)), floor, "the gap",
                gate=worse(f, worst_of(s, stat, "own_history", worst)), settle=worst[1],
                busy=busy_of(s, stat, "own_history", worst[1], matchers))
