"""The peer paths: each judged series against the same series on its peers (same pool, model, driver, series).

Per peer group, the median and the median absolute deviation (MAD) of the changes and of the levels, and the
nodes reporting (six recording rules for every figure at once); per figure, the change path and the level path
(...BelowPeers / ...SlowerThanPeers) and the fast path (...FarBelowPeers / ...FarSlowerThanPeers). Each alert
reads its gap once: how far worse the node is than its peers (1 - ratio; ratio - 1 for a lower-is-better
figure), past the larger of the figure's floor and k MADs of the peers' ratios. That gap is its `$value`, also
while its hold keeps it firing. docs/alerting.md explains the paths; docs/runbooks.md each alert.
"""
from __future__ import annotations

from fleetcanary.core.rulesettings import RuleSettings
from fleetcanary.judge import figures as judged
from fleetcanary.rules.common import (
    CHANGE_GROUP,
    CURRENT,
    HELD_STAT,
    MAD_SE,
    RATIO,
    Group,
    Shard,
    alert,
    busy_of,
    by,
    figures,
    gap_of,
    held_records,
    hold,
    interval_minutes,
    on,
    peer_query,
    peers_value,
    query,
    record,
    sel,
    settle,
    spread,
    what,
    worse,
    worst_of,
)
from fleetcanary.rules.common import dur as _dur


def groups(s: RuleSettings, shards: list[Shard]) -> list[Group]:
    out = []
    for suffix, pool in shards:
        out.append(Group("alerts", f"fleetcanary-peer-spread{suffix}", "spread_interval", spread_records(s, pool),
                         suffix[1:]))
        rules = recording(s, pool)
        rules += held_records(s, "peers", pool, ("change", "change", True), ("median", "level|fast", False),
                              (HELD_STAT, "change|level", False))
        for f in figures(s):
            if f.history:
                rules.append(peer_alert(s, f, "change", pool))
            rules.append(peer_alert(s, f, "level", pool))
            if f.fast:
                rules.append(fast_alert(s, f, pool))
        out.append(Group("alerts", f"fleetcanary-peers{suffix}", "interval", rules, suffix[1:]))
    return out


def recording(s: RuleSettings, pool: str) -> list[dict]:
    """The peers' median change and median level, every evaluation: the gaps are read against them. `pool`: a
    matcher for a sharded group."""
    return [record(f"pool:fleetcanary_judge_{stat}:peer_median",
                   f"quantile by ({by(s, *extra)}) (0.5, fleetcanary_judge_{stat}{sel(pool)})")
            for stat, extra in (("change", CHANGE_GROUP), ("median", ()))]


def spread_records(s: RuleSettings, pool: str) -> list[dict]:
    """The peers' spread, in a group of its own every `spread_interval`: the nodes reporting and the MAD of the
    changes and of the levels. A pool's spread moves with its fleet, not with one node, and these four rules were
    two fifths of the peer group's evaluation (20 of 48 s every 5 minutes at 2,000 nodes, docs/alerting-scale.md); the
    alerts read them through ``spread``."""
    out = []
    for stat, extra in (("change", CHANGE_GROUP), ("median", ())):
        g = by(s, *extra)
        src = f"fleetcanary_judge_{stat}{sel(pool)}"
        med = f"pool:fleetcanary_judge_{stat}:peer_median"
        nodes = f"pool:fleetcanary_judge_{stat}:peer_nodes"
        out += [
            record(nodes, f"count by ({g}) (count by ({g}, node) ({src}))"),
            record(f"pool:fleetcanary_judge_{stat}:peer_mad",
                   f"# the median absolute deviation of the peers' ratios (each member over the peers' median),\n"
                   f"# raised by its own standard error ({MAD_SE:g} / sqrt(members)): a MAD of 5 members' ratios\n"
                   f"# is a spread known to +-52%, and a gate of K such MADs sat under a noisy series' own spread\n"
                   f"# often enough to fire on it; 1.05x with 500 members\n"
                   f"# (|x / median - 1| written |x - median| / median: one pass over every series fewer;\n"
                   f"# the median is the peer group's newest)\n"
                   f"quantile by ({g}) (0.5,\n  abs({src} - on({g}) group_left {med})\n)\n"
                   f"/ on({g}) {med}\n"
                   f"# (the members, not the nodes: a per-GPU figure's peers are every GPU of the group)\n"
                   f"* on({g}) (1 + {MAD_SE:g} / sqrt(count by ({g}) ({src})))\n"
                   f"# only where at least {s.min_peers} nodes report: an alert that compares with it needs them\n"
                   f"and on({g}) ({nodes} >= {s.min_peers})"),
        ]
    return out


def _ratio(s: RuleSettings, f: judged.Figure, stat: str, pool: str, g: str, held: str = "",
           peer: str = "", worst: tuple[str, str] | None = None) -> str:
    """The node's statistic over its peers' median (of `peer`, default the same statistic); as the hold of alert
    `held` reads it, where given (``gap_of``), or as a hold's gate reads its worst (``worst_of``)."""
    fm = f'figure="{f.key}"'
    mine = f"fleetcanary_judge_{stat}{sel(fm, pool)}"
    read = worst_of(s, mine, "peers", worst) if worst else gap_of(s, mine, "peers", held) if held else mine
    return (f"{read}\n"
            f"    / on({g}) group_left pool:fleetcanary_judge_{peer or stat}:peer_median{sel(fm)}")


def _gate(s: RuleSettings, f: judged.Figure, stat: str, g: str, floor: float, k: float) -> str:
    """The gap past the larger of the floor and k MADs: `gap > floor and gap > k * mad`, the gap written once."""
    mad = spread(s, f"pool:fleetcanary_judge_{stat}:peer_mad" + sel(f'figure="{f.key}"'))
    return (f"# past the floor ({floor:g}) and past {k:g} MADs of the peers' ratios, whichever is larger\n"
            f"#   (the MAD is recorded every {s.spread_interval}, where at least {s.min_peers} peer nodes report)\n"
            f"  > on({g}) group_left() clamp_min({k:g} * {mad}, {floor:g})")


def peer_alert(s: RuleSettings, f: judged.Figure, path: str, pool: str) -> dict:
    """The change path (path=change) or the level path (path=level) of ...BelowPeers / ...SlowerThanPeers."""
    stat, extra, floor, k = (("change", CHANGE_GROUP, f.floor, f.k_mad) if path == "change"
                             else ("median", (), s.level_floor, s.level_k_mad))
    g = on(s, *extra)
    fm = f'figure="{f.key}"'
    lower = not f.higher_is_better
    name = f"FleetCanary{f.alert}{'SlowerThanPeers' if lower else 'BelowPeers'}"
    what_ = "its change against its best day" if path == "change" else "its median"
    expr = (f"# {f.title}, path {path}: the gap, how far {what_} is worse than its peers' median\n"
            f"{worse(f, _ratio(s, f, stat, pool, g))}\n" + _gate(s, f, stat, g, floor, k))
    if path == "change" and f.fast:
        # Confirmed by its newest runs: its change with its median replaced by the best of its newest 3 runs is
        # worse than the peers' by the floor too. The comparison above is like with like (every node's change is
        # over its median); this asks the node alone, as the fast path does, that all of its newest 3 runs agree,
        # so four heavy-tailed low runs among seven are not a verdict (9 false episodes in a week on the
        # detection fleet's Student-t GPUs without it).
        # Unconfirmed where the newest runs are not published: held (not new), or better than the median with the
        # change within half the floor (fleetcanary.judge.publish), which with the peers' median change under
        # 1 + floor / 2 cannot confirm.
        node = ", ".join((*s.peer_labels, "node", "gpu", "series"))
        confirm = (f"fleetcanary_judge_change{sel(fm, pool)}\n"
                   f"      * on({node}) group_left() (fleetcanary_judge_newest{sel(fm, pool)} / "
                   f"fleetcanary_judge_median{sel(fm, pool)})\n"
                   f"      / on({g}) group_left pool:fleetcanary_judge_{stat}:peer_median{sel(fm)}")
        expr += (f"\n# confirmed: its change over the best of its newest 3 runs is worse by the floor too\n"
                 f"and on({node}, baseline) {worse(f, confirm)} > {floor:g}")
    # The hold compares what fired, without the MAD gate: against the peers, not its own baseline, whose
    # previous driver's (baseline=previous_driver) carries the new driver's own effect for two weeks.
    worst = settle(s, f)
    expr += hold(s, name, worse(f, _ratio(s, f, stat, pool, g, held=name)), floor / 2, "the gap",
                 gate=worse(f, _ratio(s, f, stat, pool, g, worst=worst)), settle=worst[1],
                 busy=busy_of(s, f"fleetcanary_judge_{stat}{sel(fm, pool)}", "peers", worst[1], sel(fm, pool)))
    word = "slower than" if lower else "below"
    if path == "change":
        desc = (f"{what(f)}: its change against its best day ({{{{ $labels.baseline }}}} "
                f"{{{{ $labels.baseline_driver }}}}) is {{{{ $value | humanizePercentage }}}} worse than its peers': "
                f"{query('fleetcanary_judge_change', f.key, CURRENT, RATIO)} against "
                f"{peer_query(s, 'pool:fleetcanary_judge_change:peer_median', f.key, fmt=RATIO, baseline=True)}. ")
    else:
        desc = f"{what(f)} is {{{{ $value | humanizePercentage }}}} {word} its peers' median. "
    desc += (f"Median {query('fleetcanary_judge_median', f.key)}; peers' "
             f"{peer_query(s, 'pool:fleetcanary_judge_median:peer_median', f.key)} ({peers(f)}). Path {path}.")
    return _with(alert(name, expr, _dur(max(interval_minutes(s, f), 15) * 60),
                       {"severity": "warning", "figure": f.key, "path": path}, f"{f.title} {word} peers", desc),
                 peers_value(s, f))


def peers(f: judged.Figure) -> str:
    """Who the peers are, in words: the pool, and the model and driver where the figure has them."""
    return ("pool {{ $labels.pool }}" + (", {{ $labels.model }}" if f.model_field else "")
            + (", driver {{ $labels.driver_version }}" if f.per_driver else ""))


def _with(a: dict, more: dict) -> dict:
    a["annotations"].update(more)
    return a


def fast_alert(s: RuleSettings, f: judged.Figure, pool: str) -> dict:
    """The fast path: the best of the newest 3 runs far worse than the peers' median figure (a page)."""
    g = on(s)
    lower = not f.higher_is_better
    name = f"FleetCanary{f.alert}{'FarSlowerThanPeers' if lower else 'FarBelowPeers'}"
    expr = (f"# {f.title}, path fast: the gap, how far the best of its newest 3 runs is worse than its peers'\n"
            f"# median figure\n"
            f"{worse(f, _ratio(s, f, 'newest', pool, g, peer='median'))}\n"
            + _gate(s, f, "median", g, s.fast_floor, s.level_k_mad))
    # held on its median, so one lucky run of a GPU that is still slow does not resolve the page; the value is
    # the newest runs' gap, or the median's where they are not published (a recovering GPU's are better than its
    # median: fleetcanary.judge.publish), so the hold lasts as long as the median is. A held series (no fresh run:
    # the GPU went busy) publishes its newest runs as newest_held: the runs that paged, which nothing has measured
    # against since, hold it, not a median that still has older, better runs in it (it resolved, and paged again
    # at the GPU's next runs: issue 38). A series with no median yet (a new driver) holds on its newest runs.
    fm = f'figure="{f.key}"'
    peer = f"\n    / on({g}) group_left pool:fleetcanary_judge_median:peer_median{sel(fm)}"
    newest, held_newest = ("fleetcanary_judge_newest" + sel(fm, pool), "fleetcanary_judge_newest_held" + sel(fm, pool))
    median = "fleetcanary_judge_median" + sel(fm, pool)
    value = gap_of(s, median, "peers", name, prefer=f"{newest} or {held_newest}")
    gate = gap_of(s, median, "peers", name, prefer=held_newest, after=newest)
    expr += hold(s, name, worse(f, value + peer), s.fast_floor / 2,
                 "the gap of its median (of its newest runs while it has no fresh run, or no median)",
                 gate=worse(f, gate + peer))
    word = "far slower than" if lower else "far below"
    desc = (f"{what(f)}: the best of its newest 3 runs, {query('fleetcanary_judge_newest', f.key)}, is "
            f"{{{{ $value | humanizePercentage }}}} {'slower than' if lower else 'below'} its peers' median "
            f"{peer_query(s, 'pool:fleetcanary_judge_median:peer_median', f.key)} ({peers(f)}). Median "
            f"{query('fleetcanary_judge_median', f.key)}. Path fast.")
    return _with(alert(name, expr, "0m", {"severity": "critical", "figure": f.key, "path": "fast"},
                       f"{f.title} {word} peers", desc), peers_value(s, f))
