"""`fleetcanary compare BASELINE CANDIDATE`: every figure side by side, classified, and a verdict.

For each figure both sides measured: the medians, the dispersion (MAD, CV, min, max)
of the replicates (one median per run; a single run's repeats when a side has one
run), the ratio candidate/baseline with a bootstrap 95% interval (ratio of medians,
both sides resampled), and a class:

- failure: the candidate has no successful run of a figure the baseline has;
- regression / improvement: worse / better than the figure's threshold, the
  interval excludes 1, and, with several runs a side, the runs order (exact one-sided
  Mann-Whitney at 5%): a bootstrap of three runs alone is overconfident;
- within noise: otherwise.

The verdict: Blocked when a regression exceeds its block threshold or a figure
failed; Conditional pass when a regression exceeds only its warn threshold, or the
comparison was forced past differing environments; Pass otherwise. Exit codes for CI
gates: 0 Pass, 1 Blocked, 3 Conditional pass, 2 bad input or refused comparison.

Results that failed their quality checks never enter the table; the sides must not
differ in hardware, power caps, CPU limits or probe parameters unless --allow-incomparable.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from fleetcanary.core.record import RunRecord
from fleetcanary.core.stats import dispersion
from fleetcanary.core.textfile import TextFileError, read_text
from fleetcanary.core.units import human, text_table
from fleetcanary.offline import results
from fleetcanary.probes.lib import yamltext

EXIT = {"Pass": 0, "Blocked": 1, "Conditional pass": 3}
EXIT_ERROR = 2
BOOTSTRAP = 4000
# From 3 runs a side the runs themselves must order (an exact rank test can then reach 5%); with
# fewer, the interval from the repeats decides alone and the output says so.
MIN_RANK_RUNS = 3
# Default allowed regressions by unit: bandwidths are steady, latencies and op rates noisier.
# train_step's tokens/s is batch x sequence over the step time, so it has the step time's noise and
# gets the seconds thresholds (by figure: the inference canary's tokens/s share the unit and keep the
# default). flops_per_second (gpu_compute, gpu_sustained) and the sustained ratio keep the default
# until GPU runs measure their dispersion (docs/gpu-validation.md); a thresholds file changes any of them.
DEFAULT_THRESHOLDS = {"default": {"warn": 0.03, "block": 0.05},
                      "units": {"seconds": {"warn": 0.05, "block": 0.10},
                                "ops_per_second": {"warn": 0.05, "block": 0.10}},
                      "figures": [{"probe": "train_step", "figure": "tokens_per_second", "warn": 0.05, "block": 0.10}]}


@dataclass
class Row:
    figure: str
    unit: str
    higher_is_better: bool
    baseline: dict[str, float] | None
    candidate: dict[str, float] | None
    ratio: float | None
    ci95: tuple[float, float] | None
    change: float | None          # signed, positive = better
    warn: float
    block: float
    status: str                   # within noise, improvement, regression, failure
    severity: str                 # "", warn, block
    replicates: str


def _boot_medians(runs: list[list[float]], rng):
    """Medians of BOOTSTRAP hierarchical resamples: runs with replacement, then each run's repeats."""
    import numpy as np

    runs = [np.asarray(r, dtype=float) for r in runs if len(r)]
    n = len(runs)
    width = max(len(r) for r in runs)
    pick = rng.integers(0, n, (BOOTSTRAP, n))
    pooled = np.empty((BOOTSTRAP, n * width))
    for j in range(n):
        chosen = pick[:, j]
        for i, r in enumerate(runs):
            rows = np.nonzero(chosen == i)[0]
            if not len(rows):
                continue
            # each resampled run contributes `width` draws from its repeats (equal weight per run)
            pooled[rows, j * width:(j + 1) * width] = r[rng.integers(0, len(r), (len(rows), width))]
    return np.median(pooled, axis=1)


def bootstrap_ratio(base: list[list[float]], cand: list[list[float]], seed: int = 0) -> tuple[float, float]:
    """95% interval of median(candidate) / median(baseline), resampling runs and the repeats within them,
    so both run-to-run and within-run variation count (a plain bootstrap of 3 run medians is overconfident)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = _boot_medians(cand, rng) / _boot_medians(base, rng)
    r = r[np.isfinite(r)]
    if not len(r):
        return (math.nan, math.nan)
    lo, hi = np.percentile(r, [2.5, 97.5])
    return (float(lo), float(hi))


def _u_distribution(n: int, m: int) -> list[int]:
    """Counts of each Mann-Whitney U value (0..n*m) over all arrangements of n and m untied values."""

    @functools.cache
    def f(a: int, b: int) -> tuple[int, ...]:
        if a == 0 or b == 0:
            return (1,)
        x, y = f(a - 1, b), f(a, b - 1)   # the largest value belongs to the first or the second group
        out = [0] * (a * b + 1)
        for u, c in enumerate(x):
            out[u + b] += c
        for u, c in enumerate(y):
            out[u] += c
        return tuple(out)

    return list(f(n, m))


def rank_p_worse(base: list[float], cand: list[float], higher_is_better: bool) -> float:
    """One-sided exact Mann-Whitney p-value that the candidate's runs are worse than the baseline's."""
    b = base if higher_is_better else [-x for x in base]
    c = cand if higher_is_better else [-x for x in cand]
    u = sum((1.0 if x > y else 0.5 if x == y else 0.0) for x in b for y in c)  # baseline above candidate
    dist = _u_distribution(len(b), len(c))
    total = sum(dist)
    return sum(cnt for k, cnt in enumerate(dist) if k >= u - 1e-9) / total


class Thresholds:
    def __init__(self, data: dict | None = None) -> None:
        data = data or {}
        self.default = {**DEFAULT_THRESHOLDS["default"], **(data.get("default") or {})}
        self.units = {**DEFAULT_THRESHOLDS["units"], **(data.get("units") or {})}
        self.rules = DEFAULT_THRESHOLDS["figures"] + (data.get("figures") or [])  # later rules win

    @classmethod
    def load(cls, path: str | None) -> Thresholds:
        if not path:
            return cls()
        try:
            data = yamltext.load(read_text(path))
        except TextFileError as exc:
            raise results.ResultsError(str(exc)) from None
        except yaml.YAMLError as exc:
            raise results.ResultsError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
        if data is None:
            data = {}
        if not isinstance(data, dict) or set(data) - {"default", "units", "figures"}:
            raise results.ResultsError(f"{path}: expected keys default, units, figures")
        for i, rule in enumerate(data.get("figures") or []):
            if not isinstance(rule, dict) or set(rule) - {"probe", "figure", "labels", "warn", "block", "ignore"}:
                raise results.ResultsError(f"{path}: figures[{i}]: keys are probe, figure, labels, warn, block, ignore")
        units = list((data.get("units") or {}).values())
        for where in [data.get("default") or {}] + units + (data.get("figures") or []):
            for k in ("warn", "block"):
                if k in where and not (isinstance(where[k], (int, float)) and 0 <= where[k] < 1):
                    raise results.ResultsError(f"{path}: {k} must be a fraction from 0 to 1, got {where[k]!r}")
        return cls(data)

    def for_series(self, s: results.FigureSeries) -> dict[str, Any]:
        t = dict(self.default)
        t.update(self.units.get(s.unit, {}))
        for rule in self.rules:
            if rule.get("probe", s.probe) == s.probe and rule.get("figure", s.name) == s.name and \
                    all(s.labels.get(k) == str(v) for k, v in (rule.get("labels") or {}).items()):
                t.update({k: rule[k] for k in ("warn", "block", "ignore") if k in rule})
        t["warn"] = min(t["warn"], t["block"])
        return t


def classify(b: results.FigureSeries, c: results.FigureSeries, t: dict) -> Row:
    bs, bkind = b.samples()
    cs, _ = c.samples()
    db, dc = dispersion(bs), dispersion(cs)
    ratio = dc["median"] / db["median"] if db["median"] else math.nan
    lo, hi = bootstrap_ratio(b.repeats, c.repeats)
    change = (ratio - 1) if b.higher_is_better else (1 / ratio - 1 if ratio else math.nan)
    significant = not (lo <= 1.0 <= hi)
    if significant and len(b.run_medians) >= MIN_RANK_RUNS and len(c.run_medians) >= MIN_RANK_RUNS:
        # With few runs a bootstrap interval is too narrow; the runs themselves must also order
        # (exact one-sided rank test at 5%: with 3 runs a side, every candidate run on the far side).
        worse = (ratio < 1) == b.higher_is_better
        p = rank_p_worse(b.run_medians, c.run_medians, b.higher_is_better) if worse else \
            rank_p_worse(c.run_medians, b.run_medians, b.higher_is_better)
        significant = p <= 0.05
    status, severity = "within noise", ""
    if significant and math.isfinite(change):
        if change <= -t["block"]:
            status, severity = "regression", "block"
        elif change <= -t["warn"]:
            status, severity = "regression", "warn"
        elif change >= t["warn"]:
            status = "improvement"
    return Row(b.title(), b.unit, b.higher_is_better, db, dc, ratio, (lo, hi), change, t["warn"], t["block"],
               status, severity, bkind)


def compare(base_runs: list[RunRecord], cand_runs: list[RunRecord], thresholds: Thresholds) -> dict[str, Any]:
    sb, excl_b = results.series(base_runs)
    sc, excl_c = results.series(cand_runs)
    rows: list[Row] = []
    ignored = []
    for key in sorted(set(sb) | set(sc)):
        b, c = sb.get(key), sc.get(key)
        t = thresholds.for_series(b or c)
        if t.get("ignore"):
            ignored.append((b or c).title())
            continue
        if b is None:
            continue  # new in the candidate: reported in figures_only_in_candidate
        if c is None:
            probe_ran = [r for r in cand_runs if r.probe == b.probe]
            if probe_ran and not any(r.ok for r in probe_ran):
                bs, kind = b.samples()
                rows.append(Row(b.title(), b.unit, b.higher_is_better, dispersion(bs), None, None, None, None,
                                t["warn"], t["block"], "failure", "block", kind))
            continue
        rows.append(classify(b, c, t))
    failures = [r for r in rows if r.status == "failure"]
    blocks = [r for r in rows if r.severity == "block"]
    warns = [r for r in rows if r.severity == "warn"]
    verdict = "Blocked" if blocks or failures else "Conditional pass" if warns else "Pass"
    few = sorted({r.figure for r in rows if r.replicates != "runs" or (r.baseline and r.baseline["n"] < MIN_RANK_RUNS)
                  or (r.candidate and r.candidate["n"] < MIN_RANK_RUNS)})
    return {
        "verdict": verdict,
        "few_runs": few,
        "rows": rows,
        "blocking": [r.figure for r in blocks],
        "warnings": [r.figure for r in warns],
        "excluded_for_quality": [{"side": side, "probe": run.probe, "source": run.source,
                                  "started_at": run.started_at, "why": why}
                                 for side, ex in (("baseline", excl_b), ("candidate", excl_c)) for run, why in ex],
        "figures_only_in_baseline": sorted(sb[k].title() for k in set(sb) - set(sc)),
        "figures_only_in_candidate": sorted(sc[k].title() for k in set(sc) - set(sb)),
        "ignored": ignored,
        "changes": results.changes(base_runs, cand_runs),
        "failed_runs": {side: [f"{r.probe}: {r.outcome} {r.reason}".strip() for r in runs
                               if r.outcome in ("failure", "timeout", "crash")]
                        for side, runs in (("baseline", base_runs), ("candidate", cand_runs))},
    }


class Incomparable(results.ResultsError):
    """The two sides differ in what must not differ; `why` names each field."""

    def __init__(self, why: list[str]) -> None:
        super().__init__("refusing to compare results from different setups: " + "; ".join(why))
        self.why = why


def decide(base_runs: list[RunRecord], cand_runs: list[RunRecord], thresholds: Thresholds,
           allow_incomparable: bool = False) -> dict[str, Any]:
    """compare(), after the comparability check: refused (Incomparable) unless allowed, and then at
    best a Conditional pass, with the differing fields kept in forced_past."""
    why = results.incomparable(base_runs, cand_runs)
    if why and not allow_incomparable:
        raise Incomparable(why)
    result = compare(base_runs, cand_runs, thresholds)
    if why:
        result["forced_past"] = why
        if result["verdict"] == "Pass":
            result["verdict"] = "Conditional pass"
    return result


def _fmt_row(r: Row) -> tuple:
    def side(d):
        if d is None:
            return "-", "-"
        return human(d["median"], r.unit), (f"±{human(d['mad'], r.unit)} cv {100 * d['cv']:.1f}% "
                                             f"[{human(d['min'], r.unit)}, {human(d['max'], r.unit)}] n={d['n']}")
    bm, bd = side(r.baseline)
    cm, cd = side(r.candidate)
    ratio = f"{r.ratio:.3f}" if r.ratio is not None and math.isfinite(r.ratio) else "-"
    ci = f"[{r.ci95[0]:.3f}, {r.ci95[1]:.3f}]" if r.ci95 and math.isfinite(r.ci95[0]) else "-"
    status = r.status + (f" (> {r.block:.0%} block)" if r.severity == "block" and r.status == "regression" else
                         f" (> {r.warn:.0%} warn)" if r.severity == "warn" else "")
    return (r.figure, bm, bd, cm, cd, ratio, ci, status)


def table(rows: list[Row]) -> str:
    return text_table(("figure", "baseline", "dispersion", "candidate", "dispersion", "ratio", "95% CI", "class"),
                      [_fmt_row(r) for r in rows])


def to_json(result: dict[str, Any]) -> dict[str, Any]:
    return {**result, "rows": [asdict(r) for r in result["rows"]]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("baseline", nargs="+", metavar="BASELINE",
                   help="result files of the baseline (history .jsonl or `once --json` output); "
                   "separate from the candidate with --candidate when giving several")
    p.add_argument("--candidate", action="append", metavar="FILE",
                   help="candidate result file (repeatable); without it the last positional file is the candidate")
    p.add_argument("--thresholds", metavar="FILE", help="YAML: default/units/figures warn and block fractions")
    p.add_argument("--allow-incomparable", action="store_true",
                   help="compare even when hardware, power caps or probe parameters differ (verdict at best "
                   "Conditional pass)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")


def main(args) -> int:
    base_files = list(args.baseline)
    cand_files = list(args.candidate or [])
    if not cand_files:
        if len(base_files) < 2:
            print("fleetcanary compare: give BASELINE and CANDIDATE files", file=sys.stderr)
            return EXIT_ERROR
        cand_files = [base_files.pop()]
    try:
        base = results.load(base_files)
        cand = results.load(cand_files)
        thresholds = Thresholds.load(args.thresholds)
    except results.ResultsError as exc:
        print(f"fleetcanary compare: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        result = decide(base, cand, thresholds, args.allow_incomparable)
    except Incomparable as exc:
        print("fleetcanary compare: refusing to compare results from different setups "
              "(--allow-incomparable overrides):", file=sys.stderr)
        for w in exc.why:
            print(f"  {w}", file=sys.stderr)
        return EXIT_ERROR
    if not result["rows"]:
        print("fleetcanary compare: no figure was measured by both sides", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        json.dump(to_json(result), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        print(table(result["rows"]))
        print()
        for ex in result["excluded_for_quality"]:
            print(f"excluded ({ex['side']}, quality): {'; '.join(ex['why'])}")
        for side, failed in result["failed_runs"].items():
            for f in failed:
                print(f"failed run ({side}): {f}")
        for c in result["changes"]:
            print(f"changed: {c}")
        if result["few_runs"]:
            print(f"note: {len(result['few_runs'])} figures have fewer than {MIN_RANK_RUNS} runs a side; their "
                  "classes rest on the repeats of those runs alone (use once --repeat 5)")
        for w in result.get("forced_past", []):
            print(f"incomparable (forced): {w}")
        names = result["blocking"] + [r.figure for r in result["rows"] if r.status == "failure"]
        print(f"verdict: {result['verdict']}" + (f" - {', '.join(dict.fromkeys(names))}" if names else
                                                  f" - {', '.join(result['warnings'])}" if result["warnings"] else ""))
    return EXIT[result["verdict"]]
