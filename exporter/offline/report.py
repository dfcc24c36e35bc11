"""`fleetcanary report`: the guide's result template, in Markdown and JSON, from result files.

Sections: objective, environment, workload, baseline, candidate, quality,
performance, reliability, conclusion, raw evidence. With --baseline/--candidate the
performance section is the comparison (`fleetcanary compare`) and the conclusion its
verdict; with plain FILES it records one result set. --plots adds PNGs (the `report`
extra: matplotlib): collective bus bandwidth against message size, per-GPU bandwidth
bars and the P2P matrix, for whatever the results hold.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from fleetcanary.core.record import RunRecord
from fleetcanary.core.stats import dispersion
from fleetcanary.core.units import human
from fleetcanary.offline import compare as comparemod
from fleetcanary.offline import results

EXIT_ERROR = 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", metavar="FILE", help="result files of one result set")
    p.add_argument("--baseline", action="append", metavar="FILE", help="baseline result file (repeatable)")
    p.add_argument("--candidate", action="append", metavar="FILE", help="candidate result file (repeatable)")
    p.add_argument("--objective", default="", help="what this run set out to show (the template's first line)")
    p.add_argument("--out", default="fleetcanary-report", metavar="DIR", help="where report.md/report.json go")
    p.add_argument("--plots", action="store_true", help="add PNG plots (needs the `report` extra: matplotlib)")
    p.add_argument("--thresholds", metavar="FILE", help="thresholds for the comparison (see fleetcanary compare)")
    p.add_argument("--allow-incomparable", action="store_true", help="compare despite differing setups")
    p.add_argument("--evidence", action="append", default=[], metavar="URL",
                   help="a dashboard, log or artifact link for the raw evidence section (repeatable)")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def environment_section(runs: list[RunRecord]) -> dict[str, Any]:
    env = results.environment_summary(runs)
    full = next((r.environment for r in reversed(runs) if r.environment), {})
    return {
        "hardware": {k: env.get(k, full.get(k)) for k in ("cpu_model", "cpu_cores", "numa_nodes", "memory_bytes",
                                                         "gpu_model", "gpu_count", "gpu_power_limits_watts",
                                                         "gpu_mig_modes")},
        "software": {k: env.get(k, full.get(k)) for k in ("os", "kernel", "driver_version", "cuda_driver_version",
                                                         "python_version", "torch_version", "fleetcanary_version",
                                                         "git_commit")},
        "platform": {"image": env.get("image", full.get("image")), "in_kubernetes": env.get("in_kubernetes"),
                     "cgroup_cpu_limit_cores": env.get("cgroup_cpu_limit_cores"),
                     "hostnames": sorted({r.environment.get("hostname") for r in runs
                                          if r.environment.get("hostname")}),
                     # Kubernetes, runtime and the NVIDIA components (core/kube_platform.py), where recorded
                     **{k: env[k] for k in (*results.PLATFORM_VERSIONS, "gpu_sharing_strategy") if k in env}},
        "communication": {k: env[k] for k in ("nccl_version", "hca_firmware") if k in env},
    }


def workload_section(runs: list[RunRecord]) -> dict[str, Any]:
    per = defaultdict(Counter)
    for r in runs:
        per[r.probe][r.outcome] += 1
    params = results.parameters_by_probe(runs)
    return {probe: {"runs": dict(c), "parameters": params.get(probe, [])} for probe, c in sorted(per.items())}


def figures_table(runs: list[RunRecord]) -> list[dict[str, Any]]:
    sr, _ = results.series(runs)
    out = []
    for key in sorted(sr):
        s = sr[key]
        xs, kind = s.samples()
        d = dispersion(xs)
        out.append({"figure": s.title(), "unit": s.unit, "higher_is_better": s.higher_is_better, **d,
                    "replicates": kind})
    return out


def quality_section(runs: list[RunRecord]) -> dict[str, Any]:
    checks = []
    for r in runs:
        for target, reqs in ((r.result.get("extra") or {}).get("requests") or {}).items():
            for q in (req.get("quality") for req in reqs or [] if isinstance(req, dict)):
                if isinstance(q, dict):
                    checks.append({"probe": r.probe, "target": target, "check": q.get("check"), "pass": q.get("pass")})
    verification = [f"{r.probe}: {r.reason}" for r in runs if r.reason in ("wrong_result", "verification_failed")]
    _, excluded = results.series(runs)
    summary = Counter((c["target"], c["check"], bool(c["pass"])) for c in checks)
    return {"checks": [{"target": t, "check": c, "pass": p, "runs": n} for (t, c, p), n in sorted(summary.items())],
            "verification_failures": verification,
            "excluded_runs": [{"probe": r.probe, "why": why, "source": r.source} for r, why in excluded],
            "passed": not verification and not excluded and all(c["pass"] for c in checks)}


def reliability_section(runs: list[RunRecord]) -> dict[str, Any]:
    failed = [{"probe": r.probe, "outcome": r.outcome, "reason": r.reason, "detail": r.detail[:300],
               "started_at": r.started_at} for r in runs if r.outcome in ("failure", "timeout", "crash")]
    skipped = Counter(f"{r.probe}: {r.reason}" for r in runs if r.outcome == "skipped")
    request_outcomes = Counter()
    for r in runs:
        for reqs in ((r.result.get("extra") or {}).get("requests") or {}).values():
            for req in reqs or []:
                if isinstance(req, dict):
                    request_outcomes[req.get("outcome", "?")] += 1
                    if req.get("retry_after") is not None:
                        request_outcomes["retry_after_seen"] += 1
    return {"runs": len(runs), "failed_runs": failed, "skipped": dict(skipped),
            "inference_request_outcomes": dict(request_outcomes)}


def build(args) -> tuple[dict[str, Any], dict[str, list[RunRecord]]]:
    sides: dict[str, list[RunRecord]] = {}
    if args.baseline or args.candidate:
        if not (args.baseline and args.candidate):
            raise results.ResultsError("give both --baseline and --candidate, or plain FILES")
        sides["baseline"] = results.load(args.baseline)
        sides["candidate"] = results.load(args.candidate)
        files = list(args.baseline) + list(args.candidate) + list(args.files)
    else:
        if not args.files:
            raise results.ResultsError("give result FILES, or --baseline and --candidate")
        sides["results"] = results.load(args.files)
        files = list(args.files)
    all_runs = [r for rs in sides.values() for r in rs]
    rep: dict[str, Any] = {"generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if "baseline" in sides:
        cmp_ = comparemod.decide(sides["baseline"], sides["candidate"], comparemod.Thresholds.load(args.thresholds),
                                 args.allow_incomparable)
        rep["objective"] = args.objective or "Verify that the candidate does not regress against the baseline."
        rep["environment"] = {"baseline": environment_section(sides["baseline"]),
                              "candidate": environment_section(sides["candidate"]),
                              "changes": cmp_["changes"], "incomparable_fields": cmp_.get("forced_past", [])}
        rep["workload"] = {s: workload_section(rs) for s, rs in sides.items()}
        rep["baseline"] = figures_table(sides["baseline"])
        rep["candidate"] = figures_table(sides["candidate"])
        rep["quality"] = {s: quality_section(rs) for s, rs in sides.items()}
        rep["performance"] = comparemod.to_json(cmp_)
        rep["reliability"] = {s: reliability_section(rs) for s, rs in sides.items()}
        names = cmp_["blocking"] + [r.figure for r in cmp_["rows"] if r.status == "failure"]
        rep["conclusion"] = {"verdict": cmp_["verdict"], "blocking": list(dict.fromkeys(names)),
                             "warnings": cmp_["warnings"]}
    else:
        runs = sides["results"]
        rep["objective"] = args.objective or "Record this node's results."
        rep["environment"] = {"results": environment_section(runs)}
        rep["workload"] = {"results": workload_section(runs)}
        rep["baseline"] = None
        rep["candidate"] = None
        rep["quality"] = {"results": quality_section(runs)}
        rep["performance"] = {"figures": figures_table(runs)}
        rep["reliability"] = {"results": reliability_section(runs)}
        failed = rep["reliability"]["results"]["failed_runs"]
        quality_ok = rep["quality"]["results"]["passed"]
        verdict = "Pass" if not failed and quality_ok else "Blocked"
        rep["conclusion"] = {"verdict": verdict, "blocking": [f"{f['probe']}: {f['outcome']} {f['reason']}".strip()
                                                              for f in failed]
                             + ([] if quality_ok else ["quality checks failed"]), "warnings": []}
    rep["raw_evidence"] = {"files": [{"path": str(f), "sha256": _sha256(str(f))} for f in dict.fromkeys(files)],
                           "runs": len(all_runs), "links": list(args.evidence)}
    return rep, sides


# --------------------------------------------------------------------------------------- Markdown
def _md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return out


def _figs_md(figs: list[dict]) -> list[str]:
    if not figs:
        return ["No successful figures."]
    return _md_table(["figure", "median", "MAD", "CV", "min", "max", "n"],
                     [[f["figure"], human(f["median"], f["unit"]), human(f["mad"], f["unit"]), f"{100 * f['cv']:.1f}%",
                       human(f["min"], f["unit"]), human(f["max"], f["unit"]), f"{f['n']} ({f['replicates']})"]
                      for f in figs])


def markdown(rep: dict[str, Any], plots: list[str]) -> str:
    out = ["# fleetcanary result report", "", f"Generated {rep['generated_at']}.", "",
           "## Objective", "", rep["objective"], "", "## Environment", ""]
    for side, env in rep["environment"].items():
        if side in ("changes", "incomparable_fields"):
            continue
        out += [f"**{side}**", ""]
        rows = [[f"{part}.{k}", v if not isinstance(v, list) else ", ".join(map(str, v)) or "-"]
                for part, d in env.items() for k, v in d.items()]
        out += _md_table(["field", "value"], rows) + [""]
    if rep["environment"].get("changes"):
        out += ["Changed between baseline and candidate: " + "; ".join(rep["environment"]["changes"]) + ".", ""]
    if rep["environment"].get("incomparable_fields"):
        out += ["Compared despite differing setups (forced): "
                + "; ".join(rep["environment"]["incomparable_fields"]), ""]
    out += ["## Workload", ""]
    for side, wl in rep["workload"].items():
        out += [f"**{side}**", ""]
        out += _md_table(["probe", "runs by outcome", "parameters"],
                         [[p, ", ".join(f"{k} {v}" for k, v in w["runs"].items()),
                           "; ".join(json.dumps(x, sort_keys=True) for x in w["parameters"]) or "-"]
                          for p, w in wl.items()]) + [""]
    for side in ("baseline", "candidate"):
        out += [f"## {side.capitalize()}", ""]
        out += (_figs_md(rep[side]) if rep[side] is not None
                else ["Not a comparison: one result set (see Performance)."])
        out += [""]
    out += ["## Quality", ""]
    for side, q in rep["quality"].items():
        out += [f"**{side}**: {'pass' if q['passed'] else 'FAIL'}", ""]
        if q["checks"]:
            out += _md_table(["target", "check", "result", "runs"],
                             [[c["target"], c["check"], "pass" if c["pass"] else "FAIL", c["runs"]]
                              for c in q["checks"]])
            out += [""]
        for v in q["verification_failures"]:
            out += [f"- verification failed: {v}"]
        for e in q["excluded_runs"]:
            out += [f"- excluded from the tables: {e['probe']} ({'; '.join(e['why'])})"]
        if not q["checks"] and not q["verification_failures"] and not q["excluded_runs"]:
            out += ["No quality checks in these results; every figure was verified by its probe."]
        out += [""]
    out += ["## Performance", ""]
    perf = rep["performance"]
    if "rows" in perf:
        rows = []
        for r in perf["rows"]:
            b, c = r["baseline"], r["candidate"]
            rows.append([r["figure"], human(b["median"], r["unit"]) if b else "-",
                         f"{100 * b['cv']:.1f}%" if b else "-", human(c["median"], r["unit"]) if c else "-",
                         f"{100 * c['cv']:.1f}%" if c else "-",
                         f"{r['ratio']:.3f}" if r["ratio"] is not None else "-",
                         f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]" if r["ci95"] else "-",
                         r["status"] + (f" ({r['severity']})" if r["severity"] else "")])
        out += _md_table(["figure", "baseline", "CV", "candidate", "CV", "ratio", "95% CI", "class"], rows)
        for name in ("figures_only_in_baseline", "figures_only_in_candidate"):
            if perf.get(name):
                out += ["", f"{name.replace('_', ' ').capitalize()}: {', '.join(perf[name])}."]
    else:
        out += _figs_md(perf["figures"])
    out += [""]
    for p in plots:
        out += [f"![{Path(p).stem}]({Path(p).name})", ""]
    out += ["## Reliability", ""]
    for side, rel in rep["reliability"].items():
        out += [f"**{side}**: {rel['runs']} runs, {len(rel['failed_runs'])} failed", ""]
        for f in rel["failed_runs"]:
            out += [f"- {f['probe']}: {f['outcome']} {f['reason']}: {f['detail']}"]
        if rel["skipped"]:
            out += ["- skipped: " + ", ".join(f"{k} x{v}" for k, v in rel["skipped"].items())]
        if rel["inference_request_outcomes"]:
            out += ["- inference requests: "
                    + ", ".join(f"{k} {v}" for k, v in rel["inference_request_outcomes"].items())]
        out += [""]
    c = rep["conclusion"]
    out += ["## Conclusion", "", f"**{c['verdict']}**" + (f": {', '.join(c['blocking'])}" if c["blocking"] else "")
            + (f" (warnings: {', '.join(c['warnings'])})" if c["warnings"] else ""), "",
            "## Raw evidence", ""]
    out += [f"- `{f['path']}` sha256 {f['sha256']}" for f in rep["raw_evidence"]["files"]]
    out += [f"- {link}" for link in rep["raw_evidence"]["links"]]
    out += [f"- {rep['raw_evidence']['runs']} probe runs; every figure's raw repeats are in the files above.", ""]
    return "\n".join(out)


def main(args) -> int:
    try:
        rep, sides = build(args)
    except results.ResultsError as exc:
        print(f"fleetcanary report: {exc}", file=sys.stderr)
        return EXIT_ERROR
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        plots: list[str] = []
        if args.plots:
            try:
                from fleetcanary.offline import plots as report_plots
            except ImportError:
                print("fleetcanary report: --plots needs matplotlib (pip install 'fleetcanary[report]')",
                      file=sys.stderr)
                return EXIT_ERROR
            plots = report_plots.render(sides, out)
        rep["plots"] = [Path(p).name for p in plots]
        (out / "report.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
        (out / "report.md").write_text(markdown(rep, plots))
    except OSError as exc:
        print(f"fleetcanary report: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_ERROR
    print(f"{out / 'report.md'}, {out / 'report.json'}" + (f", {len(plots)} plots" if plots else "")
          + f": {rep['conclusion']['verdict']}")
    return 0
