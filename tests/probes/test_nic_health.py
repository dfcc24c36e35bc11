"""nic_health on sysfs trees built as files in the kernel's layout (tests/fixtures/sysfs, see its README)
and on real veth interfaces in a network namespace this test creates."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from fleetcanary.daemon.state import ResultStore
from fleetcanary.probes.base import ProbeContext, ProbeError, ProbeSkipped
from fleetcanary.probes.lib.nic_sysfs import parse_rate, parse_state
from fleetcanary.probes.nic_health import Config, NicHealth
from tests.support.helpers import require_binary, run_job, unavailable, wait_for

SYSFS = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
R = "fleetcanary_rdma_port_"
N = "fleetcanary_net_interface_"
GB = 1e9 / 8


def ctx(tmp_path):
    return ProbeContext(node_name="t", state_dir=str(tmp_path), deadline_monotonic=time.monotonic() + 30)


def run(tmp_path, node, **cfg):
    root = node if isinstance(node, Path) else SYSFS / node
    return NicHealth().run(Config(sysfs_root=str(root), **cfg), ctx(tmp_path))


def values(result) -> dict:
    return {(s.metric, tuple(sorted(s.labels.items()))): s.value for s in result.samples}


def value(result, metric, **labels):
    return values(result).get((metric, tuple(sorted(labels.items()))))


def port(result, metric, device, p="1", **labels):
    return value(result, metric, device=device, port=p, **labels)


def info(result, device, p="1") -> dict | None:
    """The labels of the port's info series (its identity and its device's), or None."""
    return next((dict(k[1]) for k in values(result) if k[0] == R + "info" and dict(k[1])["device"] == device
                 and dict(k[1])["port"] == p), None)


NDR_EXPECTED = ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "mlx5_3/1", "mlx5_4/1", "mlx5_6/1"]


def test_ndr_node_ports_rates_counters_and_the_missing_port(tmp_path):
    r = run(tmp_path, "ndr_node", expected_ports=NDR_EXPECTED, expected_rate_gbps=400,
            port_rates_gbps={"mlx5_4/1": 200}, interfaces=["eth0", "ens1f0np0"], port_states=True, hw_counters=True)
    # an NDR InfiniBand port, healthy
    assert info(r, "mlx5_0")["link_layer"] == "InfiniBand"
    assert port(r, R + "up", "mlx5_0") == 1
    assert port(r, R + "state", "mlx5_0", state="active") == 1 and port(r, R + "state", "mlx5_0", state="down") == 0
    assert port(r, R + "physical_state", "mlx5_0", state="link_up") == 1
    assert port(r, R + "rate_bytes_per_second", "mlx5_0") == 400 * GB
    assert info(r, "mlx5_0")["link_width"] == "4"  # a label of the port's identity (series budget)
    assert port(r, R + "expected_rate_bytes_per_second", "mlx5_0") == 400 * GB
    assert port(r, R + "rate_below_expected", "mlx5_0") == 0
    assert port(r, R + "errors_total", "mlx5_0", counter="symbol_error") == 0  # read; the exporter hides a 0
    assert port(r, R + "counters_saturated", "mlx5_0") is None  # none saturated: no series
    # the downtrained port: NDR speed on 2 lanes is 200 Gb/s
    assert port(r, R + "rate_bytes_per_second", "mlx5_2") == 200 * GB
    assert info(r, "mlx5_2")["link_width"] == "2"
    assert port(r, R + "rate_below_expected", "mlx5_2") == 1 and port(r, R + "up", "mlx5_2") == 1
    # error counters as the HCA counts them; symbol_error stuck at its 16-bit maximum
    assert port(r, R + "errors_total", "mlx5_1", counter="link_downed") == 3
    assert port(r, R + "errors_total", "mlx5_1", counter="port_rcv_errors") == 41
    assert port(r, R + "errors_total", "mlx5_1", counter="symbol_error") == 65535
    assert port(r, R + "counters_saturated", "mlx5_1") == 1
    counters = {dict(k[1])["counter"] for k in values(r) if k[0] == R + "errors_total"}
    assert counters == {"symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                        "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
                        "excessive_buffer_overrun_errors"}  # the data and packet counters stay out
    # the RoCE port: link layer Ethernet, its own expected rate, hardware counters from a fixed set
    assert info(r, "mlx5_4")["link_layer"] == "Ethernet"
    assert port(r, R + "rate_bytes_per_second", "mlx5_4") == 200 * GB
    assert port(r, R + "rate_below_expected", "mlx5_4") == 0
    assert port(r, R + "hw_events_total", "mlx5_4", counter="out_of_buffer") == 12
    assert port(r, R + "hw_events_total", "mlx5_4", counter="np_cnp_sent") == 4711
    assert port(r, R + "hw_events_total", "mlx5_4", counter="rx_write_requests") is None
    assert info(r, "mlx5_4") == {"device": "mlx5_4", "port": "1", "link_layer": "Ethernet", "link_width": "4",
                                 "hca_type": "MT4125",
                                 "fw_ver": "22.39.1002", "board_id": "MT_0000000359"}  # the device's identity too
    # the port without a cable: down, polling, and no rate judgement while down
    assert port(r, R + "up", "mlx5_5") == 0
    assert port(r, R + "physical_state", "mlx5_5", state="polling") == 1
    assert port(r, R + "rate_below_expected", "mlx5_5") is None
    assert port(r, R + "expected", "mlx5_5") == 0  # present, not in the list
    # the expected port that is not there
    assert port(r, R + "present", "mlx5_6") == 0 and port(r, R + "expected", "mlx5_6") == 1
    assert info(r, "mlx5_6") is None
    # a port that exists has its info series, and no present series (only an absent one is a finding)
    assert port(r, R + "present", "mlx5_0") is None and port(r, R + "expected", "mlx5_0") == 1
    assert not [k for k in values(r) if k[0] == R + "present" and dict(k[1])["device"] != "mlx5_6"]
    assert r.extra["missing_ports"] == ["mlx5_6/1"]
    assert value(r, "fleetcanary_rdma_ports_present") == 6
    assert value(r, "fleetcanary_rdma_ports_up") == 5
    assert value(r, "fleetcanary_rdma_ports_expected") == 6
    # Ethernet interfaces
    assert value(r, N + "up", interface="ens1f0np0") == 1
    assert value(r, N + "speed_bytes_per_second", interface="ens1f0np0") == 200000e6 / 8
    assert value(r, N + "mtu_bytes", interface="ens1f0np0") == 9000
    assert value(r, N + "carrier_changes_total", interface="ens1f0np0") == 6
    assert value(r, N + "errors_total", interface="ens1f0np0", direction="rx") == 3
    assert value(r, N + "dropped_total", interface="eth0", direction="rx") == 1377
    assert value(r, "fleetcanary_nic_sysfs_errors") == 0 and r.extra["problems"] == {}
    assert r.touched["invasive"] is False and "mlx5_3/1" in r.touched["rdma_ports"]


def test_hdr_node_speed_downtrain_armed_port_and_old_rate_format(tmp_path):
    r = run(tmp_path, "hdr_node", expected_rate_gbps=200, port_rates_gbps={"qib0/1": 10}, port_states=True,
            hw_counters=True)
    assert port(r, R + "rate_bytes_per_second", "mlx5_0") == 200 * GB
    assert port(r, R + "rate_below_expected", "mlx5_0") == 0
    # a 4X HDR port that trained at EDR speed: all lanes, half the rate
    assert info(r, "mlx5_1")["link_width"] == "4"
    assert port(r, R + "rate_bytes_per_second", "mlx5_1") == 100 * GB
    assert port(r, R + "rate_below_expected", "mlx5_1") == 1
    # LinkUp but only ARMED (no subnet manager activated it): not up, no rate judgement
    assert port(r, R + "up", "mlx5_2") == 0
    assert port(r, R + "state", "mlx5_2", state="armed") == 1
    assert port(r, R + "physical_state", "mlx5_2", state="link_up") == 1
    assert port(r, R + "rate_below_expected", "mlx5_2") is None
    # old kernels print SDR without its name
    assert port(r, R + "rate_bytes_per_second", "qib0") == 10 * GB and port(r, R + "rate_below_expected", "qib0") == 0
    hw = {dict(k[1])["device"] for k in values(r) if k[0] == R + "hw_events_total"}
    assert hw == {"mlx5_0", "mlx5_1"}  # mlx5_2 and qib0 have no hw_counters/
    assert value(r, "fleetcanary_rdma_ports_expected") is None
    assert port(r, R + "expected", "mlx5_0") is None  # no list configured: no judgement either way
    assert value(r, "fleetcanary_rdma_ports_up") == 3


def test_by_default_states_and_hardware_counters_stay_in_the_record(tmp_path):
    """What the alerts read is published (up, rates, error counters); the state enums and the driver hardware
    counters, which no rule reads, only with port_states and hw_counters: the run record has them either way."""
    r = run(tmp_path, "ndr_node", expected_rate_gbps=400, port_rates_gbps={"mlx5_4/1": 200})
    metrics = {k[0] for k in values(r)}
    assert not metrics & {R + "state", R + "physical_state", R + "hw_events_total"}
    assert {R + "up", R + "rate_bytes_per_second", R + "rate_below_expected", R + "errors_total",
            R + "counters_saturated", R + "info"} <= metrics
    assert "fleetcanary_rdma_device_info" not in metrics  # folded into the port's info series
    assert port(r, R + "up", "mlx5_5") == 0 and port(r, R + "errors_total", "mlx5_1", counter="link_downed") == 3
    assert len([k for k in values(r) if k[0] == R + "errors_total"]) == 6 * 8
    rec = {f"{p['device']}/{p['port']}": p for p in r.extra["ports"]}
    assert rec["mlx5_5/1"]["phys_state"] == (2, "Polling") and rec["mlx5_4/1"]["hw_counters"]["np_cnp_sent"] == 4711
    assert r.parameters["port_states"] is False and r.parameters["hw_counters"] is False


@pytest.mark.parametrize("text, parsed", [
    ("400 Gb/sec (4X NDR)", (400.0, 4, "NDR")), ("200 Gb/sec (4X HDR)", (200.0, 4, "HDR")),
    ("100 Gb/sec (2X HDR)", (100.0, 2, "HDR")), ("56 Gb/sec (4X FDR)", (56.0, 4, "FDR")),
    ("2.5 Gb/sec (1X SDR)", (2.5, 1, "SDR")), ("10 Gb/sec (4X)", (10.0, 4, "")),
    ("800 Gb/sec (4X XDR)", (800.0, 4, "XDR")), ("300 Gb/sec (12X QDR)", (300.0, 12, "QDR")),
    ("fast", None), ("400 Gb/sec", None), ("", None), ("-1 Gb/sec (4X NDR)", None)])
def test_rate_strings_the_kernel_prints(text, parsed):
    assert parse_rate(text) == parsed


def test_state_strings_the_kernel_prints():
    assert parse_state("4: ACTIVE") == (4, "ACTIVE")
    assert parse_state("5: ACTIVE_DEFER") == (5, "ACTIVE_DEFER")
    assert parse_state("4: PortConfigurationTraining") == (4, "PortConfigurationTraining")
    assert parse_state("7: Phy Test") == (7, "Phy Test")
    assert parse_state("ACTIVE") is None and parse_state("x: ACTIVE") is None


def test_rising_error_counters_between_two_runs_through_a_worker(tmp_path):
    """Two runs in real worker processes into the store: the running totals are set, never summed, so
    increase() in the rules sees exactly what the HCA counted between the runs."""
    root = tmp_path / "sys"
    shutil.copytree(SYSFS / "ndr_node", root)
    params = {"sysfs_root": str(root), "interfaces": ["ens1f0np0"]}
    store = ResultStore({"nic_health": NicHealth}, ["nic_health"])
    out = run_job(NicHealth, params, tmp_path, 30)
    assert out.outcome == "success", out
    store.apply(out)
    first = store.exposition.decode()
    # link_downed from 0 (the flap alert reads any increase()); the other counters once above 0
    assert 'fleetcanary_rdma_port_errors_total{counter="link_downed",device="mlx5_0",port="1"} 0.0' in first
    assert 'fleetcanary_rdma_port_errors_total{counter="symbol_error",device="mlx5_0",port="1"}' not in first
    assert 'fleetcanary_rdma_port_errors_total{counter="port_rcv_errors",device="mlx5_1",port="1"} 41.0' in first
    counters = root / "class/infiniband/mlx5_0/ports/1/counters"
    (counters / "link_downed").write_text("1\n")
    (counters / "symbol_error").write_text("25\n")
    (root / "class/net/ens1f0np0/carrier_changes").write_text("8\n")
    out = run_job(NicHealth, params, tmp_path, 30)
    assert out.outcome == "success", out
    store.apply(out)
    text = store.exposition.decode()
    assert 'fleetcanary_rdma_port_errors_total{counter="link_downed",device="mlx5_0",port="1"} 1.0' in text
    assert 'fleetcanary_rdma_port_errors_total{counter="symbol_error",device="mlx5_0",port="1"} 25.0' in text
    assert 'fleetcanary_rdma_port_errors_total{counter="link_downed",device="mlx5_1",port="1"} 3.0' in text
    assert 'fleetcanary_net_interface_carrier_changes_total{interface="ens1f0np0"} 8.0' in text
    assert "# TYPE fleetcanary_rdma_port_errors_total counter" in text


def test_a_port_that_disappears_is_reported_missing(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(SYSFS / "ndr_node", root)
    before = run(tmp_path, root, expected_port_count=6)
    assert value(before, "fleetcanary_rdma_ports_present") == 6
    assert value(before, "fleetcanary_rdma_ports_expected") == 6
    shutil.rmtree(root / "class/infiniband/mlx5_3")  # the HCA fell off the bus
    after = run(tmp_path, root, expected_port_count=6, expected_ports=["mlx5_3/1"])
    assert value(after, "fleetcanary_rdma_ports_present") == 5 and value(after, "fleetcanary_rdma_ports_expected") == 6
    assert port(after, R + "present", "mlx5_3") == 0 and port(after, R + "up", "mlx5_3") is None
    assert port(after, R + "expected", "mlx5_0") == 0  # present, but only mlx5_3/1 is listed


def test_damaged_and_missing_files_are_counted_and_named_never_a_crash(tmp_path):
    r = run(tmp_path, "broken_node", interfaces=["eth0", "eth9"], port_states=True)
    assert r.extra["problems"] == {
        "class/infiniband/mlx5_0/ports/1/state": "unexpected format: 'garbage'",
        "class/infiniband/mlx5_0/ports/1/rate": "unexpected format: 'fast'",
        "class/infiniband/mlx5_0/ports/1/link_layer": "absent",
        "class/infiniband/mlx5_0/ports/1/counters/symbol_error": "not an integer: '12x'",
        "class/infiniband/mlx5_0/ports/1/counters/link_downed": "not text",
        "class/infiniband/mlx5_1/ports": "absent",
        "class/net/eth0/statistics/tx_errors": "absent",
    }
    assert value(r, "fleetcanary_nic_sysfs_errors") == 7
    # what could be read is still published; what could not is absent, not a guess
    assert port(r, R + "physical_state", "mlx5_0", state="link_up") == 1
    assert port(r, R + "up", "mlx5_0") is None and port(r, R + "rate_bytes_per_second", "mlx5_0") is None
    assert info(r, "mlx5_0")["link_layer"] == ""  # the port is there; its link layer could not be read
    assert port(r, R + "errors_total", "mlx5_0", counter="port_rcv_errors") == 0
    assert port(r, R + "errors_total", "mlx5_0", counter="symbol_error") is None
    assert value(r, "fleetcanary_rdma_ports_present") == 1
    assert value(r, N + "errors_total", interface="eth0", direction="rx") == 0
    assert value(r, N + "errors_total", interface="eth0", direction="tx") is None
    assert value(r, N + "present", interface="eth9") == 0 and value(r, N + "up", interface="eth9") is None


def test_a_node_with_nothing_to_watch_skips_and_a_wrong_root_fails(tmp_path):
    with pytest.raises(ProbeSkipped) as ei:
        run(tmp_path, "cpu_node")
    assert ei.value.reason == "not_configured" and "class/infiniband" in ei.value.detail
    r = run(tmp_path, "cpu_node", interfaces=["eth0"])
    assert value(r, N + "up", interface="eth0") == 1 and value(r, "fleetcanary_rdma_ports_present") == 0
    # an expected port on a node without RDMA devices is a finding, not a skip
    r = run(tmp_path, "cpu_node", expected_ports=["mlx5_0/1"])
    assert port(r, R + "present", "mlx5_0") == 0
    with pytest.raises(ProbeError) as ei:
        run(tmp_path, tmp_path / "nowhere")
    assert ei.value.reason == "sysfs_unreadable"
    out = run_job(NicHealth, {"sysfs_root": str(SYSFS / "cpu_node")}, tmp_path, 30)
    assert (out.outcome, out.reason) == ("skipped", "not_configured")


@pytest.mark.parametrize("field, bad", [("interfaces", ["../../etc"]), ("interfaces", [".."]),
                                        ("devices", ["mlx5_0/ports"]), ("expected_ports", ["mlx5_0"]),
                                        ("expected_ports", ["../x/1"]), ("port_rates_gbps", {"mlx5_0/1": 0}),
                                        ("port_rates_gbps", {"mlx5_0": 400}), ("expected_rate_gbps", -1)])
def test_config_refuses_names_that_leave_sysfs_and_bad_rates(field, bad):
    with pytest.raises(ValidationError) as ei:
        Config(**{field: bad})
    assert field in str(ei.value)


# ------------------------------------------------------------------------------ real veth in a namespace
COLLECT = """
import json, sys, time
from fleetcanary.probes.base import ProbeContext
from fleetcanary.probes.nic_health import Config, NicHealth
r = NicHealth().run(Config(interfaces=sys.argv[1:]), ProbeContext("ns", "/tmp", time.monotonic() + 20))
print(json.dumps([[s.metric, s.labels, s.value] for s in r.samples]))
"""


@pytest.fixture
def netns():
    """A network namespace with a veth pair (fcva <-> fcvb) in it, both up; removed afterwards."""
    ip = require_binary("ip")
    if os.geteuid() != 0:
        unavailable("creating a network namespace needs root")
    ns = f"fcnic{os.getpid()}"
    r = subprocess.run([ip, "netns", "add", ns], capture_output=True, text=True)
    if r.returncode != 0:
        unavailable(f"cannot create a network namespace: {r.stderr.strip()}")
    try:
        for cmd in (["link", "add", "fcva", "type", "veth", "peer", "name", "fcvb"],
                    ["addr", "add", "169.254.77.1/30", "dev", "fcva"],
                    ["addr", "add", "169.254.77.2/30", "dev", "fcvb"],
                    ["link", "set", "fcva", "up"], ["link", "set", "fcvb", "up"]):
            subprocess.run([ip, "-n", ns, *cmd], check=True, capture_output=True)
        yield ip, ns
    finally:
        subprocess.run([ip, "netns", "del", ns], capture_output=True)
        assert ns not in subprocess.run([ip, "netns", "list"], capture_output=True, text=True).stdout


def collect(ip, ns, *interfaces) -> dict:
    """Run the probe inside the namespace: `ip netns exec` mounts that namespace's sysfs on /sys."""
    r = subprocess.run([ip, "netns", "exec", ns, sys.executable, "-I", "-c", COLLECT, *interfaces],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return {(m, tuple(sorted(labels.items()))): v for m, labels, v in json.loads(r.stdout)}


def test_carrier_changes_counted_when_a_real_link_goes_down_and_up(netns):
    ip, ns = netns

    def key(m: str, **kw: str) -> tuple:
        return m, tuple(sorted({"interface": "fcva", **kw}.items()))

    seen = wait_for(lambda: (v := collect(ip, ns, "fcva", "eth0")) and v.get(key(N + "up")) == 1 and v,
                    timeout=30, interval=0.2, what="fcva up")
    # the namespace has its own interfaces only: the host's eth0 is not in it
    assert seen[key(N + "present", interface="eth0")] == 0
    assert seen[key(N + "speed_bytes_per_second")] == 10000e6 / 8  # veth reports 10 Gb/s
    assert seen[key(N + "present")] == 1 and seen[key(N + "mtu_bytes")] == 1500
    before = seen[key(N + "carrier_changes_total")]
    subprocess.run([ip, "-n", ns, "link", "set", "fcvb", "down"], check=True)   # the peer drops: fcva loses carrier
    down = wait_for(lambda: (v := collect(ip, ns, "fcva")) and v.get(key(N + "up")) == 0 and v,
                    timeout=30, interval=0.2, what="fcva down")
    assert down[key(N + "carrier_changes_total")] == before + 1
    subprocess.run([ip, "-n", ns, "link", "set", "fcvb", "up"], check=True)
    up = wait_for(lambda: (v := collect(ip, ns, "fcva")) and v.get(key(N + "up")) == 1 and v,
                  timeout=30, interval=0.2, what="fcva up again")
    assert up[key(N + "carrier_changes_total")] == before + 2
    assert up[("fleetcanary_nic_sysfs_errors", ())] == 0
    # taken down itself: the kernel refuses speed and carrier reads (EINVAL); no value, and not a sysfs error
    subprocess.run([ip, "-n", ns, "link", "set", "fcva", "down"], check=True)
    off = wait_for(lambda: (v := collect(ip, ns, "fcva")) and v.get(key(N + "up")) == 0 and v,
                   timeout=30, interval=0.2, what="fcva admin down")
    assert key(N + "speed_bytes_per_second") not in off
    assert off[("fleetcanary_nic_sysfs_errors", ())] == 0


def _take_down(root: Path, device: str) -> None:
    (root / f"class/infiniband/{device}/ports/1/state").write_text("1: DOWN\n")
    (root / f"class/infiniband/{device}/ports/1/phys_state").write_text("2: Polling\n")


def test_with_no_list_a_port_down_after_being_up_is_expected_by_the_nodes_memory_for_a_day(tmp_path, monkeypatch):
    """The port-down alert reads `fleetcanary_rdma_port_expected == 1`: with no expected_ports list the probe
    publishes it for a port down now that it saw up within the last day (its memory in the state directory, kept
    across a restart of the exporter), never for a port it never saw up (mlx5_5: an uncabled port)."""
    from fleetcanary.probes import nic_health
    from fleetcanary.probes.lib import ports_seen

    root = tmp_path / "sys"
    shutil.copytree(SYSFS / "ndr_node", root)
    state = tmp_path / "state"
    t0 = 1_800_000_000.0
    monkeypatch.setattr(nic_health.time, "time", lambda: t0)

    def go():
        return NicHealth().run(Config(sysfs_root=str(root)), ProbeContext(
            node_name="t", state_dir=str(state), deadline_monotonic=time.monotonic() + 30))

    first = go()
    assert not [k for k in values(first) if k[0] == R + "expected"]  # a healthy node: no such series
    assert port(first, R + "up", "mlx5_5") == 0
    assert json.loads((state / "nic/ports_seen_up.json").read_text())["ports"]["mlx5_0/1"] == t0
    _take_down(root, "mlx5_0")
    monkeypatch.setattr(nic_health.time, "time", lambda: t0 + 3600)
    down = go()  # a new probe object, as after a restart: the memory is the file
    assert port(down, R + "up", "mlx5_0") == 0 and port(down, R + "expected", "mlx5_0") == 1
    assert port(down, R + "expected", "mlx5_5") is None and port(down, R + "expected", "mlx5_1") is None
    assert value(down, "fleetcanary_nic_sysfs_errors") == 0
    monkeypatch.setattr(nic_health.time, "time", lambda: t0 + ports_seen.WINDOW + 1)
    later = go()  # down for a day: forgotten, as the rule's day of history once forgot it
    assert port(later, R + "up", "mlx5_0") == 0 and port(later, R + "expected", "mlx5_0") is None
    assert "mlx5_0/1" not in json.loads((state / "nic/ports_seen_up.json").read_text())["ports"]


def test_a_list_decides_alone_and_the_memory_is_kept_beside_it(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(SYSFS / "ndr_node", root)
    run(tmp_path, root, expected_ports=["mlx5_1/1"])
    _take_down(root, "mlx5_0")
    r = run(tmp_path, root, expected_ports=["mlx5_1/1"])
    assert port(r, R + "expected", "mlx5_0") == 0  # up yesterday, but not listed: the list decides
    assert "mlx5_0/1" in json.loads((tmp_path / "nic/ports_seen_up.json").read_text())["ports"]


@pytest.mark.parametrize("content", [b"{not json", b'{"ports": [1, 2]}', b'{"ports": {"mlx5_0/1": "x"}}', b"\xff" * 10,
                                     b"[]"])
def test_a_malformed_memory_is_counted_named_and_rewritten_never_a_crash(tmp_path, content):
    root = tmp_path / "sys"
    shutil.copytree(SYSFS / "ndr_node", root)
    (tmp_path / "nic").mkdir(mode=0o700)
    (tmp_path / "nic/ports_seen_up.json").write_bytes(content)
    r = run(tmp_path, root)
    assert value(r, "fleetcanary_nic_sysfs_errors") == 1
    assert r.extra["problems"] == {str(tmp_path / "nic/ports_seen_up.json"): r.extra["problems"][
        str(tmp_path / "nic/ports_seen_up.json")]}
    assert r.extra["problems"][str(tmp_path / "nic/ports_seen_up.json")].startswith("malformed")
    assert port(r, R + "up", "mlx5_0") == 1  # the run is published whole
    again = run(tmp_path, root)
    assert value(again, "fleetcanary_nic_sysfs_errors") == 0
    assert set(json.loads((tmp_path / "nic/ports_seen_up.json").read_text())["ports"]) == {
        "mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "mlx5_3/1", "mlx5_4/1"}


def test_a_link_planted_as_the_memory_is_not_followed(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(SYSFS / "ndr_node", root)
    target = tmp_path / "elsewhere.json"
    target.write_text("keep")
    (tmp_path / "nic").mkdir(mode=0o700)
    (tmp_path / "nic/ports_seen_up.json").symlink_to(target)
    r = run(tmp_path, root)
    assert value(r, "fleetcanary_nic_sysfs_errors") == 1 and target.read_text() == "keep"
