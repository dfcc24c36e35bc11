"""The names promise (docs/stability.md): the code keeps every metric, label and recorded-series name of the last
release's list, unless a deprecation in release/deprecations.yaml has run its course; a deprecated name is still
emitted until its removal version; a deprecation lasts at least one minor release."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.support.helpers import load_script

ROOT = Path(__file__).resolve().parent.parent
names = load_script(ROOT / "scripts" / "names", "fleetcanary_scripts_names")


def version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def last_release(current: str) -> dict:
    import json

    files = sorted((ROOT / "release").glob("names-*.json"), key=lambda p: version_key(p.stem[len("names-"):]))
    files = [p for p in files if version_key(p.stem[len("names-"):]) <= version_key(current)]
    assert files, "no release/names-*.json at or below the current version"
    return json.loads(files[-1].read_text())


def deprecations() -> list[dict]:
    return yaml.safe_load((ROOT / "release" / "deprecations.yaml").read_text())["deprecations"] or []


def test_the_last_releases_names_are_kept_or_properly_retired():
    now = names.current()
    last = last_release(now["version"])
    retired = {(d["kind"], d["name"]): d for d in deprecations()}
    gone = []
    for metric, labels in last["metrics"].items():
        if metric not in now["metrics"]:
            gone.append(("metric", metric))
            continue
        gone += [("label", f"{metric}:{lab}") for lab in labels if lab not in now["metrics"][metric]]
    gone += [("recorded", r) for r in last["recorded"] if r not in now["recorded"]]
    bad = [f"{kind} {name}" for kind, name in gone
           if (kind, name) not in retired or version_key(retired[(kind, name)]["removed_in"])
           > version_key(now["version"])]
    assert not bad, f"gone from the code without a finished deprecation (release/deprecations.yaml): {bad}"


def test_a_deprecated_name_is_emitted_until_its_removal_and_lasts_a_minor_release():
    now = names.current()
    for d in deprecations():
        assert d["kind"] in ("metric", "label", "recorded") and d.get("replacement"), d
        dep, rem = version_key(d["deprecated_in"]), version_key(d["removed_in"])
        assert rem[:2] > dep[:2] and (rem[0] > dep[0] or rem[1] >= dep[1] + 1), f"{d}: one minor release at least"
        if version_key(now["version"]) < rem:
            metric, _, label = d["name"].partition(":")
            present = (metric in now["metrics"] and (not label or label in now["metrics"][metric])
                       if d["kind"] != "recorded" else d["name"] in now["recorded"])
            assert present, f"{d['name']} is deprecated, not removed: it must still be emitted until {d['removed_in']}"


def test_the_changelog_has_the_current_version_and_the_names_list_exists():
    now = names.current()
    text = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{now['version']}]" in text
    assert names.path_for(last_release(now["version"])["version"]).exists()
    assert len(now["metrics"]) > 100 and "pool:fleetcanary_gpu_measured:ratio_1d" in now["recorded"]
