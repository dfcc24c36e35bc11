"""A promtool rule-test file run over the shipped rule groups it reads, and only those.

promtool evaluates every rule of its rule files at every step of every test group: the hard failures' 47
scenarios over the whole rule set took 20 s of CPU, over the two groups they read 5 s. `subset()` writes,
beside a copy of the test file, the shipped rule files cut to the groups that the test's alerts and
recorded series come from and, transitively, the groups those read (a recorded name or an `ALERTS` of an
alert in their expressions). The groups are copied as they are: what promtool tests is the shipped rules'
text, and a group the test's alerts cannot read cannot change what they do.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from fleetcanary.probes.lib import yamltext

RULE_FILES = ("fleetcanary.rules.yml", "fleetcanary.alerts.yml")


def _mentions(text: str, name: str) -> bool:
    return re.search(r"(?<![A-Za-z0-9_:])" + re.escape(name) + r"(?![A-Za-z0-9_:])", text) is not None


def needed_groups(groups: list[dict], wanted: set[str]) -> set[str]:
    """The names of the groups that write `wanted` (alert or recorded names), and of those their rules read."""
    writes = {r.get("record") or r["alert"]: g["name"] for g in groups for r in g["rules"]}
    exprs = {g["name"]: "\n".join(str(r["expr"]) for r in g["rules"]) for g in groups}
    todo = {writes[n] for n in wanted if n in writes}
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        seen.add(name)
        # a recorded name, or an alert's in an ALERTS{alertname="..."} selector
        todo |= {writes[n] for n in writes if _mentions(exprs[name], n)} - seen
    return seen


def names_read(test: dict) -> set[str]:
    """Every alert a test file expects something of and every name its PromQL tests read."""
    names: set[str] = set()
    for t in test.get("tests", []):
        names |= {a["alertname"] for a in t.get("alert_rule_test", [])}
        for q in t.get("promql_expr_test", []):
            names |= set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", q["expr"]))
    return names


def subset(test_file: Path, out: Path) -> Path:
    """`test_file` copied byte for byte into `out`/tests/ (a YAML round trip would read a series' `0x60` as
    the number 96), with its rule files (../NAME) beside it over the groups it needs: -> the copy's path."""
    test = yamltext.load(test_file.read_text())
    docs = {}
    for rel in test["rule_files"]:
        if Path(rel).parent != Path(".."):
            raise ValueError(f"{test_file.name}: rule file {rel} is not ../NAME")
        docs[Path(rel).name] = yamltext.load((test_file.parent / rel).read_text())
    groups = [g for d in docs.values() for g in d["groups"]]
    keep = needed_groups(groups, names_read(test))
    (out / "tests").mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        (out / name).write_text(yaml.safe_dump({"groups": [g for g in doc["groups"] if g["name"] in keep]},
                                               sort_keys=False, width=1 << 16))
    path = out / "tests" / test_file.name
    path.write_bytes(test_file.read_bytes())
    return path
