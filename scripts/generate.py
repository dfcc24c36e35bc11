"""Regenerate every generated file, in dependency order, or check that none is stale.

    scripts/generate          rewrite them (`make generate`)
    scripts/generate --check  exit 1, naming each stale file, if a committed one differs

Each step runs as a module (`python -m alerts.build`) from the tree's root.
Order: rules (alerts/build.py) -> runbooks (alerts/runbooks.py) -> their promtool tests
(alerts/build_tests.py) -> dashboards (dashboards/build.py) -> deploy manifests (deploy/build.py:
the PrometheusRule from the rules, the dashboards ConfigMap from the JSON, the chart's files/ copies of both, the
admission policy, the chart's values schema) -> the metrics and configuration references (scripts/docgen.py:
from the probes' specs and the config models).

--check runs the same generators in a temporary copy of the tree and compares every file
under the generated folders, so a file a generator stops writing or newly writes counts too.
"""
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("alerts/build.py", "alerts/runbooks.py", "alerts/build_tests.py", "dashboards/build.py", "deploy/build.py",
         "scripts/docgen.py")
TREES = ("alerts", "dashboards", "deploy", "docs", "scripts", "charts")
SKIP = {"__pycache__"}


def run_steps(root: Path) -> None:
    for step in STEPS:
        # each step runs as a module of the tree at `root` (`python -m alerts.build`): -m puts the working
        # directory first on sys.path, so a --check copy runs its own generators
        module = step.removesuffix(".py").replace("/", ".")
        r = subprocess.run([sys.executable, "-m", module], cwd=root, capture_output=True, text=True)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()
            raise SystemExit(f"generate: {step} failed: {tail[-1] if tail else f'exit {r.returncode}'}")


def files(root: Path) -> set[str]:
    out = set()
    for tree in TREES:
        for dirpath, dirnames, names in os.walk(root / tree):
            dirnames[:] = [d for d in dirnames if d not in SKIP]
            out |= {str((Path(dirpath) / n).relative_to(root)) for n in names if not n.endswith(".pyc")}
    return out


def check() -> int:
    with tempfile.TemporaryDirectory(prefix="fleetcanary-generate-") as tmp:
        copy = Path(tmp)
        for tree in TREES:
            shutil.copytree(ROOT / tree, copy / tree, ignore=shutil.ignore_patterns(*SKIP))
        run_steps(copy)
        before, after = files(ROOT), files(copy)
        stale = sorted((before ^ after) | {f for f in before & after
                                           if not filecmp.cmp(ROOT / f, copy / f, shallow=False)})
    for f in stale:
        print(f"stale: {f}", file=sys.stderr)
    if stale:
        print("generate: run `make generate` and commit the result", file=sys.stderr)
    return 1 if stale else 0


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        return check()
    if sys.argv[1:]:
        print("usage: scripts/generate [--check]", file=sys.stderr)
        return 2
    run_steps(ROOT)
    print("generated: " + ", ".join(STEPS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
