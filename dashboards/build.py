#!/usr/bin/env python3
"""Render dashboards/boards/*.py (grafanalib) to dashboards/json/*.json with sorted keys.

    python -m dashboards.build          write the JSON
    python -m dashboards.build --check  exit 1 if the committed JSON is stale
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from grafanalib._gen import DashboardEncoder

HERE = Path(__file__).resolve().parent


def sources() -> list[Path]:
    """The board modules, one per board, each defining `dashboard`. boards/ has no __init__.py: a namespace
    package of development sources, which the wheel leaves out (tests/test_lists.py)."""
    return sorted(p for p in (HERE / "boards").glob("*.py") if p.name != "__init__.py")


def json_name(src: Path) -> str:
    """The board's file under json/: boards/node_detail.py -> node-detail.json."""
    return src.stem.replace("_", "-") + ".json"


def render() -> dict[str, str]:
    """File name under json/ -> JSON text."""
    out = {}
    for src in sources():
        board = importlib.import_module(f"dashboards.boards.{src.stem}").dashboard
        data = json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))
        out[json_name(src)] = json.dumps(data, sort_keys=True, indent=2) + "\n"
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
