"""No herd (fleetcanary.daemon.phase): a 500-node rollout starts at most a few daily burns in any minute, a node
keeps its slot across restarts, and a node without a name keeps a seed in its state directory. (The GPU budget
kept across restarts: tests/daemon/test_service.py.)"""
from __future__ import annotations

import json
import random
from collections import Counter

from fleetcanary.daemon import phase

DAY = 86400.0


def test_a_500_node_rollout_starts_at_most_a_few_daily_burns_in_any_minute():
    """Every exporter of 500 nodes restarts within the same 10 minutes; each plans gpu_sustained (daily) at its
    node's slot. Before (first runs within 10 s of the start) all 500 burns came within those 10 minutes."""
    rng = random.Random(7)
    rollout = 1_780_000_000.0
    starts = []
    for i in range(500):
        started = rollout + rng.uniform(0, 600)
        delay = phase.first_delay(started, DAY, phase.fraction(f"gpu-node-{i:04d}", "gpu_sustained"))
        assert 0 <= delay < DAY
        starts.append(started + delay)
    per_minute = Counter(int(t // 60) for t in starts)
    assert max(per_minute.values()) <= 4, per_minute.most_common(3)
    assert sum(1 for t in starts if t < rollout + 600 + 60) <= 4     # almost none in the rollout's own minutes
    # spread over the whole day: every 2-hour slice holds about 500/12 burns
    per_slice = Counter(int((t - rollout) // 7200) % 12 for t in starts)
    assert len(per_slice) == 12 and min(per_slice.values()) >= 20, per_slice


def test_a_restart_keeps_the_nodes_slot():
    f = phase.fraction("gpu-node-0042", "gpu_sustained")
    first = 1_780_000_000.0 + phase.first_delay(1_780_000_000.0, DAY, f)
    # restarted 3 hours after that run: the next run is a day after it, not now
    restarted = first + 3 * 3600
    assert restarted + phase.first_delay(restarted, DAY, f) == first + DAY
    # other probes of the same node sit elsewhere in their intervals
    assert f != phase.fraction("gpu-node-0042", "gpu_bandwidth")


def test_a_node_without_a_name_keeps_a_seed_in_its_state_directory(tmp_path):
    a = phase.seed(str(tmp_path), "")
    assert json.loads((tmp_path / "phase.json").read_text()) == {"seed": a}
    assert phase.seed(str(tmp_path), "") == a                  # kept across restarts
    assert phase.seed(str(tmp_path), "node-7") == "node-7"     # a name wins
    (tmp_path / "phase.json").write_text("{not json")
    b = phase.seed(str(tmp_path), "")                          # unreadable: a new seed, kept again
    assert b != a and phase.seed(str(tmp_path), "") == b


def test_the_daemon_plans_its_invasive_probes_at_the_nodes_slots_and_the_rest_at_once(tmp_path):
    import yaml

    from fleetcanary.core import config as configmod
    from fleetcanary.daemon.service import Daemon
    from tests.support.helpers import free_port

    cfg = {"state_dir": str(tmp_path), "node_name": "gpu-node-0042",
           "server": {"listen_address": f"127.0.0.1:{free_port()}"}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    d = Daemon(configmod.load(p, env={}), config_path=str(p))
    try:
        jobs = d._jobs()
        now = 1_780_000_000.0
        delays = d.first_delays(jobs, now=now)
        invasive = {n for n, (_, _, cls) in jobs.items() if cls == "gpu"}
        assert invasive and set(delays) == invasive             # host, storage, inference: the usual start
        for n in invasive:
            interval = jobs[n][0]
            assert delays[n] == phase.first_delay(now, interval, phase.fraction("gpu-node-0042", n))
        off = d.settings.model_copy(update={"gpu": d.settings.gpu.model_copy(update={"spread_first_runs": False})})
        d.settings = off
        assert d.first_delays(jobs, now=now) == {}
    finally:
        d.server.stop()

