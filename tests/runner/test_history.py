import gzip
import json
import os

import pytest

from fleetcanary.core.record import RunRecord
from fleetcanary.runner.history import FILENAME, History, HistoryError, read


def run(i: int, pad: str = "x" * 1000) -> RunRecord:
    return RunRecord("p", "success", started_at=float(i), detail=pad, result={"i": i})


def test_rotation_keeps_the_newest_within_bounds(tmp_path):
    h = History(str(tmp_path), max_bytes=64 << 10, backups=2)
    for i in range(300):
        h.append(run(i))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [FILENAME, FILENAME + ".1", FILENAME + ".2"]
    assert all(p.stat().st_size <= 64 << 10 for p in tmp_path.iterdir())
    newest = read(tmp_path / FILENAME)
    assert newest[-1].result["i"] == 299
    older = read(tmp_path / (FILENAME + ".1"))
    assert older[-1].result["i"] == newest[0].result["i"] - 1  # nothing lost between files


def test_no_backups_truncates(tmp_path):
    h = History(str(tmp_path), max_bytes=64 << 10, backups=0)
    for i in range(200):
        h.append(run(i, "y" * 1000))
    assert [p.name for p in tmp_path.iterdir()] == [FILENAME]


def test_unwritable_state_dir_raises_history_error(tmp_path):
    target = tmp_path / "ro"
    target.mkdir()
    (target / FILENAME).mkdir()  # a directory where the file should be: open() fails for root too
    h = History(str(target), max_bytes=1 << 20, backups=1)
    with pytest.raises(HistoryError):
        h.append(run(1))


def test_a_record_round_trips_through_the_file(tmp_path):
    original = RunRecord("gpu_bandwidth", "failure", "cuda_error", "copy failed", node="n1", started_at=1700.5,
                         wall_seconds=3.25, probe_seconds=2.5, result={"figures": [{"name": "d2d", "median": 1.0}]},
                         environment={"gpu_model": "H200"}, exit_status=0, output_tail="warning\n",
                         samples=[{"metric": "m", "labels": {}, "value": 1.0}])
    History(str(tmp_path), 1 << 20, 1).append(original)
    back = read(tmp_path / FILENAME)
    assert len(back) == 1
    assert back[0].samples == []  # samples travel worker -> daemon only
    assert back[0] == RunRecord(**{**original.__dict__, "samples": []})
    assert back[0].source == str(tmp_path / FILENAME)


def test_a_schema_1_history_line_reads_as_a_run_record(tmp_path):
    old = {"schema": 1, "probe": "p", "node": "n", "outcome": "success", "reason": "", "detail": "",
           "started_at": 10.0, "duration_seconds": 4.0, "probe_seconds": 3.0, "record": {"figures": []},
           "environment": {}}
    p = tmp_path / "old.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write(json.dumps(old) + "\n")
    (r,) = read(p)
    assert (r.wall_seconds, r.probe_seconds, r.result) == (4.0, 3.0, {"figures": []})


def test_a_torn_last_line_keeps_the_whole_lines_before_it(tmp_path):
    p = tmp_path / FILENAME
    whole = json.dumps(run(1).to_json()) + "\n" + json.dumps(run(2).to_json()) + "\n"
    p.write_text(whole + '{"probe": "p", "outc')
    assert [r.result["i"] for r in read(p)] == [1, 2]
    assert os.path.getsize(p) > 0


@pytest.mark.parametrize("text, why", [
    ('{"a": 1}\n', "not a fleetcanary result"),
    ('{"probe": "p", "outcome": "sort of"}\n', "not a run record: outcome 'sort of'"),
    ('{"probe": "p", "outcome": "success"}\n{not json\n{"probe": "p", "outcome": "success"}\n', ":2: not JSON"),
    ('{"probe": "p", "outcome": "success", "result": [1]}\n', "result is not a JSON object"),
    ("", "empty file"),
])
def test_bad_files_are_one_line_errors_naming_the_place(tmp_path, text, why):
    p = tmp_path / "bad.jsonl"
    p.write_text(text)
    with pytest.raises(HistoryError) as e:
        read(p)
    assert why in str(e.value) and "\n" not in str(e.value)
