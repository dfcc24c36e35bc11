"""Result files: loading runs, keying figures, quality exclusion and comparability.

A result file is either the results history (`results.jsonl` in the state directory,
one run record per line, rotated files too) or the output of `fleetcanary once --json`
(`{"runs": [...]}`), either of them optionally gzip-compressed (`.gz`); the history's one
reader loads both. A run is one probe run (core.record.RunRecord): outcome, figures (raw
repeats, median, dispersion), parameters and the environment it ran in.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetcanary.core.record import RunRecord
from fleetcanary.runner import history

# Environment facts that must match for two results to be compared (the guide's
# "avoid incorrect comparisons": hardware, power caps, CPU limits). Driver, CUDA,
# kernel, packages and image are what a comparison usually tests, so they may differ
# and are reported as the change.
# A GPU shared by time-slicing or MPS against a dedicated one is a different load, not a change to test (the guide:
# "mark whether the environment is shared"); GPU feature discovery's label on Kubernetes says which.
FIXED_ENVIRONMENT = ("gpu_model", "gpu_count", "cpu_model", "cpu_cores", "numa_nodes", "memory_bytes",
                     "cgroup_cpu_limit_cores", "gpu_power_limits_watts", "gpu_mig_modes", "gpu_sharing_strategy")
# What an upgrade gate tests: listed as changes, never a refusal. The platform's (Kubernetes: kubelet, container
# runtime, the NVIDIA components on the node; core/kube_platform.py) and the HCA firmware included.
PLATFORM_VERSIONS = ("kubelet_version", "container_runtime", "node_os_image", "gpu_operator_version",
                     "device_plugin_version", "dra_driver_version", "container_toolkit_version", "gpu_driver_version",
                     "mig_strategy", "gpu_replicas")
CHANGE_ENVIRONMENT = ("driver_version", "cuda_driver_version", "kernel", "os", "fleetcanary_version", "git_commit",
                      "image", "image_digest", "python_version", "torch_version", "nccl_version", *PLATFORM_VERSIONS,
                      "hca_firmware", "in_kubernetes", "hostname")


class ResultsError(Exception):
    """A result file that cannot be used; the message is one line."""


@dataclass
class FigureSeries:
    """One figure (probe, name, labels) across the runs of one side."""
    probe: str
    name: str
    labels: dict[str, str]
    unit: str
    higher_is_better: bool
    run_medians: list[float] = field(default_factory=list)
    repeats: list[list[float]] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        return figure_key(self.probe, self.name, self.labels)

    def samples(self) -> tuple[list[float], str]:
        """The replicates to compare: one median per run, or a single run's repeats."""
        if len(self.run_medians) >= 2:
            return list(self.run_medians), "runs"
        return [v for rep in self.repeats for v in rep], "repeats of one run"

    def title(self) -> str:
        lab = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        return f"{self.probe} {self.name}" + (f" {{{lab}}}" if lab else "")


def figure_key(probe: str, name: str, labels: dict[str, str]) -> tuple:
    return (probe, name, tuple(sorted((str(k), str(v)) for k, v in labels.items())))


def load(paths: list[str | Path]) -> list[RunRecord]:
    """Every run in the files, oldest first. Raises ResultsError with one line for a bad file."""
    runs: list[RunRecord] = []
    for p in paths:
        try:
            runs += history.read(p)
        except history.HistoryError as exc:
            raise ResultsError(str(exc)) from None
    runs.sort(key=lambda r: r.started_at)
    return runs


def quality_failures(run: RunRecord) -> tuple[bool, dict[str, list[str]]]:
    """Whether the whole run failed a correctness check, and the inference targets whose quality checks failed
    (the guide: performance that does not meet quality does not enter the comparison)."""
    whole = run.reason in ("wrong_result", "verification_failed")
    targets: dict[str, list[str]] = {}
    extra = run.result.get("extra") or {}
    for target, reqs in (extra.get("requests") or {}).items():
        for req in reqs or []:
            if not isinstance(req, dict):
                continue
            q = req.get("quality") if isinstance(req.get("quality"), dict) else {}
            if q.get("pass") is False or req.get("outcome") == "quality_fail":
                targets.setdefault(str(target), []).append(f"quality check {q.get('check', '?')} failed")
    return whole, targets


def series(runs: list[RunRecord]) -> tuple[dict[tuple, FigureSeries], list[tuple[RunRecord, list[str]]]]:
    """Figures of successful runs without their quality-failed parts, and what was excluded for quality."""
    out: dict[tuple, FigureSeries] = {}
    excluded = []
    for run in runs:
        whole, bad_targets = quality_failures(run)
        if whole or bad_targets:
            why = ([f"{run.probe}: {run.reason}"] if whole else []) + \
                [f"{run.probe} target {t}: {'; '.join(sorted(set(w)))}" for t, w in sorted(bad_targets.items())]
            excluded.append((run, why))
        if not run.ok or whole:
            continue
        for f in run.result.get("figures") or []:
            med = f.get("median")
            if not isinstance(med, (int, float)) or not math.isfinite(med):
                continue
            labels = {str(k): str(v) for k, v in (f.get("labels") or {}).items()}
            if labels.get("target") in bad_targets:
                continue
            key = figure_key(run.probe, f.get("name", "?"), labels)
            s = out.get(key)
            if s is None:
                s = out[key] = FigureSeries(run.probe, f.get("name", "?"), labels, f.get("unit", ""),
                                            bool(f.get("higher_is_better", True)))
            s.run_medians.append(float(med))
            s.repeats.append([float(v) for v in f.get("repeats") or [med] if isinstance(v, (int, float))])
    return out, excluded


def environment_summary(runs: list[RunRecord]) -> dict[str, Any]:
    """One environment for a set of runs: each field's single value, or all the values seen."""
    seen: dict[str, list] = defaultdict(list)
    for r in runs:
        env = dict(r.environment)
        gpus = [g for g in env.get("gpus") or [] if isinstance(g, dict) and not g.get("lost")]
        if gpus:
            env["gpu_power_limits_watts"] = ",".join(sorted({str(g.get("power_limit_watts")) for g in gpus}))
            env["gpu_mig_modes"] = ",".join(sorted({str(g.get("mig_mode")) for g in gpus}))
        pk = env.get("packages") or {}
        if isinstance(pk, dict) and pk.get("torch"):
            env["torch_version"] = pk["torch"]
        nccl = nccl_version(r)
        if nccl is not None:
            env["nccl_version"] = nccl
        for k in FIXED_ENVIRONMENT + CHANGE_ENVIRONMENT:
            if k in env and env[k] not in seen[k]:
                seen[k].append(env[k])
    return {k: (v[0] if len(v) == 1 else v) for k, v in seen.items()}


# Settings that say where or how politely a probe ran, not what it measured: they may differ.
NOT_MEASUREMENT = {"path", "base_url", "url_env", "token_env", "token_file", "headers", "ca_file", "verify_tls",
                   "nccl_tests_dir", "topology_dump", "busy_policy", "expected_gpu_seconds", "min_free_bytes",
                   "connect_timeout_seconds", "read_timeout_seconds", "request_timeout_seconds",
                   "collective_timeout_seconds", "threshold_free_bytes"}


def _measurement(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _measurement(x) for k, x in v.items() if k not in NOT_MEASUREMENT}
    if isinstance(v, list):
        return [_measurement(x) for x in v]
    return v


def _flatten(v: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(v, dict):
        out: dict[str, Any] = {}
        for k, x in v.items():
            out.update(_flatten(x, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        out = {}
        for i, x in enumerate(v):
            name = x.get("name", i) if isinstance(x, dict) else i
            out.update(_flatten(x, f"{prefix}[{name}]"))
        return out
    return {prefix: v}


def parameters_by_probe(runs: list[RunRecord]) -> dict[str, list[dict]]:
    """What each probe measured with: its config (less where/how-politely settings) and declared parameters."""
    out: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        if not r.ok:
            continue
        p = {**_flatten(_measurement(r.result.get("config") or {})),
             **{f"measured.{k}": v for k, v in _flatten(r.result.get("parameters") or {}).items()}}
        if p and p not in out[r.probe]:
            out[r.probe].append(p)
    return out


def nccl_version(run: RunRecord) -> str | None:
    """The NCCL version a collective run used (the collectives probe records it: torch's NCCL, or nccl-tests'),
    as a string; None for a run that used no NCCL or did not say."""
    extra = (run.result or {}).get("extra") if isinstance(run.result, dict) else None
    v = extra.get("nccl_version") if isinstance(extra, dict) else None
    return str(v) if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v) else None


def _nccl_versions(runs: list[RunRecord]) -> list[str]:
    return sorted({v for r in runs if r.ok and (v := nccl_version(r)) is not None})


def incomparable(base: list[RunRecord], cand: list[RunRecord]) -> list[str]:
    """Why the two sides must not be compared: differing fixed environment facts and probe parameters, and for
    collective results a differing NCCL version (the figure measures NCCL's own algorithms and protocols: another
    version is another implementation, the guide's "vendor-optimized vs reference implementation")."""
    why = []
    eb, ec = environment_summary(base), environment_summary(cand)
    for k in FIXED_ENVIRONMENT:
        if k in eb and k in ec and eb[k] != ec[k]:
            why.append(f"environment.{k}: baseline {eb[k]!r} vs candidate {ec[k]!r}")
    nb, nc = _nccl_versions(base), _nccl_versions(cand)
    if nb and nc and nb != nc:
        fb, fc = nb[0] if len(nb) == 1 else nb, nc[0] if len(nc) == 1 else nc
        why.append(f"environment.nccl_version: baseline {fb!r} vs candidate {fc!r} (collective results)")
    pb, pc = parameters_by_probe(base), parameters_by_probe(cand)
    for probe in sorted(set(pb) & set(pc)):
        if pb[probe] != pc[probe]:
            keys = sorted({k for p in pb[probe] + pc[probe] for k in p
                           if {json.dumps(x.get(k), sort_keys=True) for x in pb[probe]}
                           != {json.dumps(x.get(k), sort_keys=True) for x in pc[probe]}})
            for k in keys:
                vb = [p.get(k) for p in pb[probe]]
                vc = [p.get(k) for p in pc[probe]]
                why.append(f"{probe}.parameters.{k}: baseline {vb[0] if len(vb) == 1 else vb!r} "
                           f"vs candidate {vc[0] if len(vc) == 1 else vc!r}")
    return why


def changes(base: list[RunRecord], cand: list[RunRecord]) -> list[str]:
    """What differs that a comparison is allowed to test (driver, image, kernel, ...)."""
    eb, ec = environment_summary(base), environment_summary(cand)
    return [f"{k}: {eb.get(k)!r} -> {ec.get(k)!r}" for k in CHANGE_ENVIRONMENT if eb.get(k) != ec.get(k)]
