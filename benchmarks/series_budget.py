#!/usr/bin/env python3
"""Series per node: what one 8-GPU node with 8 InfiniBand ports exposes at the default config, by family, and
what it costs Prometheus in all.

The real daemon (`python -m fleetcanary run`, as tests/support/daemon.py starts it) on the node that
harness/series_budget.py describes (fake NVML of an HGX H100 node, a sysfs tree of 8 NDR ports, every probe
at its defaults but for what this machine needs to run it), until every enabled probe has run once; then
its /metrics counted by family, with the families the CPU cannot show in full counted as the GPU node has
them (the harness says how). The whole node adds the judge's statistics at steady state (the node's judged
series fed to a figure store at the default intervals until each has a baseline) and the series the shipped
recording rules add per node (peer records shared by a pool of 10 alike nodes); the harness says how.

    python -m benchmarks.series_budget [--params '{"gpu_health": {"per_link": true}}'] [--out FILE]
    python -m benchmarks.series_budget --docs    # docs/metrics.md's "Series per node" from the JSON

Prints a table and writes benchmarks/results/series_budget.json (--out elsewhere for other --params); exits 1
when the exposition without the judge's statistics is over its budget (400). tests/test_series_budget.py builds
the same exposition in its own process and compares it with the docs table; scripts/docgen.py keeps that section
when it regenerates the rest of docs/metrics.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.common import get, write_result
from harness.ports import free_port
from harness.series_budget import (
    BUDGET,
    DOC,
    FAKE_NVML,
    JUDGE_PREFIX,
    ROOT,
    doc_section,
    families,
    node_config,
    replace_section,
    summarize,
)

OUT = ROOT / "benchmarks/results/series_budget.json"


def daemon_exposition(work: Path, params: dict[str, dict] | None = None, timeout: float = 900.0) -> tuple[str, dict]:
    """Start the daemon, wait until every enabled probe has run once; its /metrics and each probe's outcome."""
    from prometheus_client.parser import text_string_to_metric_families

    cfg = node_config(work, params)
    port = free_port()
    cfg["server"] = {"listen_address": f"127.0.0.1:{port}"}
    (work / "node.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "FLEETCANARY_FAKE_NVML": str(FAKE_NVML)}
    with open(work / "node.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fleetcanary", "run", "--config", str(work / "node.yaml")],
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"series_budget: the daemon exited {proc.returncode}: "
                                 f"{(work / 'node.log').read_text()[-2000:]}")
            try:
                text = get(url + "/metrics").decode()
            except OSError:  # not listening yet
                time.sleep(0.5)
                continue
            enabled, ran = set(), {}
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    if s.name == "fleetcanary_probe_interval_seconds":
                        enabled.add(s.labels["probe"])
                    elif s.name == "fleetcanary_probe_runs_total" and s.value > 0:
                        ran[s.labels["probe"]] = s.labels["outcome"]
            if enabled and enabled <= set(ran):
                return text, dict(sorted(ran.items()))
            if time.monotonic() > deadline:
                raise SystemExit(f"series_budget: not every probe ran within {timeout:g} s: "
                                 f"{sorted(enabled - set(ran))}; log: {work / 'node.log'}")
            time.sleep(2)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def table(result: dict) -> str:
    w = max(len(f) for f in result["by_family"])
    gaps = result["gpu_node_gaps"]
    lines = [f"{'family':<{w}}  series  (CPU run)", f"{'-' * w}  ------"]
    lines += [f"{f:<{w}}  {n:6d}" + (f"  ({gaps[f]['measured']})" if f in gaps else "")
              for f, n in result["by_family"].items()]
    lines.append(f"{'total':<{w}}  {result['series']:6d}  ({result['series_measured']})")
    lines.append(f"{'total without ' + JUDGE_PREFIX + '*':<{w}}  {result['series_without_judge']:6d}"
                 f"  budget {result['budget']}")
    lines += ["", f"{JUDGE_PREFIX}* at steady state ({result['steady_days']} days of runs):"]
    lines += [f"  {f:<{w - 2}}  {n:6d}" for f, n in result["judge_steady"].items() if n]
    lines += [f"recorded per node (peer records over a pool of {result['pool_nodes']}):"]
    lines += [f"  {r:<{w - 2}}  {n:6g}" for r, n in result["recorded"].items()]
    lines.append(f"{'total per node':<{w}}  {result['total_per_node']:6g}  budget {result['node_budget']}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="{}", help="JSON: probe -> params to add (e.g. opt-in detail)")
    ap.add_argument("--out", default=str(OUT), help="where to write the JSON")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for every probe's first run")
    ap.add_argument("--docs", action="store_true", help="rewrite docs/metrics.md's section from --out (no run)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (config, log, exposition)")
    args = ap.parse_args()
    if args.docs:
        result = json.loads(Path(args.out).read_text())
        if result["params"]:
            raise SystemExit("series_budget: the docs table is the default config; that result used --params")
        DOC.write_text(replace_section(DOC.read_text(), doc_section(result)))
        print(f"wrote {DOC.relative_to(ROOT)}")
        return 0
    params = json.loads(args.params)
    work = Path(tempfile.mkdtemp(prefix="fleetcanary-series-"))
    try:
        t0 = time.monotonic()
        text, ran = daemon_exposition(work, params, args.timeout)
        (work / "metrics.txt").write_text(text)
        result = summarize(families(text), ran, params)
        result["wall_seconds"] = round(time.monotonic() - t0, 1)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(table(result))
    write_result(args.out, result)
    return 0 if result["series_without_judge"] <= BUDGET else 1


if __name__ == "__main__":
    sys.exit(main())
