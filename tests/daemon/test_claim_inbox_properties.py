"""Property tests of the claim inbox's gate (fleetcanary.daemon.claim_inbox.check): any bytes, any JSON,
and any record with its fields replaced by arbitrary JSON become an accepted RunRecord or one reason of
the fixed set, never an exception; what is accepted is this node's, of a probe that was asked for, inside
its time window, with finite and bounded GPU seconds and bounded series."""
from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fleetcanary.core.record import RunRecord
from fleetcanary.daemon import claim_inbox
from tests.support.helpers import free_port

NOW = 1_800_000_000.0
EXPECT = claim_inbox.Expect(node="gpu-a", invasive=frozenset({"gpu_bandwidth", "gpu_compute"}),
                            asked={"gpu_bandwidth": NOW - 600}, gpus=frozenset(str(i) for i in range(8)),
                            gpu_count=8, lifetime_seconds=5400.0, max_run_seconds=1800.0)
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30)


def good(**kw) -> dict:
    rec = RunRecord("gpu_bandwidth", "success", node="gpu-a", started_at=NOW - 30, wall_seconds=20.0,
                    result={"gpu_seconds": {"0": 15.0}, "figures": []},
                    samples=[{"metric": "m", "labels": {"gpu": "0"}, "value": 1.0}])
    return {**rec.to_json(with_samples=True), **kw}


def holds(rec, reason) -> None:
    """The gate's contract for one answer."""
    if rec is None:
        assert reason in claim_inbox.REASONS, reason
        return
    assert reason == "" and isinstance(rec, RunRecord)
    assert rec.node == EXPECT.node and rec.probe in EXPECT.asked and rec.trigger == "claim"
    assert math.isfinite(rec.started_at) and math.isfinite(rec.wall_seconds)
    assert EXPECT.asked[rec.probe] - claim_inbox.SKEW_SECONDS <= rec.started_at
    assert rec.finished_at <= NOW + claim_inbox.SKEW_SECONDS
    secs = rec.gpu_seconds
    assert set(secs) <= EXPECT.gpus and all(math.isfinite(v) and v >= 0 for v in secs.values())
    assert sum(secs.values()) <= (rec.wall_seconds + 1) * EXPECT.n_gpus
    assert len(rec.samples) <= claim_inbox.MAX_SAMPLES


@SETTINGS
@given(st.binary(max_size=2048))
def test_any_bytes_are_a_record_or_a_reason(raw):
    holds(*claim_inbox.check(raw, EXPECT, NOW)[:2])


@SETTINGS
@given(json_values)
def test_any_json_is_a_record_or_a_reason(value):
    try:
        raw = json.dumps(value).encode()
    except ValueError:
        return
    holds(*claim_inbox.check(raw, EXPECT, NOW)[:2])


FIELDS = ("probe", "outcome", "node", "started_at", "wall_seconds", "result", "samples", "environment",
          "reason", "detail", "exit_status", "probe_seconds", "schema", "trigger")


@SETTINGS
@given(st.dictionaries(st.sampled_from(FIELDS), json_values, min_size=1, max_size=4),
       st.dictionaries(st.text(max_size=4), json_values, max_size=3))
def test_a_record_with_any_fields_replaced_is_a_record_or_a_reason(replaced, gpu_seconds):
    obj = good(**replaced)
    if isinstance(obj.get("result"), dict) and gpu_seconds:
        obj["result"] = {**obj["result"], "gpu_seconds": gpu_seconds}
    holds(*claim_inbox.check(json.dumps(obj).encode(), EXPECT, NOW)[:2])


@SETTINGS
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(min_value=-10**30, max_value=10**30),
       st.sampled_from(["started_at", "wall_seconds", "gpu"]))
def test_any_number_in_a_time_or_gpu_seconds_is_a_record_or_a_reason(x, where):
    obj = good()
    if where == "gpu":
        obj["result"]["gpu_seconds"] = {"0": x}
    else:
        obj[where] = x
    raw = json.dumps(obj).encode()          # NaN and Infinity as Python writes them (json.loads reads them)
    holds(*claim_inbox.check(raw, EXPECT, NOW)[:2])


def test_the_good_record_is_accepted():
    rec, reason, _ = claim_inbox.check(json.dumps(good()).encode(), EXPECT, NOW)
    assert reason == "" and rec.probe == "gpu_bandwidth"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """A real daemon (no probes run, no Kubernetes) that publishes what the gate accepts."""
    from fleetcanary.core import config as configmod
    from fleetcanary.daemon.service import Daemon

    tmp = tmp_path_factory.mktemp("claim-props")
    p = tmp / "c.yaml"
    p.write_text(yaml.safe_dump({"node_name": "gpu-a", "state_dir": str(tmp / "state"),
                                 "server": {"listen_address": f"127.0.0.1:{free_port()}"},
                                 "gpu": {"xid_watch": "off"}, "kubernetes": {"mode": "off"}}))
    d = Daemon(configmod.load(p, env={}), config_path=str(p))
    d.server.stop()
    return d


@SETTINGS
@given(replaced=st.dictionaries(st.sampled_from(("result", "samples", "environment", "outcome", "reason",
                                                 "detail", "exit_status", "probe_seconds", "wall_seconds")),
                                json_values, min_size=1, max_size=3),
       sample=st.dictionaries(st.sampled_from(("metric", "labels", "value")), json_values, max_size=3))
def test_what_the_gate_accepts_publishes_without_an_error(daemon, replaced, sample):
    obj = good(**replaced)
    if isinstance(obj.get("samples"), list):
        obj["samples"] = [*obj["samples"], sample]
    rec, reason, _ = claim_inbox.check(json.dumps(obj).encode(), EXPECT, NOW)
    holds(rec, reason)
    event(f"accepted: {rec is not None}")
    if rec is not None:
        assert daemon.ingest([rec]) == []
        assert all(math.isfinite(v) for v in daemon.budget.left(window=3600).values())
