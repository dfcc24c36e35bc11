"""Scheduling with APScheduler 3.x: interval plus jitter per probe.

One instance of a probe at a time (max_instances=1, missed runs coalesced), probes
of one ``exclusive`` class ("gpu") serialized by a lock, and a per-GPU GPU-time budget
(a duty cycle, enforced over a window as long as the asking probe's interval, see
GpuBudget) whose remainder is handed to invasive probes, which skip with reason
"budget" when it is spent. A run whose figure jumped gets a confirmation run a few
minutes later, and each confirmation that still sees the jump another, up to confirm_runs (3):
with the jumped run, the four bad runs that turn the judge's median of 7 come within about a
quarter of an hour instead of four intervals (run_once; daemon/confirm.py decides). A scheduled run
(or an opportunistic one) that starts first drops a pending confirmation: that run ends the
suspicion or starts a new one.
"""
from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from fleetcanary.core import statefile

log = logging.getLogger("fleetcanary.scheduler")

BUDGET_WINDOW_SECONDS = 3600.0        # the shortest budget window (probes running hourly or more often)
MAX_BUDGET_WINDOW_SECONDS = 86400.0   # the longest (daily probes; a weekly probe is held to a day)
FIRST_RUN_MAX_DELAY_SECONDS = 10.0
CLOCK_CHECK_SECONDS = 1.0
CLOCK_JUMP_SECONDS = 5.0
# A run that would start sooner than this share of its interval after the previous start is a
# duplicate (APScheduler's catch-up run racing a re-plan after a clock step, a reload) and is dropped.
MIN_GAP_SHARE = 0.5


class Clock:
    """Where the scheduler's time comes from: the monotonic clock (cadence, budgets), the wall clock
    APScheduler plans on, the APScheduler that fires the jobs, and the timer of the clock watch.

    The daemon runs on this real one. Tests pass a fake (tests/support/clock.py) whose time moves only
    when the test advances it, and whose APScheduler fires due jobs at each step instead of in a thread
    of its own: a day of schedule, a clock step or a confirmation delay then takes milliseconds, and no
    verdict depends on how fast the machine wakes a thread."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def scheduler(self, **options) -> BaseScheduler:
        return BackgroundScheduler(**options)

    def every(self, seconds: float, fn: Callable[[], object], stop: threading.Event, name: str) -> None:
        """Call ``fn`` every ``seconds`` until ``stop`` is set."""
        def loop() -> None:
            while not stop.wait(seconds):
                fn()
        threading.Thread(target=loop, name=name, daemon=True).start()


def budget_window(interval_seconds: float) -> float:
    """The window over which a probe with this interval is held to the budget ratio: its
    interval, at least an hour and at most a day."""
    return min(max(float(interval_seconds), BUDGET_WINDOW_SECONDS), MAX_BUDGET_WINDOW_SECONDS)


class GpuBudget:
    """GPU seconds spent per GPU, held to ``ratio`` of wall time over a window as long as the
    interval of the probe that asks (budget_window: one hour to one day).

    One sliding hour cannot hold a daily probe: gpu_sustained's 20 s burn is more than the
    18 s an hour that 0.5% allows, yet 0.5% of a day is 432 s. So each probe is judged over its
    own window W, and each charge remembers the probe and the window Wc that made it:
    - another probe's charge counts in full in a window at least as long as its own (W >= Wc)
      while it lies within W (a daily probe sees every hourly probe's runs of the last day);
      in a shorter window (W < Wc) it counts as its amortized share s x W / Wc for as long as it
      lies within its own window Wc (an hourly probe sees a daily 22 s burn as 0.92 s an hour
      for the day after it, not as 22 s that would make it skip for an hour);
    - the asking probe's own past runs count at its scheduled rate, (W / interval - 1) x its
      last charge: the run about to start is the one its schedule allows in W. Counting its
      own previous run by its time instead would count it twice whenever the jitter brings two
      runs closer than one interval (half of all daily burns at the default 10% jitter).
    Every view then agrees with benchmarks/overhead.py's sum of per-hour shares: at steady
    state a probe finds what it needs in its window exactly when the per-hour shares of all
    GPU probes together fit ``ratio`` x 3600 s.
    """

    def __init__(self, ratio: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.ratio = ratio
        self._monotonic = monotonic
        # gpu -> (monotonic time, seconds, window of the probe that spent them, probe)
        self._spent: dict[str, deque[tuple[float, float, float, str]]] = defaultdict(deque)
        self._lock = threading.Lock()

    @property
    def seconds_per_window(self) -> float:
        """The budget of the shortest (hourly) window."""
        return self.seconds_for(BUDGET_WINDOW_SECONDS)

    def seconds_for(self, window: float) -> float:
        return self.ratio * window

    def add(self, gpu: str, seconds: float, now: float | None = None,
            window: float = BUDGET_WINDOW_SECONDS, probe: str = "") -> None:
        """Charge ``seconds`` to ``gpu``, spent by ``probe`` whose budget window is ``window``."""
        with self._lock:
            self._spent[gpu].append((self._monotonic() if now is None else now, seconds, window, probe))

    def left(self, now: float | None = None, window: float = BUDGET_WINDOW_SECONDS, probe: str | None = None,
             interval: float | None = None) -> dict[str, float]:
        """Seconds left per GPU (negative when overspent) for ``probe`` (run every ``interval``
        seconds) whose budget window is ``window``. Without a probe, every charge counts by its time."""
        now = self._monotonic() if now is None else now
        with self._lock:
            out = {}
            for gpu, dq in self._spent.items():
                while dq and dq[0][0] < now - MAX_BUDGET_WINDOW_SECONDS:
                    dq.popleft()
                spent, own = 0.0, None
                for t, s, wc, who in dq:
                    if probe is not None and who == probe:
                        if now - t <= window:
                            own = s  # the latest of the window
                        continue
                    if now - t <= max(window, wc):
                        spent += s * min(1.0, window / wc)
                if own is not None and interval:
                    spent += own * max(0.0, window / interval - 1.0)
                out[gpu] = self.seconds_for(window) - spent
            return out

    # --- kept in the state directory: a restart does not hand a GPU a fresh day of budget ------------------------
    def dump(self, wall_now: float) -> list[list]:
        """The charges of the last day as [gpu, unix time, seconds, window, probe]."""
        mono = self._monotonic()
        with self._lock:
            return [[gpu, round(wall_now - (mono - t), 3), s, wc, who]
                    for gpu, dq in self._spent.items() for t, s, wc, who in dq
                    if mono - t <= MAX_BUDGET_WINDOW_SECONDS]

    def restore(self, charges: list, wall_now: float, drop: Callable[[str, str], None] | None = None) -> int:
        """Charges from dump() of an earlier process, placed on this process's monotonic clock; ones older
        than a day are let go. A malformed one (not [str, finite number, finite seconds >= 0, finite window > 0,
        str]) or one stamped in the future (a stepped clock) is refused and passed
        to ``drop(kind, detail)``, kind "wrong_shape" or "future". Returns how many were kept."""
        mono, kept = self._monotonic(), 0
        with self._lock:
            for c in charges:
                shaped = isinstance(c, list) and len(c) == 5 and isinstance(c[0], str) and isinstance(c[4], str)
                at, secs, wc = (statefile.number(c[i]) for i in (1, 2, 3)) if shaped else (None, None, None)
                if at is None or secs is None or wc is None or secs < 0 or wc <= 0:
                    if drop:
                        drop("wrong_shape", f"charge {str(c)[:80]}")
                    continue
                age = wall_now - at
                if age < 0:
                    if drop:
                        drop("future", f"charge at {at:.0f}, {-age:.0f} s past this clock")
                    continue
                if age > MAX_BUDGET_WINDOW_SECONDS:
                    continue
                self._spent[c[0]].append((mono - age, secs, wc, c[4]))
                kept += 1
            for dq in self._spent.values():
                ordered = sorted(dq)
                dq.clear()
                dq.extend(ordered)
        return kept


class Scheduler:
    def __init__(self, run_probe: Callable[..., object], workers: int = 16, clock: Clock | None = None) -> None:
        self._run_probe = run_probe
        self.clock = clock or Clock()
        self._sched = self.clock.scheduler(
            executors={"default": ThreadPoolExecutor(max_workers=workers)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone=timezone.utc,
        )
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._probe_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)  # a scheduled run vs an extra one
        self._jobs: dict[str, tuple[float, float, str | None]] = {}
        self._last_start: dict[str, float] = {}  # monotonic start of each job's last run
        self._asked: dict[str, float] = {}        # monotonic time each probe's pending confirmation was asked for
        self._other_start: dict[str, float] = {}  # monotonic start of each probe's last run other than a confirmation
        self.aligned: set[str] = set()  # probes run on the wall clock's grid of their interval (Probe.slot_aligned)
        self._jobs_lock = threading.RLock()
        self._start_lock = threading.Lock()
        self.clock_jumps = 0
        self.on_clock_jump: Callable[[float], None] | None = None
        self._stop = threading.Event()
        self._clocks = (self.clock.now().timestamp(), self.clock.monotonic())  # the watch's last look

    @property
    def running(self) -> bool:
        return self._sched.running

    def start(self) -> None:
        self._sched.start()
        self._clocks = (self.clock.now().timestamp(), self.clock.monotonic())
        self.clock.every(CLOCK_CHECK_SECONDS, self.check_clock, self._stop, name="clock-watch")

    def shutdown(self) -> None:
        self._stop.set()
        if self._sched.running:
            self._sched.shutdown(wait=False)

    def check_clock(self) -> float:
        """One look of the clock watch (every CLOCK_CHECK_SECONDS); the step seen, 0 if none.

        APScheduler plans on the wall clock: after a step back (NTP, a VM restore) its next run
        times lie in the future and every probe would stall for as long as the step; after a step
        forward everything fires at once. Steps are seen against the monotonic clock, and the jobs
        are then planned again from the new wall time."""
        w, m = self.clock.now().timestamp(), self.clock.monotonic()
        last_wall, last_mono = self._clocks
        self._clocks = (w, m)
        step = (w - last_wall) - (m - last_mono)
        if abs(step) < CLOCK_JUMP_SECONDS:
            return 0.0
        self.clock_jumps += 1
        log.warning("wall clock stepped %+.0f s; planning every probe again from the new time", step)
        with self._jobs_lock:
            jobs = dict(self._jobs)
        # Keep each probe's cadence: its next run comes one interval after its last start, as
        # measured on the monotonic clock, whatever APScheduler made of the step meanwhile.
        with self._start_lock:
            last = dict(self._last_start)
        delays = {n: max(0.0, last[n] + iv - m) if n in last else None for n, (iv, _, _) in jobs.items()}
        if self._sched.running:
            self.set_jobs(jobs, delays=delays)
        if self.on_clock_jump:
            self.on_clock_jump(step)
        return step

    def _job(self, name: str) -> None:
        interval, _, cls = self._jobs.get(name, (60.0, 0.0, None))
        now = self.clock.monotonic()
        with self._start_lock:
            last = self._last_start.get(name)
            if last is not None and now - last < MIN_GAP_SHARE * interval:
                log.debug("probe %s: run %.3f s after the previous start dropped as a duplicate", name, now - last)
                return
            self._last_start[name] = now
        self._locked(name, interval, cls)

    def _locked(self, name: str, interval: float, cls: str | None, *args) -> None:
        """Run the probe holding its own lock (a scheduled run and a confirmation never overlap) and its
        exclusive class's; wait at most one interval for either, then let the next trigger try."""
        locks = [self._probe_locks[name]] + ([self._locks[cls]] if cls is not None else [])
        held = []
        try:
            for lock in locks:
                if not lock.acquire(timeout=interval):
                    what = f"exclusive class {cls!r}" if lock is not locks[0] else "its previous run"
                    log.warning("probe %s: %s stayed busy for a whole interval; run dropped", name, what)
                    return
                held.append(lock)
            if self._superseded(name, args[0] if args else "schedule"):
                log.debug("probe %s: another run came before its confirmation run; confirmation dropped", name)
                return
            try:
                self._run_probe(name, *args)
            except Exception:  # the daemon's run_probe records its own failures; this is the last resort
                log.exception("probe %s: the run failed in the scheduler and left no record", name)
        finally:
            for lock in reversed(held):
                lock.release()

    def _superseded(self, name: str, trigger: str) -> bool:
        """For a confirmation run about to start: whether another run of the probe (scheduled, opportunistic)
        started since it was asked for. Any other run notes its start here."""
        now = self.clock.monotonic()
        with self._start_lock:
            if trigger != "confirmation":
                self._other_start[name] = now
                return False
            asked = self._asked.pop(name, None)
            return asked is not None and self._other_start.get(name, -math.inf) > asked

    def run_once(self, name: str, delay: float, trigger: str = "confirmation") -> bool:
        """One extra run of a scheduled probe ``delay`` seconds from now (a confirmation run, daemon/confirm.py).
        It waits for the probe's exclusive class like any run; it neither replaces nor moves the scheduled
        runs, and the duplicate check does not apply to it. A confirmation is dropped when another run of the
        probe starts before it (daemon/confirm.py: that run ends or restarts the suspicion); a reload or a
        clock step drops it too. False when the probe is not scheduled."""
        with self._jobs_lock:
            if name not in self._jobs or not self._sched.running:
                return False
            interval, _, cls = self._jobs[name]
            if trigger == "confirmation":
                with self._start_lock:
                    self._asked[name] = self.clock.monotonic()
            self._sched.add_job(
                self._locked, DateTrigger(run_date=self.clock.now() + timedelta(seconds=delay),
                                          timezone=timezone.utc),
                args=[name, interval, cls, trigger], id=f"{name}:{trigger}", name=f"{name} ({trigger})",
                replace_existing=True)
        return True

    def set_jobs(self, jobs: dict[str, tuple[float, float, str | None]], first_delay: bool = True,
                 delays: dict[str, float | None] | None = None) -> None:
        """Replace all jobs. jobs: name -> (interval_seconds, jitter_seconds, exclusive class)."""
        with self._jobs_lock:
            self._jobs = dict(jobs)
            for job in self._sched.get_jobs():
                job.remove()
            now = self.clock.now()
            for name, (interval, configured_jitter, _) in jobs.items():
                delay, jitter = (delays or {}).get(name), configured_jitter
                if name in self.aligned:  # the next multiple of the interval since the epoch, no jitter
                    delay, jitter = (-now.timestamp()) % interval, 0.0
                if delay is None:
                    delay = random.uniform(0, min(jitter, FIRST_RUN_MAX_DELAY_SECONDS)) if first_delay else 0.0
                self._sched.add_job(
                    self._job, IntervalTrigger(seconds=interval, jitter=jitter or None, timezone=timezone.utc),
                    args=[name], id=name, name=name, next_run_time=now + timedelta(seconds=delay),
                    replace_existing=True,
                )
