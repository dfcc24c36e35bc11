"""Real `fleetcanary once --json` result files for the acceptance, compare and report tests."""
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

from fleetcanary import cli

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


def cli_in_process(*args) -> subprocess.CompletedProcess:
    """`fleetcanary ARGS` through the CLI's own main() in this process: the same parser, code and messages without a
    Python start-up (tests with dozens of cases; each module keeps one run through `python -m fleetcanary` for the
    process exit). A SystemExit (a config error's exit 2) is its return code."""
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    return subprocess.CompletedProcess(["fleetcanary", *argv], code, out.getvalue(), err.getvalue())


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


def steady_runs(src: Path, dst: Path, factors: tuple[float, ...]) -> None:
    """Copy a result file as the record of a steady machine: the k-th run of each probe carries that probe's first
    run's figure medians scaled by factors[k % len(factors)], its repeats +-0.5% around that. The spread within and
    between runs is then known (not whatever the machine's load did), so a verdict on it cannot depend on how
    steady the machine was; the parameters and environment stay the real run's."""
    data = json.loads(src.read_text())
    first: dict[str, dict] = {}
    seen: dict[str, int] = {}
    for run in data["runs"]:
        figures = (run.get("result") or {}).get("figures", [])
        k = seen.get(run["probe"], 0)
        seen[run["probe"]] = k + 1
        ref = first.setdefault(run["probe"], {_key(f): f for f in figures})
        for f in figures:
            if _key(f) in ref:
                level = ref[_key(f)]["median"] * factors[k % len(factors)]
                # within a run too the spread is known: the repeats sit +-0.5% around the run's level
                f["repeats"] = [level * (0.995, 1.0, 1.005)[i % 3] for i in range(len(ref[_key(f)]["repeats"]))]
                f["median"] = statistics.median(f["repeats"]) if f["repeats"] else level
    dst.write_text(json.dumps(data))


def _key(figure: dict) -> str:
    return json.dumps([figure["name"], figure.get("labels", {})], sort_keys=True)
