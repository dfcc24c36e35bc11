import json
import os

import pytest

from exporter.history import FILENAME, History, HistoryError, read


def test_rotation_keeps_the_newest_within_bounds(tmp_path):
    h = History(str(tmp_path), max_bytes=64 << 10, backups=2)
    rec = {"probe": "p", "pad": "x" * 1000}
    for i in range(300):
        h.append({**rec, "i": i})
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [FILENAME, FILENAME + ".1", FILENAME + ".2"]
    assert all(p.stat().st_size <= 64 << 10 for p in tmp_path.iterdir())
    newest = read(tmp_path / FILENAME)
    assert newest[-1]["i"] == 299
    older = read(tmp_path / (FILENAME + ".1"))
    assert older[-1]["i"] == newest[0]["i"] - 1  # nothing lost between files


def test_no_backups_truncates(tmp_path):
    h = History(str(tmp_path), max_bytes=64 << 10, backups=0)
    for i in range(200):
        h.append({"i": i, "pad": "y" * 1000})
    assert [p.name for p in tmp_path.iterdir()] == [FILENAME]


def test_unwritable_state_dir_raises_history_error(tmp_path):
    target = tmp_path / "ro"
    target.mkdir()
    (target / FILENAME).mkdir()  # a directory where the file should be: open() fails for root too
    h = History(str(target), max_bytes=1 << 20, backups=1)
    with pytest.raises(HistoryError):
        h.append({"i": 1})


def test_read_skips_torn_lines(tmp_path):
    p = tmp_path / FILENAME
    p.write_text(json.dumps({"a": 1}) + "\n{not json\n" + json.dumps({"a": 2}) + "\n")
    assert [r["a"] for r in read(p)] == [1, 2]
    assert os.path.getsize(p) > 0
