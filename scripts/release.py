"""A release's artifacts into dist/ (`make release`; docs/release.md).

    scripts/release [--out dist] [--skip-images] [--flavour F ...] [--allow-dirty]

What it checks first (one line and exit 1 on the first that fails): the version is dated in CHANGELOG.md
(`## [VERSION] - YYYY-MM-DD`, not "unreleased"); release/names-VERSION.json exists and equals what the code
promises (scripts/names --check); every generated file is current (scripts/generate --check); the chart's
version and appVersion are the package's; the work tree is clean (else --allow-dirty, and the artifacts say
-dirty through the wheel's commit stamp).

What it writes:
  fleetcanary-VERSION-py3-none-any.whl, fleetcanary-VERSION.tar.gz   python -m build
  fleetcanary-VERSION.tgz                                               helm package charts/fleetcanary
  fleetcanary-TAG.oci.tar (one per image flavour)                       skopeo copy from build/image/oci, built
                                                                        first by scripts/build-image if missing
  fleetcanary-VERSION.packages.json                                     what each artifact pins: the wheel's
      requirements, each image's Python packages (== with sha256, from image/requirements-*.txt) and its Debian
      packages (read from the image's own base layer), the chart's images
  SHA256SUMS                                                            `sha256sum -c SHA256SUMS` checks them all
"""
from __future__ import annotations

import argparse
import datetime
import functools
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import tomllib

from fleetcanary.probes.lib import yamltext
from scripts.image_cache import file_sha256, has_tag, image_facts

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "fleetcanary"


class ReleaseError(Exception):
    pass


def build_image_script():
    """scripts/build_image.py (scripts/build-image's module): its tags and lock files, one source of them."""
    from scripts import build_image

    return build_image


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def run(cmd: list[str], what: str, cwd: Path = ROOT, env: dict | None = None) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()
        raise ReleaseError(f"{what} failed (exit {r.returncode}): {tail[-1] if tail else ''}")
    return r.stdout


def helm_binary() -> str:
    for cand in (os.environ.get("FLEETCANARY_HELM", ""), str(ROOT / ".tools/bin/helm"), shutil.which("helm") or ""):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise ReleaseError("no helm: `make tools` puts one in .tools/bin")


def checks(v: str, allow_dirty: bool) -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    m = re.search(rf"^## \[{re.escape(v)}\] - (\S+)$", changelog, re.MULTILINE)
    if not m:
        raise ReleaseError(f"CHANGELOG.md has no '## [{v}] - YYYY-MM-DD' section")
    try:
        datetime.date.fromisoformat(m.group(1))
    except ValueError:
        raise ReleaseError(f"CHANGELOG.md: {v} is not dated ({m.group(1)!r}); a release has its date") from None
    if not (ROOT / "release" / f"names-{v}.json").is_file():
        raise ReleaseError(f"release/names-{v}.json is missing: scripts/names --write")
    run([sys.executable, str(ROOT / "scripts/names"), "--check"], "scripts/names --check")
    run([sys.executable, str(ROOT / "scripts/generate"), "--check"], "scripts/generate --check (make generate)")
    chart = yamltext.load((CHART / "Chart.yaml").read_text())
    if str(chart.get("version")) != v or str(chart.get("appVersion")) != v:
        raise ReleaseError(f"charts/fleetcanary/Chart.yaml: version {chart.get('version')} and appVersion "
                           f"{chart.get('appVersion')} must both be {v}")
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    if dirty and not allow_dirty:
        raise ReleaseError("the work tree has uncommitted changes (--allow-dirty to release them, stamped -dirty)")


def python_dists(out: Path) -> list[Path]:
    with tempfile.TemporaryDirectory(prefix="fleetcanary-release-") as tmp:
        run([sys.executable, "-m", "build", "--outdir", tmp, str(ROOT)], "python -m build")
        made = sorted(Path(tmp).iterdir())
        for p in made:
            shutil.move(str(p), out / p.name)
    return [out / p.name for p in made]


def chart_package(out: Path, v: str) -> Path:
    helm = helm_binary()
    run([helm, "lint", "--strict", str(CHART)], "helm lint")
    run([helm, "package", str(CHART), "--version", v, "--app-version", v, "--destination", str(out)], "helm package")
    return out / f"fleetcanary-{v}.tgz"


def images(out: Path, flavours: list[str]) -> list[tuple[str, Path]]:
    build_image = build_image_script()
    layout = ROOT / "build/image/oci"
    commit = build_image.commit()

    def current(f: str) -> bool:  # built, and from this commit (the image's revision label)
        tag = build_image.tags(f)[0]
        if not has_tag(layout, tag):
            return False
        labels = image_facts(layout, tag)["config"].get("config", {}).get("Labels") or {}
        return labels.get("org.opencontainers.image.revision") == commit

    missing = [f for f in flavours if not current(f)]
    if missing:
        if os.geteuid() != 0:
            raise ReleaseError(f"images {', '.join(missing)} are not built and building them needs root "
                               "(sudo make release, or sudo make image first)")
        cmd = [sys.executable, str(ROOT / "scripts/build-image")]
        for f in missing:
            cmd += ["--flavour", f]
        run(cmd, "scripts/build-image")
    if not shutil.which("skopeo"):
        raise ReleaseError("skopeo is needed to write the image archives (apt-get install skopeo)")
    made = []
    for f in flavours:
        tag = build_image.tags(f)[0]
        dest = out / f"fleetcanary-{tag}.oci.tar"
        dest.unlink(missing_ok=True)
        run(["skopeo", "copy", "--quiet", f"oci:{layout}:{tag}", f"oci-archive:{dest}:{tag}"], f"skopeo copy {tag}")
        made.append((f, dest))
    return made


def _base_layer(layout: Path, tag: str) -> Path:
    """The blob of an image's first layer (the Debian one, the same blob in every flavour of a build)."""
    index = json.loads((layout / "index.json").read_text())
    desc = next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name")
                == tag)
    manifest = json.loads((layout / "blobs" / "sha256" / desc["digest"].split(":", 1)[1]).read_text())
    return layout / "blobs" / "sha256" / manifest["layers"][0]["digest"].split(":", 1)[1]


@functools.cache
def _dpkg_packages(base: Path) -> list[dict]:
    """The Debian packages of a base layer, from its /var/lib/dpkg/status (read once per blob: the flavours of a
    build share it)."""
    with gzip.open(base) as gz, tarfile.open(fileobj=gz, mode="r|") as tar:
        for member in tar:
            if member.name.lstrip("./") == "var/lib/dpkg/status":
                text = tar.extractfile(member).read().decode()
                break
        else:
            return []
    out = []
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.MULTILINE))
        if fields.get("Package") and "installed" in fields.get("Status", ""):
            out.append({"name": fields["Package"], "version": fields.get("Version", ""),
                        "architecture": fields.get("Architecture", "")})
    return sorted(out, key=lambda p: p["name"])


def lock_pins(text: str) -> list[dict]:
    """A pip lock file's pins: name, version and hashes (a pin's continuation lines joined first)."""
    text = text.replace("\\\n", " ")
    return [{"name": m.group(1), "version": m.group(2), "hashes": re.findall(r"--hash=(sha256:[0-9a-f]+)", m.group(3))}
            for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)(.*)$", text, re.MULTILINE)]


def packages(v: str, wheel: Path | None, image_files: list[tuple[str, Path]], chart: Path | None) -> dict:
    """What each artifact pins (an SBOM-like list): name and version, with the hash where the lock has one."""
    doc: dict = {"fleetcanary": v, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "artifacts": {}}
    if wheel is not None:
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        doc["artifacts"][wheel.name] = {"kind": "python wheel", "requires": project["dependencies"],
                                        "extras": project.get("optional-dependencies", {})}
    if image_files:
        build_image = build_image_script()
        layout = ROOT / "build/image/oci"
        for flavour, path in image_files:
            pins = lock_pins(build_image.lock_file(flavour).read_text())
            tag = build_image.tags(flavour)[0]
            doc["artifacts"][path.name] = {
                "kind": "OCI image", "flavour": flavour, "tags": build_image.tags(flavour),
                "digest": image_facts(layout, tag)["digest"], "python": pins,
                "debian": _dpkg_packages(_base_layer(layout, tag))}
    if chart is not None:
        values = yamltext.load((CHART / "values.yaml").read_text())
        image = values.get("image", {})
        doc["artifacts"][chart.name] = {"kind": "helm chart", "images": [
            f"{image.get('repository', '')}:{image.get('tag') or v}"]}
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/release", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "dist")
    p.add_argument("--skip-images", action="store_true", help="the wheel, sdist and chart only")
    p.add_argument("--flavour", action="append", metavar="F", help="image flavours (default: every one)")
    p.add_argument("--allow-dirty", action="store_true")
    args = p.parse_args(argv)
    v = version()
    t0 = time.monotonic()
    try:
        checks(v, args.allow_dirty)
        if args.out.exists():
            shutil.rmtree(args.out)
        args.out.mkdir(parents=True)
        made = python_dists(args.out)
        wheel = next((m for m in made if m.suffix == ".whl"), None)
        chart = chart_package(args.out, v)
        image_files: list[tuple[str, Path]] = []
        if not args.skip_images:
            flavours = args.flavour or list(build_image_script().FLAVOURS)
            image_files = images(args.out, flavours)
        listing = args.out / f"fleetcanary-{v}.packages.json"
        listing.write_text(json.dumps(packages(v, wheel, image_files, chart), indent=1) + "\n")
        files = sorted(f for f in args.out.iterdir() if f.is_file() and f.name != "SHA256SUMS")
        (args.out / "SHA256SUMS").write_text("".join(f"{file_sha256(f)}  {f.name}\n" for f in files))
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    for f in files:
        print(f"{f.stat().st_size / 2**20:10.1f} MiB  {f.name}")
    print(f"{args.out}/SHA256SUMS: {len(files)} files, {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
