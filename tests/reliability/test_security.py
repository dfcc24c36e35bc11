"""Security: TLS >= 1.2 and bcrypt basic auth from an exporter-toolkit web config, no state-changing
endpoint, hostile label values, secrets kept out of logs, metrics and results."""
import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import bcrypt
import pytest
import trustme
import yaml

from fleetcanary.daemon import webconfig
from tests.conftest import ROOT
from tests.support.daemon import Daemon
from tests.support.helpers import free_port, require_binary, wait_for
from tests.support.llm import sim_server
from tests.support.prometheus import Prometheus

PASSWORD = "s3cret-canary-pass"


def get(url: str, ctx=None, user=None, password=None, method="GET"):
    req = urllib.request.Request(url, method=method)
    if user is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def tls(tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return ca, tmp_path / "server.pem", tmp_path / "ca.pem"


def served(tmp_path, web: dict | None, ssl_context=None) -> Daemon:
    """A daemon with the web config ``web`` (none: plain HTTP); ``ssl_context``: the client's, for TLS."""
    args = ()
    if web is not None:
        (tmp_path / "web.yml").write_text(yaml.safe_dump(web))
        args = ("--web.config.file", str(tmp_path / "web.yml"))
    return Daemon(tmp_path, {"probes": {"host_memory_bandwidth": {"params": {"array_bytes": 8 << 20, "repeats": 2},
                                                                   "interval_seconds": 30, "timeout_seconds": 20}}},
                  args=args, ssl_context=ssl_context)


def client_ctx(ca_path, max_version=None):
    ctx = ssl.create_default_context(cafile=str(ca_path))
    if max_version is not None:
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = max_version
    return ctx


def test_tls_with_basic_auth(tmp_path, tls):
    _, pem, ca = tls
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode().replace("$2b$", "$2y$")
    ctx = client_ctx(ca)
    s = served(tmp_path, {"tls_server_config": {"cert_file": str(pem), "key_file": str(pem), "min_version": "TLS12"},
                          "basic_auth_users": {"prometheus": hashed},
                          "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}}}, ctx)
    url = f"https://127.0.0.1:{s.port}"
    try:
        wait_for(lambda: get(url + "/healthz", ctx)[0] == 200, timeout=30, what="TLS healthz")
        assert get(url + "/metrics", ctx)[0] == 401
        assert get(url + "/metrics", ctx, "prometheus", "wrong")[0] == 401
        assert get(url + "/metrics", ctx, "nobody", PASSWORD)[0] == 401
        assert get(url + "/results", ctx)[0] == 401 and get(url + "/", ctx)[0] == 401
        code, body = get(url + "/metrics", ctx, "prometheus", PASSWORD)
        assert code == 200 and b"fleetcanary_build_info" in body
        # nothing changes state over HTTP, with or without credentials
        for method in ("POST", "PUT", "DELETE"):
            assert get(url + "/metrics", ctx, "prometheus", PASSWORD, method=method)[0] == 405
        # plain HTTP on the TLS port gets nowhere
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://127.0.0.1:{s.port}/metrics", timeout=5).read()
        # TLS 1.2 and 1.3 work; TLS 1.1 is refused (if this OpenSSL can still speak it at all)
        assert get(url + "/healthz", client_ctx(ca, ssl.TLSVersion.TLSv1_2))[0] == 200
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            old = client_ctx(ca, ssl.TLSVersion.TLSv1_1)
        old.set_ciphers("DEFAULT:@SECLEVEL=0")
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            get(url + "/healthz", old)
        # a stalled handshake does not block other clients
        import socket
        stalled = socket.create_connection(("127.0.0.1", s.port))
        try:
            assert get(url + "/healthz", ctx)[0] == 200
        finally:
            stalled.close()
    finally:
        assert s.stop() == 0
    log = s.log_path.read_text()
    assert PASSWORD not in log and hashed[7:] not in log and "Traceback" not in log


def test_web_config_is_reloaded_on_sighup_and_a_bad_one_is_refused(tmp_path, tls):
    web = {"basic_auth_users": {"a": bcrypt.hashpw(b"one", bcrypt.gensalt(4)).decode()}}
    s = served(tmp_path, web)
    url = f"http://127.0.0.1:{s.port}"
    try:
        wait_for(lambda: get(url + "/metrics", None, "a", "one")[0] == 200, timeout=30, what="auth on")
        two = bcrypt.hashpw(b"two", bcrypt.gensalt(4)).decode()
        (tmp_path / "web.yml").write_text(yaml.safe_dump({"basic_auth_users": {"a": two}}))
        s.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: get(url + "/metrics", None, "a", "two")[0] == 200, timeout=30, what="new password")
        assert get(url + "/metrics", None, "a", "one")[0] == 401
        (tmp_path / "web.yml").write_text("basic_auth_users:\n  a: plain-text-oops\n")
        s.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: b"fleetcanary_config_last_reload_successful 0.0" in get(url + "/metrics", None, "a", "two")[1],
                 timeout=30, what="the bad reload refused")
        assert get(url + "/metrics", None, "a", "two")[0] == 200, "the running web config stays"
    finally:
        assert s.stop() == 0
    log = s.log_path.read_text()
    assert "not a bcrypt hash" in log and "plain-text-oops" not in log


@pytest.mark.parametrize("web,message", [
    ({"tls_server_config": {"cert_file": "missing.pem", "key_file": "missing.pem"}}, "no such file"),
    ({"tls_server_config": {"cert_file": "x", "key_file": "x", "min_version": "TLS11"}}, "below TLS 1.2"),
    ({"tls_server_config": {"cert_file": "x", "key_file": "x", "cipher_suites": ["TLS_AES_128_GCM_SHA256"]}},
     "cipher_suites"),
    ({"basic_auth_users": {"u": "hunter2"}}, "not a bcrypt hash"),
    ({"bogus": 1}, "unknown key bogus"),
])
def test_bad_web_configs_are_one_line_errors(tmp_path, web, message):
    (tmp_path / "web.yml").write_text(yaml.safe_dump(web))
    r = subprocess.run([sys.executable, "-m", "fleetcanary", "run", "--web.config.file", str(tmp_path / "web.yml"),
                        "--listen-address", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "hunter2" not in r.stderr


def test_min_version_is_enforced_in_the_context(tls):
    _, pem, _ = tls
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump({"tls_server_config": {"cert_file": str(pem), "key_file": str(pem)}}, f)
    wc = webconfig.load(f.name)
    os.unlink(f.name)
    assert wc.ssl_context.minimum_version == ssl.TLSVersion.TLSv1_2


HOSTILE = ['quote"d', "new\nline", "back\\slash", "brace}{x=\"1\"}", "üñí©ødé ☃", "tab\tand space"]


def test_hostile_label_values_from_hardware_and_endpoints_keep_the_exposition_valid(tmp_path):
    """Label values come only from config and hardware; both may hold anything and must be escaped."""
    from fleetcanary.offline.simulate_llm import SimSettings

    facts = json.loads((ROOT / "probes/testing/nvml_facts/h100_1gpu.json").read_text())
    facts["devices"][0]["name"] = "NVIDIA " + "".join(HOSTILE)
    facts["devices"][0]["serial"] = HOSTILE[1]
    fixture = tmp_path / "hostile.json"
    fixture.write_text(json.dumps(facts))
    server, _ = sim_server(SimSettings(ttft_ms=5, itl_ms=1, max_tokens_default=8))
    model = "".join(HOSTILE)[:120]
    cfg = {"probes": {"host_memory_bandwidth": {"enabled": False},
                      "gpu_health": {"interval_seconds": 60},
                      "inference": {"interval_seconds": 30, "timeout_seconds": 20, "params": {"targets": [
                          {"name": "hostile", "base_url": f"{server.url}/v1",
                           "model": model, "stream_max_tokens": 8, "prefix_words": 16}]}}}}
    prom = d = None
    try:
        d = Daemon(tmp_path / "d", cfg, env={"FLEETCANARY_FAKE_NVML": str(fixture)})
        port, url = d.port, d.url
        def hostile_series() -> bytes | None:
            b = get(url + "/metrics")[1]
            return b if b"fleetcanary_gpu_info{" in b and b"fleetcanary_inference_success{" in b else None

        body = wait_for(hostile_series, timeout=60, what="hostile series")
        r = subprocess.run([require_binary("promtool"), "check", "metrics"], input=body, capture_output=True)
        assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), (r.stdout + r.stderr).decode()
        prom = Prometheus(tmp_path / "prom", [f"127.0.0.1:{port}"])
        rows = wait_for(lambda: prom.query("fleetcanary_gpu_info"), timeout=60, what="scraped hostile labels")
        assert rows[0]["metric"]["model"] == "NVIDIA " + "".join(HOSTILE)
        assert rows[0]["metric"]["serial"] == HOSTILE[1]
        inf = wait_for(lambda: prom.query("fleetcanary_inference_output_tokens_total"), timeout=60, what="model label")
        assert inf[0]["metric"]["model"] == model
        assert prom.targets_up()
    finally:
        if prom:
            prom.stop()
        if d:
            d.stop()
        server.close()


def test_hostile_target_names_in_config_are_refused(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"probes": {"storage": {"params": {"targets": [
        {"name": 'x"} evil{', "path": "/tmp"}]}}}}))
    r = subprocess.run([sys.executable, "-m", "fleetcanary", "check-config", str(f)], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 2 and "probes.storage.params.targets.0.name" in r.stderr


def test_header_secrets_are_redacted_from_results_and_history(tmp_path):
    from fleetcanary.offline.simulate_llm import SimSettings

    server, _ = sim_server(SimSettings(ttft_ms=5, itl_ms=1, max_tokens_default=8))
    secret = "Bearer sk-live-0123456789abcdef"
    cfg = {"probes": {"host_memory_bandwidth": {"enabled": False}, "inference": {
               "interval_seconds": 30, "timeout_seconds": 20, "params": {"targets": [
                   {"name": "t", "base_url": f"{server.url}/v1", "model": "m",
                    "headers": {"X-Api-Key": secret}, "stream_max_tokens": 8, "prefix_words": 16}]}}}}
    try:
        d = Daemon(tmp_path / "d", cfg)
        url = d.url
        def inference_result() -> bytes | None:
            b = get(url + "/results")[1]
            return b if b'"inference"' in b else None

        results = wait_for(inference_result, timeout=60, what="an inference result")
        assert b"<redacted>" in results
        for blob in (results, get(url + "/metrics")[1], (d.state_dir / "results.jsonl").read_bytes()):
            assert secret.encode() not in blob and b"sk-live" not in blob
        d.stop()
    finally:
        server.close()
    assert "sk-live" not in d.log()
