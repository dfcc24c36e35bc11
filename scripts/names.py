"""The names fleetcanary promises to keep (docs/stability.md): every metric it can expose with its label names,
every recorded series the shipped rules write, every alert with the labels it carries (what Alertmanager routes
and silences match), every config key (of the exporter, and of the remediation controller under "remediate."),
and every dashboard UID (what links and bookmarks open).

    scripts/names                 # print them as JSON
    scripts/names --write         # release/names-<version>.json, at a release
    scripts/names --check         # fail when the current version's file differs from the code
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from fleetcanary.probes.lib import yamltext

ROOT = Path(__file__).resolve().parent.parent


def alerts() -> dict[str, list[str]]:
    """Each shipped alert: the labels it sets itself and those its annotations read from its expression's series
    ($labels.X), the ones a route, a silence or a receiver's template is written against."""
    out: dict[str, list[str]] = {}
    for g in yamltext.load((ROOT / "alerts" / "fleetcanary.alerts.yml").read_text())["groups"]:
        for r in g["rules"]:
            if "alert" in r:
                carried = set(r.get("labels", {}))
                for text in r.get("annotations", {}).values():
                    carried |= set(re.findall(r"\$labels\.([A-Za-z_][A-Za-z0-9_]*)", text))
                out[r["alert"]] = sorted(carried | set(out.get(r["alert"], [])))
    return dict(sorted(out.items()))


def config_keys() -> list[str]:
    from fleetcanary.core import config, config_keys
    from fleetcanary.remediate import config as remediate

    return sorted(config_keys.keys(config.settings_model()) +
                  ["remediate." + k for k in config_keys.keys(remediate.Settings)])


def dashboards() -> dict[str, str]:
    """Each dashboard's UID and its file."""
    out = {}
    for p in sorted((ROOT / "dashboards" / "json").glob("*.json")):
        out[json.loads(p.read_text())["uid"]] = p.name
    return out


def current() -> dict:
    from fleetcanary.core.version import version
    from fleetcanary.daemon.collector import EXPORTER_METRICS
    from fleetcanary.probes import PROBES

    metrics: dict[str, list[str]] = {}
    for m in EXPORTER_METRICS:
        metrics[m.name] = sorted(m.labels)
    for cls in PROBES.values():
        for spec in cls.metrics:  # a histogram's _bucket, _sum and _count follow its name
            metrics[spec.name] = sorted(spec.labels)
    recorded = set()
    for f in ("fleetcanary.rules.yml", "fleetcanary.alerts.yml"):
        for g in yamltext.load((ROOT / "alerts" / f).read_text())["groups"]:
            recorded |= {r["record"] for r in g["rules"] if "record" in r}
    return {"version": version(), "metrics": dict(sorted(metrics.items())), "recorded": sorted(recorded),
            "alerts": alerts(), "config": config_keys(), "dashboards": dashboards()}


def gone(last: dict, now: dict) -> list[tuple[str, str]]:
    """(kind, name) of each name of `last` that `now` lacks. Kinds: metric, label ("metric:label"), recorded,
    alert, alert_label ("alert:label"), config, dashboard (a UID). A release list older than a kind has none."""
    out: list[tuple[str, str]] = []
    for metric, labels in last["metrics"].items():
        if metric not in now["metrics"]:
            out.append(("metric", metric))
            continue
        out += [("label", f"{metric}:{lab}") for lab in labels if lab not in now["metrics"][metric]]
    out += [("recorded", r) for r in last["recorded"] if r not in now["recorded"]]
    for alert, labels in last.get("alerts", {}).items():
        if alert not in now["alerts"]:
            out.append(("alert", alert))
            continue
        out += [("alert_label", f"{alert}:{lab}") for lab in labels if lab not in now["alerts"][alert]]
    out += [("config", k) for k in last.get("config", []) if k not in now["config"]]
    out += [("dashboard", uid) for uid in last.get("dashboards", {}) if uid not in now["dashboards"]]
    return out


def path_for(version: str) -> Path:
    return ROOT / "release" / f"names-{version}.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    names = current()
    text = json.dumps(names, indent=1) + "\n"
    target = path_for(names["version"])
    if args.write:
        target.write_text(text)
        print(f"wrote {target.relative_to(ROOT)}")
    elif args.check:
        if target.exists() and target.read_text() != text:
            print(f"names: {target.relative_to(ROOT)} differs from the code; a released version's names are "
                  "fixed (docs/stability.md)", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
