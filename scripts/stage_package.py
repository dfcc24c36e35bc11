#!/usr/bin/env python3
"""Lay the source folders out as the wheel installs them, without building one.

    scripts/stage_package.py DEST [--source DIR]

DEST/fleetcanary/... then holds exporter/ as `fleetcanary`, probes/ as `fleetcanary.probes`,
and the rules and dashboards data, following pyproject.toml's package-dir and packages.
Used by scripts/lint-imports (import-linter reads a package from one folder tree) and by
scripts/gpu-check (a GPU machine without the build tools). Standard library only.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

SOURCE = Path(__file__).resolve().parent.parent


def _setuptools_table(source: Path) -> dict:
    text = (source / "pyproject.toml").read_text()
    if tomllib is not None:
        return tomllib.loads(text)["tool"]["setuptools"]
    raise SystemExit("stage_package: needs Python 3.11+ (tomllib)")


def stage(source: Path, dest: Path, data: bool = True) -> None:
    cfg = _setuptools_table(source)
    dirs = cfg["package-dir"]
    patterns = cfg.get("package-data", {})
    for package in cfg["packages"]:
        parts = package.split(".")
        for i in range(len(parts), 0, -1):
            head = ".".join(parts[:i])
            if head in dirs:
                folder = source / dirs[head] / Path(*parts[i:])
                break
        else:
            folder = source / Path(*parts)
        target = dest / Path(*parts)
        target.mkdir(parents=True, exist_ok=True)
        for f in folder.glob("*.py"):
            if "." not in f.stem and "-" not in f.stem:
                shutil.copy2(f, target / f.name)
        if data:
            for pattern in patterns.get(package, []):
                for f in folder.glob(pattern):
                    (target / f.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, target / f.relative_to(folder))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest")
    ap.add_argument("--source", default=str(SOURCE))
    args = ap.parse_args()
    stage(Path(args.source).resolve(), Path(args.dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
