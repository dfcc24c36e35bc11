"""Hostile config files (issue 37): whatever the file holds, `check-config` answers exit 2 with one line per
problem naming where it is, the loader raises ConfigError and nothing else, and a SIGHUP reload of the file
keeps the running daemon and its config."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetcanary.core import config as configmod
from tests.support.helpers import metric_value as value
from tests.support.helpers import wait_for
from tests.support.reliability import fault_daemon

ROOT = Path(__file__).resolve().parents[2]
DEPTH = 3000  # past Python's recursion limit (1000): yaml's composer recursed once per level


def deep_flow(depth: int = DEPTH) -> str:
    return "gpu: " + "[" * depth + "]" * depth + "\n"


def deep_block(depth: int = 200) -> str:
    return "".join("  " * i + f"k{i}:\n" for i in range(depth)) + "  " * depth + "v: 1\n"


def laughs() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def big() -> str:
    # a valid config padded with comments past 4 MiB: the bound is the file's size, checked before parsing
    return "node_name: big\n" + "# padding padding padding padding padding padding padding padding\n" * 80_000


# (name, file text, fragment of the one line that must name the problem)
HOSTILE = [
    ("deep_flow", deep_flow(), "exceeded maximum nesting depth"),
    ("deep_block", deep_block(), "nested deeper than 64 levels"),
    ("deep_alias", "a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 40 + "*a" + "]" * 40 + "\n",
     "nested deeper than 64 levels (through alias *a)"),
    ("laughs", laughs(), "more than 1000000 values with aliases expanded"),
    ("size", big(), "larger than 4 MiB"),
    ("dup_top", "gpu:\n  budget_ratio: 0.01\ngpu:\n  busy_utilization_ratio: 0.1\n",
     "line 3, column 1: duplicate key 'gpu' (first given on line 1)"),
    ("dup_nested", "gpu:\n  budget_ratio: 0.01\n  budget_ratio: 0.5\n",
     "line 3, column 3: duplicate key 'budget_ratio' (first given on line 2)"),
    ("dup_params", "probes:\n  inference:\n    params:\n      targets: []\n      targets: []\n",
     "line 5, column 7: duplicate key 'targets'"),
    ("ratio_yes", "gpu:\n  budget_ratio: yes\n", "gpu.budget_ratio: must be a number, not a boolean"),
    ("ratio_on", "gpu:\n  busy_utilization_ratio: on\n", "gpu.busy_utilization_ratio: must be a number"),
    ("interval_true", "probes:\n  host_memory_bandwidth:\n    interval_seconds: true\n",
     "probes.host_memory_bandwidth.interval_seconds: must be a number, not a boolean"),
    ("probe_param_yes", "probes:\n  inference:\n    params:\n      targets:\n        - {name: a, base_url: "
     "'http://127.0.0.1:1/v1', model: m, connect_timeout_seconds: yes}\n",
     "probes.inference.params.targets.0.connect_timeout_seconds: must be a number, not a boolean"),
    ("int_yes", "history:\n  backups: yes\n", "history.backups: must be a number, not a boolean"),
    ("web_config_missing", "server:\n  web_config_file: /nonexistent/fleetcanary-web.yml\n",
     "server.web_config_file: file not found: /nonexistent/fleetcanary-web.yml"),
    ("secret_file_missing", "probes:\n  fabric:\n    enabled: true\n    params:\n      secret_file: /nonexistent/s\n",
     "probes.fabric.params.secret_file: file not found"),
    ("token_file_missing", "probes:\n  inference:\n    enabled: true\n    params:\n      targets:\n        - {name: a, "
     "base_url: 'http://127.0.0.1:1/v1', model: m, token_file: /nonexistent/token}\n",
     "probes.inference.params.targets.0.token_file: file not found"),
    ("bad_date", "node_name: 2001-02-30\n", "a value YAML cannot read"),
]


def check_config(path, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetcanary", "check-config", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


@pytest.mark.parametrize("name,text,fragment", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_check_config_refuses_a_hostile_file_with_exit_2_and_one_line(tmp_path, name, text, fragment):
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    r = check_config(p)
    assert r.returncode == 2, (r.returncode, r.stdout[-300:], r.stderr[-600:])
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith(f"fleetcanary: config error: {p}: ") and fragment in lines[0], lines[0]


def test_check_config_refuses_a_fifo_without_blocking(tmp_path):
    p = tmp_path / "fifo.yaml"
    os.mkfifo(p)
    r = check_config(p, timeout=30)  # the old loader blocked here forever, waiting for a writer
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"fleetcanary: config error: {p}: cannot read: not a regular file"]


def test_the_web_config_flag_names_a_missing_file(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fleetcanary", "run", "--web.config.file", str(tmp_path / "no.yml")],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"fleetcanary: config error: --web.config.file: file not found: {tmp_path / 'no.yml'}"]


def test_existing_files_and_disabled_probes_pass_the_path_check(tmp_path):
    token = tmp_path / "token"
    token.write_text("k\n")
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"probes": {
        "inference": {"enabled": True, "params": {"targets": [
            {"name": "a", "base_url": "http://127.0.0.1:1/v1", "model": "m", "token_file": str(token)}]}},
        # a disabled probe's files are not read, so they need not be mounted
        "fabric": {"enabled": False, "params": {"secret_file": "/nonexistent/s"}}}}))
    assert configmod.load(p).probes.inference.params.targets[0].token_file == str(token)
    # and a real boolean is still a boolean, a real number still a number
    p.write_text("gpu:\n  budget_ratio: 0.01\n  skip_when_compute_processes: no\n")
    s = configmod.load(p)
    assert s.gpu.budget_ratio == 0.01 and s.gpu.skip_when_compute_processes is False


@pytest.mark.parametrize("name,text,fragment", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_the_loader_raises_config_error_only(tmp_path, name, text, fragment):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(configmod.ConfigError) as ei:
        configmod.load(p, env={})
    assert len(ei.value.lines) == 1 and fragment in ei.value.lines[0]
    assert all("\n" not in line for line in ei.value.lines)


# --- properties -------------------------------------------------------------------------------------------
def assert_settings_or_one_line_errors(p: Path) -> None:
    """load() returns settings or raises ConfigError with one-line messages; any other exception fails."""
    lines = None
    try:
        configmod.load(p, env={})
    except configmod.ConfigError as exc:
        lines = exc.lines
    if lines is not None:
        assert lines and all(line and "\n" not in line and "\r" not in line for line in lines), lines


YAML_PIECES = st.sampled_from([
    "gpu:", "server:", "probes:", "history:", "  ", "    ", "\n", "- ", "[", "]", "{", "}", ", ", ": ", "&a ", "*a",
    "<<: *a", "yes", "no", "on", "1", "0.5", "-1", "1e400", ".nan", "~", "'x'", '"\\x"', "!!binary AAAA", "!!set",
    "? ", "budget_ratio", "interval_seconds", "web_config_file", "listen_address", "host_memory_bandwidth",
    "params", "enabled", "targets", "2001-02-30", "%YAML 1.1\n", "---\n", "...\n", "|\n", ">\n", "#", "\t", "\x00",
    "\ufeff", "é",
])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(YAML_PIECES, max_size=40).map("".join))
def test_property_any_yaml_text_gives_settings_or_one_line_errors(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text, encoding="utf-8")
    assert_settings_or_one_line_errors(p)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_property_any_bytes_give_settings_or_one_line_errors(tmp_path, raw):
    p = tmp_path / "c.yaml"
    p.write_bytes(raw)
    assert_settings_or_one_line_errors(p)


# --- the running daemon -----------------------------------------------------------------------------------
def test_a_sighup_with_hostile_files_keeps_the_daemon_and_its_config(tmp_path):
    d = fault_daemon(tmp_path, {"quick": {"interval_seconds": 3, "timeout_seconds": 2, "jitter_seconds": 0}})
    assert value(d.metrics(), "fleetcanary_probe_interval_seconds", probe="quick") == 3.0
    good = d.config_path.read_text()
    hostile = [deep_flow(), deep_block(), laughs(), big(), HOSTILE[5][1], "gpu:\n  budget_ratio: yes\n",
               "server:\n  web_config_file: /nonexistent/fleetcanary-web.yml\n"]
    for i, text in enumerate(hostile, start=1):
        # keep the daemon's own settings (listen address, state_dir) so only the hostile part differs
        d.config_path.write_text(good + text if not text.startswith("node_name: big") else text)
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda i=i: d.proc.poll() is not None or
                 (value(d.metrics(), "fleetcanary_config_reloads_total", result="failure") or 0) >= i,
                 timeout=60, what=f"hostile reload {i} to be refused")
        assert d.proc.poll() is None, f"the daemon exited {d.proc.returncode} on hostile reload {i}: {d.log()[-2000:]}"
        text_metrics = d.metrics()
        assert value(text_metrics, "fleetcanary_config_last_reload_successful") == 0
        assert value(text_metrics, "fleetcanary_probe_interval_seconds", probe="quick") == 3.0  # the old config
    log = d.log()
    assert "Traceback" not in log and "RecursionError" not in log
    refused = [line for line in log.splitlines() if "config reload failed" in line]
    assert len(refused) == len(hostile), refused  # one line each
    # a good file after all that is taken
    d.config_path.write_text(good.replace("interval_seconds: 3", "interval_seconds: 4"))
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: value(d.metrics(), "fleetcanary_config_reloads_total", result="success") == 1,
             timeout=60, what="the good reload")
    text_metrics = d.metrics()
    assert value(text_metrics, "fleetcanary_config_last_reload_successful") == 1
    assert value(text_metrics, "fleetcanary_probe_interval_seconds", probe="quick") == 4.0
    assert d.stop() == 0
