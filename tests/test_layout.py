"""The package's layers hold: import-linter contracts pass, a broken import fails them, no
module imports itself in a circle, the CLI loads a tool only when its subcommand runs, and
tests/ and benchmarks/ never import each other."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = ROOT / "scripts/lint-imports"


def lint(source: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LINT), "--source", str(source)], capture_output=True, text=True,
                          timeout=300)


def scratch_copy(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for top in ("exporter", "probes", "alerts", "dashboards"):
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", src / "pyproject.toml")
    return src


def test_the_contracts_pass():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "BROKEN" not in r.stdout and r.stdout.count("KEPT") >= 4


@pytest.mark.parametrize("file, line, contract", [
    ("exporter/daemon/service.py", "from fleetcanary.offline import once", "exporter layers"),
    ("exporter/core/units.py", "from fleetcanary.runner import job", "exporter layers"),
    ("probes/storage.py", "from fleetcanary.core import units", "probes import nothing of the exporter"),
    ("probes/lib/sse.py", "from fleetcanary.probes import inference", "probe libraries never import a probe"),
])
def test_a_broken_import_in_a_scratch_copy_fails_them(tmp_path, file, line, contract):
    src = scratch_copy(tmp_path)
    target = src / file
    text = target.read_text()
    marker = "from __future__ import annotations\n"
    target.write_text(text.replace(marker, marker + line + "  # noqa\n", 1) if marker in text else line + "\n" + text)
    r = lint(src)
    assert r.returncode != 0, r.stdout[-3000:]
    broken = r.stdout[r.stdout.index("Broken contracts"):]
    assert contract in broken, broken


def test_no_module_imports_itself_in_a_circle(tmp_path):
    from scripts.stage_package import stage

    stage(ROOT, tmp_path)
    code = """
import json, grimp
g = grimp.build_graph("fleetcanary", cache_dir=None)
edges = {m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}
print(json.dumps(edges))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    edges = json.loads(r.stdout)
    assert len(edges) > 50
    # Depth-first search for a back edge; report the circle.
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in edges.get(m, []):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(edges):
        if m not in state:
            circle = visit(m)
            assert circle is None, " -> ".join(circle)


def test_the_cli_imports_a_tool_only_when_its_subcommand_runs():
    code = """
import json, sys
from fleetcanary import cli
cli.build_parser("run")
before = sorted(m for m in sys.modules if m.startswith(("fleetcanary.offline", "fleetcanary.daemon")))
cli.build_parser("compare")
after = sorted(m for m in sys.modules if m.startswith("fleetcanary.offline"))
print(json.dumps([before, after]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    before, after = json.loads(r.stdout)
    assert before == [], before
    assert "fleetcanary.offline.compare" in after and "fleetcanary.offline.loadtest" not in after


def test_collecting_the_suite_imports_no_torch():
    """Every xdist worker collects every test module: a module that imports torch at import time (a constant, a
    parametrize value, a skipif) costs each worker about 1.5 CPU-s, whatever tests it then runs."""
    code = ("import io, contextlib, sys, pytest\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    code = pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', 'tests'])\n"
            "print(int(code), sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split(None, 1) == ["0", "[]\n"], r.stdout


def test_fleetcanary_help_lists_every_subcommand():
    r = subprocess.run([sys.executable, "-m", "fleetcanary", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0
    import argparse

    from fleetcanary.cli import build_parser

    # the parser is the list: a subcommand added there (a daemon command or a TOOLS entry) is checked here too
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {"run", "once", "compare", "loadtest"} <= set(sub.choices)
    for cmd in sub.choices:
        assert cmd in r.stdout, cmd


# tests/ and benchmarks/ never import each other (what both need lives in harness/, which imports neither):
# a benchmark must run from a checkout without the test tree's fixtures, and a test must not depend on a
# script whose numbers are tuned for a quiet machine.
FORBIDDEN = {"tests": {"benchmarks"}, "benchmarks": {"tests"}, "harness": {"tests", "benchmarks"}}


def imported_top_levels(source: str) -> set[str]:
    """The top-level package of every absolute import in a module: import/from statements anywhere (also
    inside functions) and importlib.import_module("...") / __import__("...") with a literal name."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("import_module", "__import__"):
                out.add(node.args[0].value.split(".")[0])
    return out


def crossings(root: Path) -> list[str]:
    found = []
    for top, banned in FORBIDDEN.items():
        for path in sorted((root / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            found += [f"{path.relative_to(root)} imports {pkg}"
                      for pkg in sorted(imported_top_levels(path.read_text()) & banned)]
    return found


def test_tests_and_benchmarks_never_import_each_other():
    assert (ROOT / "harness" / "__init__.py").exists()
    assert crossings(ROOT) == []


def test_the_import_check_sees_every_form_of_a_crossing(tmp_path):
    for top in FORBIDDEN:
        (tmp_path / top / "sub").mkdir(parents=True)
    (tmp_path / "tests/sub/test_a.py").write_text("def f():\n    from benchmarks.scrape import wrk\n")
    (tmp_path / "tests/sub/test_b.py").write_text("import importlib\nm = importlib.import_module('benchmarks.x')\n")
    (tmp_path / "tests/test_ok.py").write_text("from harness.wrk import wrk\nfrom .support import helpers\n")
    (tmp_path / "benchmarks/b.py").write_text("import tests.support.netns as n\n")
    (tmp_path / "harness/sub/h.py").write_text("x = __import__('tests')\n")
    assert crossings(tmp_path) == ["tests/sub/test_a.py imports benchmarks", "tests/sub/test_b.py imports benchmarks",
                                   "benchmarks/b.py imports tests", "harness/sub/h.py imports tests"]


def test_the_modules_scheduled_first_exist_and_hold_long_tests():
    """tests/conftest.py LONGEST and WAITING: a renamed module would silently lose its place in the run."""
    from tests.conftest import LONGEST, WAITING
    assert [m for m in WAITING if not (ROOT / m).is_file()] == []
    for module in LONGEST:
        text = (ROOT / module).read_text()
        assert "pytest.mark.long" in text, module
