"""The product a user installs behaves like the checkout.

Builds the sdist and, from it, the wheel (as `python -m build` does), installs the wheel
into a clean virtual environment and runs the commands from a directory outside the
repository that holds decoy `probes/` and `exporter/` packages which raise on import.
Nothing is downloaded: the clean environment finds the dependencies in this test
environment's site-packages through a path entry (not its .pth files, so the editable
install of the checkout stays invisible there).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import pytest
import yaml

from fleetcanary.probes.lib import yamltext
from tests.support.helpers import require_binary, wait_for

ROOT = Path(__file__).resolve().parents[2]
DECOY = "raise ImportError('decoy package from the working directory was imported')\n"


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # the build's own warnings; the lines that only name a file it copies (release/deprecations.yaml) are not
    warnings = [ln for ln in (r.stdout + r.stderr).splitlines() if re.search(r"warn|deprecat", ln, re.IGNORECASE)
                and not re.match(r"(copying|adding|creating|hard linking) ", ln)]
    assert warnings == [], warnings
    return out


@pytest.fixture(scope="module")
def wheel(dist) -> Path:
    (w,) = dist.glob("fleetcanary-*.whl")
    return w


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    v = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(v)], check=True, timeout=300)
    (purelib,) = (v / "lib").glob("python*/site-packages")
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "fleetcanary-test-deps.pth").write_text("\n".join(ours) + "\n")
    r = subprocess.run([str(v / "bin/python"), "-m", "pip", "install", "--no-index", "--no-deps", "-q", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return v


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A working directory outside the repository with decoy packages named like our folders."""
    d = tmp_path_factory.mktemp("outside")
    for name in ("probes", "exporter"):
        (d / name).mkdir()
        (d / name / "__init__.py").write_text(DECOY)
    return d


def fc(venv: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin/fleetcanary"), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=env)


def test_the_wheel_installs_one_package_with_its_data_and_no_generators(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        top = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert z.read(top).decode().split() == ["fleetcanary"]
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        assert json.loads(z.read("fleetcanary/_build.json"))["commit"] not in ("", "unknown")
    assert {n.split("/")[0] for n in names} == {"fleetcanary", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "License-Expression: Apache-2.0" in meta
    assert any(n.endswith("licenses/LICENSE") for n in names)
    for data in ("fleetcanary/rules/fleetcanary.rules.yml", "fleetcanary/rules/fleetcanary.alerts.yml",
                 "fleetcanary/dashboards/json/fleet-overview.json", "fleetcanary/probes/collectives/rank.py",
                 "fleetcanary/probes/testing/nvml_facts/h100_8gpu_degraded.json",  # the demo's nodes
                 "fleetcanary/probes/lib/xid_catalogue.yaml"):  # the XID catalogue the exporter reads
        assert data in names
    for dev_only in ("build_tests.py", "backfill.py", "runbooks.py", "docgen.py", "boards/node_detail.py",
                     "dashboards/build.py"):
        assert not [n for n in names if n.endswith(dev_only)], dev_only
    # the rule generator ships: deployers render the rules with their own settings (`fleetcanary rules`)
    assert {"fleetcanary/rules/build.py", "fleetcanary/rules/rules_nic.py", "fleetcanary/rules/rules_fabric.py"} \
        <= set(names)


def test_rules_render_with_a_deployers_settings_from_outside_the_repo(venv, outside, tmp_path):
    settings = tmp_path / "settings.yaml"
    settings.write_text('selector: \'job="gpu-canary"\'\npools: [train-a]\n')
    out = tmp_path / "rules"
    out.mkdir()
    r = fc(venv, outside, "rules", "--settings", str(settings), "--out", str(out))
    assert r.returncode == 0, r.stderr
    alerts = yamltext.load((out / "fleetcanary.alerts.yml").read_text())
    names = {g["name"] for g in alerts["groups"]}
    assert {"fleetcanary-peers-train-a", "fleetcanary-peers-other-pools"} <= names
    assert 'job="gpu-canary"' in (out / "fleetcanary.alerts.yml").read_text()
    settings.write_text("thresholds: {}\n")
    r = fc(venv, outside, "rules", "--settings", str(settings), "--out", str(out))
    assert r.returncode == 2 and "unknown keys ['thresholds']" in r.stderr and "Traceback" not in r.stderr


def test_version_probes_and_check_config_from_outside_the_repo(venv, outside):
    r = fc(venv, outside, "version")
    assert r.returncode == 0, r.stderr
    commit = re.search(r"commit (\S+)\)", r.stdout).group(1)
    if (ROOT / ".git").exists():
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        assert commit.startswith(head.strip()), (commit, head)
    else:
        assert commit != "unknown"
    r = fc(venv, outside, "probes")
    assert r.returncode == 0, r.stderr
    assert {ln.split()[0] for ln in r.stdout.splitlines()} >= {"gpu_bandwidth", "collectives", "inference"}
    r = fc(venv, outside, "check-config", str(ROOT / "config.example.yaml"))
    assert r.returncode == 0 and ": ok (" in r.stdout, r.stderr
    r = subprocess.run([str(venv / "bin/python"), "-m", "fleetcanary", "version"], capture_output=True, text=True,
                       cwd=outside, timeout=120)
    assert r.returncode == 0 and commit in r.stdout, r.stderr


def test_once_runs_a_probe_in_an_isolated_worker_and_leaves_the_history_alone(venv, outside, tmp_path):
    state = tmp_path / "state"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"state_dir": str(state), "probes": {"host_memory_bandwidth": {
        "params": {"array_bytes": 8 << 20, "repeats": 3}}}}))
    r = fc(venv, outside, "once", "--config", str(cfg), "--probe", "host_memory_bandwidth", "--json")
    assert r.returncode == 0, r.stderr
    (run,) = json.loads(r.stdout)["runs"]
    assert run["outcome"] == "success" and run["result"]["figures"], run
    assert not (state / "results.jsonl").exists()
    r = fc(venv, outside, "once", "--config", str(cfg), "--probe", "host_memory_bandwidth", "--history")
    assert r.returncode == 0, r.stderr
    assert len((state / "results.jsonl").read_text().splitlines()) == 1


def test_demo_loads_every_rule_group_into_prometheus(venv, outside, tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    expected = {g["name"] for f in ("fleetcanary.rules.yml", "fleetcanary.alerts.yml")
                for g in yamltext.load((ROOT / "alerts" / f).read_text())["groups"]}
    out = tmp_path / "demo.out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    with open(out, "wb") as log:
        # the fleet demo: its simulated nodes read the recorded NVML facts the wheel carries (not --fast, which
        # loads copies of the rule files with every group at 2 s)
        proc = subprocess.Popen([str(venv / "bin/fleetcanary"), "demo", "--nodes", "2",
                                 "--prometheus-listen", "127.0.0.1:0", "--alertmanager-listen", "127.0.0.1:0",
                                 "--workdir", str(tmp_path / "w"), "--duration", "300"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=outside, env=env, start_new_session=True)
    try:
        url = wait_for(lambda: re.search(r"Prometheus:\s+(http://\S+)", out.read_text()) or proc.poll() is not None,
                       timeout=120, what="the demo's Prometheus")
        assert proc.poll() is None, out.read_text()
        with urllib.request.urlopen(url.group(1) + "/api/v1/rules", timeout=10) as resp:
            groups = json.load(resp)["data"]["groups"]
        assert {g["name"] for g in groups} == expected
        assert all(g["file"].startswith(str(venv)) for g in groups), [g["file"] for g in groups]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    assert rc == 0, out.read_text()


@pytest.mark.long
def test_the_sdist_carries_what_the_tests_need_and_they_pass_from_it(dist, venv, tmp_path):
    (sdist,) = dist.glob("fleetcanary-*.tar.gz")
    with tarfile.open(sdist) as t:
        t.extractall(tmp_path, filter="data")
    (src,) = tmp_path.glob("fleetcanary-*")
    for needed in ("Makefile", ".ci/run", "LICENSE", "alerts/tests/peers.test.yml", "probes/testing/nvml_facts",
                   "scripts/generate", "scripts/lint-imports", "dashboards/build.py", "deploy/base/daemonset.yaml",
                   "exporter/_build.json", "probes/lib/xid_catalogue.yaml"):
        assert (src / needed).exists(), needed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # a sample that reads each kind of file the tests need from the sdist (every generator and its sources,
    # the docs, the probes' contracts, config and state files); the whole suite runs from the checkout. One run
    # of the generators is enough to show their sources are there (test_a_stale_file_is_named runs them again on
    # a copy, for its message)
    r = subprocess.run([str(venv / "bin/python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/core/test_config.py", "tests/core/test_statefile.py", "tests/runner/test_history.py",
                        "tests/probes/test_contract.py",
                        "tests/test_docs.py", "tests/test_generated.py::test_no_generated_file_is_stale"],
                       capture_output=True, text=True, cwd=src, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert re.search(r"\d+ passed", r.stdout)
    # ... and those tests ran against the installed wheel, not the checkout
    r = subprocess.run([str(venv / "bin/python"), "-c", "import fleetcanary; print(fleetcanary.__file__)"],
                       capture_output=True, text=True, cwd=src, env=env, timeout=60)
    assert r.stdout.strip().startswith(str(venv)), r.stdout


def test_a_stray_probes_folder_in_the_working_directory_does_not_reach_the_workers(venv, outside, tmp_path):
    """Workers start with python -I: a decoy fleetcanary/ where the daemon runs is not imported either."""
    (outside / "fleetcanary").mkdir(exist_ok=True)
    (outside / "fleetcanary" / "__init__.py").write_text(DECOY)
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "s"), "probes": {"host_memory_bandwidth": {
            "params": {"array_bytes": 8 << 20, "repeats": 2}}}}))
        r = fc(venv, outside, "once", "--config", str(cfg), "--probe", "host_memory_bandwidth")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "success" in r.stdout
    finally:
        shutil.rmtree(outside / "fleetcanary")
