import time

import pytest

from fleetcanary.probes.base import ProbeContext, ProbeError
from fleetcanary.probes.host_memory_bandwidth import METRIC, Config, HostMemoryBandwidth, last_level_cache_bytes


def ctx(tmp_path):
    return ProbeContext(node_name="t", state_dir=str(tmp_path), deadline_monotonic=time.monotonic() + 60)


def test_reports_copy_and_triad_with_stream_byte_counting(tmp_path):
    cfg = Config(array_bytes=16 << 20, repeats=4, threads=2)
    res = HostMemoryBandwidth().run(cfg, ctx(tmp_path))
    figs = {f.name: f for f in res.figures}
    assert set(figs) == {"copy", "triad"}
    for f in figs.values():
        assert len(f.repeats) == 4 and f.median > 1e8
        assert f.dispersion["min"] <= f.median <= f.dispersion["max"]
        assert f.dispersion["cv"] >= 0
    assert {s.labels["op"]: s.value for s in res.samples if s.metric == METRIC} == \
        {"copy": figs["copy"].median, "triad": figs["triad"].median}
    assert res.parameters["array_bytes"] == 16 << 20 and res.parameters["threads"] == 2
    assert "STREAM" in res.parameters["byte_counting"]


def test_auto_size_is_at_least_four_times_the_llc(tmp_path):
    # the cap at 128 MiB, not the default 1 GiB: this VM's LLC is 480 MiB, and three 1 GiB arrays cost 9 CPU s
    llc, cap = last_level_cache_bytes(), 128 << 20
    res = HostMemoryBandwidth().run(Config(repeats=1, warmup=0, max_array_bytes=cap), ctx(tmp_path))
    assert res.parameters["last_level_cache_bytes"] == llc
    assert res.parameters["array_bytes"] >= min(4 * llc, cap)
    assert res.parameters["array_bytes"] >= 64 << 20
    assert res.parameters["array_bytes"] == min(max(4 * llc, 64 << 20), cap)


def test_a_wrong_result_fails_the_probe(tmp_path, monkeypatch):
    import numpy as np

    real_copyto = np.copyto

    def corrupt(dst, src, *a, **k):
        real_copyto(dst, src, *a, **k)
        dst[-1:] = -1.0

    monkeypatch.setattr(np, "copyto", corrupt)
    with pytest.raises(ProbeError) as ei:
        HostMemoryBandwidth().run(Config(array_bytes=8 << 20, repeats=1, threads=1), ctx(tmp_path))
    assert ei.value.reason == "verification_failed"
