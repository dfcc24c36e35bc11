"""Run the import-linter contracts of pyproject.toml over the package as it installs.

The source folders map onto one package through setuptools' package-dir (exporter/ is
`fleetcanary`, probes/ is `fleetcanary.probes`, ...); import-linter reads a package from
one folder tree. So the .py files are staged into a temporary tree laid out as the wheel
lays them out, and `lint-imports` runs there. Exit status: lint-imports' own (non-zero on
a broken contract).

    scripts/lint-imports [--source DIR]    (DIR: a checkout, default this one)
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from scripts.stage_package import stage


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=str(Path(__file__).resolve().parent.parent))
    args = ap.parse_args()
    source = Path(args.source).resolve()
    with tempfile.TemporaryDirectory(prefix="fleetcanary-lint-") as tmp:
        stage(source, Path(tmp), data=False)
        shutil.copy2(source / "pyproject.toml", Path(tmp) / "pyproject.toml")
        env = {**os.environ, "PYTHONPATH": tmp}
        lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or "lint-imports"
        return subprocess.run([lint, "--no-cache"], cwd=tmp, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
