import gzip
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from fleetcanary.core import config as configmod
from fleetcanary.daemon.service import Daemon
from fleetcanary.probes import PROBES
from fleetcanary.probes.lib import yamltext
from tests.conftest import SMALL_HOST_BW
from tests.support.clock import FakeClock
from tests.support.fault_probes import FAULT_PROBES
from tests.support.helpers import free_port, http_get, pid_alive, wait_for
from tests.support.helpers import metric_value as value
from tests.support.reliability import pids_in
from tests.support.timeline import Timeline, events, hang_deadline

ROOT = Path(__file__).resolve().parents[2]


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_daemon_serves_host_bandwidth_results_and_health(start_daemon):
    d = start_daemon({"probes": {"host_memory_bandwidth": SMALL_HOST_BW}}, env={"NODE_NAME": "node-a"})
    wait_for(lambda: value(d.metrics(), "fleetcanary_probe_success", probe="host_memory_bandwidth") == 1.0,
             timeout=60, what="first host bandwidth run")
    text = d.metrics()
    rec = d.results()["host_memory_bandwidth"]
    for op, bytes_per_element in (("copy", 2), ("triad", 3)):
        fig = next(f for f in rec["result"]["figures"] if f["name"] == op)
        assert value(text, "fleetcanary_host_memory_bandwidth_bytes_per_second", op=op) == fig["median"]
        # Each timed pass moved 2 (copy) or 3 (triad) arrays within the worker's lifetime, however slow the
        # machine: a floor from what the run measured (it catches a figure in the wrong unit), not a speed bar.
        floor = bytes_per_element * rec["result"]["parameters"]["array_bytes"] / rec["wall_seconds"]
        assert min(fig["repeats"]) >= floor, (op, fig["repeats"], floor)
    assert value(text, "fleetcanary_probe_runs_total", probe="host_memory_bandwidth", outcome="success") >= 1
    assert value(text, "fleetcanary_probe_last_success_timestamp_seconds", probe="host_memory_bandwidth") > 1.7e9
    assert value(text, "fleetcanary_config_last_reload_successful") == 1.0
    assert value(text, "fleetcanary_build_info") == 1.0
    info = next(s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "fleetcanary_node_info")
    assert info.labels["node_name"] == "node-a" and info.labels["cpu_cores"] == str(os.cpu_count())
    assert "From the last scheduled run" in text

    code, headers, body = http_get(d.url + "/metrics", headers={"Accept-Encoding": "gzip"})
    assert code == 200 and headers["Content-Encoding"] == "gzip"
    unzipped = gzip.decompress(body).decode()
    assert "fleetcanary_host_memory_bandwidth_bytes_per_second" in unzipped
    assert "process_resident_memory_bytes" in unzipped

    code, _, body = http_get(d.url + "/results")
    rec = json.loads(body)["host_memory_bandwidth"]
    assert code == 200 and rec["outcome"] == "success"
    fig = rec["result"]["figures"][0]
    assert len(fig["repeats"]) == 3 and fig["median"] > 0 and {"mad", "cv", "min", "max"} <= set(fig["dispersion"])
    assert rec["environment"]["gpu_count"] in (0, "unknown")
    assert http_get(d.url + "/healthz")[0] == 200
    assert http_get(d.url + "/readyz")[0] == 200
    assert http_get(d.url + "/nope")[0] == 404

    hist = [json.loads(x) for x in (d.state_dir / "results.jsonl").read_text().splitlines()]
    host = [h for h in hist if h["probe"] == "host_memory_bandwidth"]
    assert host and host[0]["outcome"] == "success" and host[0]["environment"]["hostname"]
    assert {h["outcome"] for h in hist if h["probe"].startswith("gpu_")} <= {"skipped"}


def test_sighup_reload_good_then_bad_keeps_serving(start_daemon):
    d = start_daemon({"probes": {"host_memory_bandwidth": SMALL_HOST_BW}})
    d.config_path.write_text(d.config_path.read_text() + "log_level: debug\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: value(d.metrics(), "fleetcanary_config_reloads_total", result="success") == 1.0,
             what="good reload")
    d.config_path.write_text("probes:\n  host_memory_bandwidth:\n    interval_seconds: -1\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: value(d.metrics(), "fleetcanary_config_last_reload_successful") == 0.0, what="bad reload flagged")
    assert value(d.metrics(), "fleetcanary_probe_interval_seconds", probe="host_memory_bandwidth") is not None
    assert http_get(d.url + "/healthz")[0] == 200
    assert "probes.host_memory_bandwidth.interval_seconds" in d.log()
    assert "Traceback" not in d.log()


def test_sigterm_stops_promptly_and_cleanly(start_daemon):
    d = start_daemon({"probes": {"host_memory_bandwidth": SMALL_HOST_BW}})
    t0 = time.monotonic()
    assert d.stop() == 0
    # Promptly: before the probe's deadline (20 s) or its next run (30 s) could end a wait on either; the
    # daemon kills a running worker instead. A bound on a hang, not a speed bar.
    assert time.monotonic() - t0 < SMALL_HOST_BW["timeout_seconds"]
    assert "Traceback" not in d.log()


def test_port_in_use_is_one_line_and_nonzero(tmp_path, start_daemon):
    d = start_daemon({"probes": {"host_memory_bandwidth": {**SMALL_HOST_BW, "enabled": False}}})
    r = subprocess.run([sys.executable, "-m", "fleetcanary", "run", "--listen-address", f"127.0.0.1:{d.port}"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={**os.environ, "FLEETCANARY_STATE_DIR": str(tmp_path)})
    assert r.returncode == 1 and "cannot listen" in r.stderr and "Traceback" not in r.stderr


def test_daemon_never_imports_torch_or_nvml(tmp_path):
    """Runs a daemon with every probe once, in a fresh interpreter, then checks its modules. The two probes that
    measure on a CPU at small sizes (what they import does not depend on the size; at the defaults they took 10
    of the test's 13 s)."""
    cfg = tmp_path / "small.yaml"
    cfg.write_text(yaml.safe_dump({"probes": {"host_memory_bandwidth": SMALL_HOST_BW,
                                              "collectives": {"params": {"sizes_bytes": [8, 1024],
                                                                         "iterations": 2}}}}))
    script = f"""
import sys, json
from fleetcanary.core import config
from fleetcanary.daemon.service import Daemon
s = config.load({str(cfg)!r}, env={{"FLEETCANARY_STATE_DIR": {str(tmp_path)!r},
                           "FLEETCANARY_LISTEN_ADDRESS": "127.0.0.1:{free_port()}"}})
d = Daemon(s)
outs = [d.run_probe(n).outcome for n in d.probe_map]
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "pynvml") or m.startswith("fleetcanary.offline"))
maps = open("/proc/self/maps").read()
libs = [x for x in ("libtorch", "libnvidia-ml", "libcuda") if x in maps]
print(json.dumps({{"outcomes": outs, "bad": bad, "libs": libs}}))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["outcomes"] and set(res["outcomes"]) <= {"success", "skipped"}, res
    assert res["bad"] == [] and res["libs"] == [], res


HANGS = ("hang", "ignore_term", "fork_hang")
GRACE = 1.0


def test_faulty_probes_never_stop_serving_or_scheduling(tmp_path):
    """Four faulty probes, each run twice, on a fake clock: the schedule takes no time, each run takes real
    time (a worker starts, then hangs until it is killed, or aborts). /metrics answers throughout, every
    run is classified, none publishes a success, each run's duration is at least its deadline (plus the
    grace when SIGTERM is ignored) and at most the real time the rounds took, and nothing is left.

    The hanging probes are timeline probes (tests/support/timeline.py) with a deadline sized from a
    start-up measured now; abort ends on its own, so its deadline (60 s) only bounds a hang."""
    deadline = hang_deadline(tmp_path)
    interval = 4 * 60.0
    probe_map = {**PROBES, "abort": FAULT_PROBES["abort"], **dict.fromkeys(HANGS, Timeline)}
    port = free_port()
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    logs = {n: tmp_path / f"{n}.jsonl" for n in HANGS}
    cfg = {"state_dir": str(tmp_path / "s"), "server": {"listen_address": f"127.0.0.1:{port}"},
           "worker_kill_grace_seconds": GRACE,
           "probes": {**{n: {"enabled": False} for n in PROBES},  # only the faulty ones
                      "abort": {"interval_seconds": interval, "timeout_seconds": 60, "jitter_seconds": 0,
                                "params": {"pid_file": str(pid_dir / "abort")}},
                      **{n: {"interval_seconds": interval, "timeout_seconds": deadline,
                             "jitter_seconds": 0, "params": {"log_file": str(logs[n]), "mode": n}}
                         for n in HANGS}}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    failures, scrapes, stop = [], [0], threading.Event()

    def scrape():
        while not stop.is_set():
            code, _, _ = http_get(f"http://127.0.0.1:{port}/metrics", timeout=30)
            scrapes[0] += 1
            if code != 200:
                failures.append(code)

    with FakeClock() as clock:
        d = Daemon(configmod.load(p, probe_map=probe_map, env={}), config_path=str(p), probe_map=probe_map,
                   clock=clock)
        d.start()
        t = threading.Thread(target=scrape, daemon=True)
        t.start()
        try:
            t0 = time.monotonic()
            clock.advance(interval)  # two rounds, the four probes of each at once
            advanced = time.monotonic() - t0  # the real time the rounds took: no run lasted longer
            text = http_get(f"http://127.0.0.1:{port}/metrics")[2].decode()
        finally:
            stop.set()
            t.join(timeout=30)
            d.stop()
    assert failures == [] and scrapes[0] > 0
    assert value(text, "fleetcanary_probe_runs_total", probe="abort", outcome="crash") == 2
    assert value(text, "fleetcanary_probe_crashes_total", probe="abort", reason="killed_by_signal") == 2
    for n in HANGS:
        assert value(text, "fleetcanary_probe_runs_total", probe=n, outcome="timeout") == 2, n
    pids = pids_in(pid_dir)
    for n in (*HANGS, "abort"):
        assert value(text, "fleetcanary_probe_success", probe=n) == 0.0
    for n in HANGS:
        ev = events(logs[n])
        pids += [e["pid"] for e in ev if e["event"] == "start"]
        # the duration published is the last run's: not shorter than physics allows (its deadline, plus the
        # grace when SIGTERM was ignored), not longer than the real time the rounds took. SIGTERM is ignored
        # only once the worker's handler noted it: on a loaded machine the deadline can come while the worker
        # is still starting, and SIGTERM ends it at once (each run of ignore_term is one process: the second
        # start, when there is one, is the last run's)
        starts = [e["pid"] for e in ev if e["event"] == "start"]
        ignored = n == "ignore_term" and len(starts) == 2 and any(
            e["event"] == "term" and e["pid"] == starts[-1] for e in ev)
        floor = deadline + (GRACE if ignored else 0.0)
        duration = value(text, "fleetcanary_probe_duration_seconds", probe=n)
        assert floor <= duration <= advanced, (n, duration, floor, advanced)
    assert len(pids) >= 2 + 3  # abort's two runs, and at least a run of each hanging probe
    wait_for(lambda: not any(pid_alive(x) for x in pids), timeout=30, what="no faulty probe process left")


def bandwidth_daemon(tmp_path) -> Daemon:
    """A daemon (not started) whose gpu_bandwidth runs on the CPU, its state in tmp_path."""
    cfg = {"state_dir": str(tmp_path), "server": {"listen_address": f"127.0.0.1:{free_port()}"},
           "probes": {"gpu_bandwidth": {"params": {"device": "cpu", "d2d_bytes": 4 << 20, "host_bytes": 2 << 20,
                                                   "repeats": 2}}}}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return Daemon(configmod.load(p, env={}), config_path=str(p))


def test_a_target_probe_without_targets_is_off_in_all_but_name_until_a_reload_gives_it_one(tmp_path):
    """storage, object_storage and inference are enabled by default; with no target each run skips
    not_configured (in /results) and the probe publishes no fleetcanary_probe_* series, as a probe that is off."""
    d = bandwidth_daemon(tmp_path)
    try:
        out = d.run_probe("storage")
        assert (out.outcome, out.reason) == ("skipped", "not_configured")
        text = d.store.exposition.decode()
        assert 'fleetcanary_probe_interval_seconds{probe="gpu_bandwidth"}' in text
        assert not re.search(r'probe="(storage|object_storage|inference)"', text)
        path = Path(d.config_path)
        cfg = yamltext.load(path.read_text())
        cfg["probes"]["storage"] = {"params": {"targets": [{"name": "scratch", "path": str(tmp_path)}]}}
        path.write_text(yaml.safe_dump(cfg))
        assert d.reload()
        text = d.store.exposition.decode()
        assert 'fleetcanary_probe_interval_seconds{probe="storage"}' in text
        assert value(text, "fleetcanary_probe_runs_total", probe="storage", outcome="skipped") == 1
        assert not re.search(r'probe="(object_storage|inference)"', text)
    finally:
        d.server.stop()


def test_gpu_seconds_feed_the_metric_and_the_hourly_budget(tmp_path):
    d = bandwidth_daemon(tmp_path)
    out = d.run_probe("gpu_bandwidth")
    assert out.outcome == "success", out
    spent = out.result["gpu_seconds"]["0"]
    assert spent > 0
    assert d.budget.left()["0"] == 18.0 - spent
    assert f'fleetcanary_gpu_probe_seconds_total{{gpu="0"}} {spent!r}' in d.store.exposition.decode()
    d.server.stop()


def test_the_gpu_budget_survives_a_restart(tmp_path):
    """GPU seconds spent before a restart still count after it (gpu-budget.json in the state directory); charges
    older than a day, from the future, or malformed are dropped."""
    d = bandwidth_daemon(tmp_path)
    try:
        out = d.run_probe("gpu_bandwidth")
        assert out.outcome == "success", out
        spent = out.result["gpu_seconds"]["0"]
        before = d.budget.left()["0"]
    finally:
        d.server.stop()
    assert before == d.budget.seconds_per_window - spent
    charges = json.loads((tmp_path / "gpu-budget.json").read_text())
    now = time.time()
    charges += [["1", now - 2 * 86400, 5.0, 3600.0, "x"], ["1", now + 600, 5.0, 3600.0, "x"], ["bad"], "junk"]
    (tmp_path / "gpu-budget.json").write_text(json.dumps(charges))
    d2 = bandwidth_daemon(tmp_path)
    try:
        after = d2.budget.left()
    finally:
        d2.server.stop()
    assert abs(after["0"] - before) < 1e-6 and "1" not in after


def test_a_reload_applies_the_connection_caps_to_the_next_connections(start_daemon):
    """server.max_connections is read at each accept: after a SIGHUP that lowers it to 4, the fifth connection
    whose request never ends makes room by cutting the longest waiter (counted), which the first config's 64
    never did."""
    import socket
    d = start_daemon({"probes": {"host_memory_bandwidth": SMALL_HOST_BW}})
    host, port = d.url.removeprefix("http://").rsplit(":", 1)
    conf = yamltext.load(d.config_path.read_text())

    def hold(n: int) -> list[socket.socket]:
        socks = []
        for _ in range(n):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")  # headers that never end
            socks.append(s)
        return socks

    def cut() -> float:
        return value(d.metrics(), "fleetcanary_http_connections_refused_total", reason="cut") or 0.0

    held = hold(6)
    try:
        wait_for(lambda: http_get(d.url + "/healthz")[0] == 200, what="the daemon answers beside 6 idle connections")
        assert cut() == 0.0
    finally:
        for s in held:
            s.close()
    conf.setdefault("server", {})["max_connections"] = 4
    d.config_path.write_text(yaml.safe_dump(conf))
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: value(d.metrics(), "fleetcanary_config_reloads_total", result="success") == 1.0,
             what="the reload")
    held = hold(6)
    try:
        wait_for(lambda: cut() >= 1.0, what="a waiter cut under the reloaded cap of 4")
    finally:
        for s in held:
            s.close()
    assert "Traceback" not in d.log()
