"""Scheduling with APScheduler 3.x: interval plus jitter per probe.

One instance of a probe at a time (max_instances=1, missed runs coalesced), probes
of one ``exclusive`` class ("gpu") serialized by a lock, and a per-GPU, per-hour
GPU-time budget whose remainder is handed to invasive probes, which skip with
reason "budget" when it is spent.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections import defaultdict, deque
from datetime import datetime, timedelta, timezone
from typing import Callable

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

log = logging.getLogger("fleetcanary.scheduler")

BUDGET_WINDOW_SECONDS = 3600.0
FIRST_RUN_MAX_DELAY_SECONDS = 10.0
CLOCK_CHECK_SECONDS = 1.0
CLOCK_JUMP_SECONDS = 5.0
# A run that would start sooner than this share of its interval after the previous start is a
# duplicate (APScheduler's catch-up run racing a re-plan after a clock step, a reload) and is dropped.
MIN_GAP_SHARE = 0.5


def wall() -> float:
    """The wall clock as APScheduler sees it (tests shift it to simulate a step)."""
    return datetime.now(timezone.utc).timestamp()


class GpuBudget:
    """GPU seconds spent per GPU over a sliding hour."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio
        self._spent: dict[str, deque[tuple[float, float]]] = defaultdict(deque)
        self._lock = threading.Lock()

    @property
    def seconds_per_window(self) -> float:
        return self.ratio * BUDGET_WINDOW_SECONDS

    def add(self, gpu: str, seconds: float, now: float | None = None) -> None:
        with self._lock:
            self._spent[gpu].append((time.monotonic() if now is None else now, seconds))

    def left(self, now: float | None = None) -> dict[str, float]:
        now = time.monotonic() if now is None else now
        with self._lock:
            out = {}
            for gpu, dq in self._spent.items():
                while dq and dq[0][0] < now - BUDGET_WINDOW_SECONDS:
                    dq.popleft()
                out[gpu] = self.seconds_per_window - sum(s for _, s in dq)
            return out


class Scheduler:
    def __init__(self, run_probe: Callable[[str], None], workers: int = 16) -> None:
        self._run_probe = run_probe
        self._sched = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=workers)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone=timezone.utc,
        )
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._jobs: dict[str, tuple[float, float, str | None]] = {}
        self._last_start: dict[str, float] = {}  # monotonic start of each job's last run
        self._jobs_lock = threading.RLock()
        self._start_lock = threading.Lock()
        self.clock_jumps = 0
        self.on_clock_jump: Callable[[float], None] | None = None
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_clock, name="clock-watch", daemon=True)

    @property
    def running(self) -> bool:
        return self._sched.running

    def start(self) -> None:
        self._sched.start()
        self._watch.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._sched.running:
            self._sched.shutdown(wait=False)

    def _watch_clock(self) -> None:
        """APScheduler plans on the wall clock: after a step back (NTP, a VM restore) its next run
        times lie in the future and every probe would stall for as long as the step; after a step
        forward everything fires at once. Steps are seen against the monotonic clock, and the jobs
        are then planned again from the new wall time."""
        last_wall, last_mono = wall(), time.monotonic()
        while not self._stop.wait(CLOCK_CHECK_SECONDS):
            w, m = wall(), time.monotonic()
            step = (w - last_wall) - (m - last_mono)
            last_wall, last_mono = w, m
            if abs(step) < CLOCK_JUMP_SECONDS:
                continue
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

    def _job(self, name: str) -> None:
        interval, _, cls = self._jobs.get(name, (60.0, 0.0, None))
        now = time.monotonic()
        with self._start_lock:
            last = self._last_start.get(name)
            if last is not None and now - last < MIN_GAP_SHARE * interval:
                log.debug("probe %s: run %.3f s after the previous start dropped as a duplicate", name, now - last)
                return
            self._last_start[name] = now
        if cls is None:
            self._run_probe(name)
            return
        lock = self._locks[cls]
        # Serialize the class; wait at most one interval, then let the next trigger try.
        if not lock.acquire(timeout=interval):
            log.warning("probe %s: exclusive class %r stayed busy for a whole interval; run dropped", name, cls)
            return
        try:
            self._run_probe(name)
        finally:
            lock.release()

    def set_jobs(self, jobs: dict[str, tuple[float, float, str | None]], first_delay: bool = True,
                 delays: dict[str, float | None] | None = None) -> None:
        """Replace all jobs. jobs: name -> (interval_seconds, jitter_seconds, exclusive class)."""
        with self._jobs_lock:
            self._jobs = dict(jobs)
            for job in self._sched.get_jobs():
                job.remove()
            now = datetime.now(timezone.utc)
            for name, (interval, jitter, _) in jobs.items():
                delay = (delays or {}).get(name)
                if delay is None:
                    delay = random.uniform(0, min(jitter, FIRST_RUN_MAX_DELAY_SECONDS)) if first_delay else 0.0
                self._sched.add_job(
                    self._job, IntervalTrigger(seconds=interval, jitter=jitter or None, timezone=timezone.utc),
                    args=[name], id=name, name=name, next_run_time=now + timedelta(seconds=delay),
                    replace_existing=True,
                )
