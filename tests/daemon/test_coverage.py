"""Coverage from the daemon's own runs: gpu_bandwidth run by the daemon's worker (on the CPU, which measures one
device, index 0) marks GPU 0 of the recorded 8-GPU node measured and leaves the others at 0; the state directory
keeps it across a restart, and an unreadable coverage file is left behind with a warning."""
from __future__ import annotations

import yaml

from tests.support.gpu import FIXTURES
from tests.support.helpers import free_port

COV = "fleetcanary_gpu_last_measured_timestamp_seconds"
SMALL = {"device": "cpu", "d2d_bytes": 1 << 20, "host_bytes": 1 << 20, "repeats": 1, "warmup": 0}


def daemon(tmp_path):
    from fleetcanary.core import config as configmod
    from fleetcanary.daemon.service import Daemon

    cfg = {"state_dir": str(tmp_path / "state"), "server": {"listen_address": f"127.0.0.1:{free_port()}"},
           "gpu": {"xid_watch": "off"},
           "probes": {"gpu_bandwidth": {"params": SMALL, "timeout_seconds": 120}}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return Daemon(configmod.load(p, env={}), config_path=str(p))


def series(d) -> dict[tuple[str, str], float]:
    out = {}
    for line in d.store.exposition.decode().splitlines():
        if line.startswith(COV + "{"):
            labels = dict(kv.split("=", 1) for kv in line[len(COV) + 1:line.index("}")].split(","))
            out[(labels["gpu"].strip('"'), labels["probe"].strip('"'))] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_run_marks_the_gpu_it_measured_and_a_restart_keeps_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(FIXTURES / "h100_8gpu_healthy.json"))
    d = daemon(tmp_path)
    try:
        out = d.run_probe("gpu_bandwidth")
        d.store.set_environment({**d.store.node_environment, "gpus": [{"index": g} for g in range(8)]})
        first = series(d)
    finally:
        d.server.stop()
    assert out.outcome == "success", (out.reason, out.detail)
    assert first[("0", "gpu_bandwidth")] == out.finished_at
    assert [g for (g, p), ts in first.items() if p == "gpu_bandwidth" and ts == 0] == [str(g) for g in range(1, 8)]
    assert first[("", "train_step")] == 0.0  # enabled by default, measured per node, not run here
    again = daemon(tmp_path)
    try:
        kept = series(again)
    finally:
        again.server.stop()
    assert kept[("0", "gpu_bandwidth")] == out.finished_at


def test_an_unreadable_coverage_file_starts_over_without_failing(tmp_path, caplog):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "coverage.json").write_text("{not json")
    d = daemon(tmp_path)
    d.server.stop()
    assert not [k for k, ts in series(d).items() if ts > 0]
    assert any("coverage:" in r.getMessage() and "unreadable" in r.getMessage() for r in caplog.records)
