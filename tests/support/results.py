"""Real `fleetcanary once --json` result files for the acceptance, compare and report tests."""
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def config(tmp: Path, llm_url: str, storage_file_bytes: int = 32 << 20, collectives: bool = False) -> Path:
    scratch = tmp / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    cfg = {"state_dir": str(tmp / "state"), "probes": {
        "host_memory_bandwidth": {"params": {"array_bytes": 32 << 20, "repeats": 5}},
        "storage": {"params": {"repeats": 3, "targets": [{"name": "scratch", "path": str(scratch),
                                                           "file_bytes": storage_file_bytes, "checkpoint_bytes": 0,
                                                           "small_files": 20, "min_free_bytes": 0}]}},
        "collectives": {"params": {"backend": "gloo", "sizes_bytes": [1024, 65536, 1048576], "iterations": 10}},
        "inference": {"params": {"targets": [{"name": "sim", "base_url": llm_url, "model": "reference",
                                              "stream_max_tokens": 32, "prefix_words": 128}]}}}}
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def once(cfg: Path, out: Path, probes: list[str], repeat: int = 3, extra: list[str] | None = None,
         env: dict | None = None) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "fleetcanary", "once", "--config", str(cfg), "--json", "--repeat", str(repeat)]
    for p in probes:
        args += ["--probe", p]
    r = subprocess.run(args + (extra or []), capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env={**{k: v for k, v in os.environ.items() if k != "FLEETCANARY_FAKE_NVML"}, **(env or {})})
    out.write_text(r.stdout)
    return r


def fleetcanary(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetcanary", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def scale_figure(src: Path, dst: Path, probe: str, name: str, factor: float) -> int:
    """Copy a result file with one figure's repeats and median scaled (an injected regression)."""
    data = json.loads(src.read_text())
    n = 0
    for run in data["runs"]:
        if run["probe"] != probe:
            continue
        for f in run["result"].get("figures", []):
            if f["name"] == name:
                f["repeats"] = [v * factor for v in f["repeats"]]
                f["median"] *= factor
                n += 1
    dst.write_text(json.dumps(data))
    return n


def jitter_runs(src: Path, dst: Path, factors: tuple[float, ...]) -> None:
    """Copy a result file with run i's figures (repeats and median) scaled by factors[i % len(factors)]: a candidate
    whose run-to-run spread is known, for verdict tests that must not depend on how steady the machine was."""
    data = json.loads(src.read_text())
    for i, run in enumerate(data["runs"]):
        k = factors[i % len(factors)]
        for f in (run.get("result") or {}).get("figures", []):
            f["repeats"] = [v * k for v in f["repeats"]]
            f["median"] *= k
    dst.write_text(json.dumps(data))
