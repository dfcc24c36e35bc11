"""The layer cache of scripts/build-image (docs/image.md, "The layer cache").

An image has three layers: Debian, the flavour's locked dependencies (/opt/fleetcanary's venv, torch
included) and fleetcanary's own wheel installed into that venv. The first two change when their inputs do
(the Debian packages and hooks, the lock files), not with each commit, and they are nearly all of the
build's time: the CUDA 12 venv took 171 s to install and 225 s to gzip. The cache keeps, per layer, its
uncompressed tar (a later build unpacks it to install into) and, in an OCI layout of its own, the compressed
blob as an image tagged `debian-<key>` or `deps-<flavour>-<key>`. A build whose inputs hash to a kept key
copies that image's blobs into its own layout and adds only the fleetcanary layer; a node that upgrades
pulls only that layer.

An entry counts once its meta file is written, last; an interrupted build leaves at most a tag or a tar
without one, which the next build removes. One build uses a cache at a time (an flock on `lock`). Each
build keeps one entry per kind (the Debian layer, each flavour's dependencies) and removes the others.
Entries older than the maximum age (7 days by default) are rebuilt: the Debian layer then takes the
mirror's security updates, as the dependency layers built on it do.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

MAX_AGE_DAYS = 7.0


def default_dir() -> Path:
    """$FLEETCANARY_IMAGE_CACHE, else $XDG_CACHE_HOME/fleetcanary/image (~/.cache/fleetcanary/image)."""
    env = os.environ.get("FLEETCANARY_IMAGE_CACHE", "").strip()
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "fleetcanary" / "image"


def key(*parts: object) -> str:
    """A short, stable hash of a layer's inputs."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ------------------------------------------------------------------------------------ OCI image layouts

def _blob(layout: Path, digest: str) -> Path:
    algo, hexd = digest.split(":", 1)
    return layout / "blobs" / algo / hexd


def _index(layout: Path) -> dict:
    return json.loads((layout / "index.json").read_text())


def _write_index(layout: Path, index: dict) -> None:
    tmp = layout / "index.json.tmp"
    tmp.write_text(json.dumps(index, separators=(",", ":")))
    os.replace(tmp, layout / "index.json")


def _ref(desc: dict) -> str | None:
    return (desc.get("annotations") or {}).get("org.opencontainers.image.ref.name")


def has_tag(layout: Path, tag: str) -> bool:
    return (layout / "index.json").is_file() and any(_ref(m) == tag
                                                     for m in (_index(layout).get("manifests") or []))


def _descriptor(layout: Path, tag: str) -> dict:
    return next(m for m in (_index(layout).get("manifests") or []) if _ref(m) == tag)


def image_facts(layout: Path, tag: str) -> dict:
    """Digest, layer blob sizes (compressed) and config of a tag in the layout."""
    desc = _descriptor(layout, tag)
    manifest = json.loads(_blob(layout, desc["digest"]).read_text())
    return {"digest": desc["digest"], "layers": [m["size"] for m in manifest["layers"]],
            "config": json.loads(_blob(layout, manifest["config"]["digest"]).read_text())}


def copy_image(src: Path, src_tag: str, dst: Path, dst_tag: str) -> None:
    """Copy one tagged image (its manifest, config and layer blobs) from layout `src` into layout `dst`
    under `dst_tag`: blobs are content-addressed and never change, so a hard link where both sit on one
    filesystem, else a copy. The OCI image layout's own structure (index.json, blobs/<algo>/<hex>)."""
    desc = _descriptor(src, src_tag)
    manifest = json.loads(_blob(src, desc["digest"]).read_text())
    for digest in (desc["digest"], manifest["config"]["digest"], *(ly["digest"] for ly in manifest["layers"])):
        to = _blob(dst, digest)
        if to.exists():
            continue
        to.parent.mkdir(parents=True, exist_ok=True)
        part = to.with_name(to.name + ".part")
        try:
            os.link(_blob(src, digest), part)
        except OSError:
            shutil.copyfile(_blob(src, digest), part)
        os.replace(part, to)
    index = _index(dst)
    index["manifests"] = [m for m in (index.get("manifests") or []) if _ref(m) != dst_tag]
    index["manifests"].append({**desc, "annotations": {**(desc.get("annotations") or {}),
                                                       "org.opencontainers.image.ref.name": dst_tag}})
    _write_index(dst, index)


def remove_tag(layout: Path, tag: str) -> None:
    """Drop a tag from the index (`umoci gc` then removes the blobs no tag reaches)."""
    if (layout / "index.json").is_file():
        index = _index(layout)
        index["manifests"] = [m for m in (index.get("manifests") or []) if _ref(m) != tag]
        _write_index(layout, index)


# ------------------------------------------------------------------------------------------------ the cache

class Cache:
    """Layer entries under `root`: tars/<name>.tar, meta/<name>.json and the tag <name> in the layout oci/."""

    def __init__(self, root: Path, max_age_s: float = MAX_AGE_DAYS * 86400, clock=time.time):
        self.root, self.max_age_s, self.clock = root, max_age_s, clock
        self.layout, self.tars, self.meta, self.tmp = root / "oci", root / "tars", root / "meta", root / "tmp"
        self.roots = root / "roots"
        for d in (self.tars, self.meta, self.roots):
            d.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(root / "lock", os.O_WRONLY | os.O_CREAT, 0o644)
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # one build at a time; released when the build ends or dies
        shutil.rmtree(self.tmp, ignore_errors=True)  # an interrupted build's half-written tar
        self.tmp.mkdir()
        self._drop_incomplete()

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        os.close(self._lock)

    def tar(self, name: str) -> Path:
        return self.tars / f"{name}.tar"

    def root_of(self, name: str) -> Path:
        return self.roots / name

    def entry(self, name: str) -> dict | None:
        """The entry's meta when complete and younger than the maximum age, else None."""
        try:
            meta = json.loads((self.meta / f"{name}.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or not has_tag(self.layout, name):
            return None
        keeps = {"tar": self.tar(name).is_file, "root": self.root_of(name).is_dir}.get(meta.get("keeps"))
        if keeps is None or not keeps():
            return None
        if self.clock() - float(meta.get("built", 0)) > self.max_age_s:
            return None
        return meta

    def put(self, name: str, tar: Path, meta: dict, root: Path | None = None) -> dict:
        """Keep the layer `tar` as the entry `name`, or, given `root`, the root directory the layer was made in
        (moved in; a build clones it to install into) and not the tar. The layer's image must be tagged in the
        layout already. The meta file, written last, makes the entry count."""
        meta = {**meta, "built": self.clock(), "diffid": "sha256:" + file_sha256(tar),
                "uncompressed_bytes": tar.stat().st_size, "keeps": "root" if root else "tar"}
        if root is None:
            self.tar(name).unlink(missing_ok=True)
            shutil.move(str(tar), self.tar(name))
        else:
            shutil.rmtree(self.root_of(name), ignore_errors=True)
            shutil.move(str(root), self.root_of(name))
            tar.unlink()
        part = self.meta / f"{name}.json.part"
        part.write_text(json.dumps(meta, indent=1) + "\n")
        os.replace(part, self.meta / f"{name}.json")
        return meta

    def evict(self, prefix: str, keep: str) -> list[str]:
        """Remove the entries named `prefix`* but `keep` (tag, tar, meta). -> their names."""
        names = {p.stem for p in self.tars.glob(f"{prefix}*.tar")} | {p.stem for p in self.meta.glob(f"{prefix}*.json")}
        names |= {p.name for p in self.roots.glob(f"{prefix}*")}
        names |= {r for r in self._tags() if r.startswith(prefix)}
        gone = sorted(n for n in names if n != keep)
        for n in gone:
            self._remove(n)
        return gone

    def _remove(self, name: str) -> None:
        (self.meta / f"{name}.json").unlink(missing_ok=True)
        self.tar(name).unlink(missing_ok=True)
        shutil.rmtree(self.root_of(name), ignore_errors=True)
        remove_tag(self.layout, name)

    def _drop_incomplete(self) -> None:
        """A tar, root or tag without its meta file: what an interrupted build left."""
        have = {p.name[:-5] for p in self.meta.glob("*.json")}
        for p in self.tars.glob("*"):
            if p.suffix != ".tar" or p.stem not in have:
                p.unlink(missing_ok=True)
        for p in self.roots.iterdir():
            if p.name not in have:
                shutil.rmtree(p, ignore_errors=True)
        for p in self.meta.glob("*.part"):
            p.unlink(missing_ok=True)
        for r in self._tags():
            if r not in have:
                remove_tag(self.layout, r)

    def _tags(self) -> list[str]:
        if not (self.layout / "index.json").is_file():
            return []
        return [r for m in (_index(self.layout).get("manifests") or []) if (r := _ref(m))]


def clone_root(src: Path, dst: Path) -> str:
    """A copy of a cached root to install into: hard links where both sit on one filesystem (`cp -al`: the
    installs write new files and never open a cached one for writing; a .pyc Python rewrites is replaced by
    rename, a new inode), else a full copy. -> "link" or "copy"."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if os.stat(src).st_dev == os.stat(dst.parent).st_dev and \
            subprocess.run(["cp", "-al", str(src), str(dst)], capture_output=True).returncode == 0:
        return "link"
    shutil.rmtree(dst, ignore_errors=True)
    r = subprocess.run(["cp", "-a", str(src), str(dst)], capture_output=True, text=True)
    if r.returncode != 0:
        raise OSError(f"cannot copy the cached root {src}: {r.stderr.strip()[:200]}")
    return "copy"
