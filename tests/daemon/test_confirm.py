"""Confirmation runs (daemon/confirm.py): a run whose fast-path figure jumped starts a suspicion, and gets
extra runs minutes apart while they confirm it, so the judge's median turns within minutes, not intervals."""
import json
import random
import statistics

import pytest
import yaml

from fleetcanary.core import config as configmod
from fleetcanary.core.record import RunRecord
from fleetcanary.daemon.confirm import HISTORY, NOISE_HISTORY, Confirmer, threshold
from fleetcanary.daemon.service import Daemon
from fleetcanary.judge.stats import NOISE_MIN_RUNS
from tests.support.clock import FakeClock
from tests.support.fault_probes import FAULT_PROBES
from tests.support.helpers import free_port, http_get
from tests.support.helpers import metric_value as value

M = "fleetcanary_test_level"
ONLY_LEVEL = {"kubernetes": {"node_condition": {"probes": []}}}  # a probe map with the level probe alone


def rec(v: float, trigger: str = "schedule", outcome: str = "success", metric: str = M, series: str = "a") -> RunRecord:
    return RunRecord(probe="level", outcome=outcome, trigger=trigger,
                     samples=[{"metric": metric, "labels": {"series": series}, "value": v},
                              {"metric": M, "labels": {"series": "steady"}, "value": 1.0}])


def feed(c: Confirmer, values, change=0.05, runs=3, **kw) -> list[str]:
    return [c.jumped(rec(v, **kw), (M,), change, runs) for v in values]


def noisy(noise: float, n: int = NOISE_HISTORY, seed: int = 1) -> list[float]:
    """A level of 1.0 with normal run noise of this relative size."""
    rnd = random.Random(seed)
    return [1.0 + rnd.gauss(0.0, noise) for _ in range(n)]


def history(c: Confirmer, values) -> float:
    """Feed a series' runs (asking for nothing: confirm_runs 0); the median of the newest 3, which a jump is
    measured against."""
    assert feed(c, values, runs=0) == [""] * len(values)
    return statistics.median(values[-HISTORY:])


def test_a_7_percent_step_on_a_gpu_like_series_gets_three_confirmations_in_a_row():
    c = Confirmer()
    ref = history(c, noisy(0.01))
    assert threshold(noisy(0.01), 0.05) == 0.05  # 3 x ~1% noise is under confirm_change
    after = [ref * 0.93 * x for x in (1.005, 0.99, 1.01, 0.995)]  # the new level and its 1% noise
    said = feed(c, after[:1]) + feed(c, after[1:], trigger="confirmation")
    assert said[0] == (f"fleetcanary_test_level{{series=a}} {after[0] / ref - 1:+.0%} against the median of "
                       "its last 3 runs (threshold 5%); confirmation 1 of 3")
    assert [x.rsplit("; ", 1)[-1] for x in said[1:3]] == ["confirmation 2 of 3", "confirmation 3 of 3"]
    assert "before the suspicion" in said[1]  # measured against the remembered reference, not the newest runs
    assert said[3] == ""  # three confirmations were asked for: the suspicion ends
    # the level holds: the next scheduled run is no jump against its newest runs, and asks for nothing
    assert feed(c, [0.93]) == [""]


def test_a_one_off_junk_run_gets_exactly_one_confirmation():
    c = Confirmer()
    history(c, noisy(0.01))
    assert feed(c, [0.5])[0].endswith("confirmation 1 of 3")
    assert feed(c, [1.0], trigger="confirmation") == [""]  # normal again: the suspicion ends
    assert feed(c, [0.5], trigger="confirmation") == [""]  # a late one asks for nothing: no suspicion left


def test_a_noisy_series_asks_on_a_real_drop_but_not_on_a_wiggle():
    """A 1 MiB all-reduce with 4% run noise: its threshold is 3 x its noise, not the 5% that would ask on
    every third run; a GPU with 1% noise keeps 5%."""
    values = noisy(0.04)
    limit = threshold(values, 0.05)
    assert 0.09 < limit < 0.18
    c = Confirmer()
    ref = history(c, values)
    assert feed(c, [ref * 0.93]) == [""]  # a 7% wiggle
    c = Confirmer()
    ref = history(c, values)
    assert f"-20% against the median of its last 3 runs (threshold {limit:.0%})" in feed(c, [ref * 0.80])[0]
    # over 200 runs it asks far less often than a fixed 5% would
    runs = noisy(0.04, 200, seed=3)
    fixed = sum(abs(v / statistics.median(runs[i - HISTORY:i]) - 1) >= 0.05 for i, v in enumerate(runs) if i >= HISTORY)
    asked = sum(bool(x) for x in feed(Confirmer(), runs))
    assert fixed > 50 and asked < 15, (fixed, asked)
    # fewer than NOISE_MIN_RUNS figures: no noise known yet, confirm_change alone
    assert threshold(values[:NOISE_MIN_RUNS - 1], 0.05) == 0.05


def test_confirm_runs_1_is_the_old_single_confirmation():
    c = Confirmer()
    history(c, [1.0, 1.02, 0.98])
    assert feed(c, [0.80], runs=1)[0].endswith("(threshold 5%); confirmation 1 of 1")
    assert feed(c, [0.80], runs=1, trigger="confirmation") == [""]  # still low: no second one
    # without a confirmation (skipped: the GPU was busy) the next run still differs from the median and asks again
    c2 = Confirmer()
    assert feed(c2, [1.0, 1.0, 1.0, 0.8], runs=1)[-1] and feed(c2, [0.8], runs=1)[0]


def test_any_other_run_during_a_chain_ends_it_or_starts_a_fresh_one():
    c = Confirmer()
    history(c, [1.0] * 8)
    assert feed(c, [0.9])[0].endswith("confirmation 1 of 3")
    assert feed(c, [0.9], trigger="confirmation")[0].endswith("confirmation 2 of 3")
    assert feed(c, [0.9]) == [""]  # a scheduled run that does not jump (median of 1.0, 0.9, 0.9): the chain ends
    assert feed(c, [0.9], trigger="confirmation") == [""]
    # a scheduled run that jumps starts a fresh suspicion, counted from 1, against the median of its newest 3
    assert feed(c, [1.0])[0] == ("fleetcanary_test_level{series=a} +11% against the median of its last 3 runs "
                                 "(threshold 5%); confirmation 1 of 3")
    # a failed or skipped confirmation ends it: the daemon asks for no next one
    assert feed(c, [1.0], outcome="skipped", trigger="confirmation") == [""]
    assert feed(c, [0.9], trigger="confirmation") == [""]


def test_a_confirmation_run_a_failed_run_and_other_metrics_never_ask():
    c = Confirmer()
    feed(c, [1.0] * HISTORY)
    assert c.jumped(rec(0.5, trigger="confirmation"), (M,), 0.05, 3) == ""  # no suspicion to confirm
    assert c.jumped(rec(0.5, outcome="failure"), (M,), 0.05, 3) == ""
    assert c.jumped(rec(0.5, metric="fleetcanary_other"), (M,), 0.05, 3) == ""
    assert c.jumped(rec(0.5), (M,), 0.0, 3) == ""  # confirm_change 0: off
    assert c.jumped(rec(0.5), (M,), 0.05, 0) == ""  # confirm_runs 0: off
    # every figure was remembered: median(0.5, 0.5, 0.5) = 0.5, so 0.5 is no jump now
    assert c.jumped(rec(0.5), (M,), 0.05, 3) == ""


def test_too_long_a_confirm_delay_is_one_clear_config_error(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({**ONLY_LEVEL, "probes": {"level": {"interval_seconds": 60, "timeout_seconds": 5,
                                                                    "confirm_delay_seconds": 45}}}))
    with pytest.raises(configmod.ConfigError) as err:
        configmod.load(p, probe_map={"level": FAULT_PROBES["level"]}, env={})
    assert any("confirm_delay_seconds (45) must be at most half of interval_seconds (60)" in line
               for line in err.value.lines)
    p.write_text(yaml.safe_dump({**ONLY_LEVEL, "probes": {"level": {"interval_seconds": 60, "timeout_seconds": 5}}}))
    entry = configmod.load(p, probe_map={"level": FAULT_PROBES["level"]}, env={}).probe_entries()["level"]
    assert entry.effective_confirm_delay_seconds == 30.0  # the 300 s default, held to half the interval
    assert (entry.confirm_change, entry.confirm_runs) == (0.05, 3)


@pytest.mark.parametrize(("runs", "says"), [(-1, "greater than or equal to 0"), (11, "less than or equal to 10"),
                                            ("many", "a valid integer")])
def test_confirm_runs_out_of_bounds_is_one_clear_config_error(tmp_path, runs, says):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({**ONLY_LEVEL, "probes": {"level": {"interval_seconds": 600, "timeout_seconds": 5,
                                                                    "confirm_runs": runs}}}))
    with pytest.raises(configmod.ConfigError) as err:
        configmod.load(p, probe_map={"level": FAULT_PROBES["level"]}, env={})
    assert len(err.value.lines) == 1 and "\n" not in err.value.lines[0]
    assert f"probes.level.confirm_runs: Input should be {says}" in err.value.lines[0], err.value.lines


def test_the_daemon_runs_a_chain_of_confirmations_after_a_drop_and_after_the_recovery(tmp_path):
    """A real daemon and real workers on a fake clock (tests/support/clock.py): the level probe every
    600 s of schedule, its figure set through a file between steps. Each run takes real time (a worker
    starts, reads the file, reports); the schedule moves only when the test advances it, so every run
    comes exactly when planned however slow the machine, and the worker's deadline (60 s) only bounds
    a hang."""
    level = tmp_path / "level"
    level.write_text("1.0")
    port = free_port()
    interval, delay = 600.0, 30.0
    cfg = {**ONLY_LEVEL, "state_dir": str(tmp_path / "s"), "server": {"listen_address": f"127.0.0.1:{port}"},
           "probes": {"level": {"interval_seconds": interval, "timeout_seconds": 60, "jitter_seconds": 0,
                                "confirm_delay_seconds": delay, "params": {"value_file": str(level)}}}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    probe_map = {"level": FAULT_PROBES["level"]}

    def metrics() -> str:
        return http_get(f"http://127.0.0.1:{port}/metrics")[2].decode()

    def runs() -> float:
        return value(metrics(), "fleetcanary_probe_runs_total", probe="level", outcome="success") or 0

    def confirmations() -> float:  # published once there is one
        return value(metrics(), "fleetcanary_probe_confirmation_runs_total", probe="level") or 0.0

    with FakeClock() as clock:
        d = Daemon(configmod.load(p, probe_map=probe_map, env={}), config_path=str(p), probe_map=probe_map,
                   clock=clock)
        d.start()
        try:
            clock.advance(HISTORY * interval)          # runs at 0, 600, ... : HISTORY + 1 at 1.0
            assert (runs(), confirmations()) == (HISTORY + 1, 0.0)
            level.write_text("0.7")
            clock.advance(interval)                    # the drop, seen by a scheduled run
            assert (runs(), confirmations()) == (HISTORY + 2, 0.0)
            clock.advance(delay - 1)
            assert confirmations() == 0.0              # not before its delay ...
            clock.advance(1)
            assert (runs(), confirmations()) == (HISTORY + 3, 1.0)  # ... and at it
            clock.advance(delay)                       # it still sees the drop: a second one, a delay later
            assert (runs(), confirmations()) == (HISTORY + 4, 2.0)
            clock.advance(3 * interval - 2 * delay)    # the third (confirm_runs), then three scheduled runs
            assert (runs(), confirmations()) == (HISTORY + 8, 3.0)  # a level that holds asks for nothing more
            level.write_text("1.0")
            clock.advance(interval + 3 * delay)        # the recovery and its three confirmations
            assert (runs(), confirmations()) == (HISTORY + 12, 6.0)
        finally:
            d.stop()
    history = [json.loads(x) for x in (tmp_path / "s" / "results.jsonl").read_text().splitlines()]
    kinds = [h["trigger"] for h in history]
    seen = [float(line.split()[1]) for line in (tmp_path / "level.runs").read_text().splitlines()]
    assert list(zip(kinds, seen, strict=True)) == (
        [("schedule", 1.0)] * (HISTORY + 1) + [("schedule", 0.7)] + [("confirmation", 0.7)] * 3
        + [("schedule", 0.7)] * 3 + [("schedule", 1.0)] + [("confirmation", 1.0)] * 3)
