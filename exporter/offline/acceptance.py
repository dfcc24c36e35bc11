"""Node acceptance: `fleetcanary once --repeat N --expect FILE`.

The expectations file lists checks per GPU model ("*" applies to every node):

    models:
      "*":
        - {probe: host_memory_bandwidth, figure: triad, min: 20e9}
      "NVIDIA H100 80GB HBM3":
        - {probe: gpu_bandwidth, figure: d2d, min: 2.8e12}          # every GPU
        - {metric: fleetcanary_gpu_pcie_link_width, equals: 16}
        - {metric: fleetcanary_gpu_pcie_link_generation_max, equals: 5}
        - {metric: fleetcanary_gpu_p2p_link_info, label: link, in: [nvlink]}

A figure check takes, per label set, the median over the N runs of each run's median
(min/max) - measurements are noisy, acceptance is about the typical value. A metric
check takes every run's value (min: the lowest, max: the highest, equals: all of
them): one downtrained link in one run is a failure. A check nothing measured fails.
"""
from __future__ import annotations

import statistics
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fleetcanary.core.textfile import TextFileError, read_text
from fleetcanary.core.units import human, text_table
from fleetcanary.probes import PROBES
from fleetcanary.probes.lib import yamltext


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    probe: str | None = Field(None, description="Probe of a figure check (derived for metric checks).")
    figure: str | None = Field(None, description="Figure name (as in `once` output), e.g. d2d, triad, read_cold.")
    metric: str | None = Field(None, description="A published metric, e.g. fleetcanary_gpu_pcie_link_width.")
    labels: dict[str, str] = Field(default_factory=dict, description="Only series with these label values.")
    min: float | None = None
    max: float | None = None
    equals: float | None = None
    label: str | None = Field(None, description="For `in`: the label whose value is checked.")
    in_: tuple[str, ...] | None = Field(None, alias="in", description="Allowed values of `label`.")
    name: str | None = Field(None, description="Shown instead of the generated check name.")

    @model_validator(mode="after")
    def _shape(self) -> Check:
        if (self.figure is None) == (self.metric is None):
            raise ValueError("give exactly one of figure or metric")
        if self.figure is not None and self.probe not in PROBES:
            raise ValueError(f"figure checks need a known probe, got {self.probe!r}; known: {', '.join(PROBES)}")
        if self.metric is not None:
            owners = [n for n, cls in PROBES.items() if any(s.name == self.metric for s in cls.metrics)]
            if not owners:
                raise ValueError(f"no probe publishes {self.metric}")
            object.__setattr__(self, "probe", owners[0])
        if (self.label is None) != (self.in_ is None):
            raise ValueError("label and in go together")
        if self.figure is not None and self.label is not None:
            raise ValueError("label/in apply to metric checks")
        if all(v is None for v in (self.min, self.max, self.equals, self.in_)):
            raise ValueError("give a condition: min, max, equals or label+in")
        return self

    def title(self) -> str:
        if self.name:
            return self.name
        what = f"{self.probe} {self.figure}" if self.figure else self.metric
        lab = ",".join(f"{k}={v}" for k, v in self.labels.items())
        return what + (f" {{{lab}}}" if lab else "")

    def expected(self, unit: str) -> str:
        parts = []
        if self.min is not None:
            parts.append(f">= {human(self.min, unit)}")
        if self.max is not None:
            parts.append(f"<= {human(self.max, unit)}")
        if self.equals is not None:
            parts.append(f"== {self.equals:g}")
        if self.in_ is not None:
            parts.append(f"{self.label} in {{{', '.join(self.in_)}}}")
        return " and ".join(parts)


class Expectations(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    models: dict[str, list[Check]] = Field(..., description="GPU model (as NVML names it) or * -> checks")

    def for_model(self, model: str | None) -> tuple[list[Check], bool]:
        """The checks for this node, and whether the file names its GPU model."""
        checks = list(self.models.get("*", []))
        if model and model in self.models:
            return checks + list(self.models[model]), True
        return checks, not model


class ExpectationsError(Exception):
    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


def load(path: str) -> Expectations:
    try:
        data = yamltext.load(read_text(path))
    except TextFileError as exc:
        raise ExpectationsError([str(exc)]) from None
    except yaml.YAMLError as exc:
        raise ExpectationsError([f"{path}: not YAML: {str(exc).splitlines()[0]}"]) from None
    try:
        return Expectations.model_validate(data)
    except ValidationError as exc:
        raise ExpectationsError([f"{path}: {'.'.join(str(p) for p in e['loc'])}: "
                                 f"{e['msg'].removeprefix('Value error, ')}"
                                 for e in exc.errors()]) from None


def gpu_model(outcomes) -> str | None:
    for o in outcomes:
        m = (o.environment or {}).get("gpu_model")
        if isinstance(m, str) and m and m != "unknown" and (o.environment or {}).get("gpu_count"):
            return m
    return None


def _series_key(labels: dict[str, Any], drop: str | None = None) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in labels.items() if k != drop))


def _matches(labels: dict[str, Any], want: dict[str, str]) -> bool:
    return all(str(labels.get(k)) == v for k, v in want.items())


def evaluate(check: Check, outcomes) -> list[dict[str, Any]]:
    """One row per series the check covers (e.g. one per GPU)."""
    runs = [o for o in outcomes if o.probe == check.probe]
    ok_runs = [o for o in runs if o.outcome == "success"]
    if not ok_runs:
        why = ", ".join(sorted({f"{o.outcome} ({o.reason})" if o.reason else o.outcome for o in runs})) or "not run"
        return [{"check": check.title(), "series": "", "observed": f"no successful run: {why}",
                 "expected": check.expected(""), "pass": False}]
    rows = []
    if check.figure is not None:
        per: dict[tuple, list[float]] = {}
        unit = ""
        for o in ok_runs:
            for f in o.figures:
                labels = f.get("labels") or {}
                if f.get("name") == check.figure and _matches(labels, check.labels) and \
                        isinstance(f.get("median"), (int, float)):
                    per.setdefault(_series_key(labels), []).append(float(f["median"]))
                    unit = f.get("unit", "")
        for key, vals in sorted(per.items()):
            med = statistics.median(vals)
            ok = (check.min is None or med >= check.min) and (check.max is None or med <= check.max) and \
                (check.equals is None or med == check.equals)
            spread = (f" (runs {human(min(vals), unit)}..{human(max(vals), unit)}, n={len(vals)})"
                      if len(vals) > 1 else "")
            rows.append({"check": check.title(), "series": ",".join(f"{k}={v}" for k, v in key),
                         "observed": f"median {human(med, unit)}{spread}", "expected": check.expected(unit),
                         "pass": ok, "value": med})
    else:
        per_m: dict[tuple, list[Any]] = {}
        for o in ok_runs:
            for s in o.samples or []:
                labels = s.get("labels") or {}
                if s.get("metric") == check.metric and _matches(labels, check.labels):
                    if check.in_ is not None:
                        if float(s.get("value", 0)) == 1.0:
                            per_m.setdefault(_series_key(labels, drop=check.label), []).append(
                                str(labels.get(check.label)))
                    else:
                        per_m.setdefault(_series_key(labels), []).append(float(s["value"]))
        for key, vals in sorted(per_m.items()):
            series = ",".join(f"{k}={v}" for k, v in key)
            if check.in_ is not None:
                bad = sorted({v for v in vals if v not in check.in_})
                rows.append({"check": check.title(), "series": series, "observed": ",".join(sorted(set(vals))),
                             "expected": check.expected(""), "pass": not bad})
                continue
            lo, hi = min(vals), max(vals)
            ok = (check.min is None or lo >= check.min) and (check.max is None or hi <= check.max) and \
                (check.equals is None or all(v == check.equals for v in vals))
            observed = f"{lo:g}" if lo == hi else f"{lo:g}..{hi:g}"
            rows.append({"check": check.title(), "series": series, "observed": observed,
                         "expected": check.expected(""), "pass": ok})
    if not rows:
        rows.append({"check": check.title(), "series": "", "observed": "nothing measured matches",
                     "expected": check.expected(""), "pass": False})
    return rows


def run_checks(exp: Expectations, outcomes) -> dict[str, Any]:
    model = gpu_model(outcomes)
    checks, known = exp.for_model(model)
    rows = [r for c in checks for r in evaluate(c, outcomes)]
    if not known:
        rows.insert(0, {"check": "expectations for this GPU model", "series": "", "observed": model or "",
                        "expected": f"one of: {', '.join(m for m in exp.models if m != '*') or 'none listed'}",
                        "pass": False})
    return {"gpu_model": model, "rows": rows, "passed": all(r["pass"] for r in rows) and bool(rows)}


def table(result: dict[str, Any]) -> str:
    out = [text_table(("check", "series", "observed", "expected", "result"),
                      [(r["check"], r["series"] or "-", r["observed"], r["expected"], "PASS" if r["pass"] else "FAIL")
                       for r in result["rows"]])]
    failed = sum(not r["pass"] for r in result["rows"])
    out.append("")
    out.append(f"acceptance: {'PASS' if result['passed'] else 'FAIL'} ({len(result['rows']) - failed} passed, "
               f"{failed} failed; GPU model {result['gpu_model'] or 'none'})")
    return "\n".join(out)
