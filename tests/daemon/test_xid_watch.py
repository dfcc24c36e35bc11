"""The continuous XID watch (fleetcanary.daemon.xid_watch, fleetcanary.runner.xid_reader): the recorded kernel
log of tests/fixtures/kmsg replayed at random times, in random batches, into a log the watcher follows, with its
reader killed at random points: every Xid record is caught exactly once, on the right GPU, and the daemon counts
the critical ones into fleetcanary_gpu_xid_errors_total and its watched time into
fleetcanary_gpu_xid_watch_seconds_total."""
from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pytest

from fleetcanary.daemon import xid_watch
from fleetcanary.probes.testing.nvml_fake import FACTS_DIR
from fleetcanary.runner import xid_reader
from tests.support.helpers import free_port, wait_for

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
RECORDS = (FIXTURES / "kmsg" / "xid_node.log").read_text().splitlines(keepends=True)
GPUS = [{"index": i, "pci_bus_id": d["pci_bus_id"], "uuid": d["uuid"]}
        for i, d in enumerate(json.loads((FACTS_DIR / "h100_8gpu_healthy.json").read_text())["devices"])]


def expected() -> dict[int, tuple[str, int]]:
    out = {}
    for r in RECORDS:
        seq, _, message = xid_reader.parse(r)
        found = xid_reader.xid(message)
        if found:
            out[seq] = found[:2]
    return out


def test_every_xid_line_of_the_recorded_log_is_parsed():
    want = expected()
    assert len(want) == 10
    assert want[2103] == ("0000:18:00", 79) and want[2117] == ("0000:ba:00", 63)    # with and without "PCI:"
    assert {c for _, c in want.values()} == {79, 48, 13, 94, 31, 109, 119, 63, 74}
    assert xid_reader.xid("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.") is None
    assert xid_watch.pci_key("00000000:2A:00.0") == xid_watch.pci_key("0000:2a:00") == "0000:2a:00"


def replay(log: Path, watch: xid_watch.XidWatch, seed: int) -> None:
    """Write the records in random batches; after some batches kill the reader (it is restarted and must go on
    after the last record it read, catching what was written while it was down)."""
    rng = random.Random(seed)
    i = 0
    while i < len(RECORDS):
        n = rng.randint(1, 4)
        with log.open("a") as f:
            f.writelines(RECORDS[i:i + n])
        i = min(i + n, len(RECORDS))
        if rng.random() < 0.3 and watch.proc is not None and watch.proc.poll() is None:
            watch.proc.kill()                      # dies with records maybe unread; more come while it is down
            continue
        last = int(RECORDS[i - 1].split(",")[1])
        wait_for(lambda last=last: (watch.last_seq or 0) >= last, timeout=60, what=f"the watcher at seq {last}")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_watcher_catches_every_xid_exactly_once_across_restarts(tmp_path, seed):
    log = tmp_path / "kmsg.log"
    log.write_text("6,2000,1000000000,-;Linux version 6.8.0 (before the exporter started)\n"
                   "3,2001,1000000100,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n")
    caught: list[tuple[str, int]] = []
    watched: list[float] = []
    lock = threading.Lock()

    def on_xid(pci, code, message):
        with lock:
            caught.append((pci, code))

    w = xid_watch.XidWatch(str(log), on_xid, watched.append)
    w.start()
    try:
        wait_for(w.watching, timeout=60, what="the reader ready")
        replay(log, w, seed)
        final = int(RECORDS[-1].split(",")[1])
        wait_for(lambda: (w.last_seq or 0) >= final, timeout=60, what="the last record read")
    finally:
        w.stop()
    want = expected()
    assert sorted(caught) == sorted(want.values()), (caught, want)   # the XID before the start is not counted
    assert w.xids == len(want) and w.lost == 0
    assert sum(watched) > 0


def test_xids_read_before_the_gpu_facts_wait_in_the_buffer_and_are_counted_once_by_index():
    env: dict = {"gpu_count": "unknown"}
    counted: list[tuple[str, int, str, str]] = []
    buf = xid_watch.XidBuffer(lambda: env, lambda *a: counted.append(a), limit=3)
    for code in (79, 48, 13, 94):                      # the fourth is past the limit: dropped
        buf("0000:18:00", code, f"Xid {code}")
    buf.flush()
    assert counted == [] and len(buf.pending) == 3     # no facts yet: nothing counted, nothing lost
    env = {"gpus": GPUS}
    buf.flush()
    buf.flush()
    assert [(g, c) for g, c, _, _ in counted] == [("0", 79), ("0", 48), ("0", 13)] and buf.pending == []
    assert counted[0][3] == " (0000:18:00)"
    buf("0000:99:00", 63, "Xid 63")                     # facts known: at once; a PCI ID no GPU has keeps it
    assert counted[-1][:2] == ("pci:0000:99:00", 63)


def test_an_xid_bus_id_maps_to_its_gpu_index_in_either_form():
    env = {"gpus": GPUS}
    nvml = GPUS[3]["pci_bus_id"]                       # "00000000:xx:00.0" as NVML writes it
    assert xid_watch.gpu_of(nvml, env) == "3"
    assert xid_watch.gpu_of(xid_watch.pci_key(nvml), env) == "3"   # the kernel log's "0000:xx:00"
    assert not xid_watch.facts_known({}) and xid_watch.facts_known({"gpu_count": 0})


def test_the_daemon_counts_critical_xids_per_gpu_and_its_watched_time(tmp_path):
    log = tmp_path / "kmsg.log"
    log.write_text("")
    d = daemon_with(tmp_path, {"xid_watch": "on", "xid_log": str(log)})
    d.store.set_environment({**d.store.node_environment, "gpus": GPUS[:7]})   # GPU 7's facts not known yet
    w = d.xid_watch
    w.start()
    try:
        wait_for(w.watching, timeout=60, what="the reader ready")
        with log.open("a") as f:
            f.writelines(RECORDS)
        wait_for(lambda: w.xids == 10, timeout=60, what="10 XIDs read")
        w.flush()
        text = d.store.exposition.decode()
    finally:
        w.stop()
        d.server.stop()
    counts = {}
    for line in text.splitlines():
        if line.startswith("fleetcanary_gpu_xid_errors_total{"):
            labels, value = line.rsplit(" ", 1)
            counts[labels] = float(value)
    # every XID is counted now, with the catalogue's class and severity (109 too: an application-class code,
    # which pages only through its escalation); the alerts split by those labels
    x = "fleetcanary_gpu_xid_errors_total"
    assert counts == {f'{x}{{class="bus",gpu="0",severity="critical",xid="79"}}': 1.0,
                      f'{x}{{class="memory",gpu="1",severity="critical",xid="48"}}': 1.0,
                      f'{x}{{class="application",gpu="2",severity="warning",xid="13"}}': 2.0,
                      f'{x}{{class="memory",gpu="3",severity="critical",xid="94"}}': 1.0,
                      f'{x}{{class="application",gpu="4",severity="warning",xid="31"}}': 1.0,
                      f'{x}{{class="hardware",gpu="5",severity="critical",xid="119"}}': 1.0,
                      f'{x}{{class="memory",gpu="6",severity="warning",xid="63"}}': 1.0,
                      f'{x}{{class="application",gpu="0",severity="warning",xid="109"}}': 1.0,
                      f'{x}{{class="nvlink",gpu="pci:0000:db:00",severity="critical",xid="74"}}': 1.0}, counts
    # 13 twice on GPU 2 is one process (pid 41822): no escalation
    assert "fleetcanary_gpu_xid_escalations_total{" not in text
    watch_line = next(ln for ln in text.splitlines() if ln.startswith("fleetcanary_gpu_xid_watch_seconds_total"))
    assert float(watch_line.rsplit(" ", 1)[1]) > 0


def daemon_with(tmp_path, gpu: dict):
    import yaml

    from fleetcanary.core import config as configmod
    from fleetcanary.daemon.service import Daemon

    cfg = {"state_dir": str(tmp_path / "state"), "server": {"listen_address": f"127.0.0.1:{free_port()}"},
           "gpu": gpu}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return Daemon(configmod.load(p, env={}), config_path=str(p))


def test_without_the_kernel_log_the_watch_reads_nvml_events(tmp_path, monkeypatch):
    """The base DaemonSet mounts no kernel log: the watcher waits on NVML's critical-XID events (the recorded
    degraded node: XIDs 63 and 94 on GPU 6), in its own process; the daemon maps them by PCI bus ID."""
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(FACTS_DIR / "h100_8gpu_degraded.json"))
    d = daemon_with(tmp_path, {"xid_log": str(tmp_path / "absent")})
    d.store.set_environment({**d.store.node_environment, "gpus": GPUS})
    w = d.xid_watch
    assert w is not None and w.source == "nvml"
    w.start()
    try:
        wait_for(lambda: w.xids == 2, timeout=60, what="the two recorded XID events")
        assert w.watching()
        text = d.store.exposition.decode()
    finally:
        w.stop()
        d.server.stop()
    assert 'fleetcanary_gpu_xid_errors_total{class="memory",gpu="6",severity="warning",xid="63"} 1.0' in text
    assert 'fleetcanary_gpu_xid_errors_total{class="memory",gpu="6",severity="critical",xid="94"} 1.0' in text


def test_an_xid_read_before_the_gpu_facts_waits_for_them_and_is_counted_once(tmp_path, monkeypatch):
    """The reader starts with the daemon: XIDs it reads before any worker has reported the GPU facts are held
    (not labelled gpu="pci:..."), then counted under the GPU's index once gpu_health reports them; while the
    watch runs, gpu_health does not wait on the same events itself (it would count each XID twice)."""
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(FACTS_DIR / "h100_8gpu_degraded.json"))
    d = daemon_with(tmp_path, {"xid_log": str(tmp_path / "absent")})
    w = d.xid_watch
    w.start()
    try:
        wait_for(lambda: w.xids == 2, timeout=60, what="the two recorded XID events")
        assert "fleetcanary_gpu_xid_errors_total{" not in d.store.exposition.decode()
        out = d.run_probe("gpu_health")
        text = d.store.exposition.decode()
    finally:
        w.stop()
        d.server.stop()
    assert out is not None and out.outcome == "success", out and out.detail
    assert out.result["parameters"]["xid_wait_seconds"] == 0.0
    assert 'fleetcanary_gpu_xid_errors_total{class="memory",gpu="6",severity="warning",xid="63"} 1.0' in text
    assert 'fleetcanary_gpu_xid_errors_total{class="memory",gpu="6",severity="critical",xid="94"} 1.0' in text
    assert 'gpu="pci:' not in text


def test_without_a_kernel_log_or_a_gpu_driver_the_watch_stops_trying(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEETCANARY_FAKE_NVML", raising=False)
    d = daemon_with(tmp_path, {"xid_log": str(tmp_path / "absent")})
    w = d.xid_watch
    w.start()
    try:
        wait_for(lambda: w.unavailable, timeout=60, what="the reader saying NVML is not here")
        assert w.starts == 1 and not w.watching()
    finally:
        w.stop()
        d.server.stop()


def test_xid_watch_off_starts_nothing(tmp_path):
    d = daemon_with(tmp_path, {"xid_watch": "off"})
    try:
        assert d.xid_watch is None
    finally:
        d.server.stop()


def test_auto_leaves_the_kernel_log_alone_where_no_nvidia_driver_is_loaded(tmp_path, monkeypatch):
    """A readable kernel log on a machine without NVIDIA's driver holds no Xid: auto watches NVML's events
    (whose reader ends at once there) instead of keeping a reader on the kernel log; on keeps the log."""
    from fleetcanary.daemon import service

    log = tmp_path / "kmsg.log"
    log.write_text("")
    monkeypatch.setattr(service, "NVIDIA_DRIVER", str(tmp_path / "no-driver"))
    d = daemon_with(tmp_path, {"xid_log": str(log)})
    d.server.stop()
    assert d.xid_watch.source == "nvml"
    monkeypatch.setattr(service, "NVIDIA_DRIVER", str(log))  # a driver is loaded
    d = daemon_with(tmp_path, {"xid_log": str(log)})
    d.server.stop()
    assert d.xid_watch.source == str(log)
    monkeypatch.setattr(service, "NVIDIA_DRIVER", str(tmp_path / "no-driver"))
    d = daemon_with(tmp_path, {"xid_watch": "on", "xid_log": str(log)})
    d.server.stop()
    assert d.xid_watch.source == str(log)
