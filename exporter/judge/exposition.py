"""The judge's metric families: each judged series' statistics (stats.py), labelled so the fleet's
rules group peers without joins: figure, series, gpu, and the node's pool, model and driver."""
from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from fleetcanary.judge import figures as figmod
from fleetcanary.judge import freshness, publish
from fleetcanary.judge import stats as statsmod
from fleetcanary.judge.store import FigureStore

LABELS = ["figure", "series", "gpu", "pool", "model", "driver_version"]
BURN_RUNS = statsmod.median_runs(figmod.BY_KEY["gpu_sustained_ratio"])  # the daily burn's median
QUIET = (f"{statsmod.QUIET_MEDIAN_RUNS} for a quiet series: one whose run-to-run noise, measured over its complete "
         "days on this driver, is under a fifth of the change the fleet alerts on")
RUNS = (f"median of the newest {statsmod.MEDIAN_RUNS} runs ({QUIET}) on the driver now running, each run taken "
        "hour for hour: over the node's own daily swing at its time of day, once that is known")
BEST_DAY = (f"the best day: the highest daily level (lowest for a lower-is-better figure) of the last "
            f"{statsmod.BASELINE_DAYS} complete UTC days, each with at least {statsmod.DAY_MIN_RUNS} runs over "
            f"{statsmod.DAY_MIN_SPAN / 3600:.0f} h, days compared hour for hour (a median polish of the days' "
            f"{24 // statsmod.DAY_BINS}-hour bins takes the node's daily swing out)")
HELP = {
    "median": f"Median of the series' newest {statsmod.MEDIAN_RUNS} runs ({QUIET}; the daily burn's: {BURN_RUNS}) "
              "on the driver now running, in the figure's unit (docs/metrics.md lists each figure's metric); absent "
              "with fewer runs. Once published it stands in for the figure's own gauge, which the exporter then "
              "leaves out (but the P2P matrix of gpu_p2p's pairs and the daily burn; each run stays in /results). "
              "After a driver change, until the new driver has a median, the previous driver's median and change as "
              "of its last run stay published under that driver_version, as a held figure's (until a day after the "
              "series' newest run, on either driver), so a page that fired holds across the upgrade.",
    "newest": f"Best of the series' newest {statsmod.NEWEST_RUNS} runs (highest; lowest for a lower-is-better "
              "figure), in the figure's unit: low only when all three newest runs are. The fleet's fast path fires "
              "on it, and the change path asks it to confirm a drop. Published while the series is fresh only "
              "(once held, no run for 1.5 intervals and a timeout, its newest runs are not new: they move to "
              "fleetcanary_judge_newest_held, which keeps a page that fired but starts none), and only where a "
              "rule could act on it: no baseline yet, "
              f"no better than the median, or a change past {publish.NEWEST_SHARE:g} of the figure's change floor "
              "(about one series in eight on a steady node).",
    "newest_held": f"The best of a held series' newest {statsmod.NEWEST_RUNS} runs (no fresh run: the GPU is busy or "
                   "the probe skips), where fleetcanary_judge_newest would publish them were they fresh; for the "
                   "hold's day. No rule starts on it: the fast path's hold reads it, so a page that fired on the "
                   "newest runs stays firing while nothing has measured the GPU since, instead of resolving on a "
                   "median that still holds older, better runs and paging again at the next run.",
    "held": "The time (Unix seconds) of a held series' newest run (no fresh run for 1.5 intervals and a timeout: "
            "the GPU is busy or the probe skips), published while it is held and for no other series. The warnings' "
            "holds read it: a warning that fired stays firing while nothing has measured the GPU since (and for its "
            "median's span after), instead of resolving on statistics frozen by the busy spell (a median that a few "
            "lucky runs lifted under half the floor just before the GPU went busy) and paging again at the next runs.",
    "change": f"The series' level ({RUNS}) over its baseline, {BEST_DAY}, on the driver named by "
              "baseline_driver: baseline=current_driver, or baseline=previous_driver for the "
              f"{statsmod.BASELINE_DAYS} days after a driver change.",
    "drift": f"Median of the series' runs in the 24 h before its newest run, hour for hour, over its baseline "
             f"({BEST_DAY}, current driver); needs the day's runs to span {statsmod.DAY_MIN_SPAN / 3600:.0f} h and "
             f"its standard error (from the series' run noise) to be at most {statsmod.DRIFT_MAX_ERROR:.2%}, or, from "
             f"{statsmod.NOISE_MIN_RUNS} runs, the drift to be past the rules' drift floor by "
             f"{statsmod.DRIFT_FAR_ERRORS:g} standard errors of the drift, the day's and its best day's together "
             "(where that day falls short, the newest day "
             "that did not, for a day after it). "
             f"Published while it is worse than 1 by more than {publish.DRIFT_SHARE:g} of the rules' drift floor, "
             "and for their hold gap after (so the drift alert's hold never reads a stale value); every drift for "
             "that gap after the exporter starts.",
    "series": f"Judged series by state: warming (fewer than {statsmod.MEDIAN_RUNS} runs on this driver; the daily "
              f"burn {BURN_RUNS}), smoothed (a median, no baseline yet), baselined (a change against its own "
              "baseline), held (no fresh run: the GPU is busy or the probe skips; the statistics of its newest runs "
              "stay published for a day), stale (no run for a day: nothing published).",
    "runs": f"Runs of the series on the driver now running, published while it has fewer than "
            f"{statsmod.MEDIAN_RUNS} (its median needs {statsmod.MEDIAN_RUNS}; the daily burn's {BURN_RUNS}).",
}


# (name, type, help, labels) of every family this module publishes: docs/metrics.md lists them
METRICS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("fleetcanary_judge_median", "gauge", HELP["median"], tuple(LABELS)),
    ("fleetcanary_judge_newest", "gauge", HELP["newest"], tuple(LABELS)),
    ("fleetcanary_judge_newest_held", "gauge", HELP["newest_held"], tuple(LABELS)),
    ("fleetcanary_judge_held_last_run_timestamp_seconds", "gauge", HELP["held"], tuple(LABELS)),
    ("fleetcanary_judge_change", "gauge", HELP["change"], (*LABELS, "baseline", "baseline_driver")),
    ("fleetcanary_judge_drift", "gauge", HELP["drift"], tuple(LABELS)),
    ("fleetcanary_judge_runs", "gauge", HELP["runs"], tuple(LABELS)),
    ("fleetcanary_judge_series", "gauge", HELP["series"], ("pool", "figure", "state")),
    ("fleetcanary_judge_store_bytes", "gauge", "Size of the judge's figure store in the state directory "
     "(judge/figures.jsonl).", ()),
    ("fleetcanary_judge_set_aside_total", "counter", "Runs and figure store lines the judge set aside because "
     "they were stamped more than 10 minutes past its clock (anchored on the monotonic clock: a stepped wall "
     "clock), by reason: future_run (a run refused), future_line (a line of judge/figures.jsonl kept in the file, "
     "not used, at start). Once above 0.", ("reason",)),
    ("fleetcanary_judge_store_errors_total", "counter", "Figure store lines that did not parse (skipped) and writes "
     "that failed (kept in memory), by kind.", ("kind",)),
)
_HELP = {m[0]: m[2] for m in METRICS}


def families(store: FigureStore, node_labels: dict[str, str], now: float,
             hold: Callable[[str], float], fresh: Callable[[str], float] | None = None) -> Iterator:
    """hold(probe): how long a series' statistics stay published after its newest run; fresh(probe): how
    long its newest run counts as fresh (after that, until the hold ends, the series is "held"; the rules:
    judge/freshness.py)."""
    pool = node_labels.get("pool", "")
    med = GaugeMetricFamily("fleetcanary_judge_median", HELP["median"], labels=LABELS)
    new = GaugeMetricFamily("fleetcanary_judge_newest", HELP["newest"], labels=LABELS)
    held_new = GaugeMetricFamily("fleetcanary_judge_newest_held", HELP["newest_held"], labels=LABELS)
    held = GaugeMetricFamily("fleetcanary_judge_held_last_run_timestamp_seconds", HELP["held"], labels=LABELS)
    chg = GaugeMetricFamily("fleetcanary_judge_change", HELP["change"], labels=[*LABELS, "baseline", "baseline_driver"])
    dft = GaugeMetricFamily("fleetcanary_judge_drift", HELP["drift"], labels=LABELS)
    runs = GaugeMetricFamily("fleetcanary_judge_runs", HELP["runs"], labels=LABELS)
    states: dict[tuple[str, str], int] = {}
    for (figure, series, gpu), st, model in sorted(store.snapshot(), key=lambda x: x[0]):
        fig = figmod.BY_KEY[figure]
        state = freshness.series_state(st.state, now - st.last, hold(fig.probe),
                                       fresh(fig.probe) if fresh is not None else float("inf"))
        states[(figure, state)] = states.get((figure, state), 0) + 1
        if state == "stale":
            continue
        labels = [figure, series, gpu, pool, model, st.driver]
        if st.median is None:
            runs.add_metric(labels, st.runs)
        if state == "held":
            held.add_metric(labels, st.last)
        if st.median is not None:
            med.add_metric(labels, st.median)
        if publish.show_newest(store.figures.get(figure, fig), st):
            # held, the newest runs are not new: a held figure keeps a page that fired but starts none
            (held_new if state == "held" else new).add_metric(labels, st.newest)
        if st.change is not None:
            chg.add_metric([*labels, "current_driver", st.driver], st.change)
        if st.previous_change is not None:
            chg.add_metric([*labels, "previous_driver", st.previous_driver], st.previous_change)
        if store.publish.show_drift((figure, series, gpu), fig, st.drift, now):
            dft.add_metric(labels, st.drift)
        if (b := st.before) is not None and st.before_wait <= hold(fig.probe):
            # the previous driver's verdict, held, until this driver has a median (stats.py "before"), while the
            # series has not been stale since: its runs on the new driver keep it, as any held figure's newest run
            # does, and it does not come back once the series went stale
            before = [figure, series, gpu, pool, model, b.driver]
            med.add_metric(before, b.median)
            if b.change is not None:
                chg.add_metric([*before, "current_driver", b.driver], b.change)
            if b.previous_change is not None:
                chg.add_metric([*before, "previous_driver", b.previous_driver], b.previous_change)
    yield from (med, new, held_new, held, chg, dft, runs)
    count = GaugeMetricFamily("fleetcanary_judge_series", HELP["series"], labels=["pool", "figure", "state"])
    for (figure, state), n in sorted(states.items()):
        count.add_metric([pool, figure, state], n)
    yield count
    yield GaugeMetricFamily("fleetcanary_judge_store_bytes", _HELP["fleetcanary_judge_store_bytes"],
                            value=store.size_bytes())
    aside = CounterMetricFamily("fleetcanary_judge_set_aside", _HELP["fleetcanary_judge_set_aside_total"],
                                labels=["reason"])
    for reason, n in sorted(store.set_aside.items()):
        if n:
            aside.add_metric([reason], n)
    yield aside
    bad = CounterMetricFamily("fleetcanary_judge_store_errors", _HELP["fleetcanary_judge_store_errors_total"],
                              labels=["kind"])
    for kind, n in (("unreadable_line", store.bad_lines), ("write_failed", store.write_errors)):
        if n:  # as set_aside: a kind once it happened
            bad.add_metric([kind], n)
    yield bad


def smoothed(store: FigureStore, now: float, hold: Callable[[str], float]) -> set[figmod.SeriesKey]:
    """The series whose median is published now: the daemon's exposition leaves their figure's gauge out
    (figures.STANDS_IN)."""
    return {key for key, st, _ in store.snapshot() if st.median is not None
            and freshness.series_state(st.state, now - st.last, hold(figmod.BY_KEY[key[0]].probe)) != "stale"}
