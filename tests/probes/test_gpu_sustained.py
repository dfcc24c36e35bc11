"""gpu_sustained: throttle-reason accounting on recorded NVML sequences (fake NVML), the sampler
thread walking a trace, and the burn on device "cpu" with tiny shapes."""
import json
import time

import pytest
from pydantic import ValidationError

from fleetcanary.probes.base import ProbeSkipped
from fleetcanary.probes.gpu_sustained import (
    BURN,
    CLOCK,
    RATIO,
    SLOWDOWN,
    TEMP,
    THROTTLE,
    THROUGHPUT,
    Config,
    GpuSustained,
)
from fleetcanary.probes.lib import load_trace, nvml
from tests.support.gpu import ctx, fake, value

# A short CPU burn, but with an initial window a busy host's first chunks cannot use up (0.1 s was: on a 2-core host at
# load 6 the two chunks skipped as warm-up took longer, and the burn failed with too_few_chunks).
TINY = dict(device="cpu", burn_seconds=0.8, size=16, per_chunk=1, initial_seconds=0.3, sample_interval_seconds=0.02)


def trace_from_fake(monkeypatch, name="h100_8gpu_sustained_trace", period=0.1):
    """Read every GPU once per tick, as the sampler does, with the recorded cadence as timestamps."""
    facts = json.loads(fake(monkeypatch, name).read_text())
    n = len(facts["devices"][0]["sequence"])
    with nvml.open_session() as s:
        handles = s.handles()
        traces = {g.index: [] for g in handles}
        for k in range(n):
            for g in handles:
                r = s.sample(g)
                traces[g.index].append(load_trace.Sample(k * period, r["sm_mhz"], r["mem_mhz"], r["power_w"],
                                                         r["temp_c"], r["mask"]))
    return traces


def test_time_per_throttle_reason_from_a_recorded_sequence(monkeypatch):
    traces = trace_from_fake(monkeypatch)
    hot = load_trace.account(traces[5], end=20.0, tail_from=15.0)
    assert hot["throttle_seconds"]["sw_power_cap"] == pytest.approx(15.0)
    assert hot["throttle_seconds"]["hw_thermal_slowdown"] == pytest.approx(12.0)
    assert hot["throttle_seconds"]["sw_thermal_slowdown"] == pytest.approx(12.0)
    assert hot["throttle_seconds"]["hw_power_brake_slowdown"] == 0.0
    assert set(hot["throttle_seconds"]) == set(nvml.THROTTLE_REASONS.values())
    assert hot["slowdown_ratio"] == pytest.approx(0.6)
    assert hot["sm_mhz_tail"] == 1410 and hot["power_w_tail"] == 700.0
    peers = [load_trace.account(traces[i], end=20.0, tail_from=15.0) for i in range(8) if i != 5]
    for p in peers:
        assert p["throttle_seconds"]["sw_power_cap"] == pytest.approx(15.0)  # every GPU reaches the cap under load
        assert p["slowdown_ratio"] == 0.0 and p["sm_mhz_tail"] == 1755
        assert p["temp_c_max"] < hot["temp_c_max"]


def test_the_last_sample_holds_until_the_burn_ends_and_unreadable_masks_count_nothing():
    s = [load_trace.Sample(0.0, mask=0x40), load_trace.Sample(1.0, mask=None), load_trace.Sample(2.0, mask=0x8)]
    acc = load_trace.account(s, end=2.5, tail_from=2.0)
    assert acc["throttle_seconds"]["hw_thermal_slowdown"] == pytest.approx(1.0)
    assert acc["throttle_seconds"]["hw_slowdown"] == pytest.approx(0.5)
    assert acc["covered_seconds"] == pytest.approx(1.5) and acc["slowdown_ratio"] == pytest.approx(1.0)


def test_the_sampler_thread_walks_the_trace_in_order_for_every_gpu(monkeypatch):
    facts = json.loads(fake(monkeypatch, "h100_8gpu_sustained_trace").read_text())
    with nvml.open_session() as s:
        sampler = load_trace.Sampler(s, s.handles(), period=0.005)
        sampler.start(time.monotonic())
        deadline = time.monotonic() + 30
        while len(sampler.traces.get(7, [])) < 60 and time.monotonic() < deadline:
            time.sleep(0.01)
        traces = sampler.stop()
    for i in range(8):
        got = [x.mask for x in traces[i]]
        want = [x["throttle_mask"] for x in facts["devices"][i]["sequence"]]
        assert len(got) >= 60 and got == want[:len(got)] + [want[-1]] * max(0, len(got) - len(want))
        ts = [x.t for x in traces[i]]
        assert ts == sorted(ts)
    assert not sampler.intruder and not sampler.errors


def test_cpu_burn_publishes_throughput_ratio_and_the_trace_accounting(tmp_path, monkeypatch):
    facts = json.loads(fake(monkeypatch, "h100_8gpu_sustained_trace").read_text())
    r = GpuSustained().run(Config(**{**TINY, "burn_seconds": 1.4}, detail=True), ctx(tmp_path))  # to the power cap
    figs = {f.name: f for f in r.figures}
    assert figs["sustained"].median > 0 and figs["initial"].median > 0
    assert value(r, RATIO, gpu="0") == pytest.approx(figs["sustained"].median / figs["initial"].median)
    assert value(r, THROUGHPUT, gpu="0", dtype="bf16") == figs["sustained"].median
    burn = value(r, BURN, gpu="0")
    assert burn >= 0.6
    rec = r.extra["per_gpu"]["0"]
    sm = [row[1] for row in rec["trace"]]
    assert sm and sm == [x["sm"] for x in facts["devices"][0]["sequence"]][:len(sm)]
    seen = rec["accounting"]["throttle_seconds"]
    assert set(seen) == set(nvml.THROTTLE_REASONS.values())  # every reason in the record
    for reason, secs in seen.items():  # a series for each reason active in the burn
        assert 0.0 <= secs <= burn and value(r, THROTTLE, gpu="0", reason=reason) == (secs if secs > 0 else None)
    assert any(secs > 0 for secs in seen.values()) and any(secs == 0 for secs in seen.values())
    assert value(r, SLOWDOWN, gpu="0") == 0.0  # GPU 0 of the trace never overheats
    assert value(r, CLOCK, gpu="0", clock="memory") == 2619e6
    assert value(r, TEMP, gpu="0") == max(row[4] for row in rec["trace"])
    assert r.gpu_seconds["0"] == burn


def test_by_default_the_burn_publishes_what_peers_are_judged_on_and_keeps_the_rest_in_the_record(tmp_path,
                                                                                                 monkeypatch):
    """Ratio and slowdown as series; throughput, clocks, power, temperature, throttle seconds and the burn's
    length (detail) in the run record only."""
    fake(monkeypatch, "h100_8gpu_sustained_trace")
    r = GpuSustained().run(Config(**TINY), ctx(tmp_path))
    assert {s.metric for s in r.samples} == {RATIO, SLOWDOWN}
    assert r.parameters["detail"] is False
    acc = r.extra["per_gpu"]["0"]["accounting"]
    assert acc["sm_mhz_tail"] and acc["power_w_tail"] and acc["temp_c_max"]
    assert {f.name for f in r.figures} >= {"sustained", "initial"}


def test_cpu_burn_without_nvml_still_gives_the_ratio(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETCANARY_FAKE_NVML", raising=False)
    monkeypatch.setattr(nvml, "_backend", lambda: (_ for _ in ()).throw(nvml.NvmlUnavailable("none", True)))
    r = GpuSustained().run(Config(**TINY), ctx(tmp_path))
    assert value(r, RATIO, gpu="0") > 0 and value(r, THROTTLE, gpu="0", reason="sw_power_cap") is None


def test_a_job_appearing_during_the_burn_stops_it_with_gpu_busy(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_busy")  # GPU 0 has a compute process that is not this worker
    with pytest.raises(ProbeSkipped) as ei:
        GpuSustained().run(Config(**{**TINY, "burn_seconds": 30.0, "initial_seconds": 1.0}), ctx(tmp_path))
    assert ei.value.reason == "gpu_busy" and "during the burn" in ei.value.detail


def test_bad_windows_are_refused_in_one_line():
    with pytest.raises(ValidationError) as ei:
        Config(burn_seconds=2.0, initial_seconds=1.8)
    assert "initial_seconds must end before the tail window" in str(ei.value)


def test_no_gpu_here_skips_with_no_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETCANARY_FAKE_NVML", raising=False)
    with pytest.raises(ProbeSkipped) as ei:
        GpuSustained().run(Config(), ctx(tmp_path))
    assert ei.value.reason == "no_gpu"


def test_gate_applies_before_the_burn(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_healthy")
    with pytest.raises(ProbeSkipped) as ei:
        GpuSustained().run(Config(), ctx(tmp_path, gpu={"budget_left_seconds": {str(i): 5.0 for i in range(8)}}))
    assert ei.value.reason == "budget"
