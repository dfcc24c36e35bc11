"""`fleetcanary loadtest` against the reference server: finds the knee the server's capacity puts."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetcanary.offline.simulate_llm import SimSettings, start_in_thread
from fleetcanary.offline.loadtest import Dist, percentile

ROOT = Path(__file__).resolve().parents[2]


def test_concurrency_ramp_finds_the_knee_within_10_percent_of_capacity():
    s = SimSettings(ttft_ms=40, itl_ms=10, batch_size=8)
    server, _ = start_in_thread(s)
    try:
        out_tokens = 16
        capacity = s.batch_size / ((s.ttft_ms + (out_tokens - 1) * s.itl_ms) / 1000)  # 42.1 requests/s
        r = subprocess.run(
            [sys.executable, "-m", "fleetcanary", "loadtest", f"http://127.0.0.1:{server.server_address[1]}/v1",
             "--mode", "concurrency", "--concurrency", "4,8,12", "--step-seconds", "4",
             "--input-len", "fixed:16", "--output-len", f"fixed:{out_tokens}",
             "--slo-itl-p99", str(1.15 * s.itl_ms / 1000), "--slo-ttft-p99", "0.1", "--json"],
            capture_output=True, text=True, cwd=ROOT, timeout=180)
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["goodput_level"] == 8
    assert out["goodput_rps"] == pytest.approx(capacity, rel=0.10)
    steps = {st["level"]: st for st in out["steps"]}
    assert steps[12]["within_slo"] is False and steps[12]["itl_p99"] > 1.15 * s.itl_ms / 1000
    assert steps[4]["error_rate"] == 0 and steps[4]["ttft_p50"] >= 0.04


def test_poisson_workload_with_prefix_streaming_and_cancellation():
    server, sim = start_in_thread(SimSettings(ttft_ms=10, itl_ms=2))
    try:
        r = subprocess.run(
            [sys.executable, "-m", "fleetcanary", "loadtest", f"http://127.0.0.1:{server.server_address[1]}/v1",
             "--mode", "poisson", "--rates", "20", "--step-seconds", "3", "--input-len", "uniform:8:64",
             "--output-len", "lognormal:16:0.5", "--shared-prefix-ratio", "0.5", "--stream-ratio", "0.7",
             "--cancel-ratio", "0.3", "--json", "--seed", "3"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)["steps"][0]
    assert 30 <= st["started"] <= 100  # ~60 expected at 20/s for 3 s
    assert st["error_rate"] == 0 and st["cancelled"] > 0
    assert st["ttft_p99"] is not None and st["e2e_p50"] is not None


def test_bad_arguments_exit_2_with_one_line():
    r = subprocess.run([sys.executable, "-m", "fleetcanary", "loadtest", "http://127.0.0.1:9/v1", "--input-len",
                        "gaussian:3"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "fixed:N" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_distributions_and_percentiles():
    import random

    rng = random.Random(0)
    assert Dist.parse("fixed:7").sample(rng) == 7
    assert all(3 <= Dist.parse("uniform:3:9").sample(rng) <= 9 for _ in range(100))
    vals = sorted(Dist.parse("lognormal:100:0.3").sample(rng) for _ in range(2001))
    assert 90 <= vals[1000] <= 110
    assert percentile([1, 2, 3, 4], 0.5) == 2.5 and percentile([], 0.5) is None
