#!/usr/bin/env python3
"""Render dashboards/*.dashboard.py (grafanalib) to dashboards/json/*.json with sorted keys.

    python dashboards/build.py          write the JSON
    python dashboards/build.py --check  exit 1 if the committed JSON is stale
"""
from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

from grafanalib._gen import DashboardEncoder

HERE = Path(__file__).resolve().parent


def sources() -> list[Path]:
    return sorted(HERE.glob("*.dashboard.py"))


def render() -> dict[str, str]:
    """File name under json/ -> JSON text."""
    sys.path.insert(0, str(HERE))
    out = {}
    for src in sources():
        board = runpy.run_path(str(src))["dashboard"]
        data = json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))
        out[src.name.replace(".dashboard.py", ".json")] = json.dumps(data, sort_keys=True, indent=2) + "\n"
    return out


def main() -> int:
    rendered = render()
    target = HERE / "json"
    if "--check" in sys.argv[1:]:
        stale = [n for n, t in rendered.items() if not (target / n).exists() or (target / n).read_text() != t]
        extra = sorted({p.name for p in target.glob("*.json")} - set(rendered))
        for n in stale + extra:
            print(f"dashboards/json/{n} is stale: run make dashboards", file=sys.stderr)
        return 1 if stale or extra else 0
    target.mkdir(exist_ok=True)
    for n, t in rendered.items():
        (target / n).write_text(t)
    print(f"wrote {len(rendered)} dashboards to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
