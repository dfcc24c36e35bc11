"""Application-class XIDs never page alone: the real daemon reads kernel-log lines through its XID watch,
publishes what it counted, and the shipped alert rules, run by promtool over those very series, page only
for the GPU that logged the same application code from three different processes."""
from __future__ import annotations

import subprocess

import yaml
from prometheus_client.parser import text_string_to_metric_families

from fleetcanary.daemon.xid_watch import pci_key
from tests.conftest import ROOT
from tests.daemon.test_xid_watch import GPUS, daemon_with
from tests.support.helpers import require_binary, wait_for

XID_FAMILIES = ("fleetcanary_gpu_xid_errors", "fleetcanary_gpu_xid_escalations")


def kmsg(lines: list[tuple[int, int, int]]) -> list[str]:
    """(gpu index, xid, pid) -> kmsg records of the driver's Xid lines."""
    return [f"3,{500 + i},{1000 + i},-;NVRM: Xid (PCI:{pci_key(GPUS[g]['pci_bus_id'])}): {code}, pid={pid}, "
            f"name=python3, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address\n"
            for i, (g, code, pid) in enumerate(lines)]


def exposition_after(tmp_path, records: list[str]) -> str:
    tmp_path.mkdir()
    log = tmp_path / "kmsg.log"
    log.write_text("")
    d = daemon_with(tmp_path, {"xid_watch": "on", "xid_log": str(log)})
    d.store.set_environment({**d.store.node_environment, "gpus": GPUS})
    w = d.xid_watch
    w.start()
    try:
        wait_for(w.watching, timeout=60, what="the reader ready")
        with log.open("a") as f:
            f.writelines(records)
        wait_for(lambda: w.xids == len(records), timeout=60, what="every XID read")
        return d.store.exposition.decode()
    finally:
        w.stop()
        d.server.stop()


def xid_series(text: str, node: str) -> list[dict]:
    out = []
    for fam in text_string_to_metric_families(text):
        if fam.name in XID_FAMILIES:
            for s in fam.samples:
                if s.name.endswith("_total"):
                    labels = ", ".join(f'{k}="{v}"' for k, v in sorted({**s.labels, "node": node}.items()))
                    out.append({"series": f"{s.name}{{{labels}}}", "values": f"_x5 {s.value:g}x60"})
    return out


def test_application_xids_page_only_when_one_gpu_logs_them_from_three_processes(tmp_path):
    # node a: XID 13 on three different GPUs from three processes, and one process hitting GPU 0 four times
    spread = exposition_after(tmp_path / "a", kmsg([(0, 13, 100), (1, 13, 200), (2, 13, 300), (0, 31, 100),
                                                    (0, 13, 100), (0, 13, 100), (0, 13, 100)]))
    # node b: XID 13 on GPU 3 from three different processes within the hour
    same = exposition_after(tmp_path / "b", kmsg([(3, 13, 400), (3, 13, 500), (3, 13, 600)]))
    assert "fleetcanary_gpu_xid_escalations_total{" not in spread
    assert 'fleetcanary_gpu_xid_escalations_total{gpu="3",xid="13"} 1.0' in same
    assert 'fleetcanary_gpu_xid_errors_total{class="application",gpu="3",severity="warning",xid="13"} 3.0' in same

    firing = 'count by (node, alertname, gpu) (ALERTS{alertname=~"FleetCanaryGPU.*Xid.*", alertstate="firing"})'
    test = {"rule_files": [str(ROOT / "alerts/fleetcanary.rules.yml"), str(ROOT / "alerts/fleetcanary.alerts.yml")],
            "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": xid_series(spread, "a") + xid_series(same, "b"),
                       "promql_expr_test": [{"expr": firing, "eval_time": "10m", "exp_samples": [
                           {"labels": '{node="b", alertname="FleetCanaryGPUApplicationXidRepeated", gpu="3"}',
                            "value": 1}]}]}]}
    path = tmp_path / "escalation.test.yml"
    path.write_text(yaml.safe_dump(test))
    r = subprocess.run([require_binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
