"""Confirmation runs (daemon/confirm.py): a run whose fast-path figure jumped gets one extra run soon
after, so the alerts' fast path can count three runs within about one interval."""
import json

import pytest
import yaml

from fleetcanary.core import config as configmod
from fleetcanary.core.record import RunRecord
from fleetcanary.daemon.confirm import HISTORY, Confirmer
from fleetcanary.daemon.service import Daemon
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


def feed(c: Confirmer, values, change=0.10, **kw) -> list[str]:
    return [c.jumped(rec(v, **kw), (M,), change) for v in values]


def test_a_jump_against_the_median_of_the_last_runs_asks_once_either_way():
    c = Confirmer()
    said = feed(c, [1.0, 1.02, 0.98, 0.95, 0.80])
    assert said[:4] == ["", "", "", ""]  # no history yet, then a 5% move
    assert said[4] == 'fleetcanary_test_level{series=a} -18% against the median of its last 3 runs'
    # its confirmation run agrees; then the level holds against the median of (0.95, 0.80, 0.79): no new jump
    assert feed(c, [0.79], trigger="confirmation") == [""]
    assert feed(c, [0.81, 0.80, 0.79]) == ["", "", ""]
    # back up by 25%: a jump too (a fault that cleared is confirmed as fast)
    assert "+25%" in feed(c, [1.0])[0]
    # without a confirmation (skipped: the GPU was busy) the next run still differs from the median and asks again
    c2 = Confirmer()
    assert feed(c2, [1.0, 1.0, 1.0, 0.8])[-1] and feed(c2, [0.8])[0]


def test_a_confirmation_run_a_failed_run_and_other_metrics_never_ask():
    c = Confirmer()
    feed(c, [1.0] * HISTORY)
    assert c.jumped(rec(0.5, trigger="confirmation"), (M,), 0.10) == ""
    assert c.jumped(rec(0.5, outcome="failure"), (M,), 0.10) == ""
    assert c.jumped(rec(0.5, metric="fleetcanary_other"), (M,), 0.10) == ""
    assert c.jumped(rec(0.5), (M,), 0.0) == ""  # confirm_change 0: off
    # the confirmation's figure was remembered: median(1.0, 0.5, 0.5) = 0.5, so 0.5 is no jump now
    assert c.jumped(rec(0.5), (M,), 0.10) == ""


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
    assert entry.confirm_change == 0.10


def test_the_daemon_runs_one_confirmation_after_a_drop_and_one_after_the_recovery(tmp_path):
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
            clock.advance(3 * interval - delay)        # three more scheduled runs at the new level
            assert (runs(), confirmations()) == (HISTORY + 6, 1.0)  # a level that holds asks for nothing more
            level.write_text("1.0")
            clock.advance(interval + delay)            # the recovery and its confirmation
            assert (runs(), confirmations()) == (HISTORY + 8, 2.0)
        finally:
            d.stop()
    history = [json.loads(x) for x in (tmp_path / "s" / "results.jsonl").read_text().splitlines()]
    kinds = [h["trigger"] for h in history]
    seen = [float(line.split()[1]) for line in (tmp_path / "level.runs").read_text().splitlines()]
    assert list(zip(kinds, seen, strict=True)) == (
        [("schedule", 1.0)] * (HISTORY + 1) + [("schedule", 0.7), ("confirmation", 0.7)]
        + [("schedule", 0.7)] * 3 + [("schedule", 1.0), ("confirmation", 1.0)])
