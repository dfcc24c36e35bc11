"""collectives: real gloo sweeps with 2 and 4 CPU ranks, correctness faults, stalls, nccl-tests parsing."""
import json
import math
import os
import time
import uuid
from pathlib import Path

import pytest

from fleetcanary.probes.base import ProbeError, ProbeSkipped
from fleetcanary.probes.collectives import ALGBW, BUSBW, COLLECTIVES, LAT, Collectives, Config, bus_factor, nccl_tests
from tests.support.gpu import ctx
from tests.support.helpers import pid_alive, run_job, wait_for

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_tests"
SIZES = (8, 4096, 262144)


def params(ranks, **kw):
    return {"backend": "gloo", "cpu_ranks": ranks, "collectives": list(COLLECTIVES), "sizes_bytes": list(SIZES),
            "warmup_iterations": 1, "iterations": 4, **kw}


def run_worker(tmp_path, p, timeout=60.0, env=None):
    return run_job(Collectives, p, tmp_path, timeout, kill_grace_seconds=1.0, env=env)


@pytest.mark.parametrize("ranks, detail", [(2, True), (4, False)])
def test_gloo_sweep_every_collective_consistent_with_nccl_tests_formulas(tmp_path, ranks, detail):
    """Bus bandwidth is published; algorithm bandwidth and latency as series with detail only, in the run
    record's figures either way."""
    out = run_worker(tmp_path, params(ranks, detail=detail))
    assert out.outcome == "success", (out.reason, out.detail)
    by = {}
    for s in out.samples:
        lab = s["labels"]
        assert lab["ranks"] == str(ranks) and lab["backend"] == "gloo"
        by[(s["metric"], lab["collective"], int(lab["size_bytes"]))] = s["value"]
    assert {m for m, _, _ in by} == ({LAT, ALGBW, BUSBW} if detail else {BUSBW})
    if not detail:  # the same figures from the record
        kinds = {"latency": LAT, "algbw": ALGBW, "busbw": BUSBW}
        for f in out.result["figures"]:
            kind = kinds[f["name"].rsplit("_", 1)[1]]
            by.setdefault((kind, f["labels"]["collective"], int(f["labels"]["size_bytes"])), f["median"])
    sweep = {(e["collective"], e["size_bytes"]): e for e in out.result["extra"]["sweep"]}
    for coll in COLLECTIVES:
        for size in SIZES:
            lat, alg, bus = by[(LAT, coll, size)], by[(ALGBW, coll, size)], by[(BUSBW, coll, size)]
            assert lat > 0 and alg > 0
            nbytes = sweep[(coll, size)]["bytes"]
            assert nbytes >= size - size % (4 * ranks) and nbytes % (4 * ranks) == 0
            # busbw = algbw x the nccl-tests factor, and algbw = bytes / time
            assert bus == pytest.approx(alg * bus_factor(coll, ranks), rel=1e-9)
            assert alg == pytest.approx(nbytes / lat, rel=1e-9)
            e = sweep[(coll, size)]
            assert len(e["time_seconds"]) == 4 and len(e["per_rank_time_seconds"]) == ranks
            # the published time is the slowest rank's, iteration by iteration
            assert e["time_seconds"] == [max(r[k] for r in e["per_rank_time_seconds"]) for k in range(4)]
    assert bus_factor("all_reduce", 4) == 1.5 and bus_factor("all_gather", 4) == 0.75
    assert out.result["extra"]["torch"]


# 4 ranks, the last corrupted: a rank other than the root's partner (2 ranks are the same check on fewer)
@pytest.mark.parametrize("ranks", [4])
def test_a_corrupted_rank_buffer_fails_the_probe(tmp_path, ranks):
    out = run_worker(tmp_path, params(ranks, collectives=["all_reduce", "all_to_all"], sizes_bytes=[4096]),
                     env={"FLEETCANARY_COLLECTIVES_FAULT": f"corrupt:{ranks - 1}"})
    assert (out.outcome, out.reason) == ("failure", "wrong_result"), out.detail
    assert f"rank {ranks - 1}" in out.detail
    assert out.samples == []  # no number from a wrong sweep


def _rank_pids(mark: str) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if mark.encode() in Path(f"/proc/{d}/environ").read_bytes():
                    pids.append(int(d))
            except OSError:
                continue
    return pids


def test_a_stalled_rank_ends_as_a_timeout_at_the_deadline_and_leaves_nothing(tmp_path):
    """No rank outlives the deadline. The run's rendezvous directory stays until the next run (below)."""
    mark = f"FLEETCANARY_TEST_MARK={uuid.uuid4()}"
    key, val = mark.split("=")
    seen: list[int] = []
    t0 = time.monotonic()
    out = run_worker(tmp_path, params(2, collectives=["all_reduce"], sizes_bytes=[8]), timeout=8.0,
                     env={"FLEETCANARY_COLLECTIVES_FAULT": "stall:1", key: val})
    elapsed = time.monotonic() - t0
    assert out.outcome == "timeout", (out.reason, out.detail)
    # not before the deadline (physics); how promptly after it is load-bound and not judged here (a delay
    # measured at one moment does not bound a wake-up at another): the outcome says the deadline ended it
    assert elapsed >= 8.0, elapsed
    seen = _rank_pids(mark)
    wait_for(lambda: not any(pid_alive(p) for p in seen), timeout=30, what="no rank left")
    assert not [p for p in _rank_pids(mark) if pid_alive(p)]


def test_sizes_above_the_gloo_cap_are_left_out():
    """What run() sweeps (the sweeps above run it with sizes under the cap)."""
    config = Config(sizes_bytes=(8, 4 << 20, 64 << 20))
    assert Collectives._sizes(config, "gloo") == [8, 4 << 20]
    assert Collectives._sizes(config, "nccl") == [8, 4 << 20, 64 << 20]
    with pytest.raises(ProbeSkipped) as ei:
        Collectives._sizes(Config(sizes_bytes=(64 << 20,)), "gloo")
    assert ei.value.reason == "not_configured"


def test_auto_uses_gloo_without_a_gpu_and_nccl_request_skips(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETCANARY_FAKE_NVML", raising=False)
    with pytest.raises(ProbeSkipped) as ei:
        Collectives().run(Config(backend="nccl"), ctx(tmp_path))
    assert ei.value.reason == "no_gpu"
    assert Collectives._plan(Config(), ctx(tmp_path))[:2] == ("gloo", 2)


# --- nccl-tests output parsing -----------------------------------------------------------
@pytest.mark.parametrize("backend", ["auto", "gloo", "nccl"])
def test_without_torch_the_probe_skips_with_dependency_missing(tmp_path, monkeypatch, backend):
    """A default install (no `gpu` extra) has no torch: a skip with its reason, not a rank failure."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(ProbeSkipped) as e:
        Collectives().run(Config(backend=backend), ctx(tmp_path))
    assert e.value.reason == "dependency_missing"


def test_parse_text_all_reduce():
    p = nccl_tests.parse_text((FIX / "all_reduce_perf_8xH100.txt").read_text())
    assert len(p["rows"]) == 24 and p["out_of_bounds"] == 0 and p["avg_busbw_gbps"] == pytest.approx(49.6713)
    assert p["nccl_version"] == 22703
    last = p["rows"][-1]
    assert last["size"] == 67108864 and last["count"] == 16777216 and last["redop"] == "sum"
    assert last["out_of_place"] == {"time_us": 384.5, "algbw_gbps": 174.54, "busbw_gbps": 305.44, "wrong": 0}
    # nccl-tests' own numbers obey the formula it documents
    for row in p["rows"][13:]:  # from 64 KiB, where two decimals carry the precision
        op = row["out_of_place"]
        assert op["busbw_gbps"] == pytest.approx(op["algbw_gbps"] * 2 * 7 / 8, rel=0.02)
        assert op["algbw_gbps"] == pytest.approx(row["size"] / op["time_us"] / 1e3, rel=0.02)


def test_parse_json_matches_text_semantics():
    p = nccl_tests.parse_json((FIX / "reduce_scatter_perf_8xH100.json").read_text())
    assert [r["size"] for r in p["rows"]] == [1048576, 2097152, 4194304]
    assert p["rows"][1]["out_of_place"]["busbw_gbps"] == pytest.approx(43.680267)
    assert math.isnan(p["rows"][2]["in_place"]["time_us"]) and p["rows"][2]["in_place"]["wrong"] is None
    assert p["nccl_version"] == 22703 and p["out_of_bounds"] == 0


def test_nccl_tests_results_become_the_same_metrics():
    parsed = {"all_reduce": nccl_tests.parse_text((FIX / "all_reduce_perf_8xH100.txt").read_text()),
              "reduce_scatter": nccl_tests.parse_json((FIX / "reduce_scatter_perf_8xH100.json").read_text()),
              "all_to_all": nccl_tests.parse_text((FIX / "alltoall_perf_unchecked.txt").read_text())}
    r = nccl_tests.to_result(parsed, [8, 1048576, 67108864], ranks=8)
    assert {s.metric for s in r.samples} == {BUSBW}  # algbw and latency with detail only
    r = nccl_tests.to_result(parsed, [8, 1048576, 67108864], ranks=8, detail=True)
    vals = {(s.metric, s.labels["collective"], s.labels["size_bytes"]): s.value for s in r.samples}
    assert vals[(BUSBW, "all_reduce", "67108864")] == pytest.approx(305.44e9)
    assert vals[(LAT, "all_reduce", "8")] == pytest.approx(18.42e-6)
    assert vals[(ALGBW, "reduce_scatter", "1048576")] == pytest.approx(33.694602e9)
    assert vals[(BUSBW, "all_to_all", "1048576")] == pytest.approx(26.07e9)
    assert all(s.labels["backend"] == "nccl" and s.labels["ranks"] == "8" for s in r.samples)
    assert (BUSBW, "all_reduce", "16") not in vals  # only configured sizes


def test_wrong_elements_in_nccl_tests_output_fail_the_probe():
    parsed = {"all_gather": nccl_tests.parse_text((FIX / "all_gather_perf_8xH100_wrong.txt").read_text())}
    with pytest.raises(ProbeError) as ei:
        nccl_tests.to_result(parsed, [2097152], ranks=8)
    assert ei.value.reason == "wrong_result" and "7 wrong elements" in ei.value.detail


def test_garbage_output_parses_to_nothing_not_an_exception():
    assert nccl_tests.parse_text("segfault\n\x00\xff garbage 1 2 3\n")["rows"] == []
    with pytest.raises(json.JSONDecodeError):
        nccl_tests.parse_json("{truncated")


def test_a_run_dir_a_killed_worker_left_is_removed_by_the_next_run_and_a_live_ones_is_kept(tmp_path):
    """The ranks meet through a file store in the run's own directory (no TCP port another process could take
    between picking it and rank 0 binding it); a worker killed at its deadline cannot remove its directory, so the
    next run removes every one whose worker is gone."""
    import subprocess
    import sys

    from fleetcanary.probes.collectives import probe

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    root = tmp_path / "collectives"
    (root / f"run-{gone.pid}-abc").mkdir(parents=True)
    (root / f"run-{gone.pid}-abc" / "store").write_bytes(b"x")
    (root / f"run-{os.getppid()}-def").mkdir()        # a live worker's (this test's parent stands in)
    (root / "unrelated").mkdir()
    fresh = Path(probe._run_dir(str(tmp_path)))
    assert sorted(p.name for p in root.iterdir()) == sorted([f"run-{os.getppid()}-def", "unrelated", fresh.name])
    assert fresh.name.startswith(f"run-{os.getpid()}-") and fresh.stat().st_mode & 0o777 == 0o700
