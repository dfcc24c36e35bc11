"""Every hand-kept list stays in step with the one place that is the truth for it.

The truths: the probe map (probes/__init__.py PROBES), the CLI's subcommands (build_parser in
exporter/cli/__init__.py), the judged figures (exporter/judge/figures.py FIGURES, which alerts/build.py
FIGURES follows), the dashboard sources (dashboards/boards/*.py), the package folders, the kustomize
overlays and the generators of scripts/generate. Each failure names the file that fell behind and the entry it
lacks; CONTRIBUTING.md says what goes where. Files a generator writes (docs/metrics.md,
docs/configuration.md, the rules, rule tests, runbooks, dashboard JSON, deploy manifests) are
not lists kept by hand: tests/test_generated.py fails when one is stale.
"""
from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from setuptools.command.egg_info import FileList

from fleetcanary.cli import TOOLS, build_parser
from fleetcanary.probes import PROBES
from fleetcanary.probes.lib import yamltext

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def section(path: Path, heading: str) -> str:
    """The text of a Markdown section `## heading`, up to the next heading of that level."""
    text = path.read_text()
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert m, f"{path.relative_to(ROOT)}: no section '## {heading}'"
    return m.group(1)


def assert_no_problems(problems: list[str]) -> None:
    """Fail with one line per problem, each naming the file and the entry."""
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def probe_package(name: str) -> str:
    """The module directly under fleetcanary.probes that holds a probe (a package for collectives, fabric)."""
    return ".".join(PROBES[name].__module__.split(".")[:3])


# ------------------------------------------------------------------ probes (PROBES)

def test_the_readme_probe_table_has_a_row_per_probe():
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", section(ROOT / "README.md", "Probes"), re.MULTILINE)
    problems = [f"README.md, ## Probes: no row for probe `{n}` (| `{n}` | what it measures | runs on |)"
                for n in PROBES if n not in rows]
    problems += [f"README.md, ## Probes: the row `{n}` names no probe of probes/__init__.py PROBES"
                 for n in rows if n not in PROBES]
    assert_no_problems(problems)


def test_the_example_config_shows_every_probe():
    shown = yamltext.load((ROOT / "config.example.yaml").read_text())["probes"]
    assert_no_problems([f"config.example.yaml: no entry under probes: for `{n}` (its interval, or enabled: false "
                 "with a pointer to its docs)" for n in PROBES if n not in shown])


def test_the_cpu_only_overlay_decides_every_gpu_probe():
    """A CPU-only node would only count no_gpu skips of a GPU probe: the overlay turns each off or sets
    it up for the CPU (collectives on gloo). Probes off by default need no line."""
    path = ROOT / "deploy/overlays/cpu-only/config.yaml"
    entries = yamltext.load(path.read_text())["probes"]
    gpu = [n for n, cls in PROBES.items()
           if cls.default_enabled and (cls.exclusive == "gpu" or n.startswith("gpu_"))]
    assert len(gpu) >= 7, gpu
    assert_no_problems([f"{path.relative_to(ROOT)}: GPU probe `{n}` has no entry (enabled: false, or CPU settings)"
                 for n in gpu if n not in entries])


def test_every_probe_has_its_test_module():
    assert_no_problems([f"tests/probes/test_{n}.py: missing (the probe `{n}`'s own tests)"
                 for n in PROBES if not (ROOT / f"tests/probes/test_{n}.py").is_file()])


def test_the_readme_layout_names_every_probe_package():
    """The Layout table's probes/ row names the probe packages (a probe with a rank program)."""
    row = next(line for line in section(ROOT / "README.md", "Layout").splitlines() if line.startswith("| `probes/`"))
    packages = sorted(p.name for p in (ROOT / "probes").iterdir()
                      if (p / "__init__.py").is_file() and p.name not in ("lib", "testing"))
    assert packages, "no probe package found"
    assert_no_problems([f"README.md, ## Layout: the probes/ row does not name `{p}/`" for p in packages
                 if f"`{p}/`" not in row])


def lint(source: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts/lint-imports"), "--source", str(source)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})


def test_the_import_contract_forbids_every_probe_to_the_probe_libraries(tmp_path):
    """In a scratch copy, lib/ and testing/ each import every probe of the map: the contract
    "probe libraries never import a probe module" names each one as forbidden."""
    src = tmp_path / "src"
    for top in ("exporter", "probes", "alerts", "dashboards"):
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", src / "pyproject.toml")
    imports = "".join(f"import {PROBES[n].__module__}  # noqa\n" for n in PROBES)
    for file in ("probes/lib/sse.py", "probes/testing/nvml_fake.py"):
        target = src / file
        target.write_text(imports + target.read_text().replace("from __future__ import annotations\n", ""))
    r = lint(src)
    assert r.returncode != 0, r.stdout[-3000:] + r.stderr
    out = " ".join(r.stdout.split())
    assert "probe libraries never import a probe module BROKEN" in out, out[-3000:]
    assert_no_problems([f"pyproject.toml [tool.importlinter] 'probe libraries never import a probe module': "
                 f"fleetcanary.probes.{lib} may import {probe_package(n)} (probe `{n}`)"
                 for lib in ("lib", "testing") for n in PROBES
                 if f"fleetcanary.probes.{lib} is not allowed to import {probe_package(n)}:" not in out])


# ------------------------------------------------------------------ packaging

def package_dirs() -> dict[str, Path]:
    """Each listed package -> its folder, through setuptools' package-dir (the longest mapped head)."""
    tool = PYPROJECT["tool"]["setuptools"]
    out = {}
    for pkg in tool["packages"]:
        parts = pkg.split(".")
        i = next(i for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in tool["package-dir"])
        out[pkg] = ROOT / tool["package-dir"][".".join(parts[:i])] / Path(*parts[i:])
    return out


def test_every_package_folder_is_in_packages():
    listed = package_dirs()
    problems = [f"pyproject.toml [tool.setuptools] packages: {pkg} has no folder {d.relative_to(ROOT)}/__init__.py"
                for pkg, d in listed.items() if not (d / "__init__.py").is_file()]
    folders = {d.resolve() for d in listed.values()}
    for top in set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()):
        for init in sorted((ROOT / top).rglob("__init__.py")):
            if init.parent.resolve() not in folders and "__pycache__" not in init.parts:
                rel = init.parent.relative_to(ROOT)
                problems.append(f"pyproject.toml [tool.setuptools] packages: {rel}/ (it has an __init__.py) is "
                                "not listed, so the wheel leaves it out")
    assert_no_problems(problems)


def checkout_files() -> list[str]:
    """The files of this checkout: git's view (tracked and new, not ignored), or, in an unpacked sdist,
    the tree less what building and testing add."""
    if (ROOT / ".git").exists():
        r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, text=True, timeout=60, check=True)
        return [f for f in r.stdout.splitlines() if (ROOT / f).is_file()]
    skip_dirs = {".git", ".venv", "build", "dist", ".pytest_cache", ".hypothesis", "__pycache__"}
    out = []
    for dirpath, dirnames, names in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in skip_dirs and not d.endswith(".egg-info")]
        out += [str((Path(dirpath) / n).relative_to(ROOT)) for n in names]
    return [f for f in out if f not in ("PKG-INFO", "setup.cfg", "exporter/_build.json")]


def test_the_sdist_carries_every_file_of_the_checkout():
    """MANIFEST.in (through setuptools' own template engine), the packages' modules and package data:
    together they carry every file, so the tests run from the sdist too. Benchmark output stays out."""
    files = checkout_files()
    manifest = FileList()
    manifest.set_allfiles(files)
    for line in (ROOT / "MANIFEST.in").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            manifest.process_template_line(line)
    carried = set(manifest.files) | {"pyproject.toml", "setup.py", "README.md", "LICENSE", "MANIFEST.in"}
    data = PYPROJECT["tool"]["setuptools"].get("package-data", {})
    for pkg, d in package_dirs().items():
        rel = d.relative_to(ROOT)
        for f in files:
            p = Path(f)
            module = p.parent == rel and p.suffix == ".py"
            if module or (p.is_relative_to(rel) and any(fnmatch.fnmatch(str(p.relative_to(rel)), g)
                                                        for g in data.get(pkg, ()))):
                carried.add(f)
    left_out = [f for f in files if f not in carried and not f.startswith("benchmarks/results/") and f != ".gitignore"]
    assert_no_problems([f"MANIFEST.in: {f} is not in the sdist (add a pattern that carries it)"
                        for f in sorted(left_out)])


# ------------------------------------------------------------------ CLI subcommands

def subcommands() -> list[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_the_readme_commands_name_every_subcommand():
    block = section(ROOT / "README.md", "Commands")
    shown = set(re.findall(r"^fleetcanary ([a-z-]+)", block, re.MULTILINE))
    cmds = subcommands()
    assert {"run", "once", "compare"} <= set(cmds), cmds
    problems = [f"README.md, ## Commands: no line for `fleetcanary {c}`" for c in cmds if c not in shown]
    problems += [f"README.md, ## Commands: `fleetcanary {c}` is no subcommand of exporter/cli/__init__.py"
                 for c in sorted(shown - set(cmds))]
    assert_no_problems(problems)


def test_every_offline_tool_module_has_its_subcommand():
    """A module of exporter/offline with add_arguments() and main() is a tool: TOOLS names it."""
    tools = {}
    for path in sorted((ROOT / "exporter/offline").glob("*.py")):
        defs = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        if {"add_arguments", "main"} <= defs:
            tools[f"fleetcanary.offline.{path.stem}"] = path
    wired = {module for module, _ in TOOLS.values() if module.startswith("fleetcanary.offline.")}
    assert len(tools) >= 5, tools
    problems = [f"exporter/cli/__init__.py TOOLS: no subcommand for {tools[m].relative_to(ROOT)} "
                "(it has add_arguments and main)" for m in sorted(set(tools) - wired)]
    problems += [f"exporter/cli/__init__.py TOOLS: {m} has no add_arguments() and main()"
                 for m in sorted(wired - set(tools))]
    assert_no_problems(problems)
    from alerts import build as rules
    assert TOOLS["rules"][0] == "fleetcanary.rules.build" and callable(rules.add_arguments) and callable(rules.main)


# ------------------------------------------------------------------ judged figures and their alerts (alerts/build.py)

def test_every_judged_figure_has_its_alerts_runbook_text_and_test_values():
    """fleetcanary.judge.figures FIGURES is the one declaration of a judged figure: the rules alert on exactly those
    figures (alerts/build.py reads them, no table of its own), and every figure has its runbook text and the healthy
    value and series labels of its promtool tests."""
    from alerts import build, build_tests, runbooks
    from fleetcanary.judge.figures import FIGURES as JUDGED
    judged = {f.key: f for f in JUDGED}
    rules = {f.key: f for f in build.FIGURES}
    assert len(judged) >= 9, sorted(judged)
    assert build.FIGURES is JUDGED, "alerts/build.py must read the judged figures, not declare its own"
    alerted = {a["labels"]["figure"] for g in build.build()[1]["groups"] for a in g["rules"]
               if "alert" in a and "figure" in a.get("labels", {})}
    problems = [f"no alert for the judged figure `{k}`" for k in judged if k not in alerted]
    problems += [f"alerts/runbooks.py FAMILY_CHECKS: no entry for figure `{k}`" for k in rules
                 if k not in runbooks.FAMILY_CHECKS]
    problems += [f"alerts/build_tests.py HEALTHY: no entry for figure `{k}`" for k in judged
                 if k not in build_tests.HEALTHY]
    problems += [f"alerts/build_tests.py HEALTHY: `{k}` is no judged figure" for k in build_tests.HEALTHY
                 if k not in judged]
    problems += [f"alerts/build_tests.py ENTITY_VALUES: no value for the label `{label}` (figure `{f.key}`)"
                 for f in JUDGED for label in f.series if label not in build_tests.ENTITY_VALUES]
    problems += [f"alerts/build_tests.py MODELS: no model for model_field `{f.model_field}` (figure `{f.key}`)"
                 for f in JUDGED if f.model_field not in build_tests.MODELS]
    assert_no_problems(problems)


# ------------------------------------------------------------------ dashboards

NUMBERS = {"Two": 2, "Three": 3, "Four": 4, "Five": 5, "Six": 6, "Seven": 7, "Eight": 8, "Nine": 9, "Ten": 10}


def test_the_readme_names_every_dashboard():
    text = " ".join(section(ROOT / "README.md", "Dashboards").split())
    sources = sorted(p for p in (ROOT / "dashboards/boards").glob("*.py") if p.name != "__init__.py")
    problems = []
    m = re.search(r"(\w+) Grafana dashboards", text)
    if not m or NUMBERS.get(m.group(1)) != len(sources):
        problems.append(f"README.md, ## Dashboards: says '{m.group(0) if m else '(no count)'}', "
                        f"dashboards/ has {len(sources)} sources")
    for src in sources:
        board = ROOT / "dashboards/json" / (src.stem.replace("_", "-") + ".json")
        if not board.is_file():
            problems.append(f"{board.relative_to(ROOT)}: missing (make generate)")
            continue
        title = json.loads(board.read_text())["title"].removeprefix("fleetcanary / ")
        if title not in text:
            problems.append(f"README.md, ## Dashboards: does not name '{title}' ({src.relative_to(ROOT)})")
    assert_no_problems(problems)


# ------------------------------------------------------------------ deploy

def test_every_overlay_is_named_where_the_variants_are_listed():
    overlays = sorted(p.name for p in (ROOT / "deploy/overlays").iterdir() if (p / "kustomization.yaml").is_file())
    assert len(overlays) >= 4, overlays
    problems = []
    for path, form in (("docs/deploy.md", "`deploy/overlays/{}`"), ("deploy/kustomization.yaml", "overlays/{}")):
        text = (ROOT / path).read_text()
        problems += [f"{path}: does not name the overlay {form.format(o)}" for o in overlays
                     if form.format(o) not in text]
    assert_no_problems(problems)


def test_every_manifest_is_in_its_kustomization():
    problems = []
    for kust in sorted((ROOT / "deploy").rglob("kustomization.yaml")):
        doc = yamltext.load(kust.read_text())
        named = set(doc.get("resources", []))
        for gen in doc.get("configMapGenerator", []) + doc.get("secretGenerator", []):
            named |= set(gen.get("files", []))
        named |= {p["path"] for p in doc.get("patches", []) if "path" in p}  # a patch file
        for p in sorted(kust.parent.glob("*.yaml")):
            if p.name != "kustomization.yaml" and p.name not in named:
                problems.append(f"{kust.relative_to(ROOT)}: {p.name} beside it is not among its resources")
    assert_no_problems(problems)


# ------------------------------------------------------------------ generators (scripts/generate)

def test_every_generated_file_names_a_step_of_scripts_generate():
    from scripts import generate

    steps = generate.STEPS
    problems = [f"scripts/generate STEPS: {s} does not exist" for s in steps if not (ROOT / s).is_file()]
    named = 0
    for tree in ("alerts", "dashboards", "deploy", "docs"):
        for path in sorted((ROOT / tree).rglob("*")):
            if not path.is_file() or path.suffix == ".py" or "__pycache__" in path.parts:
                continue
            try:
                head = "".join(path.read_text().splitlines(keepends=True)[:4])
            except UnicodeDecodeError:
                continue
            for gen in re.findall(r"Generated by (?:`make generate` \()?([\w./-]+\.py)", head):
                named += 1
                if gen not in steps:
                    problems.append(f"scripts/generate STEPS: {path.relative_to(ROOT)} is generated by {gen}, "
                                    "which is not a step (make generate would leave it stale)")
    assert named >= 8, named
    assert_no_problems(problems)


# ------------------------------------------------------------------ CONTRIBUTING.md

def test_every_path_contributing_names_exists():
    """The recipes name files by path; a renamed or removed file makes them lie. Placeholders (NAME, TOOL,
    BOARD) are skipped; a glob must match something."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    block = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
    tokens = re.findall(r"`([^`\s]+)`", block.sub("", text)) + " ".join(block.findall(text)).split()
    paths = {t for t in tokens
             if re.fullmatch(r"\.?[\w.*-]+(/[\w.*-]*)*", t) and ("/" in t or re.search(r"\.(md|py|toml|yaml|in)$", t))
             and not re.search(r"NAME|TOOL|BOARD", t) and not t.startswith(("fleetcanary.", ".venv/"))}
    assert len(paths) >= 30, sorted(paths)
    assert_no_problems([f"CONTRIBUTING.md: names {p}, which does not exist" for p in sorted(paths)
                 if not (any(ROOT.glob(p.rstrip("/"))) if "*" in p else (ROOT / p).exists())])
