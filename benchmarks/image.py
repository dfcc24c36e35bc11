#!/usr/bin/env python3
"""The images `make image` builds (scripts/build-image, docs/image.md): per flavour, the build time, the
compressed size (the layer blobs a registry stores and a node pulls), the unpacked size (the layers' tars), and
the container's start-to-first-scrape time: from `crun run` of the unpacked bundle to the first 200 of
/metrics on a loopback port (median of --starts runs; the bundle is unpacked once, outside the timing).

    python -m benchmarks.image [--flavour cpu --flavour cuda12 --flavour cuda] [--no-build] [--out build/image]
                               [--starts 3] [--result benchmarks/results/image.json]

Builds each flavour first, twice: once into an empty layer cache (one `scripts/build-image` run, so the Debian
layer is built once and its time counts in each flavour's total), then again with the Debian and dependency
layers cached (what a commit that changes only fleetcanary costs); --no-build reads the records an earlier
build left in --out instead.
Root (mmdebstrap, chroot, crun). Prints a table and writes the JSON result.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.common import write_result
from harness.container import Container
from harness.poll import StopWaiting, wait_for
from harness.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts/build-image"


def first_scrape_seconds(layout: Path, tag: str, starts: int) -> list[float]:
    times = []
    with tempfile.TemporaryDirectory(prefix="fleetcanary-bench-image-") as tmp:
        c = Container(layout, tag, Path(tmp), f"fleetcanary-bench-{os.getpid()}")
        c.unpack()
        for i in range(starts):
            port = free_port()
            c.name = f"fleetcanary-bench-{os.getpid()}-{i}"
            c.configure(["fleetcanary", "run", "--listen-address", f"127.0.0.1:{port}"])
            try:
                t0 = c.start()

                def up(c=c, port=port):
                    if not c.running():
                        raise StopWaiting(f"the container stopped: {c.output()[-800:]}")
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                            return r.status == 200
                    except OSError:
                        return False

                wait_for(up, timeout=300, interval=0.02, what=f"{tag}'s /metrics")
                times.append(time.monotonic() - t0)
            finally:
                c.stop()
        c.remove()
    return times


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavour", action="append", help="cpu, cuda12, cuda (repeat; default: all three)")
    p.add_argument("--out", type=Path, default=ROOT / "build/image")
    p.add_argument("--no-build", action="store_true", help="measure the images an earlier build left in --out")
    p.add_argument("--starts", type=int, default=3)
    p.add_argument("--result", default=str(ROOT / "benchmarks/results/image.json"))
    args = p.parse_args()
    flavours = args.flavour or ["cpu", "cuda12", "cuda"]
    if os.geteuid() != 0:
        raise SystemExit("benchmark: needs root (mmdebstrap, chroot, crun)")
    for tool in ("mmdebstrap", "umoci", "crun"):
        if not shutil.which(tool):
            raise SystemExit(f"benchmark: {tool} is not installed (make os-deps)")

    def records() -> dict[str, dict]:
        paths = {f: args.out / f"build-{f}.json" for f in flavours}
        for f, path in paths.items():
            if not path.is_file():
                raise SystemExit(f"benchmark: no {path} (build the {f} image first, or drop --no-build)")
        return {f: json.loads(path.read_text()) for f, path in paths.items()}

    rebuilt = {}
    if args.no_build:
        first = records()
    else:
        # a clean build into an empty layer cache, then the same build again: what a commit that changes only
        # fleetcanary's code costs once the cache holds the Debian and dependency layers
        cache = args.out / "benchmark-cache"
        shutil.rmtree(cache, ignore_errors=True)
        cmd = [sys.executable, str(SCRIPT), "--out", str(args.out), "--cache", str(cache)] + \
            [a for f in flavours for a in ("--flavour", f)]
        try:
            if subprocess.run(cmd).returncode != 0:
                raise SystemExit("benchmark: the clean build failed")
            first = records()
            if subprocess.run(cmd).returncode != 0:
                raise SystemExit("benchmark: the cached build failed")
            rebuilt = records()
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    rows = []
    for f in flavours:
        rec = first[f]
        starts = first_scrape_seconds(args.out / "oci", rec["tags"][0], args.starts)
        rows.append({"flavour": f, "tags": rec["tags"], "digest": rec["digest"], "torch": rec["torch"],
                     "build_seconds": rec["seconds"]["total"], "build_steps_seconds": rec["steps"],
                     "cached_build_seconds": rebuilt[f]["seconds"]["total"] if rebuilt else None,
                     "cached_build_steps_seconds": rebuilt[f]["steps"] if rebuilt else None,
                     "same_digest_cached": rebuilt[f]["digest"] == rec["digest"] if rebuilt else None,
                     "compressed_bytes": sum(rec["layers_compressed_bytes"]),
                     "layers_compressed_bytes": rec["layers_compressed_bytes"],
                     "unpacked_bytes": sum(rec["layers_uncompressed_bytes"]),
                     "layers_unpacked_bytes": rec["layers_uncompressed_bytes"],
                     "start_to_first_scrape_seconds": round(statistics.median(starts), 2),
                     "start_to_first_scrape_all": [round(s, 2) for s in starts]})
    print(f"{'flavour':8} {'tag':12} {'build':>8} {'cached':>8} {'compressed':>12} {'unpacked':>12} "
          f"{'first scrape':>13}")
    for r in rows:
        cached = f"{r['cached_build_seconds']:>7.0f}s" if r["cached_build_seconds"] is not None else f"{'-':>8}"
        print(f"{r['flavour']:8} {r['tags'][0]:12} {r['build_seconds']:>7.0f}s {cached} "
              f"{mib(r['compressed_bytes']):>12} "
              f"{mib(r['unpacked_bytes']):>12} {r['start_to_first_scrape_seconds']:>12.2f}s")
    write_result(args.result, {
        "benchmark": "image", "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "gpu": shutil.which("nvidia-smi") is not None},
        "note": "build: a clean build of the flavour (wheel, Debian layer, wheelhouse download from the host's "
                "indexes, venv install, layers, OCI) into an empty layer cache; cached: the same build again, the "
                "Debian and dependency layers from the cache (what a commit that changes only fleetcanary costs); "
                "compressed: the layer blobs (gzip); unpacked: the layers' tars; "
                "first scrape: crun run of the unpacked bundle to the first 200 of /metrics (median)",
        "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
