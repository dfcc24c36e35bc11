"""storage: real files in a temporary directory, every failure class, nothing left behind."""
import os
from pathlib import Path

import pytest

from fleetcanary.probes.base import ProbeError, ProbeSkipped
from fleetcanary.probes.storage import WORKDIR, Config, Storage, Target
from tests.support.gpu import ctx, value
from tests.support.helpers import run_job
from tests.support.mounts import tmpfs

P = "fleetcanary_storage_"
SMALL = dict(file_bytes=4 << 20, read_block_bytes=1 << 20, random_reads=32, small_files=50,
             checkpoint_bytes=4 << 20, checkpoint_chunk_bytes=1 << 20, min_free_bytes=0)


def target(path, name="t1", **kw):
    return Target(name=name, path=str(path), **{**SMALL, **kw})


def test_every_figure_from_real_files_and_nothing_left(tmp_path):
    d = tmp_path / "nvme"
    d.mkdir()
    r = Storage().run(Config(targets=(target(d),), repeats=2), ctx(tmp_path))
    for cache in ("cold", "hot"):
        assert value(r, P + "first_byte_seconds", target="t1", cache=cache) > 0
        assert value(r, P + "read_bytes_per_second", target="t1", cache=cache) > 0
    for m in ("random_read_seconds", "write_bytes_per_second", "fsync_seconds", "checkpoint_save_seconds",
              "checkpoint_restore_seconds"):
        assert value(r, P + m, target="t1") > 0, m
    for op in ("create", "stat", "read", "unlink"):
        assert value(r, P + "metadata_ops_per_second", target="t1", op=op) > 0
    assert value(r, P + "success", target="t1") == 1
    figs = {f.name: f for f in r.figures}
    assert len(figs["read_cold"].repeats) == 2 and len(figs["random_read_4k"].repeats) == 32
    assert list(d.iterdir()) == []  # .fleetcanary removed too


def test_o_direct_cold_reads_fall_back_where_refused(tmp_path):
    d = tmp_path / "disk"
    d.mkdir()
    r = Storage().run(Config(targets=(target(d, cold_method="direct"),), repeats=1), ctx(tmp_path))
    assert value(r, P + "read_bytes_per_second", target="t1", cache="cold") > 0


def test_leftovers_of_a_killed_run_are_removed_first(tmp_path):
    d = tmp_path / "nfs"
    left = d / WORKDIR / "t" / "small"
    left.mkdir(parents=True)
    (left / "f000001").write_bytes(b"x")
    Storage().run(Config(targets=(target(d, small_files=5),), repeats=1), ctx(tmp_path))
    assert list(d.iterdir()) == []


def test_killed_at_the_deadline_mid_run_leaves_nothing(tmp_path):
    d = tmp_path / "slow"
    d.mkdir()
    params = {"targets": [{"name": "t1", "path": str(d), **SMALL, "small_files": 100000}], "repeats": 1}
    out = run_job(Storage, params, tmp_path, timeout_seconds=1.0, kill_grace_seconds=20.0)
    assert out.outcome == "timeout"
    assert list(d.iterdir()) == [], list(d.rglob("*"))[:5]


def test_path_missing(tmp_path):
    with pytest.raises(ProbeError) as ei:
        Storage().run(Config(targets=(target(tmp_path / "absent"),)), ctx(tmp_path))
    assert ei.value.reason == "path_missing"


def test_permission_denied(tmp_path):
    d = tmp_path / "locked"
    d.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    if os.geteuid() == 0:
        os.seteuid(65534)
    try:
        with pytest.raises(ProbeError) as ei:
            Storage().run(Config(targets=(target(d),)), ctx(tmp_path))
    finally:
        if os.getuid() == 0:
            os.seteuid(0)
    assert ei.value.reason == "permission_denied"


def test_read_only_filesystem(tmp_path):
    with tmpfs(tmp_path / "ro", "ro,size=16m") as d, pytest.raises(ProbeError) as ei:
        Storage().run(Config(targets=(target(d),)), ctx(tmp_path))
    assert ei.value.reason == "read_only"


def test_no_space_left(tmp_path):
    # Bytes free but no inodes: the free-space check passes, then creating files fails with ENOSPC.
    with tmpfs(tmp_path / "full", "size=64m,nr_inodes=12") as d:
        with pytest.raises(ProbeError) as ei:
            Storage().run(Config(targets=(target(d, small_files=50),), repeats=1), ctx(tmp_path))
        assert ei.value.reason == "no_space"
        assert not (Path(d) / WORKDIR).exists()


def test_low_disk_space_skips(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    with pytest.raises(ProbeSkipped) as ei:
        Storage().run(Config(targets=(target(d, min_free_bytes=1 << 60),)), ctx(tmp_path))
    assert ei.value.reason == "low_disk_space"


def test_one_bad_target_is_classified_and_the_good_one_still_reported(tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    r = Storage().run(Config(targets=(target(good, name="good"), target(tmp_path / "gone", name="gone")),
                             repeats=1), ctx(tmp_path))
    assert value(r, P + "success", target="good") == 1
    assert value(r, P + "success", target="gone") == 0
    assert value(r, P + "failures_total", target="gone", reason="path_missing") == 1
    assert r.extra["failures"]["gone"]["reason"] == "path_missing"


def test_no_targets_skips(tmp_path):
    with pytest.raises(ProbeSkipped) as ei:
        Storage().run(Config(), ctx(tmp_path))
    assert ei.value.reason == "not_configured"


def test_relative_paths_are_refused():
    with pytest.raises(ValueError, match="must be an absolute path"):
        Target(name="x", path="relative/dir")


def test_a_single_failing_target_fails_the_run_but_publishes_its_counter(tmp_path):
    with pytest.raises(ProbeError) as ei:
        Storage().run(Config(targets=(target(tmp_path / "gone", name="gone"),)), ctx(tmp_path))
    r = ei.value.result
    assert value(r, P + "success", target="gone") == 0
    assert value(r, P + "failures_total", target="gone", reason="path_missing") == 1
