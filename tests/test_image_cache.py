"""scripts/image_cache.py, the layer cache of scripts/build-image, on real OCI layouts (umoci init, new, raw
add-layer): an entry counts once complete, what an interrupted build left is removed, old entries are rebuilt,
one entry per kind is kept, and a cached image copies into another layout as umoci reads it."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from scripts import image_cache
from tests.support.helpers import require_binary


def umoci(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([require_binary("umoci"), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r


def a_tar(path: Path, name: str, text: str) -> Path:
    src = path.parent / name
    src.write_text(text)
    with tarfile.open(path, "w") as t:
        t.add(src, arcname=f"./{name}")
    return path


def add_entry(cache: image_cache.Cache, name: str, text: str = "x") -> dict:
    """What build-image does for a layer: its image tagged in the cache's layout, then put()."""
    if not (cache.layout / "index.json").is_file():
        umoci("init", "--layout", str(cache.layout))
    tar = a_tar(cache.tmp / f"{name}.tar", f"{name}.txt", text)
    umoci("new", "--image", f"{cache.layout}:{name}")
    umoci("raw", "add-layer", "--image", f"{cache.layout}:{name}", str(tar))
    return cache.put(name, tar, {"created_by": "test"})


def test_an_entry_counts_once_its_meta_is_written_and_records_its_tars_digest(tmp_path):
    cache = image_cache.Cache(tmp_path / "c")
    try:
        assert cache.entry("debian-1") is None
        meta = add_entry(cache, "debian-1", "bookworm")
        assert cache.entry("debian-1") == meta
        assert meta["diffid"] == "sha256:" + image_cache.file_sha256(cache.tar("debian-1"))
        assert meta["uncompressed_bytes"] == cache.tar("debian-1").stat().st_size
        assert not (cache.tmp / "debian-1.tar").exists()  # the tar moved in
    finally:
        cache.close()


def test_what_an_interrupted_build_left_is_removed_when_the_next_opens_the_cache(tmp_path):
    cache = image_cache.Cache(tmp_path / "c")
    add_entry(cache, "debian-1")
    # interrupted after tagging and moving its tar in, before the meta: no entry
    umoci("new", "--image", f"{cache.layout}:deps-cpu-2")
    a_tar(cache.tars / "deps-cpu-2.tar", "venv", "half")
    (cache.meta / "deps-cpu-3.json.part").write_text("{")
    (cache.tmp / "deps-cpu.tar").write_text("partial")
    assert cache.entry("deps-cpu-2") is None
    cache.close()
    again = image_cache.Cache(tmp_path / "c")
    try:
        assert not image_cache.has_tag(again.layout, "deps-cpu-2") and not again.tar("deps-cpu-2").exists()
        assert not list(again.meta.glob("*.part")) and not list(again.tmp.iterdir())
        assert again.entry("debian-1") is not None  # the complete one stays
    finally:
        again.close()


def test_an_entry_older_than_the_maximum_age_is_not_used(tmp_path):
    now = [1_000_000.0]
    cache = image_cache.Cache(tmp_path / "c", max_age_s=7 * 86400, clock=lambda: now[0])
    try:
        add_entry(cache, "debian-1")
        now[0] += 7 * 86400 - 1
        assert cache.entry("debian-1") is not None
        now[0] += 2
        assert cache.entry("debian-1") is None  # the mirror's security updates since: rebuilt
    finally:
        cache.close()


def test_one_entry_per_kind_is_kept(tmp_path):
    cache = image_cache.Cache(tmp_path / "c")
    try:
        for name in ("deps-cpu-1", "deps-cpu-2", "deps-cuda-1", "debian-1"):
            add_entry(cache, name, name)
        assert cache.evict("deps-cpu-", "deps-cpu-2") == ["deps-cpu-1"]
        assert cache.entry("deps-cpu-1") is None and not cache.tar("deps-cpu-1").exists()
        assert not image_cache.has_tag(cache.layout, "deps-cpu-1")
        assert all(cache.entry(n) for n in ("deps-cpu-2", "deps-cuda-1", "debian-1"))
        umoci("gc", "--layout", str(cache.layout))
        assert all(cache.entry(n) for n in ("deps-cpu-2", "deps-cuda-1", "debian-1"))
    finally:
        cache.close()


def test_a_cached_image_copies_into_another_layout_by_hard_links_and_umoci_builds_on_it(tmp_path):
    cache = image_cache.Cache(tmp_path / "c")
    try:
        add_entry(cache, "debian-1", "bookworm")
        out = tmp_path / "out"
        umoci("init", "--layout", str(out))
        image_cache.copy_image(cache.layout, "debian-1", out, "build-cpu")
        layer = a_tar(tmp_path / "app.tar", "app.txt", "fleetcanary")
        umoci("raw", "add-layer", "--image", f"{out}:build-cpu", str(layer))
        stat = json.loads(umoci("stat", "--image", f"{out}:build-cpu", "--json").stdout)
        assert len([h for h in stat["history"] if not h.get("empty_layer")]) == 2
        blobs = list((out / "blobs/sha256").iterdir())
        linked = [p for p in blobs if (cache.layout / "blobs/sha256" / p.name).exists()]
        assert linked and all(os.stat(p).st_nlink == 2 for p in linked)
        umoci("unpack", "--image", f"{out}:build-cpu", str(tmp_path / "bundle"))
        assert (tmp_path / "bundle/rootfs/debian-1.txt").read_text() == "bookworm"
        assert (tmp_path / "bundle/rootfs/app.txt").read_text() == "fleetcanary"
    finally:
        cache.close()


def test_one_build_at_a_time_holds_the_cache(tmp_path):
    cache = image_cache.Cache(tmp_path / "c")
    fd = os.open(tmp_path / "c/lock", os.O_WRONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        cache.close()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the build ends
    finally:
        os.close(fd)


def test_the_cache_lives_where_the_environment_says(monkeypatch, tmp_path):
    monkeypatch.delenv("FLEETCANARY_IMAGE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert image_cache.default_dir() == tmp_path / "xdg/fleetcanary/image"
    monkeypatch.setenv("FLEETCANARY_IMAGE_CACHE", str(tmp_path / "mine"))
    assert image_cache.default_dir() == tmp_path / "mine"
    assert image_cache.key("a", 1) == image_cache.key("a", 1) != image_cache.key("a", 2)


def test_a_dependency_entry_keeps_its_root_and_a_clone_of_it_shares_no_written_file(tmp_path):
    cache = image_cache.Cache(tmp_path / "c")
    try:
        root = cache.tmp / "rootfs"
        (root / "opt/fleetcanary/lib").mkdir(parents=True)
        (root / "opt/fleetcanary/lib/torch.py").write_text("torch")
        umoci("init", "--layout", str(cache.layout))
        tar = a_tar(cache.tmp / "deps.tar", "venv.txt", "venv")
        umoci("new", "--image", f"{cache.layout}:deps-cpu-1")
        meta = cache.put("deps-cpu-1", tar, {"created_by": "test"}, root=root)
        assert meta["keeps"] == "root" and meta["diffid"].startswith("sha256:") and not tar.exists()
        assert cache.entry("deps-cpu-1") == meta and not cache.tar("deps-cpu-1").exists()
        clone = tmp_path / "work/cpu/rootfs"
        assert image_cache.clone_root(cache.root_of("deps-cpu-1"), clone) == "link"
        (clone / "opt/fleetcanary/bin").mkdir()
        (clone / "opt/fleetcanary/bin/fleetcanary").write_text("app")
        assert not (cache.root_of("deps-cpu-1") / "opt/fleetcanary/bin").exists()
        assert (clone / "opt/fleetcanary/lib/torch.py").stat().st_ino == \
            (cache.root_of("deps-cpu-1") / "opt/fleetcanary/lib/torch.py").stat().st_ino
        shutil.rmtree(cache.root_of("deps-cpu-1"))
        assert cache.entry("deps-cpu-1") is None  # its root gone: no entry
    finally:
        cache.close()
