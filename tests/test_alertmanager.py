"""Alertmanager end to end: a real Prometheus with the shipped rule files scrapes two fake nodes on
127.0.0.1, a real Alertmanager with the shipped example config routes what fires to a webhook receiver
on 127.0.0.1. Shown: a node's GPU alerts (hard failures and a judged figure's: the fast path on its own
history, which fires at once where peers are too few) arrive in one notification per node; a node-level
alert (FleetCanaryGPUsMissing) inhibits the GPU alerts under it, which are then never notified;
resolution arrives; the payload carries the runbook URL and the labels a router needs.

Only timing changes from what ships: Alertmanager's group_wait/group_interval/resolve_timeout, and the
rules' group intervals and `for`, rendered by alerts/build.py with build(scale=TIME_SCALE) (a minute
becomes a second; 0m stays 0). Routes, group_by, matchers, receivers and inhibit rules are the shipped
ones; the tests check that nothing else differs, and that every alert name the example matches exists.
"""
from __future__ import annotations

import copy
import re
import urllib.parse
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from alerts import build
from fleetcanary.judge import exposition as judge
from fleetcanary.probes.gpu_health import GpuHealth
from fleetcanary.probes.lib import yamltext
from tests.support import nvl72
from tests.support.alertmanager import Alertmanager, Exposition, WebhookReceiver
from tests.support.helpers import wait_for
from tests.support.prometheus import Prometheus

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "alerts"
# A minute of the shipped group intervals and `for` becomes a second here.
TIME_SCALE = 1 / 60
# Each wait is for a state (an alert held, a notification delivered) and only a hang reaches DEADLINE: a
# step takes a few seconds on a quiet machine. No assertion depends on what arrives first within a time:
# an alert that reaches Alertmanager after its group's first notification is in the group's next one.
DEADLINE = 180.0
AM_TIMING = {"group_wait": "1s", "group_interval": "2s", "resolve_timeout": "1m"}
NVLINK, REMAP_FAILED, MISSING = "FleetCanaryNVLinkDown", "FleetCanaryGPURowRemapFailed", "FleetCanaryGPUsMissing"
# GPU memory bandwidth 30% off its own best day on a node with too few peers: the fast path on its own history
OWN_FAST = "FleetCanaryGPUMemoryBandwidthFarBelowOwnHistory"


def scaled_rules(dest: Path) -> dict[str, dict]:
    """The rule files rendered with build(scale=TIME_SCALE) into `dest`; their alerts by name. Test-only: the
    shipped intervals and `for` of minutes would make this test take minutes."""
    by_name = {}
    for name, text in build.render(scale=TIME_SCALE).items():
        (dest / name).write_text(text)
        for g in yamltext.load(text)["groups"]:
            by_name.update({r["alert"]: r for r in g["rules"] if "alert" in r})
    return by_name


def test_the_scaled_rules_differ_from_the_shipped_only_in_intervals_and_for():
    for name, text in build.render(scale=TIME_SCALE).items():
        shipped, scaled = yamltext.load((ALERTS / name).read_text()), yamltext.load(text)
        assert [g["name"] for g in scaled["groups"]] == [g["name"] for g in shipped["groups"]]
        for a, b in zip(shipped["groups"], scaled["groups"], strict=True):
            assert build.seconds(b["interval"]) == round(build.seconds(a["interval"]) * TIME_SCALE) >= 1, a["name"]
            assert len(a["rules"]) == len(b["rules"]), a["name"]
            for ra, rb in zip(a["rules"], b["rules"], strict=True):
                if "for" in ra:
                    assert build.seconds(rb["for"]) == round(build.seconds(ra["for"]) * TIME_SCALE), ra["alert"]
                assert {k: v for k, v in ra.items() if k != "for"} == {k: v for k, v in rb.items() if k != "for"}


def expand_alternatives(regex: str) -> list[str]:
    """A matcher's regex as the plain alternatives it is made of: 'A(B|C).*|D' -> ['AB.*', 'AC.*', 'D']."""
    depth, parts, start = 0, [], 0
    for i, ch in enumerate(regex):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "|" and depth == 0:
            parts.append(regex[start:i])
            start = i + 1
    parts.append(regex[start:])
    if len(parts) > 1:
        return [x for p in parts for x in expand_alternatives(p)]
    m = re.search(r"\(([^()]*\|[^()]*)\)", regex)  # an innermost group with alternatives
    if not m:
        return [regex]
    return list(dict.fromkeys(x for alt in m.group(1).split("|")
                              for x in expand_alternatives(regex[:m.start()] + alt + regex[m.end():])))


def test_expand_alternatives():
    assert expand_alternatives("A(B|C).*|D") == ["AB.*", "AC.*", "D"]
    assert sorted(expand_alternatives("X(P(Q|R)|S)")) == ["XPQ", "XPR", "XS"]


def test_every_alert_name_the_example_matches_exists():
    """Each alertname matcher of the example's routes and inhibit rules, and each alternative of a regex one, names
    at least one alert of the rule files: a renamed alert leaves no matcher that matches nothing."""
    names = set()
    for f in ("fleetcanary.rules.yml", "fleetcanary.alerts.yml"):
        names |= {r["alert"] for g in yamltext.load((ALERTS / f).read_text())["groups"] for r in g["rules"]
                  if "alert" in r}
    cfg = yamltext.load((ALERTS / "alertmanager.example.yml").read_text())
    matchers = [m for r in cfg["route"].get("routes", []) for m in r.get("matchers", [])]
    matchers += [m for r in cfg["inhibit_rules"] for k in ("source_matchers", "target_matchers") for m in r.get(k, [])]
    problems, checked = [], 0
    for m in matchers:
        got = re.fullmatch(r'alertname(=~|=|!=)"(.*)"', m)
        if not got:
            continue
        op, value = got.groups()
        for alt in expand_alternatives(value) if op == "=~" else [re.escape(value)]:
            checked += 1
            if not any(re.fullmatch(alt, n) for n in names):
                problems.append(f"alerts/alertmanager.example.yml {m}: `{alt}` matches no alert")
    assert checked >= 10 and not problems, problems


def alertmanager_config(webhook: str) -> tuple[dict, dict]:
    """(shipped, test): the test copy sends every webhook to `webhook` (keeping the URL's path, so the
    receiver is known) and shortens the timing; nothing else changes."""
    shipped = yamltext.load((ALERTS / "alertmanager.example.yml").read_text())
    cfg = copy.deepcopy(shipped)
    cfg.setdefault("global", {})["resolve_timeout"] = AM_TIMING["resolve_timeout"]
    cfg["route"]["group_wait"] = AM_TIMING["group_wait"]
    cfg["route"]["group_interval"] = AM_TIMING["group_interval"]
    for r in cfg["receivers"]:
        for w in r.get("webhook_configs", []):
            w["url"] = webhook + urllib.parse.urlsplit(w["url"]).path
    return shipped, cfg


def without_timing_and_urls(cfg: dict) -> dict:
    c = copy.deepcopy(cfg)
    c.get("global", {}).pop("resolve_timeout", None)
    for key in ("group_wait", "group_interval"):
        c["route"].pop(key, None)
        assert all(key not in sub for sub in c["route"].get("routes", [])), f"a sub-route sets {key}: adjust the test"
    for r in c["receivers"]:
        for w in r.get("webhook_configs", []):
            w["url"] = urllib.parse.urlsplit(w["url"]).path
    return c


SPECS = {s.name: s for s in GpuHealth.metrics}


def exposition(healthy: int = 8, nvlink_down: tuple[int, ...] = (), remap_failed: tuple[int, ...] = (),
               slow: tuple[int, ...] = ()) -> str:
    """A gpu_health exposition of an 8-GPU node (18 NVLinks per GPU, one down on each `nvlink_down` GPU) and the
    judge's statistics of its GPU memory bandwidth (the `slow` GPUs' confirmed figure 30% under their best day),
    rendered by prometheus_client as the exporter renders them, with the probe's and the judge's own HELP texts."""
    reg = CollectorRegistry(auto_describe=False)
    fams = []

    def fam(name, labels=(), help_=None):
        f = GaugeMetricFamily(name, help_ or SPECS[name].help, labels=list(labels))
        fams.append(f)
        return f

    fam("fleetcanary_gpus_expected").add_metric([], 8)
    fam("fleetcanary_gpus_healthy").add_metric([], healthy)
    links_up = fam("fleetcanary_gpu_nvlink_links_up", ("gpu",))
    down = fam("fleetcanary_gpu_nvlink_links_down", ("gpu",))
    pending = fam("fleetcanary_gpu_remapped_rows_pending", ("gpu",))
    failed = fam("fleetcanary_gpu_remapped_rows_failed", ("gpu",))
    for g in range(8):
        links_up.add_metric([str(g)], 17 if g in nvlink_down else 18)
        if g in nvlink_down:
            down.add_metric([str(g)], 1)
        pending.add_metric([str(g)], 0)
        failed.add_metric([str(g)], 1 if g in remap_failed else 0)
    median = fam("fleetcanary_judge_median", judge.LABELS, judge.HELP["median"])
    change = fam("fleetcanary_judge_change", (*judge.LABELS, "baseline", "baseline_driver"), judge.HELP["change"])
    for g in range(8):
        labels = ["gpu_memory_bandwidth", "d2d", str(g), "pool-a", "H100", "550.90.07"]
        median.add_metric(labels, 3.0e12 * (0.7 if g in slow else 1.0))
        change.add_metric([*labels, "current_driver", "550.90.07"], 0.7 if g in slow else 1.0)

    class Snapshot:
        def collect(self):
            return fams

    reg.register(Snapshot())
    return generate_latest(reg).decode()


def key(alert: dict) -> tuple[str, str | None]:
    return alert["labels"]["alertname"], alert["labels"].get("gpu")


@pytest.fixture
def stack(tmp_path):
    """Two fake nodes, the webhook receiver, Alertmanager, Prometheus; all stopped at the end."""
    started = []
    try:
        nodes = {n: Exposition(exposition()) for n in ("node-a", "node-b")}
        started += nodes.values()
        hook = WebhookReceiver()
        started.append(hook)
        shipped, cfg = alertmanager_config(hook.url)
        am = Alertmanager(tmp_path / "am", cfg)
        started.append(am)
        rules = scaled_rules(tmp_path)
        scrape = [{"job_name": "fleetcanary", "static_configs": [
            {"targets": [e.address], "labels": {"node": n}} for n, e in nodes.items()]}]
        prom = Prometheus(tmp_path / "prom", [], rule_files=[str(tmp_path / "fleetcanary.rules.yml"),
                                                             str(tmp_path / "fleetcanary.alerts.yml")],
                          scrape_configs=scrape, alertmanagers=[am.address])
        started.append(prom)
        yield {"nodes": nodes, "hook": hook, "am": am, "prom": prom, "rules": rules, "shipped": shipped, "cfg": cfg}
    finally:
        for s in reversed(started):
            s.stop()


def firing(notification: dict) -> list[tuple[str, str | None]]:
    return sorted((key(a) for a in notification["payload"]["alerts"] if a["status"] == "firing"), key=str)


def test_alerts_route_group_inhibit_and_resolve_through_a_real_alertmanager(stack):
    nodes, hook, am, prom, rules = stack["nodes"], stack["hook"], stack["am"], stack["prom"], stack["rules"]

    # Only timing and the webhook addresses differ from the shipped example.
    assert without_timing_and_urls(stack["cfg"]) == without_timing_and_urls(stack["shipped"])
    assert stack["cfg"]["route"]["routes"] == stack["shipped"]["route"]["routes"]
    assert stack["cfg"]["inhibit_rules"] == stack["shipped"]["inhibit_rules"]
    assert {r["name"] for r in stack["cfg"]["receivers"] if r.get("webhook_configs")} == \
        {"gpu-platform-pager", "gpu-platform-tickets"}
    wait_for(lambda: len(prom.query('up{job="fleetcanary"} == 1')) == 2, timeout=DEADLINE, what="both nodes up")

    def sent(node: str, status: str | None = None) -> list[dict]:
        return [n for n in hook.notifications() if n["payload"]["groupLabels"].get("node") == node
                and (status is None or n["payload"]["status"] == status)]

    def first(node: str, match) -> dict:
        return wait_for(lambda: next((n for n in sent(node) if match(n)), None), timeout=DEADLINE,
                        what=f"a notification for {node} like that")

    # (1) node-a: an NVLink of GPU 0 down, a failed row remap on GPU 5 and GPU 3's memory bandwidth 30% under
    # its best day (two nodes are too few peers: the fast path on its own history), all critical; node-b: an
    # NVLink of GPU 2 down. Grouped by node: node-a's three alerts (three alert names, three GPUs) in ONE
    # notification, node-b's in another. (Which notification of the group is the first to carry all depends on
    # when Prometheus delivered them, so the test waits for it rather than taking the first.)
    nodes["node-a"].set(exposition(nvlink_down=(0,), remap_failed=(5,), slow=(3,)))
    nodes["node-b"].set(exposition(nvlink_down=(2,)))
    a1 = first("node-a", lambda n: firing(n) == sorted([(NVLINK, "0"), (REMAP_FAILED, "5"), (OWN_FAST, "3")],
                                                       key=str))
    b1 = first("node-b", lambda n: firing(n) == [(NVLINK, "2")])
    assert a1["path"] == b1["path"] == "/page", "critical alerts go to the pager receiver"
    assert a1["payload"]["receiver"] == "gpu-platform-pager"
    assert a1["payload"]["groupLabels"] == {"node": "node-a"}
    assert a1["payload"]["status"] == "firing"
    assert [key(a) for a in b1["payload"]["alerts"]] == [(NVLINK, "2")]
    # (4) what a router and a person need is in the payload.
    for a in a1["payload"]["alerts"] + b1["payload"]["alerts"]:
        shipped_rule = rules[a["labels"]["alertname"]]
        assert a["status"] == "firing"
        assert a["labels"]["severity"] == shipped_rule["labels"]["severity"] == "critical"
        assert a["labels"]["node"] in ("node-a", "node-b") and a["labels"]["gpu"] in ("0", "2", "3", "5")
        assert a["annotations"]["runbook_url"] == shipped_rule["annotations"]["runbook_url"]
        assert a["annotations"]["runbook_url"].endswith("docs/runbooks.md#" + a["labels"]["alertname"].lower())
        assert a["annotations"]["summary"] and a["labels"]["node"] in a["annotations"]["description"]
    assert a1["payload"]["commonLabels"] == {"node": "node-a", "severity": "critical", "job": "fleetcanary",
                                             "instance": nodes["node-a"].address}
    # a judged figure's alert says which figure, series, path and peer group (what a router sorts by)
    [own] = [a for a in a1["payload"]["alerts"] if a["labels"]["alertname"] == OWN_FAST]
    assert {k: own["labels"][k] for k in ("figure", "series", "path", "pool", "model", "driver_version",
                                          "baseline", "baseline_driver")} == {
        "figure": "gpu_memory_bandwidth", "series": "d2d", "path": "own_fast", "pool": "pool-a", "model": "H100",
        "driver_version": "550.90.07", "baseline": "current_driver", "baseline_driver": "550.90.07"}
    assert "30% below its best day" in own["annotations"]["description"], own["annotations"]["description"]

    # (2) node-a loses a GPU (FleetCanaryGPUsMissing, node-level); while it is missing, one more NVLink
    # goes down (GPU 6). The shipped inhibit rule mutes node-a's NVLink alerts, the old and the new, and its
    # GPU memory bandwidth alert; the row remap failure is not under it and stays notified; node-b is another
    # node and is untouched.
    nodes["node-a"].set(exposition(healthy=7, nvlink_down=(0,), remap_failed=(5,), slow=(3,)))

    def inhibited(keys: list[tuple[str, str]]):
        def check() -> dict | None:
            held = {(a["labels"]["node"], *key(a)): a for a in am.alerts()}
            missing = held.get(("node-a", MISSING, None))
            if not missing or missing["status"]["state"] != "active":
                return None
            muted = [held.get(("node-a", *k)) for k in keys]
            if not all(m and m["status"]["state"] == "suppressed" for m in muted):
                return None
            return {"missing": missing, "muted": muted, "held": held}
        return check

    # Alertmanager's inhibitor and its dispatcher take a new alert from separate queues, so a flush of the
    # group in the instant between the two may still carry the old NVLink alert: what the inhibit rule
    # promises holds once Alertmanager reports the alert suppressed, and everything after is built on that.
    wait_for(inhibited([(NVLINK, "0"), (OWN_FAST, "3")]), timeout=DEADLINE,
             what="node-a's NVLink and bandwidth alerts inhibited by GPUsMissing")
    nodes["node-a"].set(exposition(healthy=7, nvlink_down=(0, 6), remap_failed=(5,), slow=(3,)))
    muted_keys = [(NVLINK, "0"), (NVLINK, "6"), (OWN_FAST, "3")]
    state = wait_for(inhibited(muted_keys), timeout=DEADLINE, what="node-a's new NVLink alert inhibited too")
    for m in state["muted"]:
        assert m["status"]["inhibitedBy"] == [state["missing"]["fingerprint"]], m["status"]
        assert m["status"]["silencedBy"] == []
    assert state["held"][("node-a", REMAP_FAILED, "5")]["status"]["state"] == "active"
    assert state["held"][("node-b", NVLINK, "2")]["status"]["state"] == "active"
    # A change the group does notify: GPU 3's row remap fails too. That notification is a flush of node-a's
    # group with the muted alerts in it: GPUsMissing and the row remap failures, not the muted alerts.
    nodes["node-a"].set(exposition(healthy=7, nvlink_down=(0, 6), remap_failed=(5, 3), slow=(3,)))
    flushed = first("node-a", lambda n: (REMAP_FAILED, "3") in firing(n))
    assert firing(flushed) == sorted([(MISSING, None), (REMAP_FAILED, "5"), (REMAP_FAILED, "3")], key=str), \
        flushed["payload"]
    assert not {NVLINK, OWN_FAST} & {a["labels"]["alertname"] for a in flushed["payload"]["alerts"]}, \
        flushed["payload"]
    flushed_at = hook.notifications().index(flushed)
    # Still inhibited, and no notification ever carried GPU 6's alert, which came after the inhibition.
    assert inhibited(muted_keys)(), "node-a's NVLink and bandwidth alerts are no longer inhibited"
    assert not any(key(a) == (NVLINK, "6") for n in hook.notifications() for a in n["payload"]["alerts"])

    # (3) both nodes healed: resolution arrives, status "resolved", for every alert that was notified. The
    # links and the bandwidth come back first, while GPUs are still missing (so no muted alert is firing when
    # the inhibition ends), then the GPU and the row remaps.
    nodes["node-a"].set(exposition(healthy=7, remap_failed=(5, 3)))
    wait_for(lambda: not [a for a in am.alerts() if key(a)[0] in (NVLINK, OWN_FAST)
                          and a["labels"]["node"] == "node-a"],
             timeout=DEADLINE, what="node-a's NVLink and bandwidth alerts resolved")
    nodes["node-b"].set(exposition())
    nodes["node-a"].set(exposition())
    notified = {(MISSING, None), (REMAP_FAILED, "5"), (REMAP_FAILED, "3")}

    def resolved_in(node: str) -> set:
        # Each alert's resolution, in whichever notification carried it: alerts that resolve at different
        # evaluations can straddle a flush of the group (one resolved in a "firing" notification while the
        # others still fire), and Alertmanager drops an alert from the group once its resolution was sent.
        return {key(a) for n in sent(node) for a in n["payload"]["alerts"] if a["status"] == "resolved"}

    wait_for(lambda: sent("node-b", "resolved") and sent("node-a", "resolved") and resolved_in("node-a") >= notified,
             timeout=DEADLINE, what=f"resolved notifications for both nodes (node-a's {sorted(notified, key=str)})")
    b_res = sent("node-b", "resolved")[0]["payload"]
    assert [(key(a), a["status"]) for a in b_res["alerts"]] == [((NVLINK, "2"), "resolved")]
    assert b_res["alerts"][0]["annotations"]["runbook_url"] == rules[NVLINK]["annotations"]["runbook_url"]
    a_res = sent("node-a", "resolved")[-1]["payload"]
    assert all(a["status"] == "resolved" and a["endsAt"] > a["startsAt"] for a in a_res["alerts"])
    # Alertmanager may report the alerts it muted as resolved, never as firing; GPU 6's never at all.
    assert not any(a["status"] == "firing" and key(a)[0] in (NVLINK, OWN_FAST) and a["labels"]["node"] == "node-a"
                   for n in hook.notifications()[flushed_at:] for a in n["payload"]["alerts"])
    assert not any(key(a) == (NVLINK, "6") and a["status"] == "firing"
                   for n in hook.notifications() for a in n["payload"]["alerts"])
    # Every notification is one node's group, as routed: no alert of another node in it.
    for n in hook.notifications():
        node = n["payload"]["groupLabels"]["node"]
        assert n["payload"]["groupLabels"] == {"node": node}
        assert {a["labels"]["node"] for a in n["payload"]["alerts"]} == {node}, n["payload"]
    wait_for(lambda: not [a for a in am.alerts() if a["status"]["state"] == "active"], timeout=DEADLINE,
             what="no active alert left in Alertmanager")


def matcher(m: str):
    """An Alertmanager matcher string -> (label, predicate on the label's value, "" when absent)."""
    name, op, value = re.fullmatch(r'(\w+)(=~|!~|!=|=)"(.*)"', m).groups()
    return name, {"=": lambda v: v == value, "!=": lambda v: v != value,
                  "=~": lambda v: re.fullmatch(value, v) is not None,
                  "!~": lambda v: re.fullmatch(value, v) is None}[op]


def candidates() -> list[dict]:
    """A label set each shipped alert raises with: its name, its static labels, and the labels of what it
    judges (node and GPU; a judged series' figure and series)."""
    out = []
    for f in ("fleetcanary.rules.yml", "fleetcanary.alerts.yml"):
        for g in yamltext.load((ALERTS / f).read_text())["groups"]:
            for r in g["rules"]:
                if "alert" not in r:
                    continue
                labels = {"alertname": r["alert"], **r.get("labels", {}), "node": "n1", "gpu": "3"}
                if "fleetcanary_judge_" in r["expr"]:
                    labels |= {"figure": "gpu_memory_bandwidth", "series": "d2d"}
                out.append(labels)
    return out


def test_every_inhibit_rule_mutes_an_alert_the_rules_raise(tmp_path):
    """For each inhibit rule of the example: a source and a target among the shipped alerts (the labels they
    raise with), sharing its `equal` labels, sent to a real Alertmanager with the example's config: the target
    is inhibited by that source. A rule no pair of shipped alerts can meet fails here."""
    import json
    import urllib.request

    cfg = yamltext.load((ALERTS / "alertmanager.example.yml").read_text())
    alerts = candidates()
    pairs = []
    for rule in cfg["inhibit_rules"]:
        src = [matcher(m) for m in rule["source_matchers"]]
        tgt = [matcher(m) for m in rule["target_matchers"]]
        found = next(((s, t) for s in alerts for t in alerts if s is not t
                      and all(ok(s.get(k, "")) for k, ok in src) and all(ok(t.get(k, "")) for k, ok in tgt)
                      and all(s.get(k, "") == t.get(k, "") for k in rule.get("equal", []))), None)
        assert found, f"inhibit rule {rule} can match no pair of shipped alerts"
        pairs.append(found)
    _, test_cfg = alertmanager_config("http://127.0.0.1:9")
    am = Alertmanager(tmp_path / "am", test_cfg)
    try:
        for i, (s, t) in enumerate(pairs):
            body = [{"labels": {**s, "node": f"n{i}"}}, {"labels": {**t, "node": f"n{i}"}}]
            req = urllib.request.Request(am.url + "/api/v2/alerts", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            assert urllib.request.urlopen(req, timeout=10).status == 200

        def muted():
            got = {(a["labels"]["alertname"], a["labels"]["node"]): a["status"] for a in am.alerts()}
            return all(got.get((t["alertname"], f"n{i}"), {}).get("inhibitedBy") and
                       not got.get((s["alertname"], f"n{i}"), {}).get("inhibitedBy")
                       for i, (s, t) in enumerate(pairs))
        wait_for(muted, timeout=60, what="each rule's target inhibited by its source")
    finally:
        am.stop()
    assert len(pairs) == len(cfg["inhibit_rules"]) == 4


# A GB200 NVL72 rack, constructed (not recorded) from NVML's documented fabric info (tests/support/nvl72.py): its 18
# trays' expositions are gpu_health's real reads of their fake NVML, fabric registered and then gone.
DOMAIN_DEGRADED, FABRIC = "FleetCanaryNVLinkDomainDegraded", "FleetCanaryGPUFabricNotReady"


def test_a_rack_wide_nvlink_fabric_fault_is_one_page_naming_its_18_nodes(tmp_path, monkeypatch):
    """An NVL72 rack's fabric goes down (every GPU of its 18 trays back in registration): through the shipped rules
    and the shipped Alertmanager example, ONE notification, grouped by the NVLink domain, to the pager: the domain
    alert (value 18 nodes) and the 72 GPUs' fabric alerts, which name all 18 nodes; no per-node page."""
    up = {n: nvl72.exposition(nvl72.gpu_health(f, monkeypatch, tmp_path))
          for n, f in nvl72.write_rack(tmp_path / "facts").items()}
    down = {n: nvl72.exposition(nvl72.gpu_health(f, monkeypatch, tmp_path))
            for n, f in nvl72.write_rack(tmp_path / "facts", fabric_up=False).items()}
    assert f'nvlink_domain="{nvl72.DOMAIN}"' in up["nvl72-a-00"] and 'fabric_state="in_progress"' in down["nvl72-a-17"]
    trays = {n: Exposition(text) for n, text in up.items()}
    started: list = list(trays.values())
    try:
        hook = WebhookReceiver()
        started.append(hook)
        _, cfg = alertmanager_config(hook.url)
        am = Alertmanager(tmp_path / "am", cfg)
        started.append(am)
        scaled_rules(tmp_path)
        scrape = [{"job_name": "fleetcanary", "static_configs": [
            {"targets": [e.address], "labels": {"node": n}} for n, e in trays.items()]}]
        prom = Prometheus(tmp_path / "prom", [], rule_files=[str(tmp_path / "fleetcanary.rules.yml"),
                                                             str(tmp_path / "fleetcanary.alerts.yml")],
                          scrape_configs=scrape, alertmanagers=[am.address])
        started.append(prom)
        # the rack registered: each node's NVLink domain is recorded, and nothing fires
        wait_for(lambda: len(prom.query(f'node:fleetcanary_nvlink_domain:info{{nvlink_domain="{nvl72.DOMAIN}"}}'))
                 == 18, timeout=DEADLINE, what="the 18 trays' NVLink domain recorded")
        assert not prom.query('ALERTS{alertname=~"FleetCanary(NVLinkDomain|GPUFabric).*"}')
        for n, e in trays.items():
            e.set(down[n])

        def page():
            for n in hook.notifications():
                alerts = [a for a in n["payload"]["alerts"] if a["status"] == "firing"]
                names = [a["labels"]["alertname"] for a in alerts]
                if names.count(DOMAIN_DEGRADED) == 1 and names.count(FABRIC) == 72:
                    return n
            return None

        n = wait_for(page, timeout=DEADLINE, what="one notification with the domain alert and the 72 GPU alerts")
        assert n["path"] == "/page" and n["payload"]["receiver"] == "gpu-platform-pager"
        assert n["payload"]["groupLabels"] == {"nvlink_domain": nvl72.DOMAIN}
        alerts = n["payload"]["alerts"]
        assert {a["labels"]["nvlink_domain"] for a in alerts} == {nvl72.DOMAIN}
        assert {a["labels"]["node"] for a in alerts if a["labels"]["alertname"] == FABRIC} == set(trays)
        [domain] = [a for a in alerts if a["labels"]["alertname"] == DOMAIN_DEGRADED]
        assert domain["annotations"]["description"].startswith(f"18 nodes of NVLink domain {nvl72.DOMAIN}")
        assert domain["annotations"]["runbook_url"].endswith("#fleetcanarynvlinkdomaindegraded")
        # every notification sent is that domain's group: no tray was paged on its own
        assert {tuple(sorted(x["payload"]["groupLabels"].items())) for x in hook.notifications()} == {
            (("nvlink_domain", nvl72.DOMAIN),)}
    finally:
        for s in reversed(started):
            s.stop()
