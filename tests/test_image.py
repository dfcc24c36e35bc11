"""The OCI images `make image` builds without a Docker engine (scripts/build-image, docs/image.md): the CPU image
is built from a clean state, unpacked by umoci into a runtime bundle and run by crun as a real container (uid
65532, read-only root, the host's network on a free loopback port); its /metrics reports the package's version,
which is the image's tag and the tag the manifests run. The lock files pin every package with a hash."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

from fleetcanary.probes.lib import yamltext
from harness.container import Container, is_root, uid_of
from scripts import build_image
from tests.conftest import SMALL_HOST_BW
from tests.support.helpers import StopWaiting, free_port, http_get, require_binary, unavailable, wait_for

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts/build-image"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def lock_pins(path: Path) -> dict[str, str]:
    return {name.lower().replace("_", "-"): v for name, v in build_image.read_lock(path)}


def canonical(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")


# ------------------------------------------------------------------------------------------- quick checks

def test_an_unknown_flavour_is_one_line_on_stderr_and_a_non_zero_exit(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--flavour", "gpu-nightly", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "unknown flavour 'gpu-nightly'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_a_missing_lock_file_is_one_line_on_stderr(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(build_image, "LOCK_DIR", tmp_path)
    monkeypatch.setattr(build_image, "check_host", lambda: None)
    assert build_image.main(["--flavour", "cpu", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "requirements-cpu.txt is missing" in err, err


@pytest.mark.parametrize("flavour", list(build_image.FLAVOURS))
def test_the_lock_files_pin_every_package_with_a_hash(flavour):
    path = build_image.lock_file(flavour)
    entries = [e for e in path.read_text().replace("\\\n", " ").splitlines() if e.strip() and not e.startswith("#")]
    assert entries and all(re.fullmatch(r"[A-Za-z0-9_.-]+==\S+\s+--hash=sha256:[0-9a-f]{64}", e.strip())
                           for e in entries), path
    pins = lock_pins(path)
    assert len(pins) == len(entries)
    # every requirement of the package and of the image's extras is pinned, torch at the flavour's version
    for req in build_image.project_requirements():
        assert canonical(req) in pins, (flavour, req)
    assert pins["torch"] == build_image.FLAVOURS[flavour]["torch"].split("==")[1]
    assert "fleetcanary" not in pins and "pytest" not in pins  # its own wheel is built; no test extras


CUDA_FLAVOURS = [f for f, v in build_image.FLAVOURS.items() if v["cuda"]]


@pytest.mark.parametrize("flavour", CUDA_FLAVOURS)
def test_a_cuda_flavours_lock_file_holds_one_cuda_major_the_one_its_torch_is_built_for(flavour):
    """cuda12's torch is PyPI's CUDA 12.8 build (drivers R525+), cuda's the CUDA 13.0 one (R580+): the runtime
    wheel the lock file pins is that version, and no wheel of the other CUDA major slips in."""
    pins = lock_pins(build_image.lock_file(flavour))
    cuda = build_image.FLAVOURS[flavour]["cuda"]
    major = cuda.split(".")[0]
    runtime = pins.get(f"nvidia-cuda-runtime-cu{major}") or pins.get("nvidia-cuda-runtime")
    assert runtime is not None and runtime.startswith(cuda + "."), (flavour, runtime)
    others = [n for n in pins if re.search(r"-cu(\d+)$", n) and not n.endswith(f"-cu{major}")]
    assert others == [], (flavour, others)
    assert build_image.FLAVOURS["cuda12"]["cuda"].startswith("12.") and build_image.FLAVOURS["cuda"]["cuda"] == "13.0"


def test_every_flavour_has_its_own_tags_and_make_image_builds_them_all():
    tags = [t for f in build_image.FLAVOURS for t in build_image.tags(f)]
    assert len(tags) == len(set(tags))
    assert build_image.tags("cuda12") == [f"{VERSION}-cuda12"]
    assert build_image.tags("cuda") == [VERSION, f"{VERSION}-cuda"]  # what deploy/base runs, unchanged
    default = re.search(r"^FLAVOURS\s*\?=\s*(.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1).split()
    assert sorted(default) == sorted(build_image.FLAVOURS)


def test_the_cpu_image_runs_the_torch_the_tests_run():
    """The Makefile's TORCH_PIN (what `make test` installs) is the CPU image's torch."""
    pin = re.search(r"^TORCH_PIN\s*\?=\s*torch==(\S+)", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1)
    assert lock_pins(build_image.lock_file("cpu"))["torch"].split("+")[0] == pin


def test_the_dockerfile_installs_the_same_lock_files():
    text = (ROOT / "Dockerfile").read_text()
    assert "image/requirements-${FLAVOUR}.txt" in text and "--require-hashes" in text
    assert re.search(r"^ARG FLAVOUR=(\w+)", text, re.MULTILINE).group(1) in build_image.FLAVOURS
    # each CUDA flavour's build-arg is shown in the header, with the index its torch comes from
    for flavour in CUDA_FLAVOURS:
        assert f"--build-arg FLAVOUR={flavour} " in text, flavour


def test_the_manifests_name_the_repository_the_images_are_built_for():
    images = [c["image"] for d in yamltext.load_all((ROOT / "deploy/base/daemonset.yaml").read_text()) if d
              for c in d["spec"]["template"]["spec"]["containers"]]
    assert f"{build_image.REPOSITORY}:{VERSION}" in images
    # the GPU nodes' tag is the CUDA flavour's
    assert VERSION in build_image.tags("cuda") and f"{VERSION}-cpu" in build_image.tags("cpu")


# ------------------------------------------------------------------------------------------- the real build

def mounts_under(path: Path) -> list[str]:
    return [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
            if ln.split()[4].startswith(str(path))]


def require_build_tools() -> None:
    for tool in ("mmdebstrap", "umoci", "crun", "skopeo", "unshare", "chroot"):
        require_binary(tool)
    if not is_root():
        unavailable("building and running the image needs root (mmdebstrap's root mode, chroot, crun)")


def session_processes(sid: int) -> list[int]:
    """The processes of a session (what a build started, however deep)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                found.append(int(d.name))
    return found


@pytest.fixture(scope="module")
def cpu_image(tmp_path_factory):
    """scripts/build-image --flavour cpu into a fresh directory, with the layer cache a developer's `make image`
    keeps (image_cache.default_dir(): the Debian and dependency layers, about 1.8 GiB; a cold cache builds
    them): -> (out dir, build record)."""
    require_build_tools()
    out = tmp_path_factory.mktemp("image")
    r = subprocess.run([sys.executable, str(SCRIPT), "--flavour", "cpu", "--out", str(out)],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr
    assert not mounts_under(out), "the build left mounts behind"
    assert not (out / "work").exists()
    yield out, json.loads((out / "build-cpu.json").read_text())
    shutil.rmtree(out, ignore_errors=True)  # the layout and the wheelhouse: half a GiB


@pytest.fixture(scope="module")
def container(cpu_image, tmp_path_factory):
    """The CPU image running as a container on a free loopback port: -> (Container, port)."""
    out, _ = cpu_image
    crun = require_binary("crun")
    c = Container(out / "oci", f"{VERSION}-cpu", tmp_path_factory.mktemp("container"),
                  f"fleetcanary-test-{free_port()}", crun=crun)
    try:
        c.unpack()
        port = free_port()
        # The defaults, but for host_memory_bandwidth's arrays: three of 1 GiB (the cap; 4 x this VM's 480 MiB
        # LLC) took 15 CPU-s while these tests read /metrics
        config = c.workdir / "fleetcanary.yaml"
        config.write_text(yaml.safe_dump({"probes": {"host_memory_bandwidth": {"params": SMALL_HOST_BW["params"]}}}))
        config.chmod(0o644)
        c.configure(["fleetcanary", "run", "--config", "/etc/fleetcanary.yaml",
                     "--listen-address", f"127.0.0.1:{port}"], files={"/etc/fleetcanary.yaml": config})
        c.start()
        yield c, port
    finally:
        c.remove()
        assert not c.running()


@pytest.mark.long
def test_the_image_is_a_valid_oci_image_of_this_version(cpu_image):
    out, record = cpu_image
    skopeo = require_binary("skopeo")
    ref = f"oci:{out / 'oci'}:{VERSION}-cpu"
    r = subprocess.run([skopeo, "inspect", ref], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    inspect = json.loads(r.stdout)
    # Debian, the locked dependencies, fleetcanary: a release that changes only fleetcanary changes the last
    assert len(inspect["Layers"]) == 3 and inspect["Os"] == "linux" and inspect["Architecture"] == "amd64"
    assert record["layers"] == ["debian", "dependencies", "fleetcanary"]
    assert len(record["layers_compressed_bytes"]) == 3 and record["layers_compressed_bytes"][2] < 2**23
    labels = inspect["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION == record["version"]
    assert labels["org.opencontainers.image.revision"] == record["revision"] != "unknown"
    assert labels["org.opencontainers.image.source"].startswith("https://")
    assert labels["io.fleetcanary.flavour"] == "cpu" and labels["io.fleetcanary.cuda"] == "none"
    r = subprocess.run([skopeo, "inspect", "--config", ref], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    config = json.loads(r.stdout)["config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["fleetcanary"] and config["Cmd"] == ["run"]
    assert "9835/tcp" in config["ExposedPorts"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PATH"].startswith("/opt/fleetcanary/bin:") and env["FLEETCANARY_STATE_DIR"] == "/var/lib/fleetcanary"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONUNBUFFERED"] == "1"


@pytest.mark.long
def test_the_container_serves_metrics_of_this_version_as_65532(container, cpu_image):
    from prometheus_client.parser import text_string_to_metric_families

    c, port = container
    _, record = cpu_image

    def scrape():
        if not c.running():
            raise StopWaiting(f"the container stopped: {c.output()[-1500:]}")
        status, _, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        return body.decode() if status == 200 else None

    text = wait_for(scrape, timeout=120, what="the container's /metrics")
    info = [s.labels for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "fleetcanary_build_info"]
    assert len(info) == 1, info
    manifest_tags = [c_["image"].rsplit(":", 1)[1]
                     for d in yamltext.load_all((ROOT / "deploy/base/daemonset.yaml").read_text()) if d
                     for c_ in d["spec"]["template"]["spec"]["containers"]]
    assert info[0]["version"] == VERSION == record["version"] == manifest_tags[0]
    assert f"{VERSION}-cpu" in record["tags"]
    assert info[0]["commit"] == record["revision"]  # the wheel in the image is stamped with the build's commit
    pid = c.state()["pid"]
    assert uid_of(pid) == (65532, 65532, 65532, 65532)


@pytest.mark.long
def test_torch_of_the_lock_imports_in_the_container(container):
    c, _ = container
    want = lock_pins(build_image.lock_file("cpu"))["torch"]
    r = c.exec("/opt/fleetcanary/bin/python", "-c",
               "import os, torch; print(torch.__version__, os.getuid(), torch.ones(3).sum().item())")
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stdout.split() == [want, "65532", "3.0"]
    # the root is read-only: the image's user writes only to its state directory and /tmp
    r = c.exec("/bin/sh", "-c", "touch /opt/fleetcanary/x; touch /var/lib/fleetcanary/x && echo state-ok")
    assert "Read-only file system" in r.stderr and r.stdout.strip() == "state-ok", (r.stdout, r.stderr)


@pytest.mark.long
def test_ctrl_c_in_the_debian_step_leaves_nothing_mounted_or_running(tmp_path):
    """Ctrl-C (SIGINT to the build's process group) while mmdebstrap has the chroot's /proc, /sys and /dev
    mounted: one line, exit 130, and no mount or process of the build is left."""
    require_build_tools()
    out = tmp_path / "out"
    # SIGINT at its default first, as in a terminal: a job started in the background of a shell without job
    # control (a CI runner's, scripts/stress-test's) inherits it ignored, and Python then never raises
    # KeyboardInterrupt; the build's exit was mmdebstrap's own (exit 1, "debian failed (exit 25)") whenever
    # mmdebstrap had its INT trap set rather than dying of the signal.
    build = [sys.executable, str(SCRIPT), "--flavour", "cpu", "--out", str(out), "--cache", str(tmp_path / "cache")]
    p = subprocess.Popen([sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                          "os.execv(sys.argv[1], sys.argv[1:])", *build],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        def in_chroot():
            if p.poll() is not None:
                raise StopWaiting(f"the build ended first: {p.stderr.read()}")
            log = out / "logs/debian.log"
            # mmdebstrap mounts the chroot's /proc, /sys and /dev after extracting the essential packages and
            # before it says this (run_essential), and unmounts them at the end
            return log.is_file() and "installing essential packages..." in log.read_text()

        wait_for(in_chroot, timeout=300, what="mmdebstrap installing the essential packages in its chroot")
        os.killpg(p.pid, signal.SIGINT)
        code = p.wait(timeout=120)
        err = p.stderr.read()
        assert code == 130, err
        assert err.count("\n") == 1 and "interrupted" in err, err
        wait_for(lambda: not session_processes(p.pid), timeout=120, what="the build's processes to exit")
        assert not mounts_under(out)
    finally:
        if p.poll() is None or session_processes(p.pid):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=60)


@pytest.mark.long
def test_a_rebuild_takes_the_debian_and_dependency_layers_from_the_cache_and_gives_the_same_image(cpu_image,
                                                                                                  tmp_path):
    """The same commit built again with the cache the fixture's build left: nothing but fleetcanary's layer
    is installed or compressed, and the image is the same, digest for digest."""
    _, first = cpu_image
    again = tmp_path / "again"
    r = subprocess.run([sys.executable, str(SCRIPT), "--flavour", "cpu", "--out", str(again)],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr
    record = json.loads((again / "build-cpu.json").read_text())
    assert record["cache"]["debian"] == record["cache"]["dependencies"] == "cached", record["cache"]
    assert not any(k.startswith(("debian", "install-", "download-cpu")) for k in record["steps"]), record["steps"]
    assert record["digest"] == first["digest"] and record["layers_compressed_bytes"] == first["layers_compressed_bytes"]
    assert not mounts_under(again) and not (again / "work").exists()
    shutil.rmtree(again, ignore_errors=True)
