"""The wrk HTTP load generator, run once against a URL, its report parsed: latency percentiles from its
distribution (--latency), requests, requests per second, and every error it counts (socket errors and
non-2xx answers). Used by benchmarks/scrape.py (the measured table) and the load test in
tests/reliability (200 scrapers, zero errors). Requests carry Accept-Encoding: gzip, as Prometheus sends.
"""
from __future__ import annotations

import re
import shutil
import subprocess

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _dur(txt: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s|m)$", txt)
    if not m:
        raise ValueError(txt)
    return float(m.group(1)) * _UNITS[m.group(2)]


def wrk(url: str, connections: int, duration: int, threads: int) -> dict:
    """Run wrk for ``duration`` seconds. wrk missing or failing: SystemExit with a one-line reason (a test
    checks the binary first, so that a missing one fails or skips by the house rule)."""
    exe = shutil.which("wrk")
    if not exe:
        raise SystemExit("benchmark: wrk is not installed (apt-get install wrk)")
    r = subprocess.run([exe, f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency", "--timeout", "10s",
                        "-H", "Accept-Encoding: gzip", url], capture_output=True, text=True, timeout=duration + 60)
    if r.returncode != 0:
        raise SystemExit(f"benchmark: wrk failed: {r.stderr.strip()[-300:]}")
    out = r.stdout
    pct = {p: _dur(v) for p, v in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)", out, re.MULTILINE)}
    reqs = re.search(r"(\d+) requests in", out)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    errs = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    bad_status = int(non2xx.group(1)) if non2xx else 0
    errors = (sum(int(x) for x in errs.groups()) if errs else 0) + bad_status
    return {"p50_seconds": pct.get("50"), "p90_seconds": pct.get("90"), "p99_seconds": pct.get("99"),
            "requests": int(reqs.group(1)) if reqs else 0, "requests_per_second": float(rps.group(1)) if rps else 0,
            "errors": errors, "non2xx": bad_status, "raw": out}
