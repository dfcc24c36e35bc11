"""`fleetcanary rules` as a deployer runs it (issue 41): settings are checked before anything is written (a
selector that lost its quote is one line and exit 2, not rules promtool rejects), promtool checks the output
when it is there, --out is created, and --format prometheusrule makes objects that client-side apply takes
(each under its 262,144-byte annotation limit, also with sharded pools) and that carry the deployer's labels."""
import json
import subprocess
import sys

import pytest
import yaml

from fleetcanary.probes.lib import yamltext
from fleetcanary.rules import matchers, prometheusrule
from tests.support.helpers import require_binary

TWO_POOLS = 'selector: job="fleetcanary"\npeer_labels: [cluster]\npools: [h100-east, h200-west]\n'


def rules(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetcanary", "rules", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("selector, what", [
    ('job="fleetcanary', "a quote is missing"),
    ("job=fleetcanary", "a quoted value expected"),
    ('job=="x"', "a quoted value expected"),
    ('job="x" cluster="y"', "',' expected"),
    ('1job="x"', "a label name expected"),
    ('job=~"(x"', "not a regular expression"),
    ('job="\\q"', "unknown escape"),
])
def test_a_malformed_selector_is_one_line_and_nothing_is_written(tmp_path, selector, what):
    (tmp_path / "s.yml").write_text(yaml.safe_dump({"selector": selector}))
    r = rules("--settings", "s.yml", "--out", "out", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and what in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_well_formed_matchers_parse():
    assert matchers.parse('job="fleetcanary", cluster=~"a|b",env!=\'x\' , zone!~`e.*`,') == [
        ("job", "=", "fleetcanary"), ("cluster", "=~", "a|b"), ("env", "!=", "x"), ("zone", "!~", "e.*")]
    assert matchers.parse("") == []


def test_rules_promtool_rejects_are_refused_before_writing(tmp_path):
    promtool = require_binary("promtool")
    # Python's re takes a lookahead; Prometheus's RE2 does not: only promtool can tell
    (tmp_path / "s.yml").write_text(yaml.safe_dump({"selector": 'job=~"(?=fleet)fleetcanary"'}))
    r = rules("--settings", "s.yml", "--out", "out", "--promtool", promtool, cwd=tmp_path)
    assert r.returncode == 2 and "promtool rejects" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_out_is_created_and_the_rules_pass_promtool(tmp_path):
    promtool = require_binary("promtool")
    (tmp_path / "s.yml").write_text(TWO_POOLS)
    r = rules("--settings", "s.yml", "--out", "a/b/c", "--promtool", promtool, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "a/b/c"
    assert sorted(p.name for p in out.iterdir()) == ["fleetcanary.alerts.yml", "fleetcanary.rules.yml"]
    check = subprocess.run([promtool, "check", "rules", *map(str, out.iterdir())], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_prometheusrule_objects_stay_under_the_apply_limit_and_carry_the_labels(tmp_path):
    (tmp_path / "s.yml").write_text(TWO_POOLS)
    plain = rules("--settings", "s.yml", "--out", "plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    r = rules("--settings", "s.yml", "--out", "op", "--format", "prometheusrule", "--labels",
              "release=kube-prometheus-stack,team=gpu", "--namespace", "monitoring", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    docs = [d for d in yamltext.load_all((tmp_path / "op/fleetcanary.prometheusrule.yaml").read_text()) if d]
    sizes = [len(json.dumps(d, separators=(",", ":"))) for d in docs]
    whole = sum(sizes)
    assert whole > prometheusrule.ANNOTATION_LIMIT, "the case must be one that one object could not hold"
    assert len(docs) >= 2 and max(sizes) <= prometheusrule.LIMIT < prometheusrule.ANNOTATION_LIMIT
    assert [d["metadata"]["name"] for d in docs] == [f"fleetcanary-{i}" for i in range(1, len(docs) + 1)]
    for d in docs:
        assert d["kind"] == "PrometheusRule" and d["apiVersion"] == "monitoring.coreos.com/v1"
        assert d["metadata"]["labels"] == {"release": "kube-prometheus-stack", "team": "gpu"}
        assert d["metadata"]["namespace"] == "monitoring"
    # every group of the rule files, once and in order
    expected = [g for f in ("fleetcanary.rules.yml", "fleetcanary.alerts.yml")
                for g in yamltext.load((tmp_path / "plain" / f).read_text())["groups"]]
    assert [g for d in docs for g in d["spec"]["groups"]] == expected


@pytest.mark.parametrize("args, what", [
    (["--labels", "release"], "not a Kubernetes label"),
    (["--labels", "re lease=x"], "not a Kubernetes label"),
    (["--name", "Fleet_Canary"], "not a Kubernetes object name"),
])
def test_bad_object_settings_are_one_line(tmp_path, args, what):
    r = rules("--out", "op", "--format", "prometheusrule", *args, cwd=tmp_path)
    assert r.returncode == 2 and what in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "op").exists()
