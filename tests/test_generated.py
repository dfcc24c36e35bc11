"""Every committed generated file (rules, rule tests, runbooks, dashboards, deploy manifests,
metrics and configuration references) is what `make generate` makes from its sources."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_generated_file_is_stale():
    r = subprocess.run([sys.executable, str(ROOT / "scripts/generate"), "--check"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr


def test_a_stale_file_is_named(tmp_path):
    tree = tmp_path / "tree"
    for top in ("alerts", "dashboards", "deploy", "docs", "scripts", "charts"):
        shutil.copytree(ROOT / top, tree / top, ignore=shutil.ignore_patterns("__pycache__"))
    with open(tree / "docs/metrics.md", "a") as f:
        f.write("hand edit\n")
    r = subprocess.run([sys.executable, str(tree / "scripts/generate"), "--check"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1
    assert "stale: docs/metrics.md" in r.stderr
