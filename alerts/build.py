#!/usr/bin/env python3
"""Generate the recording and alert rules (alerts/fleetcanary.rules.yml, alerts/fleetcanary.alerts.yml).

The node judges itself; the fleet only compares peers (docs/alerting.md). Each exporter keeps its
own runs and publishes, per judged series, statistics over runs (fleetcanary.judge): the median of
its newest 7 runs, the best of its newest 3, its change against its own baseline (the best day on
its driver; after an upgrade also against the previous driver's) and its drift. Every statistic
carries the labels peers share (figure, series, pool, model, driver_version), so these rules need
no joins and no time windows over raw runs.

The rules are a mixin: areas, settings, one final pass.

- Areas (alerts/common.py: each has one function, ``groups(s, shards)``): the peer paths (rules_peers), the
  own-history paths (rules_history), the hard failures and inventory (rules_hard), the inference canary
  (rules_inference), RDMA ports and interfaces (rules_nic), the fabric probe (rules_fabric), coverage
  (rules_coverage). The judged figures, their names, directions, floors and fast paths are declared once, in
  fleetcanary.judge.figures; their `for` is their probe's interval (the probe map).
- Settings (fleetcanary.core.rulesettings.RuleSettings, pydantic): every threshold, selector and link, from a
  YAML file of its keys, or the `alerts` section of the exporter's config (`--settings FILE` takes either: the
  same file the exporter reads, so a floor the exporter also needs is changed once). Documented with the
  exporter's config (docs/configuration.md, `alerts.*`).
- The final pass (``finish``), over every rule of every area: the deployer's selector on every raw fleetcanary
  series, durations scaled, every alert's runbook link from `runbook_url`, every expression over lines.

This writes only rule files; docs/runbooks.md is alerts/runbooks.py's (scripts/generate runs both).
Prometheus 2.42 and vmalert 1.79 both load them unchanged: no `keep_firing_for` (vmalert 1.79 rejects it; the
hard failures hold through their windows). Every judged path that can page again holds through its own ALERTS
series (`hold`): once firing, it stays firing while its gap is still past half its floor, read with
last_over_time over `hold_gap` so that a gap in the figure (an exporter restart, the first runs on a new driver)
does not resolve it either (docs/detection.md, issue 38).

`build(scale=...)` multiplies every group interval and `for` (not the data windows):
tests/test_alerts_live.py runs the shipped structure faster on a real Prometheus.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from pydantic import ValidationError

from fleetcanary.core import rulesettings
from fleetcanary.core.rulesettings import RuleSettings, seconds
from fleetcanary.judge import figures as judged
from fleetcanary.probes.lib import yamltext
from fleetcanary.rules import (
    prometheusrule,
    rules_coverage,
    rules_fabric,
    rules_hard,
    rules_history,
    rules_inference,
    rules_nic,
    rules_peers,
)
from fleetcanary.rules.common import CHANGE_GROUP, GROUP, Group, Shard, counted, counted_value, dur

HERE = Path(__file__).resolve().parent
RUNBOOK = rulesettings.runbook_base()
Settings = RuleSettings   # the settings model (fleetcanary.core.rulesettings)
SETTINGS = RuleSettings()
FIGURES = judged.FIGURES  # the judged figures, declared once (fleetcanary.judge.figures)
# the areas, in the order their groups are written (a group named by two areas gets both's rules, in this order)
AREAS = (rules_hard, rules_inference, rules_peers, rules_history, rules_nic, rules_fabric, rules_coverage)
RECORDING_ORDER = ("fleetcanary-inventory", "fleetcanary-fabric", "fleetcanary-coverage")
ALERT_ORDER = ("fleetcanary-hard-failures", "fleetcanary-probe-health", "fleetcanary-peer-spread",
               "fleetcanary-peers", "fleetcanary-own-history",
               "fleetcanary-nic", "fleetcanary-fabric-alerts", "fleetcanary-coverage-alerts")
__all__ = ["CHANGE_GROUP", "GROUP", "counted", "counted_value", "dur", "seconds"]


def pool_shards(s: RuleSettings) -> list[Shard]:
    """(group suffix, pool matcher): one group per listed pool and one for the rest; one group when none."""
    if not s.pools:
        return [("", "")]
    # a regex inside a PromQL string: re.escape's backslashes doubled (a bare '\-' is an invalid string escape)
    listed = "|".join(re.escape(p).replace("\\", "\\\\") for p in s.pools)
    return [(f"-{p}", f'pool="{p}"') for p in s.pools] + [("-other-pools", f'pool!~"{listed}"')]


# a string literal (left alone: a label value or a regex, never a selector) or a raw fleetcanary_ series with its
# matchers (a recorded series' name holds a colon, and ALERTS or up are not fleetcanary_, so neither matches)
METRIC = re.compile(r"""(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)"""
                    r"|\b(?P<name>fleetcanary_[a-zA-Z0-9_]+)(?P<matchers>\{[^}]*\})?(?![a-zA-Z0-9_:])")


def with_selector(expr: str, selector: str) -> str:
    """Add the deployer's matchers to every raw fleetcanary_ series of an expression (comment lines and string
    literals are left alone)."""
    if not selector:
        return expr

    def add(m: re.Match) -> str:
        if m.group("str"):
            return m.group(0)
        if m.group("matchers"):
            inner = m.group("matchers")[1:-1].strip()
            return f"{m.group('name')}{{{inner + ', ' if inner else ''}{selector}}}"
        return f"{m.group('name')}{{{selector}}}"

    lines = expr.split("\n")
    return "\n".join(ln if ln.lstrip().startswith("#") else METRIC.sub(add, ln) for ln in lines)


WIDTH = 110
LOGICAL = (" and ", " or ", " unless ")
MODIFIER = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*$")
ARITHMETIC = (" >= ", " <= ", " == ", " != ", " > ", " < ", " * ", " / ", " + ", " - ")


def _depths(expr: str) -> list[int]:
    """The nesting depth at each character: parentheses, and anything inside a selector's braces, a range's
    brackets or a string literal counts as nested (no line is ever broken there)."""
    out, depth, quote, closing = [], 0, "", []
    for i, ch in enumerate(expr):
        if quote:
            out.append(depth + 1)
            if ch == quote and expr[i - 1] != "\\":
                quote = ""
            continue
        if ch in "\"'`":
            quote = ch
            out.append(depth + 1)
        elif ch in "([{":
            out.append(depth)
            depth += 1
            closing.append(ch)
        elif ch in ")]}":
            depth -= 1
            closing and closing.pop()
            out.append(depth)
        else:
            out.append(depth)
    return out


def _format(expr: str, indent: int) -> list[str]:
    """A one-line expression as lines of at most WIDTH where it can: broken before its outermost `and`, `or` and
    `unless`, else before its outermost comparisons and arithmetic, else inside its longest outermost parentheses
    (their content indented by two)."""
    expr = expr.strip()
    if indent + len(expr) <= WIDTH:
        return [" " * indent + expr]
    depth = _depths(expr)
    for ops in (LOGICAL, ARITHMETIC):
        cuts = [i for i in range(1, len(expr)) if depth[i] == 0 and any(expr.startswith(op, i) for op in ops)
                and not (depth[i - 1] == 0 and expr[i - 1] in "=!<>")]
        cuts = [c for k, c in enumerate(cuts) if not k or c > cuts[k - 1] + 2]
        if cuts:
            pieces = [expr[a + 1 if a else 0:b] for a, b in zip([0, *cuts], [*cuts, len(expr)], strict=True)]
            return [line for piece in pieces for line in _format(piece, indent)]
    groups, start = [], None
    for i, ch in enumerate(expr):
        if ch == "(" and depth[i] == 0:
            start = i
        elif ch == ")" and depth[i] == 0 and start is not None:
            groups.append((start, i))
            start = None
    # an operand's parentheses, not a modifier's label list (by, on, group_left ...)
    groups = [(a, b) for a, b in groups if not MODIFIER.search(expr[:a])]
    if groups:
        a, b = max(groups, key=lambda g: g[1] - g[0])
        if b - a > 30:
            return ([" " * indent + expr[:a + 1].rstrip()] + _format(expr[a + 1:b], indent + 2)
                    + [" " * indent + expr[b:].strip()])
    return [" " * indent + expr]


def over_lines(expr: str) -> str:
    """A one-line expression longer than WIDTH written over lines, so a person reads its conditions one a line
    (PromQL ignores the line breaks; commented expressions are written over lines by their area already)."""
    if "\n" in expr or len(expr) <= WIDTH:
        return expr
    return "\n".join(_format(expr, 0))


def finish(groups: list[Group], s: RuleSettings, scale: float = 1.0) -> tuple[dict, dict]:
    """The final pass over every area's groups: the selector on every raw series, `for` and the group intervals
    scaled, each alert's runbook link, each expression over lines, a shard label on a sharded group's rules; the
    groups merged by name (in area order) and written in the files' order."""
    merged: dict[tuple[str, str], dict] = {}
    for g in groups:
        interval = dur(seconds(getattr(s, g.interval)) * scale)
        out = merged.setdefault((g.file, g.name), {"name": g.name, "interval": interval, "rules": []})
        for rule in g.rules:
            r = dict(rule, expr=over_lines(with_selector(rule["expr"], s.selector)))
            if "alert" in r:
                notes = r["annotations"]
                r["for"] = dur(seconds(r["for"]) * scale)
                r["annotations"] = {"summary": notes["summary"], "description": notes["description"],
                                    "runbook_url": s.runbook_url.format(anchor=r["alert"].lower()),
                                    **{k: v for k, v in notes.items() if k not in ("summary", "description")}}
            if g.shard:  # a shard label keeps the same rule in two groups distinct (promtool lints duplicates)
                r["labels"] = {**r.get("labels", {}), "shard": g.shard}
            out["rules"].append(r)

    def ordered(file: str, order: tuple[str, ...]) -> list[dict]:
        rank = {n: i for i, n in enumerate(order)}
        keep = [g for (f, _), g in merged.items() if f == file]
        return sorted(keep, key=lambda g: rank[next(n for n in sorted(order, key=len, reverse=True)
                                                    if g["name"] == n or g["name"].startswith(n + "-"))])

    return {"groups": ordered("rules", RECORDING_ORDER)}, {"groups": ordered("alerts", ALERT_ORDER)}


def build(scale: float = 1.0, settings: RuleSettings = SETTINGS) -> tuple[dict, dict]:
    """(recording rules, alert rules) of every area for these settings."""
    shards = pool_shards(settings)
    return finish([g for area in AREAS for g in area.groups(settings, shards)], settings, scale)


def load_settings(path: str | None) -> RuleSettings:
    """The settings of a YAML file: the rule settings' keys, or an exporter config whose `alerts` section holds
    them. Anything wrong (an unknown key or figure, a malformed selector, a wrong type) is one line."""
    if not path:
        return SETTINGS
    try:
        data = yamltext.load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"rules settings {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise SystemExit(f"rules settings {path}: not a mapping of settings")
    if isinstance(data.get("alerts"), dict) and "alerts" not in RuleSettings.model_fields:
        data = data["alerts"]   # an exporter config: its `alerts` section
    try:
        data = rulesettings.renamed(data, path)
        settings = RuleSettings.model_validate(data)
    except ValueError as exc:
        raise SystemExit(f"rules settings {path}: {_one_error(exc)}") from None
    unknown = set(settings.figures) - set(judged.BY_KEY)
    if unknown:
        raise SystemExit(f"rules settings {path}: unknown figures {sorted(unknown)}; known: {', '.join(judged.BY_KEY)}")
    return settings


TYPE_WORDS = {"int": "a int", "float": "a float", "bool": "a bool", "string": "a str", "tuple": "a list of names",
              "list": "a list of names", "dict": "a mapping"}


def _one_error(exc: ValueError) -> str:
    """A pydantic error (or a plain one) as one line: each problem's key and what is wrong with it."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    out, unknown = [], {}
    for e in exc.errors():
        loc = [str(p) for p in e["loc"]]
        key, kind, given = ".".join(loc) or "(top level)", e["type"], e.get("input")
        if kind == "extra_forbidden":
            unknown.setdefault(".".join(loc[:-1]), []).append(loc[-1])
        elif kind == "string_pattern_mismatch" and e.get("ctx", {}).get("pattern") == rulesettings.DURATION:
            out.append(f"{key} must be a duration such as 5m or 6h, not {given!r}")
        elif kind.split("_")[0] in TYPE_WORDS and kind.endswith(("_type", "_parsing")):
            out.append(f"{key} must be {TYPE_WORDS[kind.split('_')[0]]}, not {given!r}")
        else:
            out.append(f"{key}: {e['msg'].removeprefix('Value error, ')}")
    for where, keys in unknown.items():
        model = RuleSettings if not where else rulesettings.FigureSettings
        known = ", ".join(model.model_fields)
        out.insert(0, f"unknown keys {sorted(keys)}; known: {known}" if not where else
                   f"{where} may set {known}, not {sorted(keys)}")
    return "; ".join(" ".join(o.split()) for o in out)


HEADER = ("# Generated by alerts/build.py (or `fleetcanary rules`); do not edit. Change its settings and rerun it.\n")


class _Literal(str):
    pass


def _literal(dumper, data):
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")


yaml.add_representer(_Literal, _literal, Dumper=yaml.SafeDumper)


def dump(d: dict) -> str:
    def lit(x):
        if isinstance(x, dict):
            return {k: (_Literal(v) if k == "expr" and "\n" in v else lit(v)) for k, v in x.items()}
        if isinstance(x, list):
            return [lit(v) for v in x]
        return x

    return HEADER + yaml.safe_dump(lit(d), sort_keys=False, width=120)


def render(scale: float = 1.0, settings: Settings = SETTINGS) -> dict[str, str]:
    recording, alerts = build(scale, settings)
    return {"fleetcanary.rules.yml": dump(recording), "fleetcanary.alerts.yml": dump(alerts)}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--settings", metavar="FILE",
                    help="a YAML file of settings over the defaults (docs/alerting.md, 'Settings'): the rule settings' "
                    "keys, or the exporter's config, whose `alerts` section holds them")
    ap.add_argument("--out", metavar="DIR", help="where to write the rules, created if missing (default: the "
                    "current directory; beside this script when run from a checkout)")
    ap.add_argument("--format", choices=("rules", "prometheusrule"), default="rules",
                    help="rules: Prometheus rule files (fleetcanary.rules.yml, fleetcanary.alerts.yml); "
                    "prometheusrule: Prometheus Operator objects (fleetcanary.prometheusrule.yaml), packed so none "
                    "passes client-side apply's 256 KiB annotation limit")
    ap.add_argument("--labels", metavar="K=V,...", default="",
                    help="prometheusrule: labels of the objects, e.g. release=kube-prometheus-stack (its "
                    "default ruleSelector matches the release label)")
    ap.add_argument("--name", default="fleetcanary", help="prometheusrule: the objects' name (numbered if several)")
    ap.add_argument("--namespace", default="", help="prometheusrule: their namespace (default: none set)")
    ap.add_argument("--promtool", metavar="PATH", default="",
                    help="promtool to check the rules with before anything is written (default: promtool on "
                    "PATH; without one the rules are written unchecked, and it says so)")


def promtool_check(texts: dict[str, str], promtool: str) -> str | None:
    """promtool's first complaint about the rendered rule files, or None when it accepts them."""
    with tempfile.TemporaryDirectory(prefix="fleetcanary-rules-") as tmp:
        paths = []
        for name, text in texts.items():
            (Path(tmp) / name).write_text(text)
            paths.append(str(Path(tmp) / name))
        try:
            r = subprocess.run([promtool, "check", "rules", *paths], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"promtool could not run: {exc}"
    if r.returncode == 0:
        return None
    lines = [ln.strip() for ln in (r.stderr + r.stdout).splitlines() if ln.strip() and "SUCCESS" not in ln]
    bad = [ln for ln in lines if "FAILED" not in ln and not ln.startswith("Checking")]
    return (bad or lines or [f"exit {r.returncode}"])[0].replace(tmp + "/", "")


def main(args: argparse.Namespace | list[str] | None = None) -> int:
    """`python -m alerts.build [--settings FILE] [--out DIR]`, or `fleetcanary rules ...` when installed."""
    if not isinstance(args, argparse.Namespace):
        ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        add_arguments(ap)
        args = ap.parse_args(args)
    checkout = (HERE.parent / "pyproject.toml").is_file()
    out = Path(args.out) if args.out else (HERE if checkout else Path("."))
    fmt = getattr(args, "format", "rules")
    try:
        settings = load_settings(args.settings)
        texts = render(settings=settings)
        promtool = getattr(args, "promtool", "") or shutil.which("promtool") or ""
        if promtool:
            problem = promtool_check(texts, promtool)
            if problem:
                raise SystemExit(f"promtool rejects the rules these settings make, nothing written: {problem}")
        else:
            print("fleetcanary rules: promtool not found: the rules are written unchecked", file=sys.stderr)
        if fmt == "prometheusrule":
            try:
                labels = prometheusrule.parse_labels(getattr(args, "labels", ""))
                groups = [g for t in texts.values() for g in yamltext.load(t)["groups"]]
                objs = prometheusrule.objects(groups, args.name, args.namespace, labels)
            except ValueError as exc:
                raise SystemExit(str(exc)) from None
            texts = {"fleetcanary.prometheusrule.yaml":
                     HEADER + yaml.safe_dump_all(objs, sort_keys=False, width=120)}
        out.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (out / name).write_text(text)
            print(f"wrote {out / name}")
    except SystemExit as exc:
        print(f"fleetcanary rules: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"fleetcanary rules: cannot write to {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
