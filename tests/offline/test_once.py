import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def once(tmp_path, *args, env=None):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"state_dir: {tmp_path}\nprobes:\n  host_memory_bandwidth:\n    params:\n"
                   "      array_bytes: 8388608\n      repeats: 3\n")
    e = {k: v for k, v in os.environ.items() if k != "FLEETCANARY_FAKE_NVML"}
    return subprocess.run([sys.executable, "-m", "fleetcanary", "once", "--config", str(cfg), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, env={**e, **(env or {})})


def test_once_table_shows_gpu_probes_skipped_no_gpu(tmp_path):
    r = once(tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["probe", "figure", "median", "dispersion", "(MAD,", "CV)", "n", "status"]
    for probe in ("gpu_bandwidth", "gpu_p2p", "gpu_health"):
        assert any(ln.startswith(probe) and ln.rstrip().endswith("skipped (no_gpu)") for ln in lines), r.stdout
    assert any(ln.startswith("host_memory_bandwidth") and "GB/s" in ln and "success" in ln for ln in lines)
    from fleetcanary.probes import PROBES

    enabled = [n for n, cls in PROBES.items() if cls.default_enabled]  # the fabric probe is off by default
    assert f"[1/{len(enabled)}] host_memory_bandwidth" in r.stderr  # the progress display


def test_once_json_has_records_with_environment(tmp_path):
    r = once(tmp_path, "--json", "--probe", "host_memory_bandwidth")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    run = data["runs"][0]
    assert run["outcome"] == "success" and run["environment"]["cpu_model"]
    assert data["table"][0]["median"] > 0
    assert not (tmp_path / "results.jsonl").exists(), "once leaves the daemon's history alone unless asked"
    r = once(tmp_path, "--probe", "host_memory_bandwidth", "--history")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "results.jsonl").read_text().count("\n") == 1


def test_once_with_fake_nvml_runs_gpu_health(tmp_path):
    fixture = ROOT / "probes/testing/nvml_facts/h100_8gpu_degraded.json"
    r = once(tmp_path, "--probe", "gpu_health", "--json", env={"FLEETCANARY_FAKE_NVML": str(fixture)})
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)["runs"][0]
    assert run["outcome"] == "success"
    assert run["result"]["extra"]["gpus"][2]["pcie"]["width_current"] == 8


def test_unknown_probe_is_a_usage_error(tmp_path):
    r = once(tmp_path, "--probe", "nope")
    assert r.returncode == 2 and "unknown probe nope" in r.stderr


def test_once_shows_every_inference_target_and_fails_when_one_failed(tmp_path):
    """One target healthy, one answering 503: the healthy one's figures and both outcomes are printed,
    the run is a failure and `once` exits 1."""
    from fleetcanary.offline.simulate_llm import SimSettings, start_in_thread

    server, _ = start_in_thread(SimSettings(ttft_ms=5, itl_ms=1))
    base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"state_dir: {tmp_path}\nprobes:\n  inference:\n    params:\n      targets:\n"
                       f"      - {{name: good, base_url: '{base}', model: m, prefix_words: 32, stream_max_tokens: 8}}\n"
                       f"      - {{name: bad, base_url: '{base}', model: m, "
                       f"headers: {{X-Sim: '{{\"status\": 503}}'}}}}\n")
        r = subprocess.run([sys.executable, "-m", "fleetcanary", "once", "--config", str(cfg), "--probe", "inference"],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 1, (r.stdout, r.stderr)
    out = r.stdout
    assert "inference target good: success" in out and "inference target bad: http_5xx" in out
    assert any("ttft {target=good" in ln and "failure (http_5xx)" in ln for ln in out.splitlines()), out
    assert "1 of 2 targets failed" in out
