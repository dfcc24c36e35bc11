"""A poisoned claim inbox (issue 37): a real daemon and Claimer (the Kubernetes API stand-in of
tests/daemon/test_claim.py), a real claim asked for, real files in the inbox. Whatever lies in the inbox, it
drains: each hostile entry is moved into inbox/quarantine with one log line (no traceback) and counted in
fleetcanary_claim_records_rejected_total{reason}, and the good record written after it is still published.
Nothing counts for another node, the GPU budget stays finite, the series stay bounded."""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import pytest

from fleetcanary.core.record import RunRecord
from fleetcanary.daemon import claim_inbox
from tests.daemon.test_claim import (
    NODE,
    api,  # noqa: F401 - the fixture, used by name
    held_for_an_hour,
)
from tests.support.helpers import metric_value

METRIC = "fleetcanary_gpu_memory_bandwidth_bytes_per_second"
DAY = 86400.0


@pytest.fixture
def claimed(tmp_path, api):  # noqa: F811 - the fixture imported above
    """A daemon whose claim for gpu_bandwidth was asked for (its pod Pending); the claimer's clock."""
    claim_inbox.REJECTED.clear()
    d, now = held_for_an_hour(tmp_path, api)
    assert d.claimer.tick() == "created"
    yield d, now
    d.server.stop()


def record(now: float, **kw) -> dict:
    """A good record of the claim (what `fleetcanary claim` writes), with ``kw`` replacing fields."""
    rec = RunRecord("gpu_bandwidth", "success", node=NODE, started_at=now - 30, wall_seconds=20.0,
                    result={"gpu_seconds": {"0": 15.0}, "figures": []}, trigger="claim",
                    samples=[{"metric": METRIC, "labels": {"gpu": "0", "direction": "d2d"}, "value": 1e12}])
    return {**rec.to_json(with_samples=True), **kw}


def write(inbox: Path, name: str, content) -> Path:
    p = inbox / name
    p.write_bytes(content if isinstance(content, bytes) else
                  (content if isinstance(content, str) else json.dumps(content)).encode())
    return p


def ingest(d, caplog) -> list[logging.LogRecord]:
    """One tick of the claimer (the pod still Pending); the claim logger's lines."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fleetcanary.claim"):
        assert d.claimer.tick() in ("ingested", "waiting")
    return [r for r in caplog.records if r.name == "fleetcanary.claim"]


def left(d) -> dict[str, float]:
    return d.budget.left(window=3600, probe="gpu_bandwidth", interval=900)


def runs(d) -> dict[str, int]:
    return dict(d.store.state["gpu_bandwidth"].runs)


def series(d, name: str) -> int:
    return sum(1 for line in d.store.exposition.decode().splitlines() if line.startswith(name + "{"))


# --- each hostile entry: (a writer given the inbox and the claimer's clock, the reason it is refused) ----------
def _dir(inbox, now):
    (inbox / "1-bad.json").mkdir()
    (inbox / "1-bad.json" / "inner.json").write_text("{}")


def _link_to_record(inbox, now):
    outside = inbox.parent / "elsewhere.json"
    outside.write_text(json.dumps(record(now)))
    os.symlink(outside, inbox / "1-bad.json")


def _link_to_dir(inbox, now):
    os.symlink("/", inbox / "1-bad.json")


def _dangling_link(inbox, now):
    os.symlink(inbox.parent / "nowhere", inbox / "1-bad.json")


def _json(obj_fn):
    return lambda inbox, now: write(inbox, "1-bad.json", obj_fn(now))


def _text(text_fn):
    return lambda inbox, now: write(inbox, "1-bad.json", text_fn(now))


def _deep(n):
    head = json.dumps({"probe": "gpu_bandwidth", "outcome": "success", "node": NODE})[:-1]
    return lambda now: f'{head}, "started_at": {now - 30!r}, "result": {{"x": {"[" * n + "]" * n}}}}}'



def _gpu_seconds_text(value):
    return lambda now: json.dumps(record(now)).replace('"gpu_seconds": {"0": 15.0}', f'"gpu_seconds": {value}')


def _labels(n):
    return lambda now: record(now, samples=[{"metric": METRIC, "labels": {"gpu": str(i), "direction": "d2d"},
                                             "value": 1e12} for i in range(n)])


HOSTILE = {
    "a directory named *.json": (_dir, "not_a_file"),
    "a link to a good record elsewhere": (_link_to_record, "not_a_file"),
    "a link to a directory": (_link_to_dir, "not_a_file"),
    "a dangling link": (_dangling_link, "not_a_file"),
    "gpu_seconds a list": (_text(_gpu_seconds_text("[1, 2]")), "bad_gpu_seconds"),
    "gpu_seconds 1e999": (_text(_gpu_seconds_text('{"0": 1e999}')), "bad_gpu_seconds"),
    "gpu_seconds a string": (_text(_gpu_seconds_text('{"0": "15"}')), "bad_gpu_seconds"),
    "gpu_seconds past the run's duration": (_text(_gpu_seconds_text('{"0": 1e12}')), "bad_gpu_seconds"),
    "gpu_seconds on a GPU the node lacks": (_text(_gpu_seconds_text('{"99": 1.0}')), "bad_gpu_seconds"),
    "nesting past the parser's limit": (_text(_deep(100_000)), "too_deep"),
    "nesting past the record's bound": (_text(_deep(40)), "too_deep"),
    "another node's record": (_json(lambda now: record(now, node="gpu-b")), "wrong_node"),
    "a record without a node": (_json(lambda now: record(now, node="")), "wrong_node"),
    "stamped 30 days ahead": (_json(lambda now: record(now, started_at=now + 30 * DAY)), "bad_time"),
    "stamped 30 days ago": (_json(lambda now: record(now, started_at=now - 30 * DAY)), "bad_time"),
    "a duration of 1e999": (_text(lambda now: json.dumps(record(now)).replace('"wall_seconds": 20.0',
                                                                             '"wall_seconds": 1e999')), "bad_time"),
    "a start of NaN": (_text(lambda now: json.dumps(record(now, started_at="NaN"))), "bad_time"),
    "a probe no claim asked for": (_json(lambda now: record(now, probe="gpu_compute")), "not_asked"),
    "a probe that is not invasive": (_json(lambda now: record(now, probe="host_memory_bandwidth")),
                                     "unknown_probe"),
    "20,000 distinct gpu labels": (_json(_labels(20_000)), "too_many_series"),
    "3,000 distinct gpu labels": (_json(_labels(3_000)), "too_many_series"),
    "a gpu label the node lacks": (_json(lambda now: record(now, samples=[
        {"metric": METRIC, "labels": {"gpu": "12345", "direction": "d2d"}, "value": 1.0}])), "too_many_series"),
    "an environment of 10,000 GPUs": (_json(lambda now: record(now, environment={"gpus": [{"index": i} for i in
                                                                                           range(10_000)]})),
                                      "too_many_series"),
    "5 MiB": (_text(lambda now: json.dumps(record(now)) + " " * (5 << 20)), "too_large"),
    "not UTF-8": (_text(lambda now: b"\xff\xfe" + json.dumps(record(now)).encode()), "not_json"),
    "not JSON": (_text(lambda now: "{not json"), "not_json"),
    "a JSON array": (_text(lambda now: "[1, 2, 3]"), "malformed"),
    "an outcome that is a list": (_json(lambda now: record(now, outcome=["success"])), "malformed"),
    "samples that are a number": (_json(lambda now: record(now, samples=7)), "malformed"),
    "a sample that is a string": (_json(lambda now: record(now, samples=["x"])), "malformed"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_entry_is_set_aside_and_the_next_record_is_published(claimed, caplog, case):
    d, now = claimed
    inbox = d.claimer.inbox
    writer, reason = HOSTILE[case]
    writer(inbox, now[0])
    write(inbox, "2-good.json", record(now[0]))
    lines = ingest(d, caplog)
    # the good record after it is published, as the claim's run, and the hostile one is not
    assert runs(d)["success"] == 1
    last = d.store.state["gpu_bandwidth"].last
    assert (last.node, last.trigger, last.started_at) == (NODE, "claim", now[0] - 30)
    # drained: nothing named *.json is left in the inbox, the entry is in the quarantine, not lost
    assert [p.name for p in inbox.iterdir()] == ["quarantine"], list(inbox.iterdir())
    (kept,) = (inbox / "quarantine").iterdir()
    assert kept.name.endswith(f"-{reason}-1-bad.json") and (kept.is_symlink() or kept.exists())
    # one line for it, no traceback, counted by its reason
    refused = [r for r in lines if "1-bad.json" in r.getMessage()]
    assert len(refused) == 1 and f"({reason}:" in refused[0].getMessage(), [r.getMessage() for r in lines]
    assert not any(r.exc_info for r in lines)
    text = d.store.exposition.decode()
    assert metric_value(text, "fleetcanary_claim_records_rejected_total", reason=reason) == 1.0
    # the budget saw the good record's 15 GPU seconds only, and stays finite
    assert all(math.isfinite(v) for v in left(d).values())
    assert left(d)["0"] < 18.0 and "1" not in left(d)
    assert series(d, METRIC) == 1


def test_a_link_is_moved_never_followed(claimed, caplog):
    d, now = claimed
    inbox = d.claimer.inbox
    _link_to_record(inbox, now[0])
    target = inbox.parent / "elsewhere.json"
    before = target.read_bytes()
    ingest(d, caplog)
    assert not runs(d).get("success")           # the record the link points at was not read
    assert target.read_bytes() == before            # nor touched
    (kept,) = (inbox / "quarantine").iterdir()
    assert kept.is_symlink() and Path(os.readlink(kept)) == target


def test_another_nodes_record_counts_for_nothing(claimed, caplog):
    d, now = claimed
    full = left(d)
    write(d.claimer.inbox, "1-other.json", record(now[0], node="gpu-b"))
    ingest(d, caplog)
    assert d.store.state["gpu_bandwidth"].last.outcome == "skipped"   # still the tenant's skip: not published
    assert not runs(d).get("success") and left(d) == full         # nor charged
    assert metric_value(d.store.exposition.decode(), "fleetcanary_claim_records_rejected_total",
                        reason="wrong_node") == 1.0


def test_a_record_from_the_future_does_not_poison_the_store(claimed, caplog):
    d, now = claimed
    write(d.claimer.inbox, "1-future.json", record(now[0], started_at=now[0] + 30 * DAY))
    ingest(d, caplog)
    st = d.store.state["gpu_bandwidth"]
    assert st.last_success_ts is None and st.last_run_ts < now[0] + 1


def test_an_infinite_gpu_seconds_leaves_the_budget_finite(claimed, caplog):
    d, now = claimed
    write(d.claimer.inbox, "1-inf.json", _gpu_seconds_text('{"0": 1e999, "1": 1e999}')(now[0]))
    write(d.claimer.inbox, "2-good.json", record(now[0]))
    ingest(d, caplog)
    budget = left(d)
    assert all(math.isfinite(v) for v in budget.values()), budget
    assert budget["0"] == 18.0 - 3 * 15.0           # the good record's 15 s (at its hourly rate), not the inf
    assert "1" not in budget
    saved = json.loads((Path(d.settings.state_dir) / "gpu-budget.json").read_text())
    assert saved and all(math.isfinite(c[2]) for c in saved)


def test_20000_gpu_labels_publish_no_more_series_than_the_node_has_gpus(claimed, caplog):
    d, now = claimed
    for i, n in enumerate((20_000, 3_000)):
        write(d.claimer.inbox, f"{i}-labels.json", _labels(n)(now[0]))
        ingest(d, caplog)                   # one at a time: a later run's gauges would replace the earlier's
        assert series(d, METRIC) == 0
    write(d.claimer.inbox, "2-good.json", record(now[0]))
    ingest(d, caplog)
    assert series(d, METRIC) == 1


def test_a_record_whose_publishing_raises_is_set_aside_and_the_rest_published(claimed, caplog, monkeypatch):
    d, now = claimed
    apply = d.store.apply

    def broken(out):
        if out.started_at == now[0] - 40:
            raise RuntimeError("a store bug")
        return apply(out)
    monkeypatch.setattr(d.store, "apply", broken)
    write(d.claimer.inbox, "1-raises.json", record(now[0], started_at=now[0] - 40))
    write(d.claimer.inbox, "2-good.json", record(now[0]))
    lines = ingest(d, caplog)
    assert runs(d)["success"] == 1
    assert [p.name for p in d.claimer.inbox.iterdir()] == ["quarantine"]
    assert any("1-raises.json" in r.getMessage() and "(error:" in r.getMessage() for r in lines)
    assert not any(r.exc_info for r in lines)


def test_the_quarantine_is_bounded_and_names_never_clash(claimed, caplog):
    d, _ = claimed
    inbox = d.claimer.inbox
    for i in range(claim_inbox.MAX_QUARANTINE + 20):
        write(inbox, f"{i:04d}-junk.json", "{not json")
    ingest(d, caplog)
    for _ in range(3):                      # the same names again: moved beside, never over, the earlier ones
        write(inbox, "0000-junk.json", "{not json")
        ingest(d, caplog)
    kept = sorted(p.name for p in (inbox / "quarantine").iterdir())
    assert len(kept) == claim_inbox.MAX_QUARANTINE
    assert sum(1 for k in kept if k.endswith("-0000-junk.json")) == 3     # the newest kept, the oldest gone
    assert [p.name for p in inbox.iterdir()] == ["quarantine"]


def test_a_planted_quarantine_link_is_not_followed(claimed, caplog, tmp_path):
    d, _ = claimed
    inbox = d.claimer.inbox
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, inbox / "quarantine")
    write(inbox, "1-junk.json", "{not json")
    ingest(d, caplog)
    assert not list(elsewhere.iterdir())
    assert (inbox / "quarantine").is_dir() and not (inbox / "quarantine").is_symlink()
    assert len(list((inbox / "quarantine").iterdir())) == 1


def test_after_a_restart_the_claim_pods_records_are_still_accepted(claimed, caplog):
    """The claimer that asked is gone (an exporter restart): what the pod was asked for is read from its
    annotations, so its records are not refused as not asked for."""
    d, now = claimed
    d.claimer.asked.clear()
    write(d.claimer.inbox, "1-good.json", record(now[0]))
    ingest(d, caplog)
    assert runs(d)["success"] == 1


def test_a_flood_writes_the_budget_state_once_per_ingest(claimed, caplog, monkeypatch):
    """Each record with GPU seconds used to rewrite the whole budget file (every charge of the last day):
    N records, N writes of a growing file (4,000 took minutes; benchmarks/claim_flood.py). Now one."""
    d, now = claimed
    writes = []
    save = d._save_budget
    monkeypatch.setattr(d, "_save_budget", lambda: (writes.append(1), save()))
    for i in range(50):
        write(d.claimer.inbox, f"{i:04d}-flood.json", record(now[0], started_at=now[0] - 100 + i))
    ingest(d, caplog)
    assert runs(d)["success"] == 50
    assert len(writes) == 1
    saved = json.loads((Path(d.settings.state_dir) / "gpu-budget.json").read_text())
    assert len(saved) == 50                     # every charge in the one write
