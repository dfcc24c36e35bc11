"""core/statefile: the one reader and writer of the state directory. Reading takes any bytes and never raises;
writing never follows a link and never leaves a temporary; the directory checks and the lock refuse in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetcanary.core import statefile


@pytest.fixture(autouse=True)
def _clean_counts():
    statefile.ERRORS.clear()
    yield
    statefile.ERRORS.clear()


def test_a_missing_file_is_none_and_not_counted(tmp_path):
    assert statefile.read_json(tmp_path / "absent.json", "x.json", "starting empty") is None
    assert statefile.ERRORS.snapshot() == {}


@pytest.mark.parametrize("content,kind", [
    (b"\xff\xfe not utf-8", "not_utf8"),
    (b'{"a": ', "not_json"),
    (b"[" * 200_000, "too_deep"),
    (json.dumps([[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]).encode(), "too_deep"),
    (b'"a string"', "wrong_shape"),
    (b"12", "wrong_shape"),
])
def test_malformed_content_is_set_aside_counted_and_logged(tmp_path, caplog, content, kind):
    path = tmp_path / "gpu-budget.json"
    path.write_bytes(content)
    assert statefile.read_json(path, "gpu-budget.json", "starting from nothing spent") is None
    assert statefile.ERRORS.snapshot() == {("gpu-budget.json", kind): 1}
    lines = [r.getMessage() for r in caplog.records if r.name == "fleetcanary.state"]
    assert len(lines) == 1 and kind in lines[0] and "starting from nothing spent" in lines[0]
    assert "\n" not in lines[0]


def test_a_directory_a_fifo_and_a_link_are_refused_without_blocking(tmp_path):
    (tmp_path / "dir.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")  # opened O_NONBLOCK: no writer, yet the read returns at once
    secret = tmp_path / "outside"
    secret.write_text('["not yours"]')
    (tmp_path / "link.json").symlink_to(secret)
    for name in ("dir.json", "fifo.json", "link.json"):
        assert statefile.read_json(tmp_path / name, name, "ignored") is None
    assert statefile.ERRORS.snapshot() == {("dir.json", "not_a_file"): 1, ("fifo.json", "not_a_file"): 1,
                                           ("link.json", "symlink"): 1}


def test_a_file_over_the_bound_is_not_read(tmp_path):
    path = tmp_path / "coverage.json"
    path.write_bytes(b"[" + b"1," * 600 + b"1]")
    assert statefile.read_json(path, "coverage.json", "x", max_bytes=1000) is None
    assert statefile.ERRORS.snapshot() == {("coverage.json", "too_large"): 1}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=2048) | st.text(max_size=512).map(str.encode)
       | st.recursive(st.none() | st.booleans() | st.floats() | st.text(max_size=8),
                      lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=4),
                      max_leaves=40).map(lambda v: json.dumps(v).encode()))
def test_any_bytes_read_without_raising(tmp_path, raw):
    path = tmp_path / "any.json"
    path.write_bytes(raw)
    value = statefile.read_json(path, "any.json", "x", expect=(list, dict))
    assert value is None or isinstance(value, (list, dict))
    value, kind, _ = statefile.parse_json(raw)
    assert (kind is None) or (kind in statefile.KINDS and value is None)


def test_write_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    state = tmp_path / "state"
    state.mkdir()
    (state / "phase.json").symlink_to(victim)
    # the temporary's name planted as a link too: it is removed, never written through
    (state / f".phase.json.{os.getpid()}.tmp").symlink_to(victim)
    statefile.write_atomic(state / "phase.json", '{"seed": "x"}')
    assert victim.read_text() == "precious"
    assert not (state / "phase.json").is_symlink()
    assert json.loads((state / "phase.json").read_text()) == {"seed": "x"}
    assert sorted(p.name for p in state.iterdir()) == ["phase.json"]


def test_a_failed_write_leaves_no_temporary(tmp_path):
    target = tmp_path / "budget.json"
    target.write_text("[1]")
    with pytest.raises(TypeError):
        statefile.write_atomic(target, object())  # not str/bytes: fails before or while writing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.json"]
    assert target.read_text() == "[1]"


def test_append_refuses_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("")
    (tmp_path / "results.jsonl").symlink_to(victim)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        statefile.open_append(tmp_path / "results.jsonl")
    assert victim.read_text() == ""


def test_check_dir_refuses_what_others_can_write(tmp_path):
    ok = tmp_path / "ok"
    statefile.check_dir(ok)  # created 0700
    assert (os.stat(ok).st_mode & 0o777) == 0o700
    for mode in (0o770, 0o777, 0o1777, 0o720):
        d = tmp_path / f"m{mode:o}"
        d.mkdir()
        os.chmod(d, mode)
        with pytest.raises(statefile.StateDirError, match="writable by group or others"):
            statefile.check_dir(d)
    with pytest.raises(statefile.StateDirError, match="owned by uid"):
        statefile.check_dir(ok, uid=os.geteuid() + 1)
    (tmp_path / "link").symlink_to(ok)
    with pytest.raises(statefile.StateDirError, match="symbolic link"):
        statefile.check_dir(tmp_path / "link")
    (tmp_path / "file").write_text("")
    with pytest.raises(statefile.StateDirError, match=r"not a directory|File exists"):
        statefile.check_dir(tmp_path / "file")


def test_the_lock_keeps_a_second_process_out_and_dies_with_its_holder(tmp_path):
    lock = statefile.DirLock(tmp_path)
    lock.acquire()
    probe = ("import sys\nfrom fleetcanary.core import statefile\n"
             "try:\n    statefile.DirLock(sys.argv[1]).acquire()\n"
             "except statefile.StateLocked as e:\n    print(e); sys.exit(3)\nprint('acquired')\n")
    held = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert held.returncode == 3, held
    assert f"pid {os.getpid()}" in held.stdout and len(held.stdout.strip().splitlines()) == 1
    lock.release()
    free = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert free.returncode == 0 and free.stdout.strip() == "acquired", free
