"""What only the benchmarks share: plain HTTP gets, a process's CPU and RSS from /proc, and writing the
JSON result beside the printed table. Ports, polling with a deadline, servers and backfill are harness/'s
(the one library of tests and benchmarks)."""
from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


def proc_stats(pid: int) -> tuple[float, int]:
    """(cpu seconds, rss bytes) of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss


def write_result(out: str | Path, data: dict) -> None:
    """Write the benchmark's JSON (creating its folder) and say where."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(data, indent=1))
    print(f"wrote {out}")
