"""Run NVIDIA nccl-tests binaries for the collectives probe, and parse their output.

Used when ``collectives.nccl_tests_dir`` names a directory with all_reduce_perf and
friends. One process per collective drives every GPU (``-g N``) over the size range;
the sizes in the configured list are kept. Output is read from the ``-J`` JSON file
when the binary wrote one, else from the text table. Out-of-place figures are
published, as nccl-tests' own summary does; nccl-tests reports the mean time per
operation, so each figure has one value.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import tempfile
import time
from typing import Any

from fleetcanary.probes.base import Figure, ProbeError, ProbeResult, ProbeTimeout, Sample
from fleetcanary.probes.collectives.spec import ALGBW, BUSBW, LAT

BINARIES = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf", "reduce_scatter": "reduce_scatter_perf",
            "all_to_all": "alltoall_perf", "broadcast": "broadcast_perf"}

_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\S+)\s+(-?\d+)"
                  r"\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)")


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def parse_text(text: str) -> dict[str, Any]:
    """Rows of an nccl-tests text table plus its summary lines."""
    rows = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _ROW.match(line)
        if not m:
            continue
        g = m.groups()
        rows.append({"size": int(g[0]), "count": int(g[1]), "type": g[2], "redop": g[3], "root": int(g[4]),
                     "out_of_place": {"time_us": _num(g[5]), "algbw_gbps": _num(g[6]), "busbw_gbps": _num(g[7]),
                                      "wrong": None if g[8] == "N/A" else _num(g[8])},
                     "in_place": {"time_us": _num(g[9]), "algbw_gbps": _num(g[10]), "busbw_gbps": _num(g[11]),
                                  "wrong": None if g[12] == "N/A" else _num(g[12])}})
    oob = re.search(r"Out of bounds values\s*:\s*(\d+)", text)
    avg = re.search(r"Avg bus bandwidth\s*:\s*([\d.eE+-]+)", text)
    ver = re.search(r"nccl-library=(\d+)", text)
    return {"rows": rows, "out_of_bounds": int(oob.group(1)) if oob else None,
            "avg_busbw_gbps": float(avg.group(1)) if avg else None,
            "nccl_version": int(ver.group(1)) if ver else None}


def parse_json(text: str) -> dict[str, Any]:
    """The -J file: {"results": [{"size", "count", "type", "redop", "root",
    "out_of_place": {"time", "alg_bw", "bus_bw", "nwrong"}, "in_place": {...}}], ...}."""
    doc = json.loads(text)
    rows = []
    for r in doc.get("results") or []:
        def side(d):
            if not d:
                return {"time_us": math.nan, "algbw_gbps": math.nan, "busbw_gbps": math.nan, "wrong": None}
            t = d.get("time", d.get("cpu_time"))
            return {"time_us": _num(t), "algbw_gbps": _num(d.get("alg_bw")), "busbw_gbps": _num(d.get("bus_bw")),
                    "wrong": None if d.get("nwrong") is None else _num(d.get("nwrong"))}
        rows.append({"size": int(r["size"]), "count": int(r["count"]), "type": r.get("type"), "redop": r.get("redop"),
                     "root": int(str(r.get("root", -1)).strip() or -1), "out_of_place": side(r.get("out_of_place")),
                     "in_place": side(r.get("in_place"))})
    oob = (doc.get("out_of_bounds") or {}).get("count")
    avg = (doc.get("average_bus_bandwidth") or {}).get("bandwidth")
    return {"rows": rows, "out_of_bounds": oob, "avg_busbw_gbps": _num(avg) if avg is not None else None,
            "nccl_version": doc.get("nccl_version")}


def to_result(parsed: dict[str, dict[str, Any]], sizes: list[int], ranks: int, gate=None,
              detail: bool = False) -> ProbeResult:
    """Metrics and record from parsed outputs per collective (algorithm bandwidth and latency as series with
    `detail` only). Wrong results fail the probe."""

    res = ProbeResult(parameters={"backend": "nccl", "runner": "nccl-tests", "world": ranks, "sizes": sizes,
                                  "detail": detail},
                      touched={"ranks": ranks, "invasive": True, **(gate.record() if gate else {})})
    wrong = []
    wanted = set(sizes)
    for coll, p in parsed.items():
        if p.get("out_of_bounds"):
            wrong.append(f"{coll}: {p['out_of_bounds']} out-of-bounds values")
        for row in p["rows"]:
            op = row["out_of_place"]
            for side in ("out_of_place", "in_place"):
                w = row[side]["wrong"]
                if w is not None and not math.isnan(w) and w > 0:
                    wrong.append(f"{coll} size {row['size']} {side}: {int(w)} wrong elements")
            if row["size"] not in wanted or math.isnan(op["time_us"]) or op["time_us"] <= 0:
                continue
            labels = {"collective": coll, "size_bytes": str(row["size"]), "ranks": str(ranks), "backend": "nccl"}
            lat = Figure(f"{coll}_latency", "seconds", [op["time_us"] * 1e-6], labels, higher_is_better=False)
            alg = Figure(f"{coll}_algbw", "bytes_per_second", [op["algbw_gbps"] * 1e9], labels)
            bus = Figure(f"{coll}_busbw", "bytes_per_second", [op["busbw_gbps"] * 1e9], labels)
            res.figures += [bus, alg, lat]
            res.samples.append(Sample(BUSBW, labels, bus.median))
            if detail:
                res.samples += [Sample(LAT, labels, lat.median), Sample(ALGBW, labels, alg.median)]
    if wrong:
        raise ProbeError("wrong_result", "; ".join(wrong[:5]))
    res.extra = {"nccl_tests": parsed}
    return res


def run(config, ctx, ranks: int, gate) -> ProbeResult:
    sizes = sorted(config.sizes_bytes)
    parsed = {}
    for coll in config.collectives:
        exe = os.path.join(config.nccl_tests_dir, BINARIES[coll])
        if not os.access(exe, os.X_OK):
            raise ProbeError("nccl_tests_failed", f"{exe} is missing or not executable")
        with tempfile.TemporaryDirectory(prefix="fleetcanary-nccl-tests-") as tmp:
            jpath = os.path.join(tmp, "out.json")
            cmd = [exe, "-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", "2", "-g", str(ranks),
                   "-w", str(config.warmup_iterations), "-n", str(config.iterations), "-c", "1", "-J", jpath]
            left = ctx.deadline_monotonic - time.monotonic() - 2.0
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=max(left, 1.0))
            except subprocess.TimeoutExpired:
                raise ProbeTimeout("collective_timeout", f"{BINARIES[coll]} did not finish in time") from None
            if out.returncode != 0:
                raise ProbeError("nccl_tests_failed", f"{BINARIES[coll]} exited {out.returncode}: "
                                 f"{(out.stderr or out.stdout).strip().splitlines()[-1:]}")
            if os.path.exists(jpath):
                with open(jpath) as f:
                    parsed[coll] = parse_json(f.read())
            else:
                parsed[coll] = parse_text(out.stdout)
    return to_result(parsed, sizes, ranks, gate, config.detail)
