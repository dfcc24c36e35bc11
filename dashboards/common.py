"""Shared parts of the fleetcanary dashboards (grafanalib).

Every panel is built through `panel()`, which insists on a unit and on a description that
says what good looks like ("Good: ..."): operators read the panel before the docs.
Panels are placed left to right, top to bottom, on Grafana's 24-column grid.
"""
from __future__ import annotations

from grafanalib.core import (
    BarChart,
    Dashboard,
    DashboardLink,
    GridPos,
    Stat,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

from fleetcanary.rules import build as rules
from fleetcanary.rules.common import spread as rule_spread

DS = "${datasource}"
RATE = "$__rate_interval"
THRESHOLD_RED = [{"color": "green", "value": None}]


def datasource_var() -> Template:
    return Template(name="datasource", query="prometheus", type="datasource", label="Data source", default="Prometheus")


def query_var(name: str, label: str, query: str, multi: bool = True) -> Template:
    """A variable from label_values(); multi-valued ones include All as the regex .*"""
    return Template(name=name, label=label, query=query, dataSource=DS, includeAll=multi, multi=multi,
                    allValue=".*" if multi else None, refresh=2, sort=1, default="$__all" if multi else None)


# Several clusters in one Prometheus (Thanos, Mimir, federation with a `cluster` external label): every raw
# fleetcanary selector is narrowed to $cluster, whose All (.*) also matches series without the label, so a
# single-cluster Prometheus (no such label, an empty variable) shows everything.
CLUSTER = 'cluster=~"$cluster"'


def cluster_var() -> Template:
    return query_var("cluster", "Cluster", "label_values(fleetcanary_build_info, cluster)")


def pool_var() -> Template:
    return query_var("pool", "Pool", f"label_values(fleetcanary_node_info{{{CLUSTER}}}, pool)")


def model_var() -> Template:
    return query_var("model", "GPU model", "label_values(fleetcanary_gpu_info, model)")


def node_var(multi: bool = False) -> Template:
    return query_var("node", "Node", f'label_values(fleetcanary_node_info{{{CLUSTER}, pool=~"$pool"}}, node)',
                     multi=multi)


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False) -> Target:
    return Target(expr=" ".join(expr.split()), legendFormat=legend, refId=ref, instant=instant,
                  format="table" if table else "time_series", datasource=DS)


def _targets(exprs) -> list[Target]:
    out = []
    for i, e in enumerate(exprs):
        if isinstance(e, Target):
            e.refId = e.refId if e.refId != "A" or i == 0 else chr(ord("A") + i)
            out.append(e)
        else:
            expr, legend = e if isinstance(e, tuple) else (e, "")
            out.append(target(expr, legend, chr(ord("A") + i)))
    return out


def panel(kind: str, title: str, description: str, unit: str, exprs, w: int = 12, h: int = 8, **kw):
    """One panel: kind is timeseries, table, stat or barchart; unit is a Grafana unit id."""
    if "Good:" not in description:
        raise ValueError(f"panel {title!r}: the description must say what good looks like ('Good: ...')")
    if not unit:
        raise ValueError(f"panel {title!r}: set a unit")
    common = {"title": title, "description": description, "dataSource": DS, "targets": _targets(exprs),
              "gridPos": GridPos(h=h, w=w, x=0, y=0)}
    if kind == "timeseries":
        return TimeSeries(unit=unit, legendDisplayMode="table", legendPlacement="bottom",
                          legendCalcs=kw.pop("legendCalcs", ["lastNotNull", "min", "max"]), **common, **kw)
    if kind == "table":
        return Table(unit=unit, **common, **kw)
    if kind == "stat":
        return Stat(format=unit, reduceCalc="lastNotNull", **common, **kw)
    if kind == "barchart":
        return BarChart(extraJson={"fieldConfig": {"defaults": {"unit": unit}}}, **common, **kw)
    raise ValueError(f"unknown panel kind {kind}")


def instant(expr: str, legend: str = "", ref: str = "A") -> Target:
    """An instant query shown as a table (worst-N lists, matrices)."""
    return target(expr, legend, ref, instant=True, table=True)


def layout(panels: list) -> list:
    """Place panels left to right and wrap at 24 columns."""
    x = y = row_h = 0
    for p in panels:
        w, h = p.gridPos.w, p.gridPos.h
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p.gridPos = GridPos(h=h, w=w, x=x, y=y)
        x += w
        row_h = max(row_h, h)
    return panels


NODE_UID = "fleetcanary-node"
# A table cell naming a node opens that node's dashboard, same time range and data source
# (tests/dashboards/test_dashboards.py checks that each link's dashboard and variables exist).
NODE_LINK = {"title": "Node detail: ${__value.raw}",
             "url": f"/d/{NODE_UID}?var-node=${{__value.raw}}&var-datasource=${{datasource}}&${{__url_time_range}}"}


def node_links(field: str = "node") -> list[dict]:
    """Table overrides: the `field` column links to the node dashboard."""
    return [{"matcher": {"id": "byName", "options": field}, "properties": [{"id": "links", "value": [NODE_LINK]}]}]


def dashboard(title: str, uid: str, description: str, panels: list, variables: list[Template]) -> Dashboard:
    # every fleetcanary dashboard links to the others, keeping the time range and the variables
    links = [DashboardLink(title="fleetcanary", type="dashboards", tags=["fleetcanary"], asDropdown=True,
                           keepTime=True, includeVars=True)]
    for p in panels:
        for t in p.targets:
            t.expr = rules.with_selector(t.expr, CLUSTER)
    if uid != NODE_UID:  # tables elsewhere: a node column opens the node's dashboard
        for p in panels:
            if isinstance(p, Table):
                p.overrides = [*p.overrides, *node_links()]
    d = Dashboard(title=title, uid=uid, description=description, tags=["fleetcanary"], links=links,
                  panels=layout(panels), templating=Templating([datasource_var(), cluster_var(), *variables]),
                  time=Time("now-24h", "now"), refresh="1m", timezone="utc", schemaVersion=37,
                  graphTooltip=1)
    return d.auto_panel_ids()


def in_pool(expr: str) -> str:
    """Keep series of nodes in the selected pool(s); node_info carries the pool."""
    return f'({expr}) * on(node) group_left() node:fleetcanary_pool:info{{pool=~"$pool"}}'


# --- the judged statistics (fleetcanary.judge) and the fleet's peer rules (alerts/build.py) --------------------
# Each exporter publishes, per judged series, fleetcanary_judge_{median,newest,change,drift} labelled with figure,
# series, gpu, pool, model and driver_version; the peers group records the median of the peers' levels
# (pool:fleetcanary_judge_median:peer_*) and changes (pool:fleetcanary_judge_change:peer_*), the peer-spread
# group their MAD and node count every spread_interval (read through `spread`).
G = ", ".join(rules.GROUP)                            # what peers share
CG = ", ".join((*rules.GROUP, *rules.CHANGE_GROUP))   # ... and, for changes, the baseline they divide by
FIGURES = {f.key: f for f in rules.FIGURES}
LOWER = "|".join(k for k, f in FIGURES.items() if not f.higher_is_better)  # lower-is-better figures
S = rules.SETTINGS


def sel(*matchers: str) -> str:
    return "{" + ", ".join(m for m in matchers if m) + "}"


def spread(selector: str) -> str:
    """A record of the peer-spread group (a MAD, a node count) as the alerts read it: its newest value within two
    of that group's intervals, which are longer than a plain read's 5-minute lookback."""
    return rule_spread(S, selector)


def level_ratio(stat: str, *m: str) -> str:
    """A level statistic (median or newest) over the median of its peers' medians."""
    return (f"fleetcanary_judge_{stat}{sel(*m)} / on({G}) group_left "
            f"pool:fleetcanary_judge_median:peer_median{sel(*m)}")


def change_ratio(*m: str) -> str:
    """A series' change against its own best day over the median of its peers' changes (same baseline)."""
    return f"fleetcanary_judge_change{sel(*m)} / on({CG}) group_left pool:fleetcanary_judge_change:peer_median{sel(*m)}"


def own(stat: str):
    """A statistic that is already a ratio to the series' own best day (change, drift)."""
    return lambda *m: f"fleetcanary_judge_{stat}{sel(*m)}"


def shortfall(ratio, *m: str) -> str:
    """How much worse than its reference a ratio is, for every figure at once: 1 - r, or r - 1 for a
    lower-is-better figure (the quantity the alerts compare with their floors; 0.05 is 5% worse)."""
    hi, lo = f'figure!~"{LOWER}"', f'figure=~"{LOWER}"'
    return f"(1 - {ratio(*m, hi)}) or ({ratio(*m, lo)} - 1)"


def pct(x: float) -> str:
    return f"{x * 100:g}%"


def per_figure(attr: str) -> str:
    """A threshold that differs by figure, in words: "2.5% for GPU memory bandwidth, ..., 5% for the others"."""
    values: dict[float, list[str]] = {}
    for f in FIGURES.values():
        values.setdefault(getattr(f, attr), []).append(f.title)
    common = max(values, key=lambda v: len(values[v]))
    rest = [f"{pct(v)} for {', '.join(titles)}" for v, titles in values.items() if v != common]
    return ", ".join([*rest, f"{pct(common)} for the others"]) if rest else pct(common)


def columns(rename: dict[str, str], hide: tuple[str, ...] = ("Time", "job", "instance")) -> dict:
    """A table transformation: hide the scrape labels, name the value columns."""
    return {"id": "organize", "options": {"excludeByName": dict.fromkeys(hide, True), "renameByName": rename}}
