"""Build steps pyproject.toml cannot declare.

1. The wheel and the sdist carry the commit they were built from, in fleetcanary/_build.json:
   FLEETCANARY_GIT_COMMIT when set (the image build passes it), else `git rev-parse HEAD` of
   this checkout, else (building from an sdist) the file the sdist already carries.
2. The rules and dashboards packages ship their data only: the generator scripts beside
   the data (dashboards/boards/*.py, alerts/build_tests.py, ...) are development tools. The rule
   generator alerts/build.py (with common.py, rules_*.py, matchers.py and prometheusrule.py) ships, for
   `fleetcanary rules`.
"""
import json
import os
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
BUILD_INFO = "_build.json"
DATA_ONLY = ("fleetcanary.rules", "fleetcanary.dashboards")
# ... except the rule generator, which deployers run with their own settings (`fleetcanary rules`).
SHIPPED_MODULES = {"fleetcanary.rules": {"__init__", "build", "common", "matchers", "prometheusrule", "rules_coverage",
                                         "rules_fabric", "rules_hard", "rules_history", "rules_inference", "rules_nic",
                                         "rules_peers"}}


def _commit() -> str | None:
    env = os.environ.get("FLEETCANARY_GIT_COMMIT", "").strip()
    if env:
        return env
    if (HERE / ".git").exists():
        try:
            out = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True,
                                 timeout=10, check=True)
            dirty = subprocess.run(["git", "-C", str(HERE), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            return None
    return None


def _write_build_info(directory: Path) -> None:
    commit = _commit()
    target = directory / BUILD_INFO
    if commit is None:
        shipped = HERE / "exporter" / BUILD_INFO
        if shipped.is_file() and shipped.resolve() != target.resolve():
            target.write_text(shipped.read_text())
        return
    target.write_text(json.dumps({"commit": commit}) + "\n")


class BuildPy(build_py):
    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        if package in DATA_ONLY:
            modules = [m for m in modules if m[1] in SHIPPED_MODULES.get(package, {"__init__"})]
        return modules

    def run(self):
        super().run()
        if not self.editable_mode:
            out = Path(self.build_lib) / "fleetcanary"
            out.mkdir(parents=True, exist_ok=True)
            _write_build_info(out)


class Sdist(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        _write_build_info(Path(base_dir) / "exporter")


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
