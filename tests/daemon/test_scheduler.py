"""The scheduler on a fake clock (tests/support/clock.py): the real APScheduler job store, triggers and
thread pool, and our duplicate check, locks and clock watch, with time that moves only when the test moves
it. Hours of schedule take milliseconds and every time in an assertion is exact."""
import itertools
import threading

import pytest

from fleetcanary.daemon.scheduler import (
    BUDGET_WINDOW_SECONDS,
    CLOCK_CHECK_SECONDS,
    MAX_BUDGET_WINDOW_SECONDS,
    GpuBudget,
    Scheduler,
    budget_window,
)
from tests.support.clock import FakeClock


@pytest.fixture
def clock():
    with FakeClock() as c:
        yield c


def test_budget_is_a_sliding_hour_per_gpu():
    b = GpuBudget(0.005)
    assert b.seconds_per_window == 18.0
    b.add("0", 10.0, now=1000.0)
    b.add("0", 5.0, now=2000.0)
    b.add("1", 1.0, now=2000.0)
    assert b.left(now=2000.0) == {"0": 3.0, "1": 17.0}
    assert b.left(now=1000.0 + BUDGET_WINDOW_SECONDS + 1) == {"0": 13.0, "1": 17.0}


def test_budget_reads_the_clock_it_is_given(clock):
    b = GpuBudget(0.005, monotonic=clock.monotonic)
    b.add("0", 10.0)
    clock.advance(1800)
    assert b.left() == {"0": 8.0}
    clock.advance(1801)
    assert b.left() == {"0": 18.0}


def test_budget_window_is_the_interval_between_an_hour_and_a_day():
    assert budget_window(900) == BUDGET_WINDOW_SECONDS
    assert budget_window(6 * 3600) == 6 * 3600
    assert budget_window(86400) == MAX_BUDGET_WINDOW_SECONDS == 86400
    assert budget_window(7 * 86400) == 86400


def test_a_daily_burn_longer_than_an_hours_budget_fits_its_daily_window():
    """The sustained burn (22 s charged) after a day of hourly-window probes at their default shares
    (16.9 s an hour together): a sliding hour (18 s) could never hold it, its daily window (432 s) does."""
    b = GpuBudget(0.005)
    day = 86400.0
    t0 = 10 * day
    for k in range(96):  # every 15 minutes for a day: 4.225 s each = 16.9 s an hour
        b.add("0", 4.225, now=t0 + 900.0 * k, window=3600.0, probe="hourly")
    now = t0 + day - 1.0
    assert b.left(now=now)["0"] < 22.0  # the old sliding-hour view: the burn would skip with `budget`
    left = b.left(now=now, window=budget_window(day), probe="gpu_sustained", interval=day)["0"]
    assert abs(left - (432.0 - 96 * 4.225)) < 1e-9
    assert left >= 22.0


def test_a_daily_burn_counts_as_its_amortized_share_in_an_hour():
    b = GpuBudget(0.005)
    b.add("0", 22.0, now=1000.0, window=86400.0, probe="gpu_sustained")
    b.add("0", 2.0, now=1500.0, window=3600.0, probe="gpu_p2p")
    hour = b.left(now=2000.0, window=3600.0, probe="gpu_compute", interval=1800.0)["0"]
    assert abs(hour - (18.0 - 2.0 - 22.0 / 24)) < 1e-9
    # A daily window counts both in full.
    assert b.left(now=2000.0, window=86400.0)["0"] == 432.0 - 24.0
    # Still its share 20 hours later, when the hourly charge has left the hour; gone after a day.
    assert abs(b.left(now=1000.0 + 20 * 3600, window=3600.0)["0"] - (18.0 - 22.0 / 24)) < 1e-9
    assert b.left(now=1000.0 + 86400 + 1, window=3600.0)["0"] == 18.0


def test_a_probes_own_previous_run_counts_at_its_scheduled_rate_not_twice():
    """Jitter brings two daily burns 23 hours apart: the previous one is inside the day, yet the
    schedule allows one burn a day, so it must not leave the next one short."""
    b = GpuBudget(0.005)
    b.add("0", 22.0, now=0.0, window=86400.0, probe="gpu_sustained")
    b.add("0", 400.0, now=3600.0, window=3600.0, probe="other")
    now = 23 * 3600.0
    assert b.left(now=now, window=86400.0)["0"] == 10.0  # by time alone: 22 + 400 spent
    assert b.left(now=now, window=86400.0, probe="gpu_sustained", interval=86400.0)["0"] == 32.0
    # A probe running every 30 minutes has one more run of its own in an hour: its last charge once.
    c = GpuBudget(0.005)
    c.add("0", 0.3, now=0.0, probe="gpu_compute")
    c.add("0", 0.3, now=1800.0, probe="gpu_compute")
    assert abs(c.left(now=3500.0, probe="gpu_compute", interval=1800.0)["0"] - 17.7) < 1e-9


def test_exclusive_probes_never_overlap_and_each_runs(clock):
    """Three probes of one exclusive class fall due together, four times: the thread pool starts them at
    once and the class lock lets one run at a time (each holds the class for 0.1 s of real time, long
    enough for an overlap to show)."""
    active, overlaps, runs = set(), [], []
    lock = threading.Lock()
    gate = threading.Event()

    def run_probe(name):
        with lock:
            if active:
                overlaps.append((name, set(active)))
            active.add(name)
        gate.wait(0.1)  # holds the class; not waiting for a state
        with lock:
            active.discard(name)
            runs.append((clock.monotonic(), name))

    s = Scheduler(run_probe, workers=4, clock=clock)
    s.start()
    s.set_jobs({"a": (60.0, 0.0, "gpu"), "b": (60.0, 0.0, "gpu"), "c": (60.0, 0.0, "gpu")}, first_delay=False)
    t0 = clock.monotonic()
    clock.advance(200)
    s.shutdown()
    assert overlaps == []
    assert sorted(runs) == sorted((t0 + k * 60.0, n) for k in range(4) for n in "abc")


def test_jitter_delays_runs_but_stays_within_the_interval(clock):
    starts: list[float] = []
    s = Scheduler(lambda n: starts.append(clock.monotonic()), clock=clock)
    s.start()
    t0 = clock.monotonic()
    s.set_jobs({"x": (100.0, 10.0, None)})
    job = s._sched.get_job("x")
    assert job.trigger.jitter == 10.0 and job.trigger.interval.total_seconds() == 100.0
    assert job.max_instances == 1 and job.coalesce is True
    clock.advance(20 * 110.0)
    s.shutdown()
    assert 0 <= starts[0] - t0 <= 10.0  # the first run: within the jitter of the start
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) >= 18 and all(100.0 <= g <= 110.0 for g in gaps), gaps
    assert len(set(gaps)) > 1  # jittered, not a fixed cadence


def test_a_replan_right_after_a_run_does_not_run_the_probe_twice(clock):
    """A re-plan (reload, clock step) that asks for an immediate run just after one started must not
    make a burst: the duplicate is dropped and the cadence stays one interval."""
    starts: list[float] = []
    s = Scheduler(lambda name: starts.append(clock.monotonic()), workers=2, clock=clock)
    s.start()
    t0 = clock.monotonic()
    s.set_jobs({"x": (2.0, 0.0, None)}, first_delay=False)
    clock.advance(0.1)
    assert starts == [t0]
    s.set_jobs({"x": (2.0, 0.0, None)}, first_delay=False)  # asks for a run now, 0.1 s after the first
    clock.advance(0.5)
    assert starts == [t0], "the re-plan's run 0.1 s after the first was not dropped"
    clock.advance(5.0)
    s.shutdown()
    # the re-plan's own cadence resumes one interval after it (t0 + 0.1 + 2 k)
    assert starts == pytest.approx([t0, t0 + 2.1, t0 + 4.1])


@pytest.mark.parametrize("step", [-3600.0, 3600.0])
def test_a_wall_clock_step_replans_the_probes(clock, step):
    """APScheduler plans on the wall clock: after a step back every probe would stall for the step; after a
    step forward its catch-up run would come right after the last run. The clock watch sees the step
    against the monotonic clock and plans each probe one interval after its last start."""
    runs: list[float] = []
    jumps: list[float] = []
    s = Scheduler(lambda name: runs.append(clock.monotonic()), workers=2, clock=clock)
    s.on_clock_jump = jumps.append
    s.start()
    t0 = clock.monotonic()
    s.set_jobs({"quick": (1.0, 0.0, None)}, first_delay=False)
    clock.advance(1.25)
    assert runs == [t0, t0 + 1.0]
    clock.step_wall(step)
    t_step = clock.monotonic()
    clock.advance(5.0)
    s.shutdown()
    assert jumps == [pytest.approx(step)] and s.clock_jumps == 1
    after = [r for r in runs if r > t_step]
    # seen at the watch's next look (CLOCK_CHECK_SECONDS), and the 1 s cadence kept across the step:
    # no stall, no burst, no run lost
    assert CLOCK_CHECK_SECONDS <= 1.0
    assert runs == pytest.approx([t0 + k for k in range(7)]), runs
    assert len(after) == 5


def test_a_confirmation_run_comes_after_its_delay_and_moves_no_scheduled_run(clock):
    runs: list[tuple[float, str]] = []
    s = Scheduler(lambda name, trigger="schedule": runs.append((clock.monotonic(), trigger)), clock=clock)
    s.start()
    t0 = clock.monotonic()
    s.set_jobs({"x": (600.0, 0.0, None)}, first_delay=False)
    clock.advance(10)
    assert s.run_once("x", 30.0) is True and s.run_once("nope", 30.0) is False
    clock.advance(1200)
    s.shutdown()
    assert runs == [(t0, "schedule"), (t0 + 40.0, "confirmation"), (t0 + 600.0, "schedule"),
                    (t0 + 1200.0, "schedule")]


def test_a_confirmation_that_a_scheduled_run_came_before_is_dropped(clock):
    """The run that came first ends the suspicion or starts a new one (daemon/confirm.py); the confirmation
    would be a spent GPU run that asks for nothing."""
    runs: list[tuple[float, str]] = []
    s = Scheduler(lambda name, trigger="schedule": runs.append((clock.monotonic(), trigger)), clock=clock)
    s.start()
    t0 = clock.monotonic()
    s.set_jobs({"x": (600.0, 0.0, None)}, first_delay=False)
    clock.advance(500)
    assert s.run_once("x", 200.0) is True      # due at 700, after the scheduled run at 600
    clock.advance(300)
    assert s.run_once("x", 30.0) is True       # due at 830: nothing came between, it runs
    clock.advance(100)
    s.shutdown()
    assert runs == [(t0, "schedule"), (t0 + 600.0, "schedule"), (t0 + 830.0, "confirmation")]


def test_the_default_schedule_never_refuses_the_daily_burn():
    """Five days of every default GPU probe charging its expected_gpu_seconds at its interval plus
    APScheduler-style jitter (uniform 0..jitter after each planned time): the daily sustained burn
    runs every day after the first under the windowed budget; a sliding hour refused it every time."""
    import random

    from fleetcanary.core import config as configmod
    from fleetcanary.probes import PROBES

    settings = configmod.settings_model()()
    probes = {}
    for name, cls in PROBES.items():
        charge = cls.Config.model_fields.get("expected_gpu_seconds")
        entry = settings.probe_entries()[name]
        if charge is not None and entry.enabled:
            probes[name] = (float(charge.default), entry.interval_seconds, entry.effective_jitter_seconds)
    assert "gpu_sustained" in probes and probes["gpu_sustained"][1] == 86400
    rng = random.Random(19)
    events = []
    for name, (_, interval, jitter) in probes.items():
        offset = rng.uniform(0, interval)
        events += [(offset + k * interval + rng.uniform(0, jitter), name)
                   for k in range(int(5 * 86400 // interval) + 1)]
    events.sort()

    def sustained_runs(windowed: bool) -> tuple[int, int]:
        b = GpuBudget(settings.gpu.budget_ratio)
        ran = due = 0
        for t, name in events:
            cost, interval, _ = probes[name]
            w = budget_window(interval)
            left = (b.left(now=t, window=w, probe=name, interval=interval) if windowed else b.left(now=t)).get("0")
            if name == "gpu_sustained" and t > 86400:
                due += 1
            if left is not None and left < cost:
                continue
            ran += name == "gpu_sustained" and t > 86400
            b.add("0", cost, now=t, window=w if windowed else BUDGET_WINDOW_SECONDS, probe=name)
        return ran, due

    ran, due = sustained_runs(windowed=True)
    assert due >= 3 and ran == due
    assert sustained_runs(windowed=False)[0] == 0


def test_a_slot_aligned_probe_runs_on_the_wall_clock_grid_without_jitter():
    """Probe.slot_aligned (the fabric probe): every node's run starts at the same multiples of
    the interval since the epoch, whatever the configured jitter, also after a re-plan."""
    s = Scheduler(lambda n: None)
    s._sched.start(paused=True)  # plans only; nothing runs
    s.aligned = {"fabric"}
    for delays in (None, {"fabric": 1.234}):          # a first plan, then a clock-step re-plan
        s.set_jobs({"fabric": (300.0, 30.0, "gpu"), "other": (300.0, 30.0, None)}, delays=delays)
        job = s._sched.get_job("fabric")
        r = job.next_run_time.timestamp() % 300.0
        assert min(r, 300.0 - r) < 1e-3, job.next_run_time
        assert not job.trigger.jitter
        assert s._sched.get_job("other").trigger.jitter == 30.0
    s.shutdown()


def test_only_the_fabric_probe_is_slot_aligned():
    from fleetcanary.probes import PROBES

    assert [n for n, cls in PROBES.items() if cls.slot_aligned] == ["fabric"]
