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


def write_history(work: Path, nodes: list[Node], need: dict[str, float], end: int, step: int,
                  written=lambda path: None) -> dict:
    """OpenMetrics of every series a rule reads through a range window, at `step` over that window (and two
    steps more), ending at `end`: one file per 2-hour block, handed to `written` once complete (a Backfill makes
    it a block while the next is written: 2,000 nodes' judge history is 60 GB of text). The raw series and the
    judge's statistics alike (before issue 42's last pass the judge's were left out: the holds' last_over_time
    over 6 h then read the live run's quarter hour of samples, not six hours of them)."""
    _, kind = metric_kinds()
    by_family: dict[str, list] = defaultdict(list)
    for n in nodes:
        for fam, sample, labels in n.raw:
            if sample in need:
                lab = fmt_labels(labels)
                full = fmt_labels({"job": "fleetcanary", "instance": n.node, "node": n.node, **labels})
                by_family[fam].append((sample, full, n.model, labels, n.node + lab, None))
        for fam, labels, v in n.judge:  # the judge's statistics: the hold branches read them over hold_gap
            if fam in need:
                full = fmt_labels({"job": "fleetcanary", "instance": n.node, "node": n.node, **labels})
                by_family[fam].append((fam, full, n.model, labels, "", v))
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
                for sample, lab, model, labels, ident, const in rows:
                    name = sample if k == "histogram" else fam
                    pre = f"{sample}{{{lab}}} "
                    if const is not None:  # a judge statistic: the value the node publishes, steady
                        f.write("".join(f"{pre}{const:.10g} {t}\n" for t in times))
                        samples += len(times)
                        continue
                    shape = value(name, labels, model, series_rng(name, ident), times[0])
                    if name.endswith(("_total", "_bucket", "_count", "_sum", "_timestamp_seconds")):
                        f.write("".join(f"{pre}{value(name, labels, model, None, t):.10g} {t}\n" for t in times))
                    else:  # a gauge the rules read through a window: its constant healthy value
                        f.write("".join(f"{pre}{shape:.10g} {t}\n" for t in times))
                samples += sum(len(times) for r in rows if r[-1] is None)
            f.write("# EOF\n")
        files.append(path)
        written(path)
    return {"samples": samples, "series": series, "files": files, "families": dict(sorted(families.items()))}


class Backfill:
    """promtool over each file handed to it, two at a time, the next file written meanwhile; each file is removed
    once it is a block, so at most three are on disk."""

    def __init__(self, data: Path, workers: int = 2) -> None:
        from concurrent.futures import ThreadPoolExecutor
        self.data, self.workers = data, workers
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.running: list = []

    def _one(self, p: Path) -> None:
        try:
            create_blocks(p, self.data)
        finally:
            p.unlink(missing_ok=True)

    def __call__(self, path: Path) -> None:
        while len(self.running) >= self.workers:  # wait for a slot: the file being written is the third
            self.running.pop(0).result()
        self.running.append(self.pool.submit(self._one, path))

    def wait(self) -> None:
        for f in self.running:
            f.result()
        self.pool.shutdown()
