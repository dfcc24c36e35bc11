"""State files that survive anything (issue 37): the state directory lives on the host and outlives every pod,
so whatever is in it (a torn write, a person's edit, a file another user planted, a future or past version's
format) must never stop the daemon's start (a crash loop that outlives pod restarts) and never make it write
anywhere but its own files. Each of gpu-budget.json, coverage.json, phase.json and judge/figures.jsonl gets
every hostile form below at once; the real daemon starts, counts each file in fleetcanary_state_errors_total
and writes nothing outside. Then planted links for results.jsonl and the temporary names, the state
directory's own checks, two daemons on one directory, and property tests of every reader
(core/statefile and the entry checks of each file).

Hostile inputs: 6 forms x 4 files (24, six daemon starts) and 2 wrong-typed files; 7 planted links
(results.jsonl, judge/figures.jsonl, its old and new temporary names, judge/ itself, phase.json.tmp, a
write_atomic temporary); 5 state-directory checks (world- and group-writable, a link, another owner, the
kubelet's fsGroup volume accepted and refused without setgid); 1 lock (two daemons).
Property tests: 200 examples each for the budget, coverage, phase, figure store and results history readers.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetcanary.core import statefile
from fleetcanary.core.record import RunRecord
from fleetcanary.daemon import phase
from fleetcanary.daemon.scheduler import GpuBudget
from fleetcanary.daemon.state import ResultStore
from fleetcanary.judge.store import FigureStore
from fleetcanary.probes import PROBES
from fleetcanary.runner import history as historymod
from tests.support.daemon import READY_TIMEOUT_S, Daemon
from tests.support.helpers import metric_value, unavailable

FILES = ("gpu-budget.json", "coverage.json", "phase.json", "judge/figures.jsonl")
ALL_OFF = {"probes": {n: {"enabled": False} for n in PROBES}}
OUTSIDE = b'{"secret": "a file of someone else; the daemon must never write it"}\n'
DEEP = b"[" * 200_000 + b"]" * 200_000


def _wrong_shape(name: str) -> bytes:
    """JSON that parses but is not what the file holds: each of these stopped the old daemon's start."""
    return {
        # KeyError on c[0] of an object
        "gpu-budget.json": json.dumps([{"0": 1}, ["0", time.time() - 60, 1.0, 3600.0, "gpu_bandwidth"], ["0", "x"],
                                       ["0", time.time() - 60, float("inf"), 3600.0, "p"]]).encode(),
        "coverage.json": json.dumps([{"0": 1}, ["0", "gpu_bandwidth", float("nan")], "abc"]).encode(),
        "phase.json": b"[1, 2]",  # AttributeError: a list has no .get
        # TypeError in the figure store's sort: a string time beside a number
        "judge/figures.jsonl": b'{"t": "5", "v": {}}\n{"t": 1700000000, "v": {}}\n{"t": 1700000100, "v": 3}\n',
    }[name].replace(b"Infinity", b"1e999")


def _sparse(path: Path, size: int) -> None:
    """A file of `size` bytes that takes no disk (a hole)."""
    path.write_bytes(b"")
    os.truncate(path, size)


FORMS = {
    # form: (write it into place, the kind counted)
    "wrong_shape": (lambda p, name: p.write_bytes(_wrong_shape(name)), "wrong_shape"),
    "wrong_depth": (lambda p, name: p.write_bytes(DEEP), "too_deep"),  # RecursionError in json.load
    "binary": (lambda p, name: p.write_bytes(bytes(random.Random(name).randrange(128, 256) for _ in range(4096))),
               "not_utf8"),
    "huge": (lambda p, name: _sparse(p, statefile.MAX_BYTES + 1), "too_large"),
    "directory": (lambda p, name: p.mkdir(), "not_a_file"),
    "symlink_outside": (lambda p, name: p.symlink_to(p.parents[len(Path(name).parts)] / "outside"), "symlink"),
}


def _plant(state: Path, form: str) -> None:
    state.mkdir(mode=0o700)
    (state / "judge").mkdir(mode=0o700)
    write, _ = FORMS[form]
    for name in FILES:
        write(state / name, name)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_daemon_starts_past_every_hostile_state_file_and_counts_each(tmp_path, form):
    outside = tmp_path / "outside"
    outside.write_bytes(OUTSIDE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(OUTSIDE)
    state = tmp_path / "state"
    _plant(state, form)
    if form == "symlink_outside":  # and the old temporary name of phase.json's write, with no phase.json to read
        (state / "phase.json.tmp").symlink_to(elsewhere)
    d = Daemon(tmp_path / "d", {**ALL_OFF, "state_dir": str(state)})  # ready, or the log's tail
    text = d.metrics()
    kind = FORMS[form][1]
    counted = {name: metric_value(text, "fleetcanary_state_errors_total", file=name, kind=kind) for name in FILES}
    assert all(counted.values()), (counted, d.log()[-3000:])
    assert d.stop() == 0
    log = d.log()
    assert "Traceback" not in log, log[-3000:]
    for name in FILES:  # one line for each file set aside (the figure store's lines: one for the file)
        assert sum(1 for line in log.splitlines() if f"state {name}:" in line) >= 1, (name, log[-3000:])
    assert outside.read_bytes() == OUTSIDE and elsewhere.read_bytes() == OUTSIDE
    assert json.loads((state / "phase.json").read_text())["seed"] if form != "directory" else True


def test_a_planted_link_for_results_jsonl_is_never_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(OUTSIDE)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / historymod.FILENAME).symlink_to(outside)
    h = historymod.History(str(state), 1 << 20, 2)
    h.append(RunRecord(probe="host_memory_bandwidth", outcome="success", started_at=time.time() - 1, wall_seconds=1))
    assert outside.read_bytes() == OUTSIDE
    path = state / historymod.FILENAME
    assert not path.is_symlink() and len(historymod.read(path)) == 1
    assert statefile.ERRORS.snapshot().get((historymod.FILENAME, "symlink")) == 1


def test_planted_links_for_the_figure_store_and_its_temporary_names_are_never_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(OUTSIDE)
    judge = tmp_path / "state" / "judge"
    judge.mkdir(parents=True, mode=0o700)
    for name in ("figures.jsonl", "figures.tmp", f".figures.jsonl.{os.getpid()}.tmp"):  # the old and the new
        (judge / name).symlink_to(outside)
    store = FigureStore(str(tmp_path / "state"))
    samples = [{"metric": "fleetcanary_host_memory_bandwidth_bytes_per_second", "labels": {"op": "copy"},
                "value": 5e10}]
    now = time.time()
    assert store.observe(RunRecord(probe="host_memory_bandwidth", outcome="success", started_at=now - 10,
                                   wall_seconds=10, samples=samples))
    assert outside.read_bytes() == OUTSIDE
    assert not (judge / "figures.jsonl").is_symlink() and len(list(store._lines())) == 1


def test_write_atomic_removes_a_planted_temporary_and_writes_the_target_only(tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(OUTSIDE)
    target = tmp_path / "gpu-budget.json"
    (tmp_path / f".{target.name}.{os.getpid()}.tmp").symlink_to(outside)
    statefile.write_atomic(target, "[]")
    assert outside.read_bytes() == OUTSIDE and target.read_text() == "[]" and not target.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-budget.json", "outside"]  # no temporary left


def _start_fails(tmp_path: Path, state: Path) -> tuple[int, str]:
    """`fleetcanary run` on `state`: its exit status and output, once it exits (a hang fails the test)."""
    d = Daemon(tmp_path / "d", {**ALL_OFF, "state_dir": str(state)}, ready=False)
    try:
        rc = d.proc.wait(timeout=READY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the daemon started on {state}; log:\n{d.log()[-2000:]}")
    return rc, d.log()


@pytest.mark.parametrize("case", ["world_writable", "group_writable", "a_symlink"])
def test_a_state_directory_others_can_plant_files_in_is_refused_with_one_line(tmp_path, case):
    state = tmp_path / "state"
    if case == "a_symlink":
        real = tmp_path / "real"
        real.mkdir(mode=0o700)
        state.symlink_to(real)
    else:
        state.mkdir()
        os.chmod(state, 0o777 if case == "world_writable" else 0o770)
    rc, log = _start_fails(tmp_path, state)
    lines = [ln for ln in log.splitlines() if ln.strip()]
    assert rc != 0 and "Traceback" not in log and len(lines) == 1, log
    assert "state directory" in lines[0] and ("writable by group or others" in lines[0] or "symbolic link" in lines[0])


def test_a_state_directory_of_another_user_is_refused_with_one_line(tmp_path):
    if os.geteuid() != 0:
        unavailable("needs root to hand a directory to another user")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, 65533, 65533)
    rc, log = _start_fails(tmp_path, state)
    lines = [ln for ln in log.splitlines() if ln.strip()]
    assert rc != 0 and "Traceback" not in log and len(lines) == 1 and "owned by uid 65533" in lines[0], log


def test_a_second_daemon_on_the_same_state_directory_refuses_and_the_first_keeps_serving(tmp_path):
    first = Daemon(tmp_path / "a", ALL_OFF)
    second = Daemon(tmp_path / "b", {**ALL_OFF, "state_dir": str(first.state_dir)}, ready=False)
    try:
        rc = second.proc.wait(timeout=READY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a second daemon runs on {first.state_dir}; log:\n{second.log()[-2000:]}")
    log = second.log()
    assert rc != 0 and "Traceback" not in log, log
    refusals = [ln for ln in log.splitlines() if "in use by another fleetcanary daemon" in ln]
    assert len(refusals) == 1 and f"pid {first.pid}" in refusals[0], log
    assert first.get("/readyz")[0] == 200
    assert first.stop() == 0
    again = Daemon(tmp_path / "c", {**ALL_OFF, "state_dir": str(first.state_dir)})  # the lock went with it
    assert again.stop() == 0


# --- every reader, on anything ------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=4), inner, max_size=5),
    max_leaves=20)
# a file's bytes: arbitrary bytes, or JSON (lists of entries of about the right shape among them)
ENTRY = st.lists(st.one_of(st.text(max_size=3), st.floats(allow_nan=True, allow_infinity=True),
                           st.integers(min_value=-(2 ** 70), max_value=2 ** 70), st.none()), max_size=6)
CONTENT = st.one_of(st.binary(max_size=300),
                    JSON.map(lambda v: json.dumps(v).encode()),
                    st.lists(st.one_of(ENTRY, JSON), max_size=8).map(lambda v: json.dumps(v).encode()))
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


_SCRATCH = tempfile.TemporaryDirectory(prefix="fc-prop-")  # removed when the test process ends


def _in_file(raw: bytes, name: str) -> Path:
    """The bytes in a file of a fresh directory of its own."""
    d = Path(tempfile.mkdtemp(dir=_SCRATCH.name))
    path = d / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    return path


@PROPERTY
@given(CONTENT)
def test_the_budget_reader_never_raises_and_keeps_only_finite_past_charges(raw):
    path = _in_file(raw, "gpu-budget.json")
    data = statefile.read_json(path, "gpu-budget.json", "test", expect=list) or []
    budget, now, dropped = GpuBudget(0.01, monotonic=lambda: 1e6), time.time(), []
    kept = budget.restore(data, now, drop=lambda kind, detail: dropped.append(kind))
    charges = budget.dump(now)
    assert kept == len(charges) and all(isinstance(x, (int, float)) for c in charges for x in c[1:4])
    assert all(abs(x) != float("inf") and x == x for c in charges for x in c[1:4])
    assert set(dropped) <= {"wrong_shape", "future"}
    budget.left()  # usable


@PROPERTY
@given(CONTENT)
def test_the_coverage_reader_never_raises_and_keeps_only_finite_past_times(raw):
    path = _in_file(raw, "coverage.json")
    data = statefile.read_json(path, "coverage.json", "test", expect=list) or []
    store = ResultStore(PROBES, ["gpu_bandwidth"])
    store.restore_coverage(data, now=time.time(), drop=lambda kind, detail: None)
    assert all(0 < ts <= time.time() + 600 for ts in store.last_measured.values())


@PROPERTY
@given(CONTENT)
def test_the_phase_reader_never_raises_and_always_gives_a_seed(raw):
    path = _in_file(raw, "phase.json")
    seed = phase.seed(str(path.parent), "")
    assert isinstance(seed, str) and seed
    assert phase.seed(str(path.parent), "") == seed  # kept


LINES = st.lists(st.one_of(st.binary(max_size=60), JSON.map(lambda v: json.dumps(v).encode()),
                           st.fixed_dictionaries({"t": JSON, "v": JSON}, optional={"u": JSON, "d": JSON})
                           .map(lambda v: json.dumps(v).encode())), max_size=8)


@PROPERTY
@given(LINES)
def test_the_figure_store_reader_never_raises(lines):
    path = _in_file(b"\n".join(lines), "judge/figures.jsonl")
    store = FigureStore(str(path.parent.parent))
    store.snapshot()
    samples = [{"metric": "fleetcanary_host_memory_bandwidth_bytes_per_second", "labels": {"op": "copy"},
                "value": 5e10}]
    store.observe(RunRecord(probe="host_memory_bandwidth", outcome="success", started_at=time.time() - 10,
                            wall_seconds=10, samples=samples))  # a compaction over whatever was there
    assert all(isinstance(ln["t"], float) for ln in store._lines())


@PROPERTY
@given(st.one_of(st.binary(max_size=300), LINES.map(b"\n".join)))
def test_the_results_history_reader_raises_only_its_one_line_error(raw):
    path = _in_file(raw, "results.jsonl")
    error, runs = "", []
    try:
        runs = historymod.read(path)
    except historymod.HistoryError as exc:
        error = str(exc)
    assert "\n" not in error and all(isinstance(r, RunRecord) for r in runs)



def test_a_kubernetes_fsgroup_volume_is_accepted_and_the_same_directory_without_setgid_refused():
    """The base DaemonSet's emptyDir, as the kubelet hands it to fsGroup 65532: root-owned, group 65532, 2777
    (its parent under /var/lib/kubelet/pods is root's only). The same modes without the setgid bit: refused."""
    if os.geteuid() != 0:
        unavailable("needs root to make a directory of another owner and run as 65532")
    top = Path(tempfile.mkdtemp(prefix="fc-fsgroup-"))  # pytest's own tmp is root's only: 65532 must reach it
    os.chmod(top, 0o755)
    state = top / "state"
    state.mkdir()
    os.chown(state, 0, 65532)
    check = [sys.executable, "-c", f"from fleetcanary.core import statefile; statefile.check_dir({str(state)!r})"]
    as_65532 = ["setpriv", "--reuid", "65532", "--regid", "65532", "--clear-groups", *check]
    os.chmod(state, 0o2777)
    ok = subprocess.run(as_65532, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr[-2000:]
    os.chmod(state, 0o777)
    assert not os.stat(state).st_mode & 0o2000
    refused = subprocess.run(as_65532, capture_output=True, text=True, timeout=60)
    shutil.rmtree(top)
    assert refused.returncode != 0 and "owned by uid 0" in refused.stderr, refused.stderr[-2000:]


def test_a_judge_directory_planted_as_a_link_is_never_written_through(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "judge").symlink_to(elsewhere)
    store = FigureStore(str(state))
    samples = [{"metric": "fleetcanary_host_memory_bandwidth_bytes_per_second", "labels": {"op": "copy"},
                "value": 5e10}]
    assert store.observe(RunRecord(probe="host_memory_bandwidth", outcome="success", started_at=time.time() - 10,
                                   wall_seconds=10, samples=samples))
    assert list(elsewhere.iterdir()) == [] and len(store.snapshot()) == 1  # kept in memory only
    assert statefile.ERRORS.snapshot().get(("judge/figures.jsonl", "symlink")) == 1


def test_the_budget_and_the_coverage_come_back_from_their_files_and_a_failed_write_is_one_line(tmp_path, caplog):
    """daemon/state_files.py: what one process keeps, the next restores; a write that fails is one line and
    nothing else (the daemon goes on with what it holds in memory)."""
    from fleetcanary.daemon.state_files import BUDGET_FILE, COVERAGE_FILE, StateFiles


    files = StateFiles(str(tmp_path))
    budget, store = GpuBudget(0.1), ResultStore(PROBES, ["gpu_bandwidth"])
    budget.add("0", 12.5, window=3600.0, probe="gpu_bandwidth")
    store.apply(RunRecord("gpu_bandwidth", "success", started_at=time.time() - 30, wall_seconds=20,
                          result={"gpu_seconds": {"0": 12.5, "3": 12.5}}))
    files.save_budget(budget)
    files.save_coverage(store)
    assert [c[0] for c in json.loads((tmp_path / BUDGET_FILE).read_text())] == ["0"]
    assert sorted(g for g, _, _ in json.loads((tmp_path / COVERAGE_FILE).read_text())) == ["0", "3"]
    again_budget, again = GpuBudget(0.1), ResultStore(PROBES, ["gpu_bandwidth"])
    files.restore_budget(again_budget)
    files.restore_coverage(again)
    assert again_budget.left(window=3600.0)["0"] == pytest.approx(360.0 - 12.5)
    assert again.last_measured == store.last_measured and set(again.last_measured) == {("0", "gpu_bandwidth"),
                                                                                          ("3", "gpu_bandwidth")}
    files.dir = str(tmp_path / "absent")  # a directory that is not there: the write fails
    with caplog.at_level("WARNING", logger="fleetcanary.daemon"):
        files.save_coverage(store)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["coverage"]
    assert statefile.ERRORS.snapshot() == {}


@pytest.mark.parametrize("name", ["gpu-budget.json", "coverage.json"])
def test_a_state_file_of_the_wrong_type_is_dropped_with_one_line_and_counted(tmp_path, caplog, name):
    """Before: an object where a list belongs was dropped without a word."""
    from fleetcanary.daemon.state_files import StateFiles
    (tmp_path / name).write_text('{"0": [1, 2, 3]}')
    with caplog.at_level("INFO"):
        assert StateFiles(str(tmp_path)).read(name, "what", "starting from nothing") == []
    lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(lines) == 1 and "wrong_shape" in lines[0], lines
    assert statefile.ERRORS.snapshot() == {(name, "wrong_shape"): 1}
