"""The statistics of one judged series, computed from its runs (not from time windows), so any
probe interval gives the same meaning: the median of the newest 7 runs is 7 runs at 10 minutes or
at 6 hours.

A series' runs are (finish time, value, driver). Statistics use the runs on the driver of the
newest run only: after a driver upgrade the old driver's runs stop counting at once, except for the
previous driver's baseline, which judges the first two weeks on the new one.

- median: the median of the newest MEDIAN_RUNS runs (absent with fewer; the daily burn's: 5 days,
  figures.Figure.median_runs), or of the newest QUIET_MEDIAN_RUNS for a quiet series: one whose
  own run-to-run noise (the median over its complete days on this driver of each day's robust
  spread of successive runs, 1.4826 MAD of the differences over sqrt 2, relative to the day's
  median; a slow daily swing does not move it) is under its figure's ``quiet_noise``, a fifth of
  the change the fleet needs (alerts/build.py floor). A median of 5 runs moves on the third bad
  run of 5, two runs before a median of 7: where the runs barely scatter that is as safe, and a
  fault is seen an interval or more sooner; where they scatter (heavy tails, a busy node) the
  median of 7 is what keeps a daily trough with two junk runs in it from reading as a drop. The
  noise is known from the first complete day on a driver; until then a series is not quiet.
- newest: the best of the newest NEWEST_RUNS runs (highest, or lowest for a lower-is-better figure).
  Junk runs (a tenant's job started during the probe) are low; the best of three is low only when
  all three are, which a real fault does and two junk runs in a row cannot. The fleet's fast path
  fires on it (three bad runs) and holds on the median (so one lucky run of a GPU that is still
  slow does not resolve the page); the change path asks it to confirm a drop (four heavy-tailed
  low runs among seven move the median, not the newest three's best).
- level: the median of the same runs as the median, each taken hour for hour: divided by the node's
  own daily swing at its time (the baseline's profile below, interpolated between the bins' centres),
  so that the runs of a node's daily trough are not read as a drop against a best day that is a
  whole day's level. The change and the drift are over it; the published median stays in the
  figure's unit, as measured. It is the same statistic on every node, with no premium: the fleet
  compares a node's change with the median of its peers' changes, and until issue 38 the change was
  over the better of the median and the best of the newest three, which sits above the median by
  about a run's noise (the peers' median change 1.01-1.03 on a 1 MiB all-reduce with 4% run noise)
  while a node whose newest runs were low, or whose drop had latched, read its median alone: 3-11%
  under peers on a normal day. Two junk runs among the median's runs move it by an order statistic,
  not to their level; a fault moves it once it is most of them.
- baseline: the best day on the driver now running: the highest (lowest) daily median among the
  complete UTC days of the last BASELINE_DAYS on that driver, each with at least DAY_MIN_RUNS runs
  spread over DAY_MIN_SPAN. The best day, not a trailing median, so that a fault the GPU keeps is
  never absorbed into its own baseline: it is reported for as long as it lasts (two weeks at most).
  Days are compared hour for hour: a part day (runs in some of the day's DAY_BINS three-hour bins
  only: the exporter's first day, a day cut short by a tenant's job) leans to the part of the
  node's daily swing it saw, and the best of plain daily medians picks the part day that saw
  only the warm hours, so every cool trough after it read as a drop. So each day's median is
  divided by its lean: the node's own daily swing (each bin's effect in a median polish, Tukey's
  robust two-way fit of day x bin in logs, over the days' bin medians), averaged over the bins
  the day's runs fell in, weighted by its runs. A whole day leans by about 1. A bin's part of
  the swing is known once PROFILE_MIN_DAYS days had runs in it (from fewer it is one junk run or
  one odd day), and the swing is taken out once PROFILE_MIN_BINS of the 8 bins are known (a
  node busy every night still gets it); until then days stand as they are. The swing is the node's, not
  its driver's: the profile is over every complete day kept, on any driver. A part day is never dropped,
  so a fault or a ramp that began on the exporter's first day is judged against the runs
  before it. Each day is taken at its median less the lead the best of that many days has by luck alone
  (best_lead: 0.87 standard errors of a day's median for 3 days, 1.71 for 14; the error from the series' run
  noise and the day's runs): the best day is then the node's level, not its luckiest day, on a node of few
  runs a day as on one of many. Without it a busy GPU's best day, of few runs, stood about a standard error
  higher than its peers' (a normal GPU read 4% under peers whose days were whole), and a part day of 23 runs
  that read 2.6% high made every later day of a 1 MiB all-reduce a 4% drift (issue 38). Until the node's swing
  is known, a rough one stands in for it (bins seen on ROUGH_MIN_DAYS days with ROUGH_MIN_RUNS runs each,
  ROUGH_MIN_BINS of them), both to lean the days the best day is chosen from and to take the level's runs hour
  for hour, so the two sides of a change are read alike: a busy node's part day of the warm hours, taken as it
  was, stood 1% over its whole days and its trough's runs read 3% under it (5 GPUs of one node paged for 14 hours
  after an upgrade); with the days leaned and the runs not, a busy GPU's first runs on a new driver, all in its
  night trough, read 2% under its peers' change for 12 hours (issue 38).
- change: level / baseline.
- previous driver: for the BASELINE_DAYS after an upgrade, level / the best day on the driver
  before it. The fleet judges it against the nodes upgraded the same way: the driver's own effect
  is common to them and cancels, and a GPU that lost more stands out, also when its fault came with
  the upgrade (a baseline on the new driver would have absorbed it).
- before: until the driver now running has a median (its first MEDIAN_RUNS runs: hours, a day on a busy GPU),
  the verdict on the driver before it as of that driver's last run (its median and change). The node publishes
  it under the previous driver's label as a held figure, so a page on a GPU that was slow before its upgrade
  holds until the new driver has a verdict of its own, instead of resolving when the old driver's statistics
  stop and paging again hours later (issue 38: 8-12 faults per fleet paged twice across the rolling upgrade).
  Held as the series is: until a day after its newest run on either driver (a busy GPU's first run on the new
  driver keeps it; a day after the old driver's last run, it went 80 minutes before the new median came and the
  page fired again: issue 38, fifth pass), and never again once the series has waited longer than that between
  two runs (``Stats.before_wait``, against the probe's hold: a stale verdict that came back with the new driver's
  next runs paged the regression path a second time).
- drift: the median of the runs of the 24 h before the newest run, each taken hour for hour as in the level, over the
  baseline: a slow ramp that the 5-run figure's noise hides. The day's median needs DAY_MIN_RUNS runs spread over
  DAY_MIN_SPAN, and enough runs that its standard error (1.2533 x the series' run noise / sqrt(runs)) is at most
  DRIFT_MAX_ERROR: a busy node's day of a few runs of a 4%-noise series is not a figure to hold against a 4% drift
  floor (20 false drift warnings on the 1 MiB all-reduce at 49% busy before issue 38); or, from NOISE_MIN_RUNS runs, a
  day whose drift is past the rules' drift floor by DRIFT_FAR_ERRORS standard errors of the drift, the day's and its
  best day's together (a busy GPU's day is too short for the 0.5%, but not for telling a 15% drift from a 4% floor).
  The daily swing is taken out of the baseline's days the same way (``lean``), so the two sides are alike. Where the
  24 h before the newest run fall short of those runs (a busy GPU whose window just lost its oldest run), the newest
  day that had them stands, for a day at most and on the same driver, as a held figure's statistics do: the drift of a
  busy GPU came and went with the count of runs in its trailing day, and its alert resolved and fired again (issue
  38).
"""
from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from fleetcanary.judge.figures import Figure

DAY = 86400.0
MEDIAN_RUNS = 7
QUIET_MEDIAN_RUNS = 5   # a quiet series' median (Figure.quiet_noise)
NOISE_MIN_RUNS = 8      # a day's runs needed to measure its run-to-run noise
NEWEST_RUNS = 3
BASELINE_DAYS = 14
DAY_MIN_RUNS = 3
DAY_MIN_SPAN = 6 * 3600.0
DAY_BINS = 8        # 3-hour bins of the UTC day: days are compared hour for hour
PROFILE_MIN_DAYS = 3  # days with runs in a bin before its part of the node's daily swing is known
PROFILE_MIN_BINS = 6  # bins known before the swing is taken out
ROUGH_MIN_DAYS, ROUGH_MIN_BINS = 2, 4  # the rough swing that stands in for it until then,
ROUGH_MIN_RUNS = 3  # from bins of 3 runs a day at least: a bin of one junk run read 15% low at 80% busy
# The drift's standard error at most this: an eighth of the rules' 4% drift floor. The best day is the best of up
# to 14, about 1.7 standard errors of a day's median above a typical day (more with the error of the daily swing
# it is corrected by), so a normal day already reads that far under it; at a quarter of the floor two 4%-noise
# series of 48 runs a day drifted "4%" for a day and more on the detection fleet, at a sixth one did for 9 hours.
DRIFT_FLOOR = 0.04  # the rules' default drift floor (the exporter passes the configured one: Series(drift_floor=))
DRIFT_MAX_ERROR = DRIFT_FLOOR / 8
# ... or a day of NOISE_MIN_RUNS runs or more whose drift is past the floor by this many standard errors of the
# drift: a busy GPU's day too short for a 0.5% error still tells a 15% drift from a 4% floor (its drift alert
# resolved for 10 hours and fired again while the median said 14% all along: issue 38, fourth pass). The error is
# the gap's, the day's and its best day's together (``DriftEvidence``): a best day of 4 runs is as uncertain as
# a short day held against it. Two errors of the gap, not four of the day alone (issue 38, seventh pass): on the
# six detection fleets no healthy series' short day came within 0.9 of them (the worst 1.11, a 1 MiB all-reduce
# held against a best day of 4 runs, which read 2.2 of the day's errors alone), and a 5% collective step measured
# only 16 times before the week's end read 2.5 (1.6 at 4 of the day's errors: missed).
DRIFT_FAR_ERRORS = 2.0


def median_runs(fig: Figure) -> int:
    """Runs in the figure's median: its own (the daily burn's 5 days) or MEDIAN_RUNS."""
    return fig.median_runs or MEDIAN_RUNS


def median_words(fig: Figure) -> str:
    """The runs in the figure's median, in words for help texts: "7 runs", or "7 runs, or 5 for a quiet series"."""
    runs = median_runs(fig)
    if fig.quiet_noise > 0 and runs > QUIET_MEDIAN_RUNS:
        return f"{runs} runs, or {QUIET_MEDIAN_RUNS} for a quiet series"
    return f"{runs} runs"


@dataclass(frozen=True)
class DriftEvidence:
    """A day's drift against its best day: how far worse than 1 (0.05: 5% worse), the day's median's standard error,
    the drift's (the day's and its best day's together: both medians of the same run noise), and their runs."""
    gap: float
    day_error: float
    error: float
    runs: int
    best_runs: int


@dataclass(frozen=True)
class Stats:
    driver: str
    runs: int                       # runs on the current driver held in the store
    last: float                     # finish time of the newest run
    median: float | None = None
    newest: float | None = None
    baseline: float | None = None
    change: float | None = None
    previous_driver: str = ""
    previous_baseline: float | None = None
    previous_change: float | None = None
    drift: float | None = None
    before: Stats | None = None     # the previous driver's verdict while this one has no median (module docstring)
    before_wait: float = 0.0        # the longest wait between runs since that verdict's last run

    @property
    def state(self) -> str:
        if self.median is None:
            return "warming"
        return "baselined" if self.change is not None else "smoothed"


def best_lead(days: int) -> float:
    """How many standard errors of a day's median the best of `days` days leads a typical day by, for days of the
    same level (the expected largest of that many normal draws, Blom's approximation): 0 for one day, 0.85 for 3,
    1.71 for 14. The best day is taken that far under its median, so it is the node's level, not its luckiest day."""
    return statistics.NormalDist().inv_cdf((days - 0.375) / (days + 0.25)) if days > 1 else 0.0


def day_of(t: float) -> int:
    return int(t // DAY)


def day_median(times: list[float], values: list[float]) -> float | None:
    """The median of one day's runs, when they are enough to stand for the day."""
    if len(values) < DAY_MIN_RUNS or times[-1] - times[0] < DAY_MIN_SPAN:
        return None
    return statistics.median(values)


def bin_medians(times: list[float], values: list[float]) -> tuple[tuple[float, int] | None, ...]:
    """The median and count of one day's runs in each of its DAY_BINS bins (None: no run in it)."""
    bins: list[list[float]] = [[] for _ in range(DAY_BINS)]
    for t, v in zip(times, values, strict=True):
        bins[int((t % DAY) * DAY_BINS // DAY) % DAY_BINS].append(v)
    return tuple((statistics.median(b), len(b)) if b else None for b in bins)


def hour_profile(days: list[tuple], sweeps: int = 6, min_days: int | None = None,
                 min_bins: int | None = None) -> list[float | None] | None:
    """The node's own daily swing: each bin's effect (log) in a median polish of the days' bin medians
    (Tukey's two-way fit, day x bin, in logs), mean 0 over the bins known. A bin is known once PROFILE_MIN_DAYS
    days had runs in it (a bin's effect from fewer is one junk run or one odd day); None while fewer than
    PROFILE_MIN_BINS are known."""
    min_days, min_bins = min_days or PROFILE_MIN_DAYS, min_bins or PROFILE_MIN_BINS
    known = [b for b in range(DAY_BINS) if sum(1 for bins in days if bins[b] is not None) >= min_days]
    if len(known) < min_bins:
        return None
    res = [cells for bins in days if (cells := {b: math.log(bins[b][0]) for b in known if bins[b] is not None})]
    col = dict.fromkeys(known, 0.0)
    for _ in range(sweeps):
        for cells in res:
            m = statistics.median(cells.values())
            for b in cells:
                cells[b] -= m
        for b in known:
            m = statistics.median(cells[b] for cells in res if b in cells)
            col[b] += m
            for cells in res:
                if b in cells:
                    cells[b] -= m
    mean = statistics.fmean(col.values())
    return [col[b] - mean if b in col else None for b in range(DAY_BINS)]


def lean(bins: tuple, profile: list[float | None]) -> float:
    """How far a day's plain median leans above a whole day's, from the bins its runs fell in (each
    weighted by its runs; bins whose swing is not known yet left out) and the node's daily swing."""
    seen = [(math.exp(p), c[1]) for c, p in zip(bins, profile, strict=True) if c is not None and p is not None]
    return sum(w * n for w, n in seen) / sum(n for _, n in seen) if seen else 1.0


def swing_reader(profile: list[float | None]) -> Callable[[float], float]:
    """The daily swing (log) at a time of day t: interpolated between the centres of the known bins on either
    side (around midnight too), so a run early in a bin is not taken at the bin's average. The known bins are
    found once per profile (a drift reads every run of its day through one)."""
    known = [(b + 0.5) * DAY / DAY_BINS for b, p in enumerate(profile) if p is not None]
    values = [p for p in profile if p is not None]
    if not known:
        return lambda t: 0.0

    def at(t: float) -> float:
        x = t % DAY
        i = bisect.bisect_right(known, x)
        x0, y0 = (known[i - 1], values[i - 1]) if i > 0 else (known[-1] - DAY, values[-1])
        x1, y1 = (known[i], values[i]) if i < len(known) else (known[0] + DAY, values[0])
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    return at


def run_noise(values: list[float]) -> float | None:
    """One day's run-to-run noise: the robust standard deviation of one run, relative to the day's median,
    from the successive differences (a slow daily swing barely moves them). None with too few runs."""
    if len(values) < NOISE_MIN_RUNS:
        return None
    diffs = [abs(b - a) for a, b in itertools.pairwise(values)]
    return 1.4826 * statistics.median(diffs) / math.sqrt(2) / statistics.median(values)


class Series:
    """One judged series' runs, kept incrementally: ``add`` is O(1) but for the day's median, so a
    benchmark can drive a fleet of them for a simulated week."""

    def __init__(self, fig: Figure, drift_floor: float = DRIFT_FLOOR) -> None:
        self.fig = fig
        self.drift_floor = drift_floor
        self.driver = ""
        self.previous = ""
        self.runs = 0                 # runs on the current driver
        self.last = 0.0
        self.before: Stats | None = None  # the previous driver's verdict until this one has a median
        self._before_wait = 0.0  # the longest wait between runs since its last run (the exposition's bound)
        self._drift_runs: list[tuple[float, float]] | None = None  # the newest trailing day enough for a drift
        self.today = -1
        self.median_runs = median_runs(fig)
        self.tail: deque[tuple[float, float]] = deque(maxlen=self.median_runs)  # newest runs, current driver
        self.recent: deque[tuple[float, float]] = deque()      # the 24 h before the newest run, current driver
        self.days: dict[tuple[int, str], list[tuple[float, float]]] = {}  # today's runs per driver
        self.day_medians: dict[tuple[int, str], float | None] = {}       # complete days of the last 14
        self.day_bins: dict[tuple[int, str], tuple] = {}               # and their bins' medians and counts
        self.day_noise: dict[tuple[int, str], float] = {}              # and their run-to-run noise
        self.smooth = self.median_runs  # runs in the median now (QUIET_MEDIAN_RUNS for a quiet series)
        self._best: dict[str, tuple[float | None, int]] = {}  # best_day per driver and its day's runs, until a day ends
        self._profile: list[float | None] | None = None  # the node's daily swing, until a day ends
        self._profile_day = -1
        self._rough: list[float | None] | None = None
        # hour_for_hour's factor of each run time under one profile (a drift reads its whole day at every run)
        self._factors_of: list[float | None] | None = None
        self._factors: dict[float, float] = {}
        self._rough_day = -1

    def add(self, t: float, value: float, driver: str) -> None:
        if t < self.last:
            return  # out of order (a clock step back): the statistics are over runs in time order
        if self.fig.history and self._drift_day_ok(self.recent):
            self._drift_runs = list(self.recent)  # kept by the runs, not by when the statistics are read (a reload)
        if driver != self.driver:
            if self.driver:
                before = self.stats()  # the old driver's runs, before they stop counting
                if before is not None and before.median is not None:
                    self.before, self._before_wait = before, 0.0
                self.previous = self.driver
            self.driver = driver
            self.runs = 0
            self._drift_runs = None
            self.tail.clear()
            self.recent.clear()
            self.smooth = self._smooth()
        if self.before is not None:
            self._before_wait = max(self._before_wait, t - self.last)
        self.runs += 1
        self.last = t
        self.tail.append((t, value))
        if len(self.tail) >= self.median_runs:
            self.before = None  # this driver has its median
        self.recent.append((t, value))
        while self.recent and self.recent[0][0] <= t - DAY:
            self.recent.popleft()
        today = day_of(t)
        if today != self.today:
            # A day that is over keeps only its median (None: too few runs to stand for the day).
            for key in [k for k in self.days if k[0] < today]:
                runs = self.days.pop(key)
                times, values = [r[0] for r in runs], [r[1] for r in runs]
                self.day_medians[key] = day_median(times, values)
                if self.day_medians[key] is not None:
                    self.day_bins[key] = bin_medians(times, values)
                    if (noise := run_noise(values)) is not None:
                        self.day_noise[key] = noise
            for key in [k for k in self.day_medians if k[0] < today - BASELINE_DAYS]:
                del self.day_medians[key]
                self.day_bins.pop(key, None)
                self.day_noise.pop(key, None)
            self._best.clear()
            self.smooth = self._smooth()
            self.today = today
        self.days.setdefault((today, driver), []).append((t, value))

    def noise(self) -> float | None:
        """The series' run-to-run noise on the driver now running (None before a complete day)."""
        return self.noise_on(self.driver)

    def _smooth(self) -> int:
        noise = self.noise()
        quiet = self.fig.quiet_noise > 0 and noise is not None and noise < self.fig.quiet_noise
        return min(QUIET_MEDIAN_RUNS, self.median_runs) if quiet else self.median_runs

    def _median(self) -> float | None:
        if len(self.tail) < self.median_runs:
            return None
        return statistics.median(v for _, v in list(self.tail)[-self.smooth:])

    def _level(self) -> float | None:
        """The median's runs taken hour for hour (see the module docstring)."""
        if len(self.tail) < self.median_runs:
            return None
        return statistics.median(self.hour_for_hour(list(self.tail)[-self.smooth:]))

    def _newest(self) -> float | None:
        if not self.fig.fast or len(self.tail) < NEWEST_RUNS:
            return None
        newest = [v for _, v in list(self.tail)[-NEWEST_RUNS:]]
        return max(newest) if self.fig.higher_is_better else min(newest)

    def profile(self) -> list[float | None] | None:
        """The node's daily swing (hour_profile) over every complete day kept, on any driver; None until known."""
        if self._profile_day != self.today:
            self._profile = hour_profile([self.day_bins[k] for k, m in self.day_medians.items() if m is not None])
            self._profile_day = self.today
        return self._profile

    def rough_profile(self) -> list[float | None] | None:
        """The node's daily swing from bins seen on ROUGH_MIN_DAYS days with ROUGH_MIN_RUNS runs each: rougher than
        profile(), it stands in for it while that is not known (a busy node's nights are seen on few days)."""
        if self._rough_day != self.today:
            days = [tuple(c if c is not None and c[1] >= ROUGH_MIN_RUNS else None for c in self.day_bins[k])
                    for k, m in self.day_medians.items() if m is not None]
            self._rough = hour_profile(days, min_days=ROUGH_MIN_DAYS, min_bins=ROUGH_MIN_BINS)
            self._rough_day = self.today
        return self._rough

    def swing(self) -> list[float | None] | None:
        """The swing both sides of a change are read by: the node's daily swing, the rough one while that is not
        known (a part day of the warm hours stood 1% over the node's whole days, and the runs of its trough read
        3% under it), None while neither is."""
        return self.profile() or self.rough_profile()

    def hour_for_hour(self, runs) -> list[float]:
        """Each run's value over the node's swing (``swing``) at its time of day; as measured while none is known."""
        profile = self.swing()
        if profile is None:
            return [v for _, v in runs]
        if profile is not self._factors_of:  # a new profile, at most daily: each run's factor read again
            self._factors_of, self._factors = profile, {}
        factors = self._factors
        if missing := [t for t, _ in runs if t not in factors]:
            at = swing_reader(profile)
            factors.update((t, math.exp(at(t))) for t in missing)
        return [v / factors[t] for t, v in runs]

    def noise_on(self, driver: str | None) -> float | None:
        """The series' run-to-run noise on `driver` (None: on any), the median of its complete days'; None before
        one."""
        days = [v for k, v in self.day_noise.items() if driver is None or k[1] == driver]
        return statistics.median(days) if days else None

    def best_day(self, driver: str) -> float | None:
        """The best day's level on `driver`, days compared hour for hour, each at the bound of what it showed (see
        the module docstring)."""
        if driver in self._best:
            return self._best[driver][0]
        days = {k: m for k, m in self.day_medians.items() if k[1] == driver and m is not None}
        profile = self.swing()
        noise = self.noise_on(driver) or self.noise_on(None)
        lead = best_lead(len(days))
        best, best_runs = None, 0
        for key, median in days.items():
            m = median / lean(self.day_bins[key], profile) if profile is not None else median
            runs = sum(c[1] for c in self.day_bins[key] if c is not None)
            if noise is not None:
                shrink = lead * 1.2533 * noise / math.sqrt(runs)
                m *= (1 - shrink) if self.fig.higher_is_better else (1 + shrink)
            if best is None or (m > best if self.fig.higher_is_better else m < best):
                best, best_runs = m, runs
        self._best[driver] = (best, best_runs)
        return best

    def stats(self) -> Stats | None:
        if not self.runs:
            return None
        fig = self.fig
        out: dict = {"driver": self.driver, "runs": self.runs, "last": self.last}
        median, newest = self._median(), self._newest()
        if median is not None:
            out["median"] = median
        elif self.before is not None:
            out["before"], out["before_wait"] = self.before, self._before_wait
        if newest is not None:
            out["newest"] = newest
        if not fig.history:
            return Stats(**out)
        level = self._level()
        baseline = self.best_day(self.driver)
        if baseline is not None:
            out["baseline"] = baseline
            if level is not None:
                out["change"] = level / baseline
            if (drift := self._held_drift()) is not None:
                out["drift"] = drift / baseline
        if self.previous:
            pb = self.best_day(self.previous)
            if pb is not None:
                out["previous_driver"] = self.previous
                out["previous_baseline"] = pb
                if level is not None:
                    out["previous_change"] = level / pb
        return Stats(**out)

    def _held_drift(self) -> float | None:
        """The drift's level (``_drift``), or where the day before the newest run is not enough for one, the newest
        trailing day that was, for a day after its newest run (the module docstring)."""
        level = self._drift()
        if level is None and self._drift_runs and self.last - self._drift_runs[-1][0] <= DAY:
            level = statistics.median(self.hour_for_hour(self._drift_runs))
        return level

    def _drift(self) -> float | None:
        """The last 24 h's median, hour for hour, when its runs are enough to stand for the day (``_drift_day_ok``)."""
        return self._drift_level(self.recent)

    def _drift_day_ok(self, runs) -> bool:
        """A day of runs stands for a drift (``_drift_level``); the median is taken only where the error alone
        does not decide (``add`` asks at every run)."""
        error = self._drift_error(runs)
        return error is not None and (error <= DRIFT_MAX_ERROR or self._drift_level(runs, error) is not None)

    def _drift_level(self, runs, error: float | None = None) -> float | None:
        """The day's median, hour for hour, where the day stands for a drift: its standard error at most
        DRIFT_MAX_ERROR, or, from NOISE_MIN_RUNS runs, its drift past the floor by DRIFT_FAR_ERRORS of that error
        (never one near the floor, nor a good one: those need the whole 0.5%)."""
        error = self._drift_error(runs) if error is None else error
        if error is None or (error > DRIFT_MAX_ERROR and len(runs) < NOISE_MIN_RUNS):
            return None
        level = statistics.median(self.hour_for_hour(runs))
        if error <= DRIFT_MAX_ERROR:
            return level
        ev = self._evidence(runs, level, error)
        return level if ev is not None and ev.gap - self.drift_floor >= DRIFT_FAR_ERRORS * ev.error else None

    def drift_evidence(self) -> DriftEvidence | None:
        """The trailing day's drift against the best day on this driver with its errors, whether or not the day
        stands for a drift; None where it cannot (too few runs, too short a span, the noise or the best day not
        known). What the short-day rule reads (benchmarks/detection/drift_far.py measures it on the fleets)."""
        error = self._drift_error(self.recent)
        if error is None:
            return None
        return self._evidence(self.recent, statistics.median(self.hour_for_hour(self.recent)), error)

    def _evidence(self, runs, level: float, error: float) -> DriftEvidence | None:
        baseline = self.best_day(self.driver)
        if baseline is None:
            return None
        gap = 1.0 - level / baseline if self.fig.higher_is_better else level / baseline - 1.0
        # the best day is a median of the same run noise: its lead is taken out, its error stays
        best_runs = self._best[self.driver][1]
        return DriftEvidence(gap, error, error * math.sqrt(1.0 + len(runs) / best_runs), len(runs), best_runs)

    def _drift_error(self, runs) -> float | None:
        """The standard error of a day's median (1.2533 x the run noise / sqrt(runs)), where the day can stand for
        a drift at all: DAY_MIN_RUNS over DAY_MIN_SPAN, the noise known (a 4%-noise all-reduce drifted "4%" for 31
        hours the day after its driver's upgrade, when its noise on the new driver was not measured yet)."""
        if len(runs) < DAY_MIN_RUNS or runs[-1][0] - runs[0][0] < DAY_MIN_SPAN:
            return None
        noise = self.noise()  # None until a complete day on this driver measured it (the day after an upgrade)
        return None if noise is None else 1.2533 * noise / math.sqrt(len(runs))
