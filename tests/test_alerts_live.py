"""The shipped rules on a live Prometheus: every peer path (change, level), fast path, fast path on its own
history, regression, drift and driver-change alert of every judged figure fires on the node that should raise
it, and no judged alert fires on a healthy node or on a path it should not.

The exporters stand in through one server (tests/support/fleet_exporter.py) that serves each node's judged
statistics (fleetcanary_judge_*), as the exporter publishes them, and Prometheus scrapes it as a fleet (one job,
the node label from the target). Nothing is backfilled: the statistics are computed on the node, so the rules
read no windows of runs. What promtool cannot show, this does: the real scrape labels, the groups' own
intervals (the own-history group reads the peer group's recorded node counts), the descriptions' queries.

The rules come from alerts/build.py with build(scale=SCALE): every group interval and `for` a 300th (the peer
groups' 5 minutes: a second; a regression's 2 hours: 24 s), with the hard-failure groups at the peer groups'
interval so that they too evaluate each second. Fleet: seven nodes in pool-a (n6 30% worse on every statistic;
n7 upgraded to a new driver, alone in its GPU figures' peer group, 30% worse than its best day on the old one)
and three in pool-s (s3 30% worse: too few peers, the fast path on its own history).
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from alerts import build
from fleetcanary.probes.lib import yamltext
from tests.support.fleet_exporter import FleetExporter, Member, build_tests, judged_pages
from tests.support.prometheus import Prometheus
from tests.support.vmalert import alerts, evaluations

ROOT = Path(__file__).resolve().parent.parent

SCALE = 1 / 300
SETTINGS = build.SETTINGS.model_copy(update={"hard_interval": build.SETTINGS.interval})
HEALTHY = [f"n{i}" for i in range(1, 6)] + ["s1", "s2"]
DEGRADED = "n6"        # peers' change, level and fast paths; regression; drift
DRIVER_CHANGED = "n7"  # the driver-change alert
SMALL_DEGRADED = "s3"  # in a pool of 3: the fast path on its own history; regression; drift
# who must raise each path
RAISED_BY = {"change": {DEGRADED}, "level": {DEGRADED}, "fast": {DEGRADED}, "own_fast": {SMALL_DEGRADED},
             "regression": {DEGRADED, SMALL_DEGRADED}, "drift": {DEGRADED, SMALL_DEGRADED},
             "driver_change": {DRIVER_CHANGED}}
CAP = 600.0  # seconds: only a Prometheus that stops evaluating reaches it (the budget is in evaluations)


def healthy(rng: random.Random, node: str) -> Member:
    """A healthy node's statistics, each within 0.5% of the healthy figure (of its best day)."""
    return Member(node, pool="pool-s" if node.startswith("s") else "pool-a",
                  **{k: 1 + rng.uniform(-0.005, 0.005) for k in ("median", "newest", "change", "drift")})


def members() -> dict[str, list[Member]]:
    out = {}
    for f in build_tests.figures():
        bad = build_tests.off(f, 0.3)
        rng = random.Random(f.key)
        # a GPU figure on a new driver starts over (no baseline on it yet) and is judged against its best day on
        # the previous one; the others are not judged per driver, and the upgrade leaves them healthy
        upgraded = (Member(DRIVER_CHANGED, driver=build_tests.NEW_DRIVER, median=bad, newest=bad, change=None,
                           drift=None, previous=bad) if build_tests.per_driver(f) else healthy(rng, DRIVER_CHANGED))
        out[f.key] = [healthy(rng, n) for n in HEALTHY] + [
            Member(DEGRADED, median=bad, newest=bad, change=bad, drift=bad), upgraded,
            Member(SMALL_DEGRADED, pool="pool-s", median=bad, newest=bad, change=bad, drift=bad)]
    return out


def expected() -> set[tuple[str, str, str]]:
    """(alertname, node, path) of every judged alert that must fire, and of none other."""
    want = {(rule["alert"], node, path) for (key, path), rule in build_tests.RULES.items() for node in RAISED_BY[path]}
    assert {p for _, _, p in want} == set(RAISED_BY)
    return want


def judged_firing(url: str) -> set[tuple[str, str, str]]:
    return {(a["labels"]["alertname"], a["labels"].get("node", ""), a["labels"]["path"]) for a in alerts(url)
            if a["state"] == "firing" and "path" in a["labels"]}


def wait_evaluated(url: str, predicate, groups: set[str], budget: int, what: str) -> None:
    """Poll ``predicate`` until it holds; fail once every group in ``groups`` has done ``budget`` evaluations
    (progress, not seconds: a loaded machine that misses evaluations gets the time it lost), or after CAP."""
    deadline = time.monotonic() + CAP
    while not predicate():
        done = evaluations(url)
        if all(done.get(g, 0) >= budget for g in groups) or time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen after {({g: done.get(g, 0) for g in groups})} evaluations")
        time.sleep(1)


@pytest.mark.long
def test_every_judged_alert_fires_on_its_node_and_none_elsewhere_on_a_live_prometheus(tmp_path):
    rules = []
    for name, text in build.render(scale=SCALE, settings=SETTINGS).items():
        rules.append(tmp_path / name)
        rules[-1].write_text(text)
    docs = [yamltext.load(p.read_text()) for p in rules]
    # every group at 1 s but the peers' spread (15 minutes scaled: 3 s), which the waits below do not count: it
    # evaluates a third as often, and the alerts read its newest
    intervals = {g["name"]: g["interval"] for d in docs for g in d["groups"]}
    assert intervals.pop("fleetcanary-peer-spread") == "3s" and set(intervals.values()) == {"1s"}, intervals
    groups = set(intervals)
    longest = max(build.seconds(r.get("for", "0s")) for d in docs for g in d["groups"] for r in g["rules"])
    assert longest == 24, longest  # a 2-hour regression `for`, scaled

    want = expected()
    pages = judged_pages(members())
    exporter = FleetExporter(pages)
    prom = None
    try:
        prom = Prometheus(tmp_path / "prometheus", [], rule_files=[str(p) for p in rules],
                          scrape_configs=exporter.scrape_configs())
        fired: set[tuple[str, str, str]] = set()

        def all_fired() -> bool:
            fired.clear()
            fired.update(judged_firing(prom.url))
            return want <= fired

        # Three times the longest `for` in evaluations: the alerts need it once, after a few evaluations that
        # record the peer statistics.
        try:
            wait_evaluated(prom.url, all_fired, groups, 3 * longest, "every judged alert")
        except AssertionError as e:
            raise AssertionError(f"{e}; never fired: {sorted(want - fired)}; fired: {sorted(fired)}") from None
        # Whatever else would fire has had time to (the series are the same from the first scrape).
        wait_evaluated(prom.url, lambda: all(evaluations(prom.url).get(g, 0) >= longest + 5 for g in groups),
                       groups, 3 * longest, "the longest `for` and a few evaluations more")
        fired = judged_firing(prom.url)
        descriptions = {a["labels"]["alertname"]: a["annotations"]["description"] for a in alerts(prom.url)
                        if a["labels"].get("node") == DEGRADED and a["labels"].get("path") == "change"}
    finally:
        if prom:
            prom.stop()
        exporter.stop()
    assert fired == want, f"extra: {sorted(fired - want)}; missing: {sorted(want - fired)}"
    assert not {a for a in fired if a[1] in HEALTHY}
    # the descriptions' queries found the node's statistics and its peers' on the live server
    queried = [d.split(": its change against its best day ", 1)[1] for d in descriptions.values()]
    assert len(queried) >= 7 and not [q for q in queried if "none" in q], descriptions
