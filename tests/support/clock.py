"""A fake clock for the scheduler (exporter/daemon/scheduler.py, Clock): time moves only when a test moves it.

    with FakeClock() as clock:
        s = Scheduler(run_probe, clock=clock)      # or Daemon(settings, clock=clock)
        s.start(); s.set_jobs({...})
        clock.advance(3600)                        # an hour of schedule, in milliseconds
        clock.step_wall(-3600)                     # NTP steps the wall clock back; monotonic time goes on

What runs is the real scheduler: APScheduler's own job store, triggers, jitter and coalescing, its
thread-pool executor and our jobs, duplicate check, locks and clock watch. Only its main loop is
replaced: instead of a thread that sleeps until the next run time, ``advance`` moves both clocks to
each due time in turn, lets APScheduler submit what is due, and waits until those runs have finished
before it moves on. A run therefore takes no fake time however long it takes in real time, so the
verdict never depends on how fast the machine is. Runs due at the same time still run concurrently.

APScheduler reads the wall clock through ``datetime.now`` in its scheduler module; entering the clock
points that module's ``datetime`` at this clock, leaving it restores the real one.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import apscheduler.schedulers.base as aps_base
from apscheduler.schedulers.base import BaseScheduler

from fleetcanary.daemon.scheduler import Clock

EPOCH = 1_900_000_000.0   # the fake wall clock's start (2030), far from the real one: a leak of real time shows
IDLE_TIMEOUT_S = 300.0    # real seconds a step waits for its runs (real workers) to finish: only a hang reaches it


class _SteppedScheduler(BaseScheduler):
    """APScheduler without its thread: the clock calls _process_jobs() at each due time."""

    def wakeup(self) -> None:
        pass

    def shutdown(self, wait: bool = True) -> None:
        super().shutdown(wait=False)


class FakeClock(Clock):
    def __init__(self, wall: float = EPOCH, monotonic: float = 1000.0) -> None:
        self._mono = float(monotonic)
        self._offset = float(wall) - self._mono  # wall = monotonic + offset, until the wall clock steps
        self._lock = threading.RLock()
        self._timers: list[list] = []            # [next monotonic time, period, fn, stop event]
        self.scheduled: list[_SteppedScheduler] = []
        self._saved = None

    # --- Clock ------------------------------------------------------------------------------
    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def now(self) -> datetime:
        with self._lock:
            return datetime.fromtimestamp(self._mono + self._offset, timezone.utc)

    def scheduler(self, **options) -> BaseScheduler:
        s = _SteppedScheduler(**options)
        self.scheduled.append(s)
        return s

    def every(self, seconds, fn, stop, name) -> None:
        with self._lock:
            self._timers.append([self._mono + seconds, float(seconds), fn, stop])

    # --- the test's handle ------------------------------------------------------------------
    def __enter__(self) -> FakeClock:
        clock = self

        class _Now(datetime):
            @classmethod
            def now(cls, tz=None):
                t = clock.now()
                return t if tz is None or tz is timezone.utc else t.astimezone(tz)

        self._saved = aps_base.datetime
        aps_base.datetime = _Now
        return self

    def __exit__(self, *exc) -> None:
        aps_base.datetime = self._saved
        for s in self.scheduled:
            if s.running:
                s.shutdown()

    def step_wall(self, seconds: float) -> None:
        """The wall clock jumps by ``seconds`` (NTP, a VM restore); the monotonic clock does not."""
        with self._lock:
            self._offset += seconds

    def advance(self, seconds: float) -> None:
        """Move both clocks ``seconds`` forward, firing every run and clock-watch look that falls due on the
        way, each at its own time, and return once the runs have finished."""
        target = self.monotonic() + seconds
        while True:
            self._fire_due()
            nxt = self._next_due()
            if nxt is None or nxt > target:
                break
            with self._lock:
                self._mono = max(self._mono, nxt)
        with self._lock:
            self._mono = target
        self._fire_due()

    def wall_to_monotonic(self, t: datetime) -> float:
        with self._lock:
            return t.timestamp() - self._offset

    # --- internals --------------------------------------------------------------------------
    def _next_due(self) -> float | None:
        times = [t for t, _, _, stop in self._timers if not stop.is_set()]
        for s in self.scheduled:
            if s.running:
                times += [self.wall_to_monotonic(j.next_run_time) for j in s.get_jobs() if j.next_run_time]
        return min(times) if times else None

    def _fire_due(self) -> None:
        """Until nothing more is due now: the clock-watch looks, then APScheduler's due jobs, then wait for
        those runs (a run may plan another, e.g. a confirmation run with no delay)."""
        for _ in range(10_000):
            fired = False
            now = self.monotonic()
            for timer in list(self._timers):
                if not timer[3].is_set() and timer[0] <= now:
                    timer[0] += timer[1]
                    timer[2]()
                    fired = True
            for s in self.scheduled:
                if s.running and any(j.next_run_time and self.wall_to_monotonic(j.next_run_time) <= now
                                     for j in s.get_jobs()):
                    s._process_jobs()
                    fired = True
            self._wait_idle()
            if not fired:
                return
        raise AssertionError("the fake clock fired 10,000 times without time moving: a job that is always due")

    def _busy(self) -> bool:
        """A run submitted and not finished. (APScheduler counts a run after submitting it, so a run that
        ended at once leaves a count of 0 behind: only a positive count is a run.)"""
        for s in self.scheduled:
            for ex in s._executors.values():
                with ex._lock:
                    if any(n > 0 for n in ex._instances.values()):
                        return True
        return False

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + IDLE_TIMEOUT_S
        while self._busy():
            if time.monotonic() > deadline:
                raise AssertionError(f"runs still going after {IDLE_TIMEOUT_S:.0f} s of real time")
            time.sleep(0.002)  # polling the executors for the end of real runs
