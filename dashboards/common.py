"""Shared parts of the fleetcanary dashboards (grafanalib).

Every panel is built through `panel()`, which insists on a unit and on a description that
says what good looks like ("Good: ..."): operators read the panel before the docs.
Panels are placed left to right, top to bottom, on Grafana's 24-column grid.
"""
from __future__ import annotations

from grafanalib.core import BarChart, Dashboard, GridPos, Stat, Table, Target, Template, Templating, Time, TimeSeries

DS = "${datasource}"
RATE = "$__rate_interval"
THRESHOLD_RED = [{"color": "green", "value": None}]


def datasource_var() -> Template:
    return Template(name="datasource", query="prometheus", type="datasource", label="Data source", default="Prometheus")


def query_var(name: str, label: str, query: str, multi: bool = True) -> Template:
    """A variable from label_values(); multi-valued ones include All as the regex .*"""
    return Template(name=name, label=label, query=query, dataSource=DS, includeAll=multi, multi=multi,
                    allValue=".*" if multi else None, refresh=2, sort=1, default="$__all" if multi else None)


def pool_var() -> Template:
    return query_var("pool", "Pool", "label_values(fleetcanary_node_info, pool)")


def model_var() -> Template:
    return query_var("model", "GPU model", "label_values(fleetcanary_gpu_info, model)")


def node_var(multi: bool = False) -> Template:
    return query_var("node", "Node", 'label_values(fleetcanary_node_info{pool=~"$pool"}, node)', multi=multi)


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


def dashboard(title: str, uid: str, description: str, panels: list, variables: list[Template]) -> Dashboard:
    d = Dashboard(title=title, uid=uid, description=description, tags=["fleetcanary"],
                  panels=layout(panels), templating=Templating([datasource_var(), *variables]),
                  time=Time("now-24h", "now"), refresh="1m", timezone="utc", schemaVersion=37,
                  graphTooltip=1)
    return d.auto_panel_ids()


def in_pool(expr: str) -> str:
    """Keep series of nodes in the selected pool(s); node_info carries the pool."""
    return f'({expr}) * on(node) group_left() node:fleetcanary_pool:info{{pool=~"$pool"}}'
