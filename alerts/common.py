"""What every area of the rules shares (alerts/build.py assembles them): the one interface an area module has, the
PromQL and template pieces the judged paths are written with, and durations.

An area module (rules_peers, rules_history, rules_hard, rules_inference, rules_nic, rules_fabric, rules_coverage)
has one function, ``groups(s, shards) -> list[Group]``: its recording rules and alerts, in the groups they belong
to, from the settings `s` (fleetcanary.core.rulesettings.RuleSettings) alone. An alert's annotations hold its
summary and description; its `for` and its group's interval are unscaled; its selectors hold only the matchers the
rule itself needs. alerts/build.py's final pass (``finish``) adds the deployer's selector to every raw fleetcanary
series, scales the durations, sets every alert's runbook link and formats every expression over lines: no area
does any of that itself, so none can do it differently.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fleetcanary.core.rulesettings import RuleSettings, seconds
from fleetcanary.judge import figures as judged
from fleetcanary.judge import stats as judge_stats

RATIO = 'printf "%.3f"'  # template format of a ratio (change): 0.943, not humanize's 943m
CURRENT = ", baseline='current_driver'"
# The MAD's relative standard error for normal data: the normalised MAD's asymptotic variance is 1.36 sigma^2 / n,
# so its standard error is sqrt(1.36) = 1.166 / sqrt(n) of it
MAD_SE = 1.17
GROUP = ("pool", "model", "driver_version", "figure", "series")   # what peers share (plus RuleSettings.peer_labels)
CHANGE_GROUP = ("baseline", "baseline_driver")                     # ... and, for changes, the baseline they divide by
Shard = tuple[str, str]     # (group name suffix, pool matcher): ("", "") when the groups are not sharded
NO_SHARD: Shard = ("", "")


@dataclass
class Group:
    """A rule group as an area makes it: the file it goes in ("rules" or "alerts"), its name, which setting is its
    interval ("interval": the judged groups', "hard_interval"), its rules, and its shard (a label on its rules)."""
    file: str
    name: str
    interval: str
    rules: list[dict] = field(default_factory=list)
    shard: str = ""


def alert(name: str, expr: str, for_: str, labels: dict, summary: str, description: str, **more: str) -> dict:
    """An alert as an area writes it; the final pass adds its runbook_url (after the description)."""
    return {"alert": name, "expr": expr, "for": for_, "labels": labels,
            "annotations": {"summary": summary, "description": description, **more}}


def record(name: str, expr: str) -> dict:
    return {"record": name, "expr": expr}


# --- durations -------------------------------------------------------------------------------------------------
def dur(secs: float) -> str:
    secs = round(secs)
    if secs == 0:
        return "0m"
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= n and secs % n == 0:
            return f"{secs // n}{unit}"
    return f"{secs}s"


def interval_minutes(s: RuleSettings, f: judged.Figure) -> float:
    """The `for` of a figure's peer alerts: the deployer's, else the figure's own (the daily burn's hour), else its
    probe's default interval (the probe map)."""
    over = s.figures.get(f.key)
    if over is not None and over.interval_minutes is not None:
        return over.interval_minutes
    if f.for_minutes:
        return f.for_minutes
    from fleetcanary.probes import PROBES

    return PROBES[f.probe].default_interval_seconds / 60


def figures(s: RuleSettings) -> list[judged.Figure]:
    """The judged figures, with the deployer's floors (the same the exporter reads)."""
    return list(judged.configured(s).values())


# --- PromQL pieces ---------------------------------------------------------------------------------------------
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


def by(s: RuleSettings, *extra: str) -> str:
    return ", ".join((*s.peer_labels, *GROUP, *extra))


def on(s: RuleSettings, *extra: str) -> str:
    """The labels an alert matches one figure's series and records on: the peer group's but `figure`, which
    both sides' selectors fix."""
    return ", ".join(x for x in (*s.peer_labels, *GROUP, *extra) if x != "figure")


def sel(*matchers: str) -> str:
    """A selector of the matchers a rule needs (the final pass adds the deployer's to raw series)."""
    return "{" + ", ".join(m for m in matchers if m) + "}"


def worse(f: judged.Figure, ratio: str) -> str:
    """How far worse a ratio is (the gap): 1 - r for a higher-is-better figure, r - 1 otherwise."""
    return f"(1 - {ratio})" if f.higher_is_better else f"({ratio} - 1)"


# the judge's fleetcanary_judge_<HELD_STAT>, on each held series only: its groups record it as they record statistics
HELD_STAT = "held_last_run_timestamp_seconds"
HOLD_MARK = "# hold:"  # the comment that opens a hold branch (the detection replay splits an alert there)


def firing(s: RuleSettings, name: str) -> str:
    """The series whose alert `name` fires now, as a hold narrows its statistic to them: `and` this."""
    on_ = ", ".join((*s.peer_labels, "node", "gpu", "series", "baseline"))
    return f'on({on_}) ALERTS{{alertname="{name}", alertstate="firing"}}'


def hold(s: RuleSettings, name: str, value: str, floor: float, what: str, unless: str = "", gate: str = "",
         settle: str = "", busy: str = "") -> str:
    """The hold branch of a judged alert: while the alert fires, it stays firing as long as `value`, the same gap
    the alert fires on (read through ``gap_of``: through a gap of up to `hold_gap` in the figure, the value recorded
    while the alert fired), is past `floor`, half the alert's own; `gate`, where given, is what must be past it
    instead (the fast path: its median; a warning: its worst gap over `settle`, ``settle``), and `value` is then
    only its value. So `$value` means one thing, fired or held: the gap now. `busy` (a warning's, ``busy_of``): the
    series that hold whatever their gate reads, as nothing has measured them since (held: the GPU is busy).
    Without it a steady fault near a threshold resolves and fires again whenever noise, the peers' MAD gate or
    a gap in the figure moves it across (docs/detection.md, issue 38).

    `value` (and `gate`) read the node's statistic through ``gap_of``, which keeps only the series whose alert
    fires before any arithmetic: the branch is then a few series, not a second pass of divisions and joins over
    every series of the figure whose result an `and ALERTS` at its end would throw away (two fifths of the judged
    groups' query time at 2,000 nodes, docs/alerting-scale.md, eighth pass). That narrowing is what limits the
    branch to a firing alert, so it must be there."""
    if not s.hold:
        return ""
    for part in (value, gate if not settle else ""):  # a settle gate is `and`-ed onto the narrowed value
        if part and firing(s, name) not in part:
            raise ValueError(f"{name}: a hold must read its statistic through gap_of(..., {name!r}): {part}")
    node = ", ".join((*s.peer_labels, "node", "gpu", "series", *(("baseline",) if settle else ())))
    if busy and (not settle or unless):
        raise ValueError(f"{name}: only a warning's settled hold holds while its series is busy")
    cond = (f"or {value} > {floor:g}" if not gate else
            f"or {value}\n  and on({node}) {gate} > {floor:g}" if not busy else
            f"or {value}\n  and on({node}) (\n    {gate} > {floor:g}\n    or {busy}\n  )")
    if settle:  # the warnings: the worst gap over the median's runs must be past half the floor (``settle``)
        through = (f", or its newest\n# through a gap in the figure (up to {s.hold_gap} before)"
                   if settle != s.hold_gap else ",\n# through a gap in the figure too")
        recorded = (f"the worst value\n# the group recorded of its firing series over the last {settle} (the "
                    f"median's runs){through}")
        value_note = "\n# (the value is the gap at this evaluation)"
        if busy:
            value_note += (f"; and, whatever its worst reads, while its series is held (no\n# fresh run: its GPU is "
                           f"busy) and for {settle} after: frozen statistics are not recovered ones")
    else:
        recorded = (f"the value\n# the group recorded of its firing series at this evaluation (through a gap in the "
                    f"figure, up to\n# {s.hold_gap} before)")
        value_note = ("\n# (the value is the newest runs' gap, the median's where those are not published)"
                      if gate else "")
    return (f"\n{HOLD_MARK} once firing, it stays firing while {what} is past {floor:g}, half the floor: {recorded}"
            f"{value_note}\n"
            + cond
            + (f"\n  unless {unless}" if unless else ""))


def spread_window(s: RuleSettings) -> str:
    """How far back a reader of the peers' spread group looks: two of its intervals and a minute, so one late or
    missed evaluation of that group does not blank the gates."""
    return dur(2 * seconds(s.spread_interval) + 60)


def spread(s: RuleSettings, selector: str) -> str:
    """A record of the peers' spread group (a MAD, a node count) as another group reads it: its newest value within
    ``spread_window`` (the group runs every `spread_interval`, past the 5-minute lookback of a plain read)."""
    return f"last_over_time({selector}[{spread_window(s)}])"


def held_name(stat: str, area: str) -> str:
    """The recorded series a hold reads: a judge statistic of the series whose alert fires or is pending."""
    return f"node:fleetcanary_judge_{stat}:held_{area}"


def settle(s: RuleSettings, f: judged.Figure) -> tuple[str, str]:
    """How a warning's hold reads its firing series: the worst value recorded over the span of the median's runs
    (``min_over_time`` for a higher-is-better figure; the figure's median runs times its interval, at most
    `hold_gap`), so the alert resolves only once its gap has stayed under half the floor for a whole median's worth of
    runs. A fault at the gate reads a little either side of it, and its median, moved by a few lucky runs, dipped
    under half the floor for an hour now and then: the page resolved and fired again (a 3% GPU step on a 3% gate,
    issue 38). Returns (function, window)."""
    window = min(judge_stats.median_runs(f) * interval_minutes(s, f) * 60, seconds(s.hold_gap))
    return ("min_over_time" if f.higher_is_better else "max_over_time"), dur(window)


def gap_of(s: RuleSettings, selector: str, area: str, name: str, prefer: str = "", after: str = "") -> str:
    """A node's statistic as the hold of alert `name` reads it: of the series whose alert fires (``firing``), its
    newest value recorded while the alert fired or was pending (``held``, recorded before the group's alerts: the
    statistic at this evaluation, else through a gap in it of up to `hold_gap`). `selector` is
    ``fleetcanary_judge_<stat>{...}``; `area` the group that records it; `prefer`, where given, a statistic read
    before it where present (the fast path's newest runs), `after` one read where neither is.

    The statistic itself is not read: its record already holds this evaluation's value of every series the hold
    can keep, so the branch reads a few recorded series, where reading the statistic (and `and`-ing the result
    with ALERTS) read every series of the figure once more (issue 42, docs/alerting-scale.md)."""
    held = held_selector(selector, area)
    read = f"last_over_time({held}[{s.hold_gap}])"
    parts = [p for p in (prefer, read, after) if p]
    if len(parts) > 1:
        # a sharded group's records carry its shard label (alerts/build.py finish), the statistics do not
        read = "(" + f" or{' ignoring(shard)' if s.pools else ''} ".join(parts) + ")"
    return f"({read} and {firing(s, name)})"


def worst_of(s: RuleSettings, selector: str, area: str, worst: tuple[str, str]) -> str:
    """A warning's hold gate (``settle``): the worst value of the statistic `selector` recorded for its firing
    series over the window, or its newest through a longer gap (up to `hold_gap`). Every series of the record, not
    narrowed to one alert's: the gate is `and`-ed onto the hold's value, which is (``gap_of``)."""
    held = held_selector(selector, area)
    read = f"{worst[0]}({held}[{worst[1]}])"
    return read if worst[1] == s.hold_gap else f"({read} or last_over_time({held}[{s.hold_gap}]))"


def busy_of(s: RuleSettings, selector: str, area: str, window: str, matchers: str) -> str:
    """A warning's series that nothing has measured for a while (``hold``'s `busy`): the record of its statistic
    `selector` (``fleetcanary_judge_<stat>{...}``, its labels, baseline included, for the hold's join) where its
    group recorded the series held (``fleetcanary_judge_held_last_run_timestamp_seconds``, recorded as the
    statistics are: ``held_records``; `matchers`, the figure's and pool's, as ``sel`` writes them: it has no
    baseline) within `window`, the settle's (``settle``). A median a few lucky runs lifted under half the floor
    just before the GPU went busy stayed frozen there for the busy spell (9.6 hours), longer than the settle
    window, and the warning resolved and paged again at the GPU's next runs (issue 38, sixth pass): a window
    counted in time cannot tell a frozen figure from a recovered one, the judge can. Held within the window, not
    held now: the GPU's first run back need not move its median, and the settle must then read a whole window of
    fresh runs, not the frozen value the busy spell left in it."""
    keys = ", ".join((*s.peer_labels, "node", "gpu", "series"))
    return (f"{held_selector(selector, area)} and on({keys})\n      "
            f"last_over_time({held_name(HELD_STAT, area)}{matchers}[{window}])")


def held_selector(selector: str, area: str) -> str:
    """`selector` (``fleetcanary_judge_<stat>{...}``) with its record's name: what a hold reads (``held``)."""
    name_, braces = selector.split("{", 1)
    return held_name(name_.removeprefix("fleetcanary_judge_"), area) + "{" + braces


def held_records(s: RuleSettings, area: str, pool: str, *held_by: tuple[str, str, bool]) -> list[dict]:
    """The records a group writes before its alerts, one per (statistic, paths, with baseline) of `held_by`: the
    statistics of the series whose alert fires or is pending, which its holds read (``gap_of``). None without
    holds."""
    return [held(s, area, stat, paths, pool, baseline) for stat, paths, baseline in held_by] if s.hold else []


def held(s: RuleSettings, area: str, stat: str, paths: str, pool: str, baseline: bool = False) -> dict:
    """The record a hold reads (``gap_of``): statistic `stat` of every series whose alert of a path in `paths` (a
    regex) fires or is pending, written before the group's alerts (a group's rules run in order at one timestamp:
    they read it at this evaluation, and it reads the ALERTS of the group's previous one). Pending too: an alert
    that turns firing at this evaluation has its statistic recorded already, for a gap at the next. Only those
    series: the holds read a few of them over `hold_gap` where ``last_over_time(statistic[hold_gap])`` read every
    series' `hold_gap` of samples, six hours of samples of every judged series each evaluation (twice the peers
    group's cost at 1,000 nodes, issue 42)."""
    keys = ", ".join((*s.peer_labels, "node", "gpu", "series", "figure", *(("baseline",) if baseline else ())))
    names = paths.split("|")
    path = f'path=~"{paths}"' if len(names) > 1 else f'path="{paths}"'
    return record(held_name(stat, area),
                  f"# the {stat} of each series whose {', '.join(names[:-1]) + ' or ' if len(names) > 1 else ''}"
                  f"{names[-1]} path fires or is pending, before the\n"
                  f"# alerts: their holds read it (a few series, not every series of the figure)\n"
                  f"fleetcanary_judge_{stat}{sel(pool)}\n"
                  f'and on({keys}) ALERTS{{alertname=~"FleetCanary.+", alertstate=~"firing|pending", {path}}}')


# --- templates -------------------------------------------------------------------------------------------------
def query(metric: str, figure: str, extra: str = "", fmt: str = "humanize") -> str:
    """A template that reads one statistic of the alerted series (vmalert and Prometheus both have `query`)."""
    q = f"{metric}{{node='%s', figure='{figure}', series='%s', gpu='%s'{extra}}}"
    return (f'{{{{ with query (printf "{q}" $labels.node $labels.series $labels.gpu) }}}}'
            f"{{{{ . | first | value | {fmt} }}}}{{{{ else }}}}none{{{{ end }}}}")


def peer_query(s: RuleSettings, metric: str, figure: str, extra: str = "", fmt: str = "humanize",
               baseline: bool = False) -> str:
    """A template that reads one statistic of the alerted series' peer group (its peer labels included; the
    baseline labels of the alerted series where `baseline`)."""
    labels = [*s.peer_labels, "pool", "model", "driver_version"]
    q = ", ".join(f"{k}='%s'" for k in labels) + f", figure='{figure}', series='%s'{extra}"
    args = " ".join(f"$labels.{k}" for k in [*labels, "series", *(("baseline", "baseline_driver") if baseline else ())])
    if baseline:
        q += ", baseline='%s', baseline_driver='%s'"
    return (f'{{{{ with query (printf "{metric}{{{q}}}" {args}) }}}}'
            f"{{{{ . | first | value | {fmt} }}}}{{{{ else }}}}none{{{{ end }}}}")


def what(f: judged.Figure) -> str:
    gpu = " GPU {{ $labels.gpu }}" if f.gpu else ""
    return f"{f.title[:1].upper()}{f.title[1:]} of {{{{ $labels.node }}}}{gpu}" + " ({{ $labels.series }})"


def median_words(f: judged.Figure) -> str:
    """Runs in the exporter's median of the figure, in words (fleetcanary.judge.stats)."""
    return judge_stats.median_words(judged.BY_KEY[f.key])


def peers_value(s: RuleSettings, f: judged.Figure) -> dict:
    """The peers' median figure of the alerted series as a plain number, in the figure's unit: what `fleetcanary
    remediate` compares a confirming run with before it acts on a performance verdict (docs/remediation.md)."""
    return {"peers_value": peer_query(s, "pool:fleetcanary_judge_median:peer_median", f.key, fmt='printf "%g"')}
