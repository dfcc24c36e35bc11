"""`make release` (scripts/release, docs/release.md): the artifacts with checksums that verify, and the checks that
stop a release which is not one (an undated version, a names list out of date). The image archives are left out
here (--skip-images: building them takes root and minutes); the session that releases records them."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from fleetcanary.probes.lib import yamltext
from scripts import release
from tests.conftest import ROOT
from tests.support.helpers import require_tool

SCRIPT = ROOT / "scripts" / "release"
VERSION = release.version()


# The release with its names check left out: for a tree that holds names added since VERSION was released
SKIP_NAMES_CHECK = ("import sys; from scripts import release; real = release.run; "
                    "release.run = lambda cmd, what, **kw: "
                    "'' if what == 'scripts/names --check' else real(cmd, what, **kw); "
                    "sys.exit(release.main(sys.argv[1:]))")


@pytest.mark.long
def test_the_release_writes_each_artifact_with_a_checksum_that_verifies(tmp_path):
    require_tool("helm")
    out = tmp_path / "dist"
    args = ["--skip-images", "--allow-dirty", "--out", str(out)]
    names = subprocess.run([sys.executable, str(ROOT / "scripts" / "names"), "--check"], capture_output=True,
                           text=True, timeout=120, cwd=ROOT)
    if names.returncode == 0:  # the tree is VERSION as released
        r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900, cwd=ROOT)
    else:
        # Names added since VERSION was released (CHANGELOG's [Unreleased]): the tree is no longer VERSION, and the
        # check says so in one line; the artifacts are built and checked without it.
        assert names.stderr.strip().endswith("a released version's names are fixed (docs/stability.md)"), names.stderr
        r = subprocess.run([sys.executable, "-c", SKIP_NAMES_CHECK, *args], capture_output=True, text=True,
                           timeout=900, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout + r.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([f"fleetcanary-{VERSION}-py3-none-any.whl", f"fleetcanary-{VERSION}.tar.gz",
                            f"fleetcanary-{VERSION}.tgz", f"fleetcanary-{VERSION}.packages.json", "SHA256SUMS"])
    sums = dict(reversed(line.split("  ", 1)) for line in (out / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == set(names) - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name
    with tarfile.open(out / f"fleetcanary-{VERSION}.tgz") as chart:
        meta = yamltext.load(chart.extractfile("fleetcanary/Chart.yaml"))
        assert meta["version"] == VERSION and meta["appVersion"] == VERSION
        assert "fleetcanary/values.schema.json" in chart.getnames()
    listing = json.loads((out / f"fleetcanary-{VERSION}.packages.json").read_text())
    wheel = listing["artifacts"][f"fleetcanary-{VERSION}-py3-none-any.whl"]
    assert any(req.startswith("pydantic") for req in wheel["requires"])
    assert listing["artifacts"][f"fleetcanary-{VERSION}.tgz"]["images"] == [
        f"ghcr.io/fleetcanary/fleetcanary:{VERSION}"]


@pytest.fixture
def release_in(tmp_path, monkeypatch):
    """scripts/release's functions over a copy of the files its checks read, so a test can spoil one."""
    for rel in ("CHANGELOG.md", "pyproject.toml", f"release/names-{VERSION}.json", "charts/fleetcanary/Chart.yaml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    # the module's own globals, pointed at the copy for this test only (monkeypatch restores them)
    monkeypatch.setattr(release, "ROOT", tmp_path)
    monkeypatch.setattr(release, "CHART", tmp_path / "charts" / "fleetcanary")
    # names --check and generate --check: the real ones run in CI anyway
    monkeypatch.setattr(release, "run", lambda cmd, what, **_: "")
    return tmp_path, release


def test_a_release_needs_its_version_dated_named_and_the_chart_to_match(release_in):
    root, ns = release_in
    ns.checks(VERSION, allow_dirty=True)  # as it is: a release
    changelog = (root / "CHANGELOG.md").read_text()
    (root / "CHANGELOG.md").write_text(changelog.replace(f"## [{VERSION}] - ", f"## [{VERSION}] - x", 1))
    with pytest.raises(ns.ReleaseError, match="not dated"):
        ns.checks(VERSION, allow_dirty=True)
    (root / "CHANGELOG.md").write_text(changelog)
    (root / f"release/names-{VERSION}.json").unlink()
    with pytest.raises(ns.ReleaseError, match="names"):
        ns.checks(VERSION, allow_dirty=True)
    shutil.copy(ROOT / f"release/names-{VERSION}.json", root / f"release/names-{VERSION}.json")
    chart = root / "charts/fleetcanary/Chart.yaml"
    chart.write_text(chart.read_text().replace(f"appVersion: \"{VERSION}\"", 'appVersion: "0.0.1"'))
    with pytest.raises(ns.ReleaseError, match="appVersion"):
        ns.checks(VERSION, allow_dirty=True)


def test_a_release_stops_with_one_line_on_a_failed_check(tmp_path):
    """The whole script: a check that fails is one line on stderr and exit 1, and nothing is written."""
    env_root = tmp_path / "tree"
    shutil.copytree(ROOT, env_root, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", ".tools",
                                                                    "__pycache__", "benchmarks"))
    changelog = env_root / "CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace(f"## [{VERSION}] - ", f"## [{VERSION}] - unreleased ", 1))
    r = subprocess.run([sys.executable, str(env_root / "scripts/release"), "--skip-images", "--out",
                        str(tmp_path / "dist")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.startswith("release: ") and len(r.stderr.strip().splitlines()) == 1, \
        r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "dist").exists()


def test_an_images_python_packages_are_listed_with_their_hashes():
    pins = {p["name"]: p for p in release.lock_pins((ROOT / "image" / "requirements-cuda12.txt").read_text())}
    assert pins["torch"]["version"] == "2.10.0" and pins["torch"]["hashes"]
    assert all(p["hashes"] and all(h.startswith("sha256:") for h in p["hashes"]) for p in pins.values())
    assert len(pins) > 40
