"""The names promise (docs/stability.md): the code keeps every metric, label and recorded-series name of the last
release's list, unless a deprecation in release/deprecations.yaml has run its course; a deprecated name is still
emitted until its removal version; a deprecation lasts at least one minor release."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetcanary.probes.lib import yamltext
from scripts import names

ROOT = Path(__file__).resolve().parent.parent


def version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def last_release(current: str) -> dict:
    import json

    files = sorted((ROOT / "release").glob("names-*.json"), key=lambda p: version_key(p.stem[len("names-"):]))
    files = [p for p in files if version_key(p.stem[len("names-"):]) <= version_key(current)]
    assert files, "no release/names-*.json at or below the current version"
    return json.loads(files[-1].read_text())


def deprecations() -> list[dict]:
    return yamltext.load((ROOT / "release" / "deprecations.yaml").read_text())["deprecations"] or []


def unretired(last: dict, now: dict) -> list[str]:
    retired = {(d["kind"], d["name"]): d for d in deprecations()}
    return [f"{kind} {name}" for kind, name in names.gone(last, now)
            if (kind, name) not in retired or version_key(retired[(kind, name)]["removed_in"])
            > version_key(now["version"])]


def test_the_last_releases_names_are_kept_or_properly_retired():
    now = names.current()
    bad = unretired(last_release(now["version"]), now)
    assert not bad, f"gone from the code without a finished deprecation (release/deprecations.yaml): {bad}"


def test_a_removed_alert_label_config_key_or_dashboard_fails_the_promise():
    """What the test above catches, each kind: the code as it is, less one name of the last release."""
    now = names.current()
    last = last_release(now["version"])
    assert last.get("alerts") and last.get("config") and last.get("dashboards"), "the release list predates them"
    alert = "FleetCanaryGPUCriticalXid" if "FleetCanaryGPUCriticalXid" in now["alerts"] else next(iter(now["alerts"]))
    cases = {
        f"alert {alert}": {**now, "alerts": {k: v for k, v in now["alerts"].items() if k != alert}},
        f"alert_label {alert}:severity": {**now, "alerts": {**now["alerts"], alert: [
            lab for lab in now["alerts"][alert] if lab != "severity"]}},
        "config kubernetes.claim.after_seconds": {**now, "config": [
            k for k in now["config"] if k != "kubernetes.claim.after_seconds"]},
        "config remediate.dry_run": {**now, "config": [k for k in now["config"] if k != "remediate.dry_run"]},
        f"dashboard {next(iter(now['dashboards']))}": {**now, "dashboards": dict(list(now["dashboards"].items())[1:])},
    }
    for expected, changed in cases.items():
        assert unretired(last, changed) == [expected], expected


def test_a_renamed_config_key_is_read_with_a_warning_for_a_minor_release(tmp_path, caplog, monkeypatch):
    from fleetcanary.core import config, config_keys

    for d in (d for d in deprecations() if d["kind"] == "config"):  # the changelog's list and the loader's agree
        table = config_keys.REMEDIATE_RENAMED if d["name"].startswith("remediate.") else config_keys.RENAMED
        assert any(d["name"].removeprefix("remediate.") == r.old and r.removed_in == d["removed_in"]
                   for r in table), d
    assert len([d for d in deprecations() if d["kind"] == "config"]) == \
        len(config_keys.RENAMED) + len(config_keys.REMEDIATE_RENAMED)
    rename = config_keys.Renamed("kubernetes.claim.wait_seconds", "kubernetes.claim.after_seconds", "0.3.0", "0.4.0")
    monkeypatch.setattr(config_keys, "RENAMED", (rename,))
    path = tmp_path / "c.yaml"
    path.write_text("kubernetes:\n  claim:\n    wait_seconds: 7200\n")
    with caplog.at_level("WARNING", logger="fleetcanary.config"):
        assert config.load(path).kubernetes.claim.after_seconds == 7200
    assert "kubernetes.claim.wait_seconds is deprecated since 0.3.0" in caplog.text
    path.write_text("kubernetes:\n  claim:\n    wait_seconds: 7200\n    after_seconds: 3600\n")
    with pytest.raises(config.ConfigError) as err:
        config.load(path)
    assert err.value.lines == [f"{path}: kubernetes.claim.wait_seconds: renamed kubernetes.claim.after_seconds in "
                               "0.3.0, and both are given; keep kubernetes.claim.after_seconds"]


def test_a_deprecated_name_is_emitted_until_its_removal_and_lasts_a_minor_release():
    now = names.current()
    for d in deprecations():
        assert d["kind"] in ("metric", "label", "recorded", "alert", "alert_label", "config", "dashboard") \
            and d.get("replacement"), d
        dep, rem = version_key(d["deprecated_in"]), version_key(d["removed_in"])
        assert rem[:2] > dep[:2] and (rem[0] > dep[0] or rem[1] >= dep[1] + 1), f"{d}: one minor release at least"
        if version_key(now["version"]) < rem and d["kind"] != "config":  # a renamed key: the test below
            first, _, second = d["name"].partition(":")
            present = {"metric": first in now["metrics"], "label": second in now["metrics"].get(first, []),
                       "recorded": d["name"] in now["recorded"], "alert": first in now["alerts"],
                       "alert_label": second in now["alerts"].get(first, []),
                       "dashboard": d["name"] in now["dashboards"]}[d["kind"]]
            assert present, f"{d['name']} is deprecated, not removed: it must still be emitted until {d['removed_in']}"


def test_the_changelog_has_the_current_version_and_the_names_list_exists():
    now = names.current()
    text = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{now['version']}]" in text
    assert names.path_for(last_release(now["version"])["version"]).exists()
    assert len(now["metrics"]) > 100 and "pool:fleetcanary_gpu_measured:ratio_1d" in now["recorded"]
