"""A real Prometheus scrapes a running fleetcanary; promtool lints the exposition."""
import subprocess

from tests.conftest import SMALL_HOST_BW
from tests.support.helpers import http_get, require_binary, wait_for
from tests.support.prometheus import Prometheus


def test_prometheus_scrapes_host_bandwidth(tmp_path, start_daemon):
    d = start_daemon({"probes": {"host_memory_bandwidth": SMALL_HOST_BW}})
    prom = Prometheus(tmp_path / "prom", [f"127.0.0.1:{d.port}"])
    try:
        result = wait_for(lambda: prom.query('fleetcanary_host_memory_bandwidth_bytes_per_second{op="triad"}'),
                          timeout=60, what="host bandwidth series in Prometheus")
        assert result[0]["metric"]["node"] == "test-node"
        # the daemon's own triad figure, and at least the bytes each pass moved over the worker's lifetime (a floor
        # from the run itself, however slow the machine; a figure in the wrong unit falls far below it)
        rec = d.results()["host_memory_bandwidth"]
        triad = next(f for f in rec["result"]["figures"] if f["name"] == "triad")
        assert float(result[0]["value"][1]) == triad["median"]
        assert triad["median"] >= 3 * rec["result"]["parameters"]["array_bytes"] / rec["wall_seconds"]
        ok = prom.query('fleetcanary_probe_success{probe="host_memory_bandwidth"}')
        assert float(ok[0]["value"][1]) == 1.0
        assert prom.targets_up()
    finally:
        prom.stop()


def test_promtool_check_metrics_has_no_findings(start_daemon):
    promtool = require_binary("promtool")
    d = start_daemon({"probes": {"host_memory_bandwidth": SMALL_HOST_BW}})
    wait_for(lambda: 'fleetcanary_probe_success{probe="host_memory_bandwidth"} 1.0' in d.metrics(),
             timeout=60, what="a successful run")
    body = http_get(d.url + "/metrics")[2]
    r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().strip() == "" and r.stderr.decode().strip() == "", (r.stdout, r.stderr)
