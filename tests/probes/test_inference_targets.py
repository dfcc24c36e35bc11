"""inference with many targets (issue 37): with 1,000 targets every share of the run's deadline was too short for
a target's first request and every target failed as 'timeout' without one request sent; now each tried target
gets at least min_target_seconds, the ones the deadline cannot hold are deferred (counted, reason deadline) and
come first in the next run, against the reference streaming server on 127.0.0.1."""
import time

import pytest

from fleetcanary.offline.simulate_llm import SimSettings
from fleetcanary.probes.base import ProbeError
from fleetcanary.probes.inference import Config, Inference, Target
from tests.support.gpu import ctx, value
from tests.support.llm import sim_server

P = "fleetcanary_inference_"
N = 1000


@pytest.fixture(scope="module")
def fast_sim():
    srv, _ = sim_server(SimSettings(ttft_ms=2, itl_ms=1, max_tokens_default=4))
    with srv:
        yield f"{srv.url}/v1"


def targets(base, n=N, **kw):
    return tuple(Target(name=f"t{i:04d}", base_url=base, model="m", prefix_words=16, stream_max_tokens=4,
                        non_streaming=False, **kw) for i in range(n))


def run(config, context):
    try:
        return Inference().run(config, context)
    except ProbeError as exc:  # the record of a failed run, to say what failed
        raise AssertionError(f"the run failed: {exc.detail[:300]}") from None


def test_a_thousand_targets_are_tried_not_starved(tmp_path, fast_sim):
    # 2 s a target (the default is 1 s): one request to the local simulator took over a second once, on a machine
    # the suite's workers shared at load 10; what is tested is the sharing of the deadline, not its size
    config = Config(targets=targets(fast_sim), min_target_seconds=2.0)
    context = ctx(tmp_path, seconds=10.0)
    r = run(config, context)
    assert time.monotonic() < context.deadline_monotonic
    per = r.extra["targets"]
    tried = list(per)
    # every target the run tried got its requests sent and answered, none was cut before its first request
    assert tried and all(v["outcome"] == "success" for v in per.values()), per
    assert "not_sent" not in r.extra
    # every share at least min_target_seconds; only the run's first target may get less, when less than that was
    # left once the run had set up (a loaded machine), and then it is the only one tried
    first, *rest = per.values()
    assert all(v["budget_seconds"] >= 2.0 for v in rest)
    assert first["budget_seconds"] >= 2.0 or not rest, first
    assert all(value(r, P + "success", target=t) == 1 for t in tried)
    # the rest are deferred and counted, with their reason; none is both
    deferred = r.extra["not_tried"]
    assert deferred["reason"] == "deadline" and deferred["count"] == N - len(tried) > 0
    assert not set(deferred["targets"]) & set(tried)
    # the next run starts where this one stopped: the first deferred target is tried first
    r2 = run(config, ctx(tmp_path, seconds=10.0))
    assert next(iter(r2.extra["targets"])) == deferred["targets"][0]
    assert not set(r2.extra["targets"]) & set(tried)  # two short runs do not reach round to the first again


def test_targets_the_deadline_holds_are_all_tried_in_order(tmp_path, fast_sim):
    config = Config(targets=targets(fast_sim, n=5))
    r = run(config, ctx(tmp_path, seconds=20.0))
    assert list(r.extra["targets"]) == [f"t{i:04d}" for i in range(5)] and "not_tried" not in r.extra
    assert not (tmp_path / "inference" / "rotation.json").exists()  # nothing deferred, nothing to remember


def test_no_time_for_any_target_is_a_timeout_failure_not_a_success(tmp_path, fast_sim):
    with pytest.raises(ProbeError) as ei:
        Inference().run(Config(targets=targets(fast_sim, n=3)), ctx(tmp_path, seconds=0.5))
    assert ei.value.reason == "timeout" and ei.value.result.extra["not_tried"]["count"] == 3
