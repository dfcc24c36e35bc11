#!/usr/bin/env python3
"""The storage probe beside fio, on the same file, size and mode.

One file (default 1 GiB, in --dir) is written once. Then, interleaved so drift hits
both alike, --rounds times each:
- cold sequential read, 1 MiB blocks, O_DIRECT:     probe (_read_file, direct)  vs  fio rw=read direct=1 psync
- cold sequential read, 1 MiB blocks, page cache evicted first:
                                                    probe (fadvise DONTNEED)    vs  fio rw=read direct=0 invalidate=1
- 4 KiB random read latency, O_DIRECT, N reads:     probe (_random_reads)       vs  fio rw=randread bs=4k direct=1 psync
                                                                                    (clat p50)
The probe side calls the same functions the storage probe runs. Prints medians and
the ratio probe/fio (target: within 10%), writes benchmarks/results/storage.json.

    python -m benchmarks.storage [--dir DIR] [--size-mib 1024] [--rounds 3] [--random-reads 2000]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import write_result
from fleetcanary.probes import storage

ROOT = Path(__file__).resolve().parent.parent


def fio(args: list[str]) -> dict:
    exe = shutil.which("fio")
    if not exe:
        raise SystemExit("benchmark: fio is not installed (apt-get install fio)")
    r = subprocess.run([exe, "--output-format=json", *args], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"benchmark: fio failed: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]["read"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(ROOT / "benchmarks/results"), help="directory on the storage to test")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--random-reads", type=int, default=2000)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/storage.json"))
    args = ap.parse_args()
    size = args.size_mib << 20
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fc-bench-storage-", dir=args.dir))
    f = work / "bench.bin"
    # rows[key][who][position]: position 0 = read first in its round, 1 = second
    rows: dict[str, dict[str, list[list[float]]]] = {k: {"probe": [[], []], "fio": [[], []]}
                                                     for k in ("seq_direct", "seq_evicted", "rand4k_direct")}
    try:
        storage._write_file(f, size, 16 << 20)
        common = [f"--filename={f}", f"--size={size}", "--name=bench", "--ioengine=psync"]
        def probe_seq_direct():
            _, t, n = storage._read_file(f, 1 << 20, 4096, direct=True)
            return n / t

        def probe_seq_evicted():
            storage._evict(f)
            _, t, n = storage._read_file(f, 1 << 20, 4096, direct=False)
            return n / t

        def fio_seq_evicted():
            storage._evict(f)
            return fio(common + ["--rw=read", "--bs=1M", "--direct=0", "--invalidate=1"])["bw_bytes"]

        pairs = {
            "seq_direct": (probe_seq_direct,
                           lambda: fio(common + ["--rw=read", "--bs=1M", "--direct=1"])["bw_bytes"]),
            "seq_evicted": (probe_seq_evicted, fio_seq_evicted),
            "rand4k_direct": (
                lambda: statistics.median(storage._random_reads(f, size, args.random_reads, direct=True)),
                lambda: fio(common + ["--rw=randread", "--bs=4k", "--direct=1", f"--number_ios={args.random_reads}",
                                      "--randrepeat=0"])["clat_ns"]["percentile"]["50.000000"] / 1e9),
        }
        # Who goes first alternates by round, and results are compared by position: on a
        # virtual disk the host's own page cache can serve the second reader of the same
        # blocks (seen here: ~2x), which would otherwise decide the comparison.
        for i in range(args.rounds):
            for key, (probe_fn, fio_fn) in pairs.items():
                order = (("probe", probe_fn), ("fio", fio_fn)) if i % 2 == 0 else (("fio", fio_fn), ("probe", probe_fn))
                for pos, (who, fn) in enumerate(order):
                    rows[key][who][pos].append(fn())
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"storage probe vs fio on {args.dir} ({os.statvfs(args.dir).f_bsize} B blocks), file {args.size_mib} MiB, "
          f"{args.rounds} rounds interleaved (order alternating), medians")
    print("each tool is compared with the other in the same position of its round (first reader: cold on the "
          "host too; second reader: possibly served by the host's cache)")
    print(f"{'measurement':34} {'position':>9} {'probe':>14} {'fio':>14} {'probe/fio':>10}")
    result = {"dir": args.dir, "size_bytes": size, "rounds": args.rounds, "rows": {}}
    names = {"seq_direct": "cold seq read, O_DIRECT, 1 MiB", "seq_evicted": "cold seq read, cache evicted, 1 MiB",
             "rand4k_direct": "4 KiB random read latency, O_DIRECT"}
    for key, v in rows.items():
        unit = (lambda x: f"{x * 1e6:10.1f} us") if key.startswith("rand") else (lambda x: f"{x / 1e6:9.1f} MB/s")
        result["rows"][key] = {"probe": v["probe"], "fio": v["fio"]}
        for pos, pos_name in enumerate(("first", "second")):
            p, q = statistics.median(v["probe"][pos]), statistics.median(v["fio"][pos])
            ratio = p / q
            verdict = "ok" if abs(ratio - 1) <= 0.10 else "OFF"
            print(f"{names[key]:34} {pos_name:>9} {unit(p):>14} {unit(q):>14} {ratio:>9.3f} {verdict}")
            result["rows"][key][pos_name] = {"probe_median": p, "fio_median": q, "ratio": ratio}
        # Pooled: each tool had the same number of first and second places, so this is fair too.
        ap_, aq = v["probe"][0] + v["probe"][1], v["fio"][0] + v["fio"][1]
        p, q = statistics.median(ap_), statistics.median(aq)
        cvp, cvq = statistics.stdev(ap_) / statistics.fmean(ap_), statistics.stdev(aq) / statistics.fmean(aq)
        verdict = "ok" if abs(p / q - 1) <= 0.10 else "OFF"
        print(f"{names[key]:34} {'pooled':>9} {unit(p):>14} {unit(q):>14} {p / q:>9.3f} {verdict}  "
              f"(CV probe {cvp * 100:.0f}%, fio {cvq * 100:.0f}%)")
        result["rows"][key]["pooled"] = {"probe_median": p, "fio_median": q, "ratio": p / q, "probe_cv": cvp,
                                         "fio_cv": cvq}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
