"""`fleetcanary once`: run the enabled probes once, in isolated workers, and report.

Progress goes to stderr; the table (or JSON with --json) goes to stdout. With
--history, every run is also appended to the results history in the config's state
directory, as the daemon would; without it, `once` leaves the daemon's history alone.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from fleetcanary.core import kube_platform
from fleetcanary.core.record import RunRecord
from fleetcanary.core.units import human, text_table
from fleetcanary.offline import acceptance
from fleetcanary.runner import job as jobmod
from fleetcanary.runner.history import History, HistoryError
from fleetcanary.runner.isolation import become_subreaper, run_isolated


def platform_facts(settings, environ=os.environ, warn=None) -> dict[str, Any]:
    """In a pod (or with kubernetes.api_url), the Kubernetes platform of this node for the run records, as the
    daemon records it (core/kube_platform.py): one read of the Node and one list of its pods. {} outside Kubernetes,
    with kubernetes.mode off or no node_name; a failed read is one warning line and {} (the runs go on)."""
    cfg = settings.kubernetes
    node_name = settings.node_name
    if cfg.mode == "off" or not node_name or not (environ.get("KUBERNETES_SERVICE_HOST") or cfg.api_url):
        return {}
    try:
        from kubernetes import client

        conf = client.Configuration()
        if cfg.api_url:   # a loopback plain-HTTP server that authenticates for us (config validates it)
            conf.host = cfg.api_url
        else:
            from kubernetes.config.incluster_config import InClusterConfigLoader

            InClusterConfigLoader(environ.get("FLEETCANARY_KUBE_TOKEN_FILE") or kube_platform.TOKEN_FILE,
                                  environ.get("FLEETCANARY_KUBE_CA_FILE") or kube_platform.CA_FILE,
                                  environ=environ).load_and_set(conf)
        conf.retries = False
        api = client.CoreV1Api(client.ApiClient(conf))
        node = api.read_node(node_name, _request_timeout=cfg.api_timeout_seconds)
        pods = api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}",
                                               _request_timeout=cfg.api_timeout_seconds)
    except Exception as exc:  # noqa: BLE001 - the platform is a nicety of the record, never a reason to stop
        if warn:
            warn(f"warning: the Kubernetes platform is not recorded: {type(exc).__name__}: "
                 f"{str(exc).splitlines()[0][:200] if str(exc) else ''}", end=True)
        return {}
    return kube_platform.from_node(node) | kube_platform.from_pods(
        pods.items or [], kube_platform.own_pod_name(environ), kube_platform.own_namespace(environ))


def run_probes(settings, probe_map, names: list[str], repeat: int = 1, progress=None,
               write_history: bool = False, platform: dict[str, Any] | None = None) -> list[RunRecord]:
    become_subreaper(reap_everything=True)
    fields = kube_platform.record_fields(platform) if platform else {}
    outcomes = []
    total = len(names) * repeat
    history = History(settings.state_dir, settings.history.max_bytes, settings.history.backups) \
        if write_history else None
    i = 0
    for _ in range(repeat):
        for name in names:
            i += 1
            entry = settings.probe_entries()[name]
            if progress:
                progress(f"[{i}/{total}] {name} (deadline {entry.timeout_seconds:g}s) ...", end=False)
            job = jobmod.build(name, probe_map[name], entry.params.model_dump(mode="json"),
                               jobmod.probe_context(settings))
            out = run_isolated(job, entry.timeout_seconds, settings.worker_kill_grace_seconds)
            if fields and out.environment:
                out.environment.update(fields)
            if progress:
                why = f" ({out.reason})" if out.reason else ""
                progress(f" {out.outcome}{why} in {out.wall_seconds:.1f}s", end=True)
            if history is not None:
                try:
                    history.append(out)
                except HistoryError as exc:
                    if progress:
                        progress(f"warning: results history not written: {exc}", end=True)
            outcomes.append(out)
    return outcomes


def rows(outcomes: list[RunRecord]) -> list[dict[str, Any]]:
    """One row per figure; a run without figures gets one row with its status. A failed run
    that still measured something (a probe with several targets, one of them broken) shows
    its figures too, each with the run's status, and its detail once."""
    out = []
    for o in outcomes:
        figs = o.figures
        status = o.outcome + (f" ({o.reason})" if o.reason else "")
        if o.outcome != "success" and (not figs or o.outcome != "failure"):
            out.append({"probe": o.probe, "figure": "-", "unit": "", "median": None, "mad": None, "cv": None,
                        "n": 0, "status": status, "detail": o.detail})
            continue
        if not figs:
            out.append({"probe": o.probe, "figure": "-", "unit": "", "median": None, "mad": None, "cv": None,
                        "n": 0, "status": status, "detail": ""})
            continue
        for i, f in enumerate(figs):
            labels = ",".join(f"{k}={v}" for k, v in (f.get("labels") or {}).items())
            d = f.get("dispersion") or {}
            out.append({"probe": o.probe, "figure": f["name"] + (f" {{{labels}}}" if labels else ""),
                        "unit": f["unit"], "median": f.get("median"), "mad": d.get("mad"), "cv": d.get("cv"),
                        "n": int(d.get("n", 0)), "status": status,
                        "detail": o.detail if o.outcome != "success" and i == 0 else ""})
    return out


def target_lines(outcomes: list[RunRecord]) -> list[str]:
    """Per-target outcomes of probes that report them (result.extra.targets: name -> outcome, detail)."""
    lines = []
    for o in outcomes:
        targets = ((o.result.get("extra") or {}).get("targets")) or {}
        if not isinstance(targets, dict):
            continue
        for name, t in targets.items():
            if not isinstance(t, dict):
                continue
            detail = f": {t['detail']}" if t.get("detail") else ""
            took = f" in {t['seconds']:.1f}s of {t['budget_seconds']:.1f}s" if isinstance(
                t.get("seconds"), (int, float)) and isinstance(t.get("budget_seconds"), (int, float)) else ""
            lines.append(f"{o.probe} target {name}: {t.get('outcome', '?')}{took}{detail}")
    return lines


def table(rs: list[dict[str, Any]]) -> str:
    lines = []
    for r in rs:
        disp = "-" if r["median"] is None else f"±{human(r['mad'], r['unit'])}, {100 * (r['cv'] or 0):.1f}%"
        lines.append((r["probe"], r["figure"], human(r["median"], r["unit"]), disp, str(r["n"] or "-"), r["status"]))
    return text_table(("probe", "figure", "median", "dispersion (MAD, CV)", "n", "status"), lines)


def main(settings, probe_map, names: list[str], as_json: bool, repeat: int = 1, expect: str | None = None,
         write_history: bool = False) -> int:
    expectations = None
    if expect:
        try:
            expectations = acceptance.load(expect)
        except acceptance.ExpectationsError as exc:
            for line in exc.lines:
                print(f"fleetcanary: expectations error: {line}", file=sys.stderr)
            return 2

    def progress(msg: str, end: bool) -> None:
        if not as_json or sys.stderr.isatty():
            sys.stderr.write(msg + ("\n" if end else ""))
            sys.stderr.flush()

    t0 = time.monotonic()
    outcomes = run_probes(settings, probe_map, names, repeat, progress, write_history,
                          platform=platform_facts(settings, warn=progress))
    rs = rows(outcomes)
    verdict = acceptance.run_checks(expectations, outcomes) if expectations is not None else None
    if as_json:
        json.dump({"runs": [o.to_json() for o in outcomes], "table": rs, "targets": target_lines(outcomes),
                   **({"acceptance": verdict} if verdict is not None else {}),
                   "wall_seconds": time.monotonic() - t0}, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        print(table(rs))
        broken = [r for r in rs if r["detail"] and not r["status"].startswith("skipped")]
        for r in broken:
            print(f"{r['probe']}: {r['detail']}")
        per_target = target_lines(outcomes)
        if per_target:
            print()
            for line in per_target:
                print(line)
        if verdict is not None:
            print()
            print(acceptance.table(verdict))
    if verdict is not None and not verdict["passed"]:
        return 1
    return 1 if any(o.outcome in ("failure", "timeout", "crash") for o in outcomes) else 0
