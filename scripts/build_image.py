"""Build fleetcanary's OCI images without a Docker engine (docs/image.md): `make image`.

    scripts/build-image [--flavour cpu|cuda12|cuda ...] [--out build/image] [--docker-archive]
                        [--cache DIR | --no-cache] [--cache-max-age DAYS]
    scripts/build-image --lock [--flavour ...]      # refresh image/requirements-*.txt

Three layers per image, the first shared by every flavour:
  1. Debian bookworm (mmdebstrap, minbase): python3, ca-certificates, user and group 65532, an empty
     /var/lib/fleetcanary owned by them. Nothing else: the driver (libcuda, libnvidia-ml, nvidia-smi) is
     mounted by the NVIDIA container runtime, and the CUDA torch wheel brings its own CUDA libraries.
  2. /opt/fleetcanary, a venv with the locked dependencies (image/requirements-<flavour>.txt: == pins with
     hashes, torch included), installed offline inside the Debian root from a wheelhouse the host's pip
     downloaded (so it sees the host's indexes).
  3. The project's wheel (stamped with its commit) installed into that venv: what changes with each commit.
The first two are kept between builds in the layer cache (scripts/image_cache.py) under the hash of their
inputs, so a build that changes only fleetcanary installs and compresses only the third.
umoci assembles them into an OCI layout (build/image/oci); the tags are the package's version: <version> and
<version>-cuda for the CUDA 13 flavour (what deploy/base runs on GPU nodes), <version>-cuda12 for the CUDA 12
one (drivers older than R580), <version>-cpu for the CPU one.

Runs as root (mmdebstrap's root mode, chroot). Every mount lives in a private mount namespace (unshare), so
nothing stays mounted after a failure or Ctrl-C. A failure is one line on stderr and a non-zero exit; the
failing step's full output is in build/image/logs/. build/image/build-<flavour>.json records what was built,
with the time of each step and the layers' sizes (benchmarks/image.py reads it).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

from scripts import image_cache

ROOT = Path(__file__).resolve().parent.parent
LOCK_DIR = ROOT / "image"
REPOSITORY = "ghcr.io/fleetcanary/fleetcanary"  # deploy/base/daemonset.yaml runs <REPOSITORY>:<version>
SOURCE_URL = "https://github.com/fleetcanary/fleetcanary"
EXTRAS = ("kube", "gpu")  # what a DaemonSet node needs: the Kubernetes API and pod-resources, torch
# torch per flavour; the CPU pin is the Makefile's TORCH_PIN (tests/test_image.py checks it)
# (docs/image.md has the driver and GPU matrix). cuda: PyPI's torch 2.14.1 is built for CUDA 13.0 (driver R580+);
# cuda12: 2.10.0 is the newest torch whose PyPI build is CUDA 12 (12.8: driver R525+ by minor version
# compatibility, R570+ for its PTX; Volta to Blackwell), for the R535/R550/R570 nodes of the installed base.
# "cuda": the CUDA version of the flavour's torch (torch.version.cuda), checked against the lock file's runtime.
FLAVOURS = {
    "cpu": {"torch": "torch==2.13.0+cpu", "tags": ("{v}-cpu",), "cuda": None},
    "cuda12": {"torch": "torch==2.10.0", "tags": ("{v}-cuda12",), "cuda": "12.8"},
    "cuda": {"torch": "torch==2.14.1", "tags": ("{v}", "{v}-cuda"), "cuda": "13.0"},
}
SUITE = "bookworm"
DEB_PACKAGES = ("python3", "ca-certificates")
SOURCES = Path("/etc/apt/sources.list.d/debian.sources")  # the host's mirror, when it has one
UID = GID = 65532
VENV = "/opt/fleetcanary"
STATE_DIR = "/var/lib/fleetcanary"
PORT = 9835
ENV = {"PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "FLEETCANARY_STATE_DIR": STATE_DIR}
# docs, manuals and translations stay out of the Debian layer (as in Debian's slim images)
DPKG_EXCLUDES = ("path-exclude=/usr/share/man/*", "path-exclude=/usr/share/info/*", "path-exclude=/usr/share/doc/*",
                 "path-include=/usr/share/doc/*/copyright", "path-exclude=/usr/share/locale/*",
                 "path-include=/usr/share/locale/locale.alias", "path-exclude=/usr/share/lintian/*")
TOOLS = ("mmdebstrap", "umoci", "unshare", "chroot", "tar")
# the sources the wheel is built from (the Dockerfile copies the same)
WHEEL_SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "config.example.yaml",
                 "exporter", "probes", "alerts", "dashboards")


class BuildError(Exception):
    """A one-line reason the build stopped."""


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def tags(flavour: str) -> list[str]:
    return [t.format(v=version()) for t in FLAVOURS[flavour]["tags"]]


def lock_file(flavour: str) -> Path:
    return LOCK_DIR / f"requirements-{flavour}.txt"


def shown(path: Path) -> str:
    """A path as a message shows it: relative to the checkout when inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def pip_python() -> str:
    """The Python whose pip resolves and downloads (the venv's: it sees the host's pip config and indexes)."""
    venv = ROOT / ".venv/bin/python"
    return str(venv) if venv.exists() else sys.executable


def git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def commit() -> str:
    """HEAD, with -dirty when tracked files changed (as setup.py stamps it); 'unknown' outside a checkout."""
    head = git("rev-parse", "HEAD")
    if not head:
        return "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def source_date_epoch() -> int:
    env = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if env.isdigit():
        return int(env)
    last = git("log", "-1", "--format=%ct")
    return int(last) if last and last.isdigit() else 0


class Steps:
    """Runs the build's commands: each one's output goes to logs/<step>.log, its wall time to `times`."""

    def __init__(self, out: Path):
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.times: dict[str, float] = {}

    def run(self, step: str, cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> str:
        log = self.logs / f"{step}.log"
        t0 = time.monotonic()
        with open(log, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            try:
                r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                   stdin=subprocess.DEVNULL)
            except OSError as e:
                raise BuildError(f"{step}: cannot run {cmd[0]}: {e.strerror}") from None
        self.times[step] = self.times.get(step, 0.0) + time.monotonic() - t0
        if r.returncode != 0:
            if r.returncode < 0 and -r.returncode == signal.SIGINT:
                raise KeyboardInterrupt
            last = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            raise BuildError(f"{step} failed (exit {r.returncode}): {last[-1][:200] if last else 'no output'}"
                             f" (full output: {log})")
        return log.read_text(errors="replace")


# ---------------------------------------------------------------------------------------------- lock files

def project_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in EXTRAS:
        reqs += project["optional-dependencies"][extra]
    return [r for r in reqs if not re.match(r"torch\b", r)]  # the flavour's torch pin replaces the extra's range


def resolve(requirements: list[str], steps: Steps, step: str) -> list[dict]:
    """pip's own resolution (a dry run against the host's indexes): [{name, version, sha256}]."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        steps.run(step, [pip_python(), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                         "--only-binary=:all:", "--report", str(report), *requirements])
        data = json.loads(report.read_text())
    out = []
    for item in data["install"]:
        hashes = item["download_info"].get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            raise BuildError(f"{step}: pip reports no sha256 for {item['metadata']['name']}")
        out.append({"name": item["metadata"]["name"], "version": item["metadata"]["version"],
                    "sha256": hashes["sha256"]})
    return sorted(out, key=lambda d: d["name"].lower())


def write_lock(path: Path, pins: list[dict], header: str) -> None:
    lines = [f"# {ln}" if ln else "#" for ln in header.splitlines()]
    for p in pins:
        lines.append(f"{p['name']}=={p['version']} \\\n    --hash=sha256:{p['sha256']}")
    path.write_text("\n".join(lines) + "\n")


def lock(flavours: list[str], out: Path) -> None:
    steps = Steps(out)
    LOCK_DIR.mkdir(exist_ok=True)
    how = "Generated by `scripts/build-image --lock` from pyproject.toml; refresh with `make image-lock`."
    for flavour in flavours:
        reqs = [FLAVOURS[flavour]["torch"], *project_requirements()]
        pins = resolve(reqs, steps, f"lock-{flavour}")
        write_lock(lock_file(flavour), pins,
                   f"{how}\nThe {flavour} image's Python packages (fleetcanary[{','.join(EXTRAS)}] and "
                   f"{FLAVOURS[flavour]['torch']}),\ninstalled with --require-hashes; fleetcanary's own wheel is "
                   "built from this checkout.")
        print(f"{shown(lock_file(flavour))}: {len(pins)} packages")
    pip_pin = resolve(["pip"], steps, "lock-tools")
    write_lock(LOCK_DIR / "requirements-tools.txt", pip_pin,
               f"{how}\nThe pip that installs the image's venv (run from its wheel; the image ships no pip).")
    print(f"image/requirements-tools.txt: {pip_pin[0]['name']}=={pip_pin[0]['version']}")


def read_lock(path: Path) -> list[tuple[str, str]]:
    if not path.is_file():
        raise BuildError(f"{shown(path)} is missing: run scripts/build-image --lock")
    text = path.read_text().replace("\\\n", " ")
    return re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.MULTILINE)


# ---------------------------------------------------------------------------------------------- the build

def check_host() -> None:
    if os.geteuid() != 0:
        raise BuildError("must run as root (mmdebstrap's root mode and chroot): sudo make image")
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        raise BuildError(f"missing {', '.join(missing)}: install with `make os-deps` as root "
                         f"(Debian packages mmdebstrap umoci util-linux coreutils tar)")


def build_wheel(work: Path, steps: Steps, stamp: str, epoch: int) -> Path:
    """The project's wheel, from a copy of its sources (a parallel build in the checkout cannot clash); its zip
    entries dated `epoch` (SOURCE_DATE_EPOCH), so that one commit gives one wheel, byte for byte, and the pip
    metadata that records its hash (direct_url.json) is the same in every build."""
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for name in WHEEL_SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_build.json"))
        else:
            shutil.copy2(p, src / name)
    dist = work / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    env = {**os.environ, "FLEETCANARY_GIT_COMMIT": stamp, "SOURCE_DATE_EPOCH": str(epoch)}
    isolation = ["--no-isolation"] if _has_build_backend() else []
    steps.run("wheel", [pip_python(), "-m", "build", "--wheel", *isolation, "--outdir", str(dist), str(src)],
              env=env)
    wheels = list(dist.glob("fleetcanary-*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"wheel: expected one fleetcanary wheel in {dist}, found {len(wheels)}")
    return wheels[0]


def _has_build_backend() -> bool:
    """setuptools>=77 beside `build` in the Python that builds: no isolated environment to download."""
    probe = ("import build, setuptools; "
             "raise SystemExit(int(setuptools.__version__.split('.')[0]) < 77)")
    return subprocess.run([pip_python(), "-c", probe], capture_output=True).returncode == 0


def wheelhouse(out: Path, flavour: str | None, steps: Steps) -> tuple[Path, Path]:
    """Every locked wheel of `flavour` (None: pip's alone, for a build whose dependency layer is cached) and
    pip's, downloaded by the host's pip into out/wheelhouse (kept between builds: a file already there with the
    locked hash is not fetched again). -> (wheelhouse, pip's wheel)."""
    house = out / "wheelhouse"
    house.mkdir(parents=True, exist_ok=True)
    for lock_path in ([lock_file(flavour)] if flavour else []) + [LOCK_DIR / "requirements-tools.txt"]:
        read_lock(lock_path)
        steps.run(f"download-{flavour or 'pip'}", [pip_python(), "-m", "pip", "download", "--quiet", "--no-deps",
                                                   "--require-hashes", "--only-binary=:all:", "--dest", str(house),
                                                   "-r", str(lock_path)])
    (_pip, pip_version), = read_lock(LOCK_DIR / "requirements-tools.txt")
    pip_wheel = next(iter(house.glob(f"pip-{pip_version}-*.whl")), None)
    if pip_wheel is None:
        raise BuildError(f"download: pip {pip_version}'s wheel is not in {house}")
    return house, pip_wheel


def base_epoch() -> int:
    """The time of the Debian and dependency layers' files: SOURCE_DATE_EPOCH when set, else the time of the last
    commit that changed their inputs (image/, this script). They, and their cache keys, stay the same over the
    commits that change only fleetcanary's code."""
    env = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if env.isdigit():
        return int(env)
    last = git("log", "-1", "--format=%ct", "--", "image", "scripts/build_image.py")
    return int(last) if last and last.isdigit() else source_date_epoch()


def created(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def init_layout(layout: Path, steps: Steps) -> None:
    if not (layout / "index.json").is_file():
        shutil.rmtree(layout, ignore_errors=True)
        steps.run("oci-init", ["umoci", "init", "--layout", str(layout)])


def debian_hooks() -> list[str]:
    return [
        f"chroot \"$1\" groupadd --system --gid {GID} fleetcanary",
        f"chroot \"$1\" useradd --system --uid {UID} --gid {GID} --home-dir {STATE_DIR} --no-create-home "
        "--shell /usr/sbin/nologin fleetcanary",
        f"install -d -m 0755 -o {UID} -g {GID} \"$1{STATE_DIR}\"",
        # the runtime mounts its own; the host's must not end up in the image
        ": > \"$1/etc/resolv.conf\"; echo localhost > \"$1/etc/hostname\"",
        "rm -f \"$1\"/var/cache/debconf/*-old \"$1\"/var/lib/dpkg/*-old \"$1\"/etc/*-",
    ]


DEBIAN_BY = f"mmdebstrap --variant=minbase --include={','.join(DEB_PACKAGES)} {SUITE}"


def debian_layer(cache: image_cache.Cache, work: Path, steps: Steps, epoch: int) -> tuple[str, dict, bool]:
    """The Debian root as a tar (mmdebstrap sorts it and clamps its times to `epoch`), kept in the cache under
    the hash of its inputs. -> (cache entry, its meta, built by this run)."""
    sources = SOURCES.read_text() if SOURCES.is_file() else ""
    name = "debian-" + image_cache.key("debian", SUITE, DEB_PACKAGES, DPKG_EXCLUDES, debian_hooks(), sources, epoch)
    meta = cache.entry(name)
    if meta:
        return name, meta, False
    tar = cache.tmp / "debian.tar"
    mirror = [str(SOURCES)] if SOURCES.is_file() else []
    cmd = ["unshare", "--mount", "--propagation", "private", "mmdebstrap", "--mode=root", "--variant=minbase",
           f"--include={','.join(DEB_PACKAGES)}", "--format=tar", "--skip=output/dev",
           *(f"--dpkgopt={o}" for o in DPKG_EXCLUDES), *(f"--customize-hook={h}" for h in debian_hooks()),
           SUITE, str(tar), *mirror]
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch), "TMPDIR": str(work)}
    steps.run("debian", cmd, env=env)
    init_layout(cache.layout, steps)
    ref = f"{cache.layout}:{name}"
    steps.run("debian-oci", ["umoci", "new", "--image", ref])
    steps.run("debian-oci", ["umoci", "raw", "add-layer", "--image", ref, "--history.created", created(epoch),
                             "--history.created_by", DEBIAN_BY, str(tar)])
    meta = cache.put(name, tar, {"created_by": DEBIAN_BY})
    cache.evict("debian-", name)
    return name, meta, True


# Inside the Debian root (chroot), with the wheelhouse and the inputs bind-mounted read-only. The dependencies'
# layer: the venv and the locked packages; one mtime for every file, then .pyc files that record it
# (reproducible, and valid after the tar clamps times). As pip does, a file that is not Python 3.11 (torch's
# py312_intrinsics.py) is left uncompiled.
DEPS_INSTALL = r"""
set -eu
python3 -m venv --without-pip {venv}
pip="{venv}/bin/python /inputs/{pip_wheel}/pip"
$pip install --no-index --find-links /wheelhouse --require-hashes --only-binary=:all: --no-compile \
    -r /inputs/requirements.txt
$pip check
find {venv} -exec touch -h -d @{epoch} {{}} +
{venv}/bin/python -c "import compileall, py_compile; compileall.compile_dir('{venv}/lib', quiet=2, workers=0, \
    invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)"
"""

# fleetcanary's layer: its wheel into that venv, and pip check of the whole
APP_INSTALL = r"""
set -eu
{venv}/bin/python /inputs/{pip_wheel}/pip install --no-index --no-deps --no-compile /inputs/{wheel}
{venv}/bin/python /inputs/{pip_wheel}/pip check
"""

# ... its .pyc files once the host set its files' mtimes, and the entry point's answer
APP_COMPILE = r"""
set -eu
{venv}/bin/python -c "import compileall, py_compile, sys; raise SystemExit(0 if all([compileall.compile_dir(d, \
    quiet=2, workers=0, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP) for d in sys.argv[1:]]) else 1)" \
    {dirs}
{venv}/bin/fleetcanary version
"""

MOUNTS = r"""
set -eu
root=$1
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
for d in wheelhouse inputs; do mkdir -p "$root/$d"; done
mount --bind "$2" "$root/wheelhouse" && mount -o remount,bind,ro "$root/wheelhouse"
mount --bind "$3" "$root/inputs" && mount -o remount,bind,ro "$root/inputs"
exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 /bin/sh -c "$4"
"""

TAR = ["tar", "--sort=name", "--numeric-owner", "--format=posix", "--clamp-mtime",
       "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime"]


def fresh_rootfs(work: Path, flavour: str, tars: list[Path], steps: Steps) -> Path:
    """A root with `tars` unpacked in order, beside an empty inputs/ for the chroot's read-only inputs."""
    fdir = work / flavour
    shutil.rmtree(fdir, ignore_errors=True)
    rootfs = fdir / "rootfs"
    rootfs.mkdir(parents=True)
    (fdir / "inputs").mkdir()
    for tar in tars:
        steps.run(f"unpack-{flavour}", ["tar", "-C", str(rootfs), "-xpf", str(tar), "--numeric-owner"])
    (rootfs / "dev").mkdir(exist_ok=True)
    return rootfs


def in_chroot(step: str, rootfs: Path, house: Path, script: str, steps: Steps) -> str:
    """`script` by sh in the root, every mount in a private namespace. -> its output."""
    log = steps.run(step, ["unshare", "--mount", "--propagation", "private", "sh", "-c", MOUNTS, "mounts",
                           str(rootfs), str(house), str(rootfs.parent / "inputs"), script])
    for d in ("wheelhouse", "inputs"):
        (rootfs / d).rmdir()  # the mount points (empty once the namespace is gone)
    return log


def deps_layer(cache: image_cache.Cache, work: Path, out: Path, flavour: str, debian: tuple[str, dict],
               steps: Steps, epoch: int) -> tuple[str, dict, bool, Path, Path]:
    """The venv with the flavour's locked packages, kept in the cache under the hash of the Debian layer's
    content and the lock files, with the root it was installed in (fleetcanary's layer is installed into a
    clone of it). -> (cache entry, its meta, built by this run, wheelhouse, pip's wheel)."""
    lock_text, tools = lock_file(flavour).read_text(), (LOCK_DIR / "requirements-tools.txt").read_text()
    name = f"deps-{flavour}-" + image_cache.key("deps", flavour, debian[1]["diffid"], lock_text, tools,
                                                DEPS_INSTALL, VENV, epoch)
    meta = cache.entry(name)
    if meta:
        return (name, meta, False, *wheelhouse(out, None, steps))
    house, pip_wheel = wheelhouse(out, flavour, steps)
    rootfs = fresh_rootfs(work, flavour, [cache.tar(debian[0])], steps)
    shutil.copy2(lock_file(flavour), rootfs.parent / "inputs/requirements.txt")
    shutil.copy2(pip_wheel, rootfs.parent / "inputs" / pip_wheel.name)
    in_chroot(f"install-{flavour}", rootfs, house,
              DEPS_INSTALL.format(venv=VENV, pip_wheel=pip_wheel.name, epoch=epoch), steps)
    tar = cache.tmp / f"deps-{flavour}.tar"
    steps.run(f"layer-{flavour}", [*TAR, "-C", str(rootfs), f"--mtime=@{epoch}", "-cf", str(tar), "." + VENV])
    by = f"venv {VENV}: {shown(lock_file(flavour))}"
    ref = f"{cache.layout}:{name}"
    steps.run(f"deps-oci-{flavour}", ["umoci", "tag", "--image", f"{cache.layout}:{debian[0]}", name])
    steps.run(f"deps-oci-{flavour}", ["umoci", "raw", "add-layer", "--image", ref, "--history.created",
                                      created(epoch), "--history.created_by", by, str(tar)])
    meta = cache.put(name, tar, {"created_by": by}, root=rootfs)
    cache.evict(f"deps-{flavour}-", name)
    return name, meta, True, house, pip_wheel


def installed_roots(rootfs: Path) -> list[str]:
    """What pip installed of fleetcanary's wheel (its RECORD): the top-level package directories and
    dist-info under site-packages, and the entry-point scripts; paths relative to the root."""
    records = list(rootfs.glob(VENV.lstrip("/") + "/lib/python3*/site-packages/fleetcanary-*.dist-info/RECORD"))
    if len(records) != 1:
        raise BuildError(f"app: expected one fleetcanary RECORD in the venv, found {len(records)}")
    site = records[0].parent.parent
    roots = set()
    for row in csv.reader(records[0].read_text().splitlines()):
        if not row:
            continue
        path = Path(os.path.normpath(site / row[0]))
        top = site / path.relative_to(site).parts[0] if path.is_relative_to(site) else path
        roots.add(str(top.relative_to(rootfs)))
    return sorted(roots)


def app_layer(work: Path, flavour: str, cache: image_cache.Cache, deps: str, house: Path, pip_wheel: Path,
              wheel: Path, steps: Steps, epoch: int) -> tuple[Path, str]:
    """fleetcanary's layer: its wheel installed into the venv, in a clone of the dependency layer's cached
    root, the files pip installed tarred. -> (tar, what `fleetcanary version` said)."""
    fdir = work / flavour
    shutil.rmtree(fdir, ignore_errors=True)
    rootfs, inputs = fdir / "rootfs", fdir / "inputs"
    t0 = time.monotonic()
    image_cache.clone_root(cache.root_of(deps), rootfs)
    steps.times[f"clone-{flavour}"] = time.monotonic() - t0
    inputs.mkdir()
    for f in (wheel, pip_wheel):
        shutil.copy2(f, inputs / f.name)
    in_chroot(f"app-{flavour}", rootfs, house, APP_INSTALL.format(venv=VENV, pip_wheel=pip_wheel.name,
                                                                  wheel=wheel.name), steps)
    roots = installed_roots(rootfs)
    for top in roots:  # one mtime, then .pyc files that record it
        for dirpath, dirnames, filenames in os.walk(rootfs / top):
            for n in dirnames + filenames:
                os.utime(os.path.join(dirpath, n), (epoch, epoch), follow_symlinks=False)
        os.utime(rootfs / top, (epoch, epoch), follow_symlinks=False)
    dirs = " ".join("/" + t for t in roots if (rootfs / t).is_dir())
    log = in_chroot(f"app-{flavour}", rootfs, house, APP_COMPILE.format(venv=VENV, dirs=dirs), steps)
    version_line = log.strip().splitlines()[-1] if log.strip() else ""
    tar = rootfs.parent / "fleetcanary.tar"
    steps.run(f"layer-app-{flavour}", [*TAR, "-C", str(rootfs), f"--mtime=@{epoch}", "-cf", str(tar),
                                       *("./" + t for t in roots)])
    shutil.rmtree(rootfs)
    return tar, version_line


def assemble(out: Path, flavour: str, cache: image_cache.Cache, deps: str, app: tuple[Path, str], steps: Steps,
             epoch: int, stamp: str) -> None:
    """The flavour's image in out/oci: the cached Debian and dependency layers' blobs copied, fleetcanary's
    layer added, the config, the tags."""
    layout = out / "oci"
    init_layout(layout, steps)
    work_ref = f"{layout}:build-{flavour}"
    image_cache.copy_image(cache.layout, deps, layout, f"build-{flavour}")
    steps.run(f"oci-{flavour}", ["umoci", "raw", "add-layer", "--image", work_ref, "--history.created",
                                 created(epoch), "--history.created_by", app[1], str(app[0])])
    meta = {"org.opencontainers.image.title": "fleetcanary",
            "org.opencontainers.image.description": "Prometheus exporter and canary benchmarker for GPU nodes",
            "org.opencontainers.image.version": version(),
            "org.opencontainers.image.revision": stamp,
            "org.opencontainers.image.source": SOURCE_URL,
            "org.opencontainers.image.licenses": "Apache-2.0",
            "org.opencontainers.image.created": created(epoch),
            "org.opencontainers.image.base.name": f"debian:{SUITE} (mmdebstrap {SUITE} minbase)",
            "io.fleetcanary.flavour": flavour,
            "io.fleetcanary.torch": FLAVOURS[flavour]["torch"].split("==", 1)[1],
            "io.fleetcanary.cuda": FLAVOURS[flavour]["cuda"] or "none"}
    cmd = ["umoci", "config", "--image", work_ref, "--no-history", "--created", created(epoch), "--os", "linux",
           "--architecture", "amd64", "--config.user", f"{UID}:{GID}", "--config.workingdir", "/",
           "--config.entrypoint", "fleetcanary", "--config.cmd", "run", "--config.exposedports", f"{PORT}/tcp"]
    cmd += [a for k, v in ENV.items() for a in ("--config.env", f"{k}={v}")]
    cmd += [a for k, v in meta.items() for a in ("--config.label", f"{k}={v}")]
    cmd += [a for k, v in meta.items() for a in ("--manifest.annotation", f"{k}={v}")]
    steps.run(f"oci-{flavour}", cmd)
    for tag in tags(flavour):
        if image_cache.has_tag(layout, tag):
            steps.run(f"oci-{flavour}", ["umoci", "rm", "--image", f"{layout}:{tag}"])
        steps.run(f"oci-{flavour}", ["umoci", "tag", "--image", work_ref, tag])
    steps.run(f"oci-{flavour}", ["umoci", "rm", "--image", work_ref])
    steps.run(f"oci-{flavour}", ["umoci", "gc", "--layout", str(layout)])


def docker_archive(out: Path, flavour: str, steps: Steps) -> Path:
    if not shutil.which("skopeo"):
        raise BuildError("--docker-archive needs skopeo (apt-get install skopeo)")
    tag = tags(flavour)[0]
    dest = out / f"fleetcanary-{tag}.docker.tar"
    dest.unlink(missing_ok=True)
    steps.run(f"archive-{flavour}", ["skopeo", "copy", "--quiet", f"oci:{out / 'oci'}:{tag}",
                                     f"docker-archive:{dest}:{REPOSITORY}:{tag}"])
    return dest


def build(flavours: list[str], out: Path, archive: bool, cache_dir: Path | None,
          max_age_days: float = image_cache.MAX_AGE_DAYS) -> None:
    """`cache_dir` None: a cache for this build alone (in its work directory, removed at the end)."""
    check_host()
    for f in flavours:
        read_lock(lock_file(f))
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)  # a previous run's leftovers (an interrupted mmdebstrap's tempdir)
    work.mkdir()
    steps = Steps(out)
    epoch, stamp, base = source_date_epoch(), commit(), base_epoch()
    t_start = time.monotonic()
    cache = image_cache.Cache(cache_dir or work / "cache", max_age_days * 86400)
    try:
        wheel = build_wheel(work, steps, stamp, epoch)
        debian_name, debian_meta, debian_built = debian_layer(cache, work, steps, base)
        shared = time.monotonic() - t_start  # the wheel and the Debian layer serve every flavour
        for flavour in flavours:
            t0 = time.monotonic()
            deps_name, deps_meta, deps_built, house, pip_wheel = deps_layer(
                cache, work, out, flavour, (debian_name, debian_meta), steps, base)
            app, version_line = app_layer(work, flavour, cache, deps_name, house, pip_wheel, wheel, steps, epoch)
            app_by = f"{VENV}: {wheel.name}[{','.join(EXTRAS)}]"
            sizes = [debian_meta["uncompressed_bytes"], deps_meta["uncompressed_bytes"], app.stat().st_size]
            assemble(out, flavour, cache, deps_name, (app, app_by), steps, epoch, stamp)
            dest = docker_archive(out, flavour, steps) if archive else None
            app.unlink()
            facts = image_cache.image_facts(out / "oci", tags(flavour)[0])
            record = {"flavour": flavour, "tags": tags(flavour), "repository": REPOSITORY, "version": version(),
                      "revision": stamp, "source_date_epoch": epoch, "base_epoch": base, "digest": facts["digest"],
                      "torch": FLAVOURS[flavour]["torch"].split("==", 1)[1],
                      "fleetcanary_version_output": version_line,
                      "layers": ["debian", "dependencies", "fleetcanary"],
                      "layers_compressed_bytes": facts["layers"], "layers_uncompressed_bytes": sizes,
                      "cache": {"dir": str(cache_dir) if cache_dir else None,
                                "debian": "built" if debian_built else "cached",
                                "dependencies": "built" if deps_built else "cached"},
                      "docker_archive": str(dest) if dest else None,
                      "seconds": {"shared (wheel, debian layer)": round(shared, 1),
                                  "flavour": round(time.monotonic() - t0, 1),
                                  "total": round(shared + time.monotonic() - t0, 1)},
                      "steps": {k: round(v, 1) for k, v in steps.times.items()
                                if not any(k.endswith(f"-{o}") for o in FLAVOURS if o != flavour)}}
            (out / f"build-{flavour}.json").write_text(json.dumps(record, indent=2) + "\n")
            mib = sum(facts["layers"]) / 2**20
            print(f"oci:{out / 'oci'}:{tags(flavour)[0]}  {', '.join(tags(flavour))}  {facts['digest'][:19]}  "
                  f"{mib:.0f} MiB compressed  {record['seconds']['total']:.0f} s  (layers: Debian "
                  f"{record['cache']['debian']}, dependencies {record['cache']['dependencies']})")
        if cache_dir:
            steps.run("cache-gc", ["umoci", "gc", "--layout", str(cache.layout)])
    finally:
        cache.close()
    shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/build-image", description=__doc__.split("\n\n")[0])
    p.add_argument("--flavour", action="append", metavar="FLAVOUR",
                   help=f"one of {', '.join(FLAVOURS)} (repeat for several; default: all)")
    p.add_argument("--out", type=Path, default=ROOT / "build/image", help="output directory (default: build/image)")
    p.add_argument("--docker-archive", action="store_true",
                   help="also write <out>/fleetcanary-<tag>.docker.tar (docker load, ctr import) with skopeo")
    p.add_argument("--lock", action="store_true", help="refresh image/requirements-*.txt instead of building")
    p.add_argument("--cache", type=Path, default=None, metavar="DIR",
                   help="the layer cache: the Debian and dependency layers kept between builds (default: "
                        "$FLEETCANARY_IMAGE_CACHE, else $XDG_CACHE_HOME/fleetcanary/image)")
    p.add_argument("--no-cache", action="store_true", help="build every layer; keep none")
    p.add_argument("--cache-max-age", type=float, default=image_cache.MAX_AGE_DAYS, metavar="DAYS",
                   help=f"rebuild a cached layer older than this (default {image_cache.MAX_AGE_DAYS:g}: the "
                        "Debian mirror's security updates)")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    flavours = []
    for item in args.flavour or list(FLAVOURS):
        for f in filter(None, item.replace(",", " ").split()):
            if f not in FLAVOURS:
                print(f"build-image: unknown flavour {f!r} (known: {', '.join(FLAVOURS)})", file=sys.stderr)
                return 2
            flavours.append(f)
    if not flavours:
        print(f"build-image: no flavour given (known: {', '.join(FLAVOURS)})", file=sys.stderr)
        return 2
    out = args.out.resolve()
    try:
        if args.lock:
            lock(list(dict.fromkeys(flavours)), out)
        else:
            cache = None if args.no_cache else (args.cache or image_cache.default_dir()).resolve()
            build(list(dict.fromkeys(flavours)), out, args.docker_archive, cache, args.cache_max_age)
    except BuildError as e:
        print(f"build-image: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the disk filled up, a directory cannot be written, ...
        print(f"build-image: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("build-image: interrupted (nothing stays mounted: every mount lived in a private namespace)",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
