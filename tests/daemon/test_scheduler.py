import threading

from fleetcanary.daemon.scheduler import BUDGET_WINDOW_SECONDS, GpuBudget, Scheduler
from tests.support.helpers import wait_for


def test_budget_is_a_sliding_hour_per_gpu():
    b = GpuBudget(0.005)
    assert b.seconds_per_window == 18.0
    b.add("0", 10.0, now=1000.0)
    b.add("0", 5.0, now=2000.0)
    b.add("1", 1.0, now=2000.0)
    assert b.left(now=2000.0) == {"0": 3.0, "1": 17.0}
    assert b.left(now=1000.0 + BUDGET_WINDOW_SECONDS + 1) == {"0": 13.0, "1": 17.0}


def test_exclusive_probes_never_overlap_and_each_runs():
    active, overlaps, runs = set(), [], []
    lock = threading.Lock()
    gate = threading.Event()

    def run_probe(name):
        with lock:
            if active:
                overlaps.append((name, set(active)))
            active.add(name)
        gate.wait(0.3)
        with lock:
            active.discard(name)
            runs.append(name)

    s = Scheduler(run_probe, workers=4)
    s.set_jobs({"a": (1.0, 0.0, "gpu"), "b": (1.0, 0.0, "gpu"), "c": (1.0, 0.0, "gpu")}, first_delay=False)
    s.start()
    try:
        wait_for(lambda: {"a", "b", "c"} <= set(runs) and len(runs) >= 6, timeout=20, what="each probe to run")
    finally:
        s.shutdown()
    assert overlaps == []


def test_jitter_delays_runs_but_stays_within_the_interval():
    from datetime import datetime, timezone

    s = Scheduler(lambda n: None)
    s._sched.start(paused=True)  # jobs get their defaults once added to a started scheduler
    s.set_jobs({"x": (100.0, 10.0, None)})
    job = s._sched.get_job("x")
    s.shutdown()
    first = (job.next_run_time - datetime.now(timezone.utc)).total_seconds()
    assert 0 <= first <= 10.0
    assert job.trigger.jitter == 10.0 and job.trigger.interval.total_seconds() == 100.0
    assert job.max_instances == 1 and job.coalesce is True


def test_a_replan_right_after_a_run_does_not_run_the_probe_twice():
    """A re-plan (reload, clock step) that asks for an immediate run just after one started must not
    make a burst: the duplicate is dropped and the cadence stays one interval."""
    import time

    starts: list[float] = []
    s = Scheduler(lambda name: starts.append(time.monotonic()), workers=2)
    s.start()
    try:
        s.set_jobs({"x": (2.0, 0.0, None)}, first_delay=False)
        wait_for(lambda: len(starts) >= 1, timeout=10, what="the first run")
        s.set_jobs({"x": (2.0, 0.0, None)}, first_delay=False)  # asks for a run now
        wait_for(lambda: len(starts) >= 2, timeout=10, what="the next run")
    finally:
        s.shutdown()
    assert starts[1] - starts[0] >= 1.0, starts
