"""Node acceptance: `fleetcanary once --repeat N --expect FILE` on real runs (and fake NVML for GPU facts)."""
import json
import subprocess
import sys

import pytest

from fleetcanary.offline.simulate_llm import SimSettings, start_in_thread
from tests.conftest import ROOT
from tests.support.results import config, once

NVML = ROOT / "probes/testing/nvml_facts"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    server, _ = start_in_thread(SimSettings(ttft_ms=20, itl_ms=4, max_tokens_default=32))
    yield config(tmp_path_factory.mktemp("acc"), f"http://127.0.0.1:{server.server_address[1]}/v1")
    server.shutdown()
    server.server_close()


def expect(tmp_path, text: str):
    f = tmp_path / "expect.yaml"
    f.write_text(text)
    return f


CPU_OK = """
models:
  "*":
    - {probe: host_memory_bandwidth, figure: triad, min: 1.0e9}
    - {probe: storage, figure: read_hot, labels: {target: scratch}, min: 1.0e8}
    - {probe: storage, figure: first_byte_cold, max: 0.5}
    - {probe: inference, figure: ttft, max: 1.0}
    - {metric: fleetcanary_inference_quality_pass, equals: 1}
"""


def test_acceptance_passes_and_prints_every_check(cfg, tmp_path):
    r = once(cfg, tmp_path / "out.txt", ["host_memory_bandwidth", "storage", "inference"], repeat=2,
             extra=["--expect", str(expect(tmp_path, CPU_OK))])
    data = json.loads((tmp_path / "out.txt").read_text())
    assert r.returncode == 0, r.stderr[-2000:]
    acc = data["acceptance"]
    assert acc["passed"] is True and acc["gpu_model"] is None
    checks = {row["check"] for row in acc["rows"]}
    assert {"host_memory_bandwidth triad", "storage read_hot {target=scratch}", "inference ttft",
            "fleetcanary_inference_quality_pass"} <= checks
    triad = next(row for row in acc["rows"] if row["check"] == "host_memory_bandwidth triad")
    assert "n=2" in triad["observed"] and triad["pass"] and triad["value"] > 1e9


def test_a_failed_check_fails_the_run_and_is_named(cfg, tmp_path):
    text = CPU_OK.replace("min: 1.0e9", "min: 1.0e15")
    out = tmp_path / "out.txt"
    r = once(cfg, out, ["host_memory_bandwidth", "storage", "inference"], repeat=2,
             extra=["--expect", str(expect(tmp_path, text))])
    assert r.returncode == 1
    # the table form names the failed check
    t = subprocess.run([sys.executable, "-m", "fleetcanary", "once", "--config", str(cfg), "--probe",
                        "host_memory_bandwidth", "--expect", str(expect(tmp_path, text))],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert t.returncode == 1
    fail = [ln for ln in t.stdout.splitlines() if ln.rstrip().endswith("FAIL")]
    assert fail and fail[0].startswith("host_memory_bandwidth triad") and ">= 1000.00 TB/s" in fail[0]
    assert "acceptance: FAIL" in t.stdout


def test_checks_of_a_probe_that_did_not_run_fail(cfg, tmp_path):
    text = "models:\n  '*':\n    - {probe: gpu_bandwidth, figure: d2d, min: 1.0e12}\n"
    r = once(cfg, tmp_path / "o.txt", ["host_memory_bandwidth"], repeat=1,
             extra=["--expect", str(expect(tmp_path, text))])
    acc = json.loads((tmp_path / "o.txt").read_text())["acceptance"]
    assert r.returncode == 1 and not acc["passed"]
    assert "no successful run" in acc["rows"][0]["observed"]


GPU = f"""
models:
  "{H100}":
    - {{metric: fleetcanary_gpu_pcie_link_width, equals: 16}}
    - {{metric: fleetcanary_gpu_pcie_link_generation_max, equals: 5}}
    - {{metric: fleetcanary_gpus_visible, min: 8}}
    - {{metric: fleetcanary_gpu_nvlink_links_up, min: 18}}
"""


@pytest.mark.parametrize("fixture,passed,failing", [
    ("h100_8gpu_healthy.json", True, []),
    ("h100_8gpu_degraded.json", False,
     ["fleetcanary_gpu_pcie_link_width gpu=2", "fleetcanary_gpu_nvlink_links_up gpu=5"]),
])
def test_pcie_and_nvlink_expectations_per_gpu(cfg, tmp_path, fixture, passed, failing):
    out = tmp_path / "o.txt"
    r = once(cfg, out, ["gpu_health"], repeat=2, extra=["--expect", str(expect(tmp_path, GPU))],
             env={"FLEETCANARY_FAKE_NVML": str(NVML / fixture)})
    acc = json.loads(out.read_text())["acceptance"]
    assert acc["gpu_model"] == H100
    assert acc["passed"] is passed and (r.returncode == 0) is passed
    widths = [row for row in acc["rows"] if row["check"] == "fleetcanary_gpu_pcie_link_width"]
    assert len(widths) == 8, "one row per GPU"
    bad = [f"{row['check']} {row['series']}" for row in acc["rows"] if not row["pass"]]
    for f in failing:
        assert any(b.startswith(f) for b in bad), (f, bad)


def test_a_gpu_model_missing_from_the_file_fails(cfg, tmp_path):
    text = "models:\n  'NVIDIA B200':\n    - {metric: fleetcanary_gpus_visible, min: 8}\n"
    out = tmp_path / "o.txt"
    r = once(cfg, out, ["gpu_health"], repeat=1, extra=["--expect", str(expect(tmp_path, text))],
             env={"FLEETCANARY_FAKE_NVML": str(NVML / "h100_8gpu_healthy.json")})
    acc = json.loads(out.read_text())["acceptance"]
    assert r.returncode == 1 and acc["rows"][0]["check"] == "expectations for this GPU model"
    assert acc["rows"][0]["observed"] == H100 and "NVIDIA B200" in acc["rows"][0]["expected"]


@pytest.mark.parametrize("text,message", [
    ("models:\n  '*':\n    - {probe: storage}\n", "give exactly one of figure or metric"),
    ("models:\n  '*':\n    - {probe: nope, figure: x, min: 1}\n", "figure checks need a known probe"),
    ("models:\n  '*':\n    - {metric: fleetcanary_nope, min: 1}\n", "no probe publishes fleetcanary_nope"),
    ("models:\n  '*':\n    - {probe: storage, figure: read_hot}\n", "give a condition"),
    ("models: [\n", "not YAML"),
    ("{}", "models: Field required"),
])
def test_bad_expectation_files_are_one_line_errors(cfg, tmp_path, text, message):
    r = once(cfg, tmp_path / "o.txt", ["host_memory_bandwidth"], repeat=1,
             extra=["--expect", str(expect(tmp_path, text))])
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
