import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetcanary.core import config as configmod
from tests.support.results import cli_in_process

ROOT = Path(__file__).resolve().parents[2]

# (config text, a fragment the one-line message must contain: the field path)
INVALID = [
    ("bogus: 1\n", "bogus: unknown key"),
    ("server:\n  listen_address: 'localhost'\n", "server.listen_address"),
    ("server:\n  listen_address: ':70000'\n", "server.listen_address"),
    ("server:\n  listen_address: ':http'\n", "server.listen_address"),
    ("server:\n  nope: 1\n", "server.nope: unknown key"),
    ("probes:\n  host_memory_bandwidth:\n    interval_seconds: -5\n", "probes.host_memory_bandwidth.interval_seconds"),
    ("probes:\n  host_memory_bandwidth:\n    interval_seconds: 'often'\n",
     "probes.host_memory_bandwidth.interval_seconds"),
    ("probes:\n  host_memory_bandwidth:\n    interval_seconds: 60\n    timeout_seconds: 60\n",
     "probes.host_memory_bandwidth: timeout_seconds (60) must be shorter than interval_seconds (60)"),
    ("probes:\n  host_memory_bandwidth:\n    interval_seconds: 60\n    timeout_seconds: 30\n    jitter_seconds: 90\n",
     "probes.host_memory_bandwidth: jitter_seconds (90) must be shorter"),
    ("probes:\n  host_memory_bandwidth:\n    enabled: 'maybe'\n", "probes.host_memory_bandwidth.enabled"),
    ("probes:\n  host_memory_bandwidth:\n    params:\n      repeats: 0\n",
     "probes.host_memory_bandwidth.params.repeats"),
    ("probes:\n  host_memory_bandwidth:\n    params:\n      buffer: 1\n",
     "probes.host_memory_bandwidth.params.buffer: unknown key"),
    ("probes:\n  no_such_probe: {}\n", "probes.no_such_probe: unknown key"),
    ("history:\n  max_bytes: 10\n", "history.max_bytes"),
    ("history:\n  backups: -1\n", "history.backups"),
    ("gpu:\n  budget_ratio: 2\n", "gpu.budget_ratio"),
    ("gpu:\n  busy_utilization_ratio: -0.1\n", "gpu.busy_utilization_ratio"),
    ("log_level: loud\n", "log_level"),
    ("- just\n- a list\n", "(top level): must be a mapping"),
    ("server: [1, 2\n", "line 2, column 1"),
    ("worker_kill_grace_seconds: 0\n", "worker_kill_grace_seconds"),
]


def check_config(path: str) -> subprocess.CompletedProcess:
    """`fleetcanary check-config PATH` in-process (a few dozen cases); the process exit of a bad config is
    test_run_with_bad_config_exits_2_without_traceback's, through `python -m fleetcanary`."""
    return cli_in_process("check-config", path)


@pytest.mark.parametrize("text,fragment", INVALID, ids=[f"invalid{i}" for i in range(len(INVALID))])
def test_invalid_config_exits_2_with_one_line_naming_the_field(tmp_path, text, fragment):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    r = check_config(str(p))
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) >= 1
    assert all(line.startswith("fleetcanary: config error: ") for line in lines), lines
    assert "Traceback" not in r.stderr
    assert any(fragment in line for line in lines), (fragment, lines)


def test_missing_and_unreadable_files(tmp_path):
    r = check_config(str(tmp_path / "absent.yaml"))
    assert r.returncode == 2 and "file not found" in r.stderr and "Traceback" not in r.stderr
    d = tmp_path / "dir.yaml"
    d.mkdir()
    r = check_config(str(d))
    assert r.returncode == 2 and "cannot read" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    b = tmp_path / "binary.yaml"
    b.write_bytes(b"\xff\xfe\x00garbage")
    r = check_config(str(b))
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_permission_denied(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("{}")
    p.chmod(0)
    # Root reads any file, so as root the load runs with the effective UID of `nobody`.
    root = os.geteuid() == 0
    if root:
        os.seteuid(65534)
    try:
        with pytest.raises(configmod.ConfigError) as ei:
            configmod.load(p, env={})
    finally:
        if root:
            os.seteuid(0)
    assert ei.value.lines == [f"{p}: cannot read: Permission denied"]


def test_several_errors_each_on_its_own_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("bogus: 1\nserver:\n  listen_address: nope\nhistory:\n  backups: -3\n")
    r = check_config(str(p))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 3
    assert {"bogus", "server.listen_address", "history.backups"} <= {ln.split(": ")[3] for ln in lines}


def test_empty_file_and_no_file_give_working_defaults(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("")
    r = check_config(str(p))
    assert r.returncode == 0 and "ok" in r.stdout and "host_memory_bandwidth" in r.stdout
    s = configmod.load(None, env={})
    assert s.server.listen_address == f":{configmod.DEFAULT_PORT}"
    entry = s.probe_entries()["host_memory_bandwidth"]
    assert entry.enabled and entry.timeout_seconds < entry.interval_seconds
    assert entry.effective_jitter_seconds == pytest.approx(0.1 * entry.interval_seconds)


def test_environment_overrides_what_kubernetes_injects(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("node_name: from-file\nstate_dir: /from/file\n")
    s = configmod.load(p, env={"NODE_NAME": "gpu-node-17", "FLEETCANARY_STATE_DIR": str(tmp_path),
                               "FLEETCANARY_LISTEN_ADDRESS": "127.0.0.1:9999", "FLEETCANARY_POOL": "h100-a"})
    assert s.node_name == "gpu-node-17"
    assert s.state_dir == str(tmp_path)
    assert s.server.listen_address == "127.0.0.1:9999"
    assert s.pool == "h100-a"
    with pytest.raises(configmod.ConfigError) as ei:
        configmod.load(None, env={"FLEETCANARY_LISTEN_ADDRESS": "bad"})
    assert "server.listen_address" in ei.value.lines[0]


def test_every_field_has_a_default_and_a_description():
    model = configmod.settings_model()

    seen = []

    def walk(m, path):
        for name, f in m.model_fields.items():
            assert not f.is_required(), f"{path}{name} has no default"
            seen.append(path + name)
            sub = f.annotation
            if isinstance(sub, type) and hasattr(sub, "model_fields"):
                walk(sub, f"{path}{name}.")
    walk(model, "")
    assert "probes.host_memory_bandwidth.params.repeats" in seen
    from fleetcanary.probes import PROBES
    for cls in PROBES.values():
        for name, f in cls.Config.model_fields.items():
            assert not f.is_required(), f"{cls.name}.{name} has no default"
            assert f.description, f"{cls.name}.{name} documents no unit/meaning"


def test_run_with_bad_config_exits_2_without_traceback(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("probes:\n  host_memory_bandwidth:\n    timeout_seconds: 900\n")
    r = subprocess.run([sys.executable, "-m", "fleetcanary", "run", "--config", str(p)],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "timeout_seconds" in r.stderr and "Traceback" not in r.stderr


def test_the_shipped_example_config_is_valid():
    r = check_config(str(ROOT / "config.example.yaml"))
    assert r.returncode == 0, r.stderr
    assert "8 probes enabled" in r.stdout or "probes enabled" in r.stdout
    s = configmod.load(ROOT / "config.example.yaml", env={})
    assert s.probe_entries()["storage"].params.targets[0].name == "local-nvme"
    assert s.gpu.expected_count == 8
