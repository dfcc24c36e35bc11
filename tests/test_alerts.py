"""Rules and alerts: promtool clean and tested, generated files current, runbooks and names complete."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import load_script, require_binary

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "alerts"
sys.path.insert(0, str(ALERTS))

build = load_script(ALERTS / "build.py", "fleetcanary_alerts_build")
build_tests = load_script(ALERTS / "build_tests.py", "fleetcanary_alerts_build_tests")


def all_alerts():
    return [r for g in yaml.safe_load((ALERTS / "fleetcanary.alerts.yml").read_text())["groups"] for r in g["rules"]]


def test_promtool_check_rules_is_clean():
    promtool = require_binary("promtool")
    r = subprocess.run([promtool, "check", "rules", str(ALERTS / "fleetcanary.rules.yml"),
                        str(ALERTS / "fleetcanary.alerts.yml")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING" not in r.stdout + r.stderr


TEST_FILES = sorted(p.name for p in (ALERTS / "tests").glob("*.test.yml"))


# Each rule-test file is its own test and its own promtool process (up to a minute and a half on this 2-core
# machine): under xdist they spread over the workers (tests/conftest.py SPREAD) and start first (`long`).
@pytest.mark.long
@pytest.mark.parametrize("test_file", TEST_FILES)
def test_promtool_rule_tests_pass(test_file):
    promtool = require_binary("promtool")
    r = subprocess.run([promtool, "test", "rules", test_file], cwd=ALERTS / "tests", stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-6000:]


def test_every_alert_follows_the_conventions_and_is_tested():
    tests_text = "".join(p.read_text() for p in (ALERTS / "tests").glob("*.test.yml"))
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    for a in all_alerts():
        name = a["alert"]
        assert re.match(r"^FleetCanary[A-Z][A-Za-z0-9]+$", name)
        assert a["labels"]["severity"] in ("critical", "warning", "info")
        assert {"summary", "description", "runbook_url"} <= set(a["annotations"])
        assert a["annotations"]["runbook_url"].endswith("#" + name.lower())
        assert f"\n## {name}\n" in runbooks
        assert f"alertname: {name}" in tests_text, f"{name} has no promtool test"


def known_names() -> set[str]:
    from fleetcanary.daemon.collector import EXPORTER_METRICS
    from fleetcanary.probes import PROBES

    names = {m.name for m in EXPORTER_METRICS} | {"up"}
    for cls in PROBES.values():
        for s in cls.metrics:
            names.add(s.name)
            if s.type == "histogram":
                names |= {s.name + "_bucket", s.name + "_sum", s.name + "_count"}
    for g in yaml.safe_load((ALERTS / "fleetcanary.rules.yml").read_text())["groups"]:
        names |= {r["record"] for r in g["rules"]}
    return names


def test_rules_and_alerts_use_only_defined_metric_names():
    known = known_names()
    used = set()
    for f in ("fleetcanary.rules.yml", "fleetcanary.alerts.yml"):
        for g in yaml.safe_load((ALERTS / f).read_text())["groups"]:
            for r in g["rules"]:
                used |= set(re.findall(r"\b((?:[a-z_]+:)?fleetcanary_[a-z0-9_]+(?::[a-z0-9_]+)?)", r["expr"]))
    unknown = sorted(u for u in used if u not in known)
    assert not unknown, f"undefined metric names in rules: {unknown}"


def test_alertmanager_example_is_valid():
    amtool = require_binary("amtool")
    r = subprocess.run([amtool, "check-config", str(ALERTS / "alertmanager.example.yml")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_fast_path_figure_gets_confirmation_runs_and_only_those():
    """The fast path counts on the exporter's confirmation run (three runs within 1.2 intervals); the probes
    declare which figures get one (Probe.confirm_metrics). The two lists must name the same metrics."""
    from fleetcanary.probes import PROBES

    fast = {f.metric for f in build.FAMILIES if f.fast}
    confirmed = {m for cls in PROBES.values() for m in cls.confirm_metrics}
    assert fast == confirmed, (sorted(fast - confirmed), sorted(confirmed - fast))
