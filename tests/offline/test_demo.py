"""`fleetcanary demo`: a simulated fleet on recorded NVML facts, one failing GPU, and its alerts arriving.

The pieces (each node's facts, the Prometheus and Alertmanager configs) are checked by the real promtool and
amtool; the whole demo runs as a subprocess with a real Prometheus and Alertmanager, and must deliver the bad
GPU's alerts to its receiver, none for the healthy nodes, have `fleetcanary remediate` taint the bad node alone
on the demo's Kubernetes API and the bad node's exporter set its fault conditions there (the healthy ones' all
False), and leave nothing running.
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from fleetcanary.core import resources
from fleetcanary.offline import demo_fleet as fleet
from fleetcanary.probes.lib import yamltext
from tests.support.helpers import require_binary, wait_for

ROOT = Path(__file__).resolve().parents[2]
HEALTHY = json.loads(fleet.HEALTHY_FACTS.read_text())


def test_every_node_has_its_own_gpus_and_only_the_bad_gpu_differs_from_the_recording():
    names = fleet.node_names(6)
    bad = fleet.degraded_node(names)
    facts = {n: fleet.node_facts(i, n == bad) for i, n in enumerate(names, 1)}
    uuids = [d["uuid"] for f in facts.values() for d in f["devices"]]
    serials = [d["serial"] for f in facts.values() for d in f["devices"]]
    assert len(set(uuids)) == len(uuids) == 48 and len(set(serials)) == 48
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", u) for u in uuids)
    ignore = ("uuid", "serial")
    for node, f in facts.items():
        for gpu, (dev, rec) in enumerate(zip(f["devices"], HEALTHY["devices"], strict=True)):
            same = ({k: v for k, v in dev.items() if k not in ignore}
                    == {k: v for k, v in rec.items() if k not in ignore})
            assert same == (node != bad or gpu != fleet.DEGRADED_GPU), (node, gpu)
        assert bool(f["xid_events"]) == (node == bad)
    dev = facts[bad]["devices"][fleet.DEGRADED_GPU]
    assert dev["ecc"]["uncorrected_volatile"] == 1 and dev["remapped_rows"][2] is True
    assert {e["xid"] for e in facts[bad]["xid_events"]} == {63, 94}


def test_the_demo_configs_pass_promtool_amtool_and_the_exporters_own_check(tmp_path):
    promtool, amtool = require_binary("promtool"), require_binary("amtool")
    am = fleet.alertmanager_config(resources.alertmanager_example(), "http://127.0.0.1:1/")
    example = yamltext.load(resources.alertmanager_example())
    assert am["inhibit_rules"] == example["inhibit_rules"]  # the shipped inhibitions, as shipped
    assert [r.get("matchers") for r in am["route"]["routes"]] == [r.get("matchers") for r in example["route"]["routes"]]
    assert {r["name"] for r in am["receivers"]} == {r["name"] for r in example["receivers"]}
    assert all(r["webhook_configs"][0]["url"] == "http://127.0.0.1:1/" for r in am["receivers"])
    (tmp_path / "am.yml").write_text(yaml.safe_dump(am))
    r = subprocess.run([amtool, "check-config", str(tmp_path / "am.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    with resources.rule_files() as rules:
        prom = fleet.prometheus_config({"demo-h100-01": "127.0.0.1:2", "demo-h100-02": "127.0.0.1:3"},
                                       "127.0.0.1:4", rules, fast=True)
        (tmp_path / "prom.yml").write_text(yaml.safe_dump(prom))
        r = subprocess.run([promtool, "check", "config", str(tmp_path / "prom.yml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = fleet.exporter_config(tmp_path, "demo-h100-01", "127.0.0.1:5", "http://127.0.0.1:6/v1", False,
                                "http://127.0.0.1:7")
    assert cfg["kubernetes"]["api_url"] == "http://127.0.0.1:7" and cfg["kubernetes"]["node_condition"]["per_fault"]
    assert "kubernetes" not in fleet.exporter_config(tmp_path, "n", "127.0.0.1:5", "http://127.0.0.1:6/v1", False)
    (tmp_path / "fc.yaml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "fleetcanary", "check-config", str(tmp_path / "fc.yaml")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(n for n, p in cfg["probes"].items() if p.get("enabled", True)) == sorted(fleet.ON)


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "1"], "--nodes must be at least 2"),
    (["--until-fired", "FleetCanaryNoSuchAlert", "--duration", "60"], "FleetCanaryNoSuchAlert is not one of"),
])
def test_bad_arguments_get_one_line_and_a_nonzero_exit(argv, message, tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    r = subprocess.run([sys.executable, "-m", "fleetcanary", "demo", "--workdir", str(tmp_path / "w"),
                        "--prometheus-listen", "127.0.0.1:0", "--alertmanager-listen", "127.0.0.1:0", *argv],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr, r.stderr


def _alive(workdir: Path) -> list[str]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(workdir) in cmd:
            out.append(f"{pid}: {cmd[:200]}")
    return out


@pytest.mark.long
def test_the_bad_gpus_alerts_reach_the_receiver_and_the_healthy_nodes_stay_silent(tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    workdir = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetcanary", "demo", "--fast", "--workdir", str(workdir),
         "--prometheus-listen", "127.0.0.1:0", "--alertmanager-listen", "127.0.0.1:0",
         "--until-fired", "FleetCanaryGPUCriticalXid,FleetCanaryGPUXidWarning,FleetCanaryGPUUncorrectableECC",
         "--duration", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the demo did not end by itself\n{out}\n{err}")
    assert proc.returncode == 0, out + err
    bad = fleet.degraded_node(fleet.node_names(6))
    fired = re.findall(r"^\[\+\d+:\d\d\] FIRING\s+\w+\s+(\S+)\s+(\S+) GPU (\d+)(?: xid=(\d+))?", out, re.MULTILINE)
    assert {(a, n, g, x) for a, n, g, x in fired} == {
        # XID 63 (a row remap recorded) is a memory-class warning in the catalogue, 94 (contained ECC) critical
        ("FleetCanaryGPUXidWarning", bad, "6", "63"), ("FleetCanaryGPUCriticalXid", bad, "6", "94"),
        ("FleetCanaryGPUUncorrectableECC", bad, "6", "")}, out
    assert "alerts on healthy nodes: 0" in out, out
    # remediate, dry-run off, got the same notifications: the bad node tainted and labelled by the hard-fault
    # rule (its uncorrectable ECC error or the XID 94 that came with it, whichever notification came first), an
    # Event with the evidence, the healthy nodes untouched
    assert (f"remediate (dry-run off) on {bad}: taint fleetcanary.io/quarantine:NoSchedule, "
            "label fleetcanary.io/health=failed") in out, out
    event = next(line for line in out.splitlines() if "Event Warning Quarantined:" in line)
    assert "rule hard-fault" in event and any(f"{a} (critical, gpu=6" in event for a in (
        "FleetCanaryGPUUncorrectableECC", "FleetCanaryGPUCriticalXid")), event
    assert "remediate on healthy nodes: 5 of 5 untouched" in out, out
    # the bad node's own exporter set its per-fault node conditions on the same API (kubernetes.api_url), each
    # with the reason and the GPU in the message; the healthy nodes' exporters wrote theirs, every one False
    assert f"node conditions on {bad} (from its exporter): 3 of 7 fault conditions True" in out, out
    conds = dict(re.findall(r"^    (FleetCanary\w+)=True (.*)$", out, re.MULTILINE))
    assert set(conds) == {"FleetCanary" + t for t in fleet.EXPECTED_CONDITIONS}, out
    for t, reason in fleet.EXPECTED_CONDITIONS.items():
        assert conds["FleetCanary" + t].startswith(f"{reason}: GPU 6"), conds
    assert "XID 94" in conds["FleetCanaryGPUHardwareXid"] and "1 uncorrectable ECC" in conds[
        "FleetCanaryGPUUncorrectableECC"], conds
    assert "node conditions on healthy nodes: 5 of 5 with every fault condition False" in out, out
    # the node's GPU errors panel, from its own queries: each XID counted once (the watch and gpu_health share
    # the node's events), the ECC error and the pending remap
    panel = next(line for line in out.splitlines() if "panel node-detail / GPU errors" in line)
    for shown in ("GPU 6 XID 63: 1", "GPU 6 XID 94: 1", "GPU 6 uncorrectable ECC: 1", "GPU 6 remap pending: 1"):
        assert shown in panel, panel
    assert not _alive(workdir), _alive(workdir)


@pytest.mark.long
def test_ctrl_c_still_prints_the_summary_with_the_panels_and_stops_everything(tmp_path):
    """Ctrl-C reaches every process in the terminal's foreground group: the demo and, before, each child it
    started, so Prometheus was gone when the summary queried it ("no answer" on every panel)."""
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    workdir = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetcanary", "demo", "--fast", "--workdir", str(workdir),
         "--prometheus-listen", "127.0.0.1:0", "--alertmanager-listen", "127.0.0.1:0", "--duration", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("Alerts as Alertmanager sends them" in ln for ln in lines) or proc.poll() is not None,
                 timeout=300, interval=0.2, what="the demo's fleet up")
        assert proc.poll() is None, "".join(lines) + proc.stderr.read()
        os.killpg(proc.pid, signal.SIGINT)  # as the terminal does: the whole foreground process group
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=30)
    out = "".join(lines)
    assert proc.returncode == 0 and "Summary:" in out, out + proc.stderr.read()
    panels = [ln for ln in out.splitlines() if ln.startswith("  panel ")]
    assert len(panels) == 2 and not any("no answer" in ln for ln in panels), out
    assert not _alive(workdir), _alive(workdir)
