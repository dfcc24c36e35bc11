"""The steady state's history: every series a rule reads through a range window, written as OpenMetrics at
the scrape interval and made TSDB blocks by promtool (harness/backfill.py)."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from fleetcanary.probes.lib import yamltext
from harness.backfill import create_blocks
from harness.durations import seconds

from .model import Node, fmt_labels, metric_kinds, series_rng, value


# --------------------------------------------------------------------------- the steady state's history
def windows_read(rule_files: list[Path]) -> dict[str, float]:
    """Sample name -> the longest range (+ offset) a rule reads it with, seconds."""
    out: dict[str, float] = {}
    pat = re.compile(r"\b(fleetcanary_[a-z0-9_]+)(?:\{[^}]*\})?\[(\w+)(?::\w+)?\](?:\s*offset\s+(\w+))?")
    for f in rule_files:
        for g in yamltext.load(f.read_text())["groups"]:
            for r in g["rules"]:
                for name, rng, off in pat.findall(r["expr"]):
                    out[name] = max(out.get(name, 0), seconds(rng) + (seconds(off) if off else 0))
    return out


BLOCK = 7200  # promtool's block: it parses its whole input once per 2-hour block, so each gets its own file


def write_history(work: Path, nodes: list[Node], need: dict[str, float], end: int, step: int) -> dict:
    """OpenMetrics of every series a rule reads through a range window, at `step` over that window (and two
    steps more), ending at `end`: one file per 2-hour block."""
    _, kind = metric_kinds()
    by_family: dict[str, list] = defaultdict(list)
    for n in nodes:
        for fam, sample, labels in n.raw:
            if sample in need:
                lab = fmt_labels(labels)
                full = fmt_labels({"job": "fleetcanary", "instance": n.node, "node": n.node, **labels})
                by_family[fam].append((sample, full, n.model, labels, n.node + lab))
    plan, families = {}, {}
    for fam, rows in by_family.items():
        span = max(need[s] for s, *_ in rows) + 2 * step
        start = end - int(span) // step * step
        plan[fam] = start
        families[fam] = {"series_per_node": len(rows) // len(nodes), "step_seconds": step,
                         "samples_per_series": len(range(start, end + 1, step)), "window_seconds": end - start}
    first = min(plan.values()) // BLOCK * BLOCK
    files, samples, series = [], 0, sum(len(r) for r in by_family.values())
    for w in range(first, end + 1, BLOCK):
        path = work / f"history-{w}.om"
        with open(path, "w", buffering=1 << 22) as f:
            for fam, rows in by_family.items():
                start = plan[fam]
                t0 = max(start, start + -(-(w - start) // step) * step)
                times = list(range(t0, min(w + BLOCK, end + 1), step))
                if not times:
                    continue
                k = {"info": "gauge"}.get(kind.get(fam, "gauge"), kind.get(fam, "gauge"))
                f.write(f"# TYPE {fam.removesuffix('_total') if k == 'counter' else fam} {k}\n")
                for sample, lab, model, labels, ident in rows:
                    name = sample if k == "histogram" else fam
                    pre = f"{sample}{{{lab}}} "
                    shape = value(name, labels, model, series_rng(name, ident), times[0])
                    if name.endswith(("_total", "_bucket", "_count", "_sum", "_timestamp_seconds")):
                        f.write("".join(f"{pre}{value(name, labels, model, None, t):.10g} {t}\n" for t in times))
                    else:  # a gauge the rules read through a window: its constant healthy value
                        f.write("".join(f"{pre}{shape:.10g} {t}\n" for t in times))
                samples += len(rows) * len(times)
            f.write("# EOF\n")
        files.append(path)
    return {"samples": samples, "series": series, "files": files, "families": dict(sorted(families.items()))}


def backfill(files: list[Path], data: Path) -> None:
    """promtool per file, two at a time; each file is removed once it is a block."""
    from concurrent.futures import ThreadPoolExecutor

    def one(p: Path) -> None:
        create_blocks(p, data)
        p.unlink()

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, files))
