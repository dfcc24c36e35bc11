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
        self._intervals: dict[str, float] = {}
        self._exclusive: dict[str, str | None] = {}

    @property
    def running(self) -> bool:
        return self._sched.running

    def start(self) -> None:
        self._sched.start()

    def shutdown(self) -> None:
        if self._sched.running:
            self._sched.shutdown(wait=False)

    def _job(self, name: str) -> None:
        cls = self._exclusive.get(name)
        if cls is None:
            self._run_probe(name)
            return
        lock = self._locks[cls]
        # Serialize the class; wait at most one interval, then let the next trigger try.
        if not lock.acquire(timeout=self._intervals.get(name, 60.0)):
            log.warning("probe %s: exclusive class %r stayed busy for a whole interval; run dropped", name, cls)
            return
        try:
            self._run_probe(name)
        finally:
            lock.release()

    def set_jobs(self, jobs: dict[str, tuple[float, float, str | None]], first_delay: bool = True) -> None:
        """Replace all jobs. jobs: name -> (interval_seconds, jitter_seconds, exclusive class)."""
        for job in self._sched.get_jobs():
            job.remove()
        now = datetime.now(timezone.utc)
        for name, (interval, jitter, exclusive) in jobs.items():
            self._intervals[name] = interval
            self._exclusive[name] = exclusive
            delay = random.uniform(0, min(jitter, FIRST_RUN_MAX_DELAY_SECONDS)) if first_delay else 0.0
            self._sched.add_job(
                self._job, IntervalTrigger(seconds=interval, jitter=jitter or None, timezone=timezone.utc),
                args=[name], id=name, name=name, next_run_time=now + timedelta(seconds=delay),
                replace_existing=True,
            )
