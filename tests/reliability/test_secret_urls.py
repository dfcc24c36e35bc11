"""Secrets in URLs never leave (issue 37): a base_url's user:password@ and a URL's secret query parameters
(api_key, token, X-Amz-Signature, ...) given to the inference and object storage probes, through real servers on
127.0.0.1, appear nowhere: /results, results.jsonl and the rest of the state directory, the log, /metrics; nor
does a URL a probe puts in its crash message (the record's detail and the worker's output tail)."""
from fleetcanary.offline.simulate_llm import SimSettings
from fleetcanary.probes.lib.redact import redact_url
from tests.support.helpers import http_get, wait_for
from tests.support.llm import sim_server
from tests.support.object_server import ObjectServer
from tests.support.reliability import fault_daemon
from tests.support.timeline import self_ending_deadline

# every secret carries MARK, so one search finds any of them, whole or in part
MARK = "FLEETCANARYLEAK"
SECRETS = {
    "userinfo password": f"pw-{MARK}-userinfo",
    "api_key": f"ak-{MARK}-query",
    "X-Amz-Signature": f"sig{MARK}amz",
    "X-Amz-Credential": f"cred{MARK}amz",
    "token": f"tok-{MARK}-obj",
    "closed-port password": f"pw-{MARK}-closed",
    "access_token": f"at-{MARK}-closed",
    "crash password": f"pw-{MARK}-crash",
    "crash sig": f"sig-{MARK}-crash",
}


def assert_no_secret(where: dict[str, str]) -> None:
    for name, text in where.items():
        for what, secret in SECRETS.items():
            assert secret not in text, f"the {what} leaked into the {name}"
        assert MARK not in text, f"part of a secret leaked into the {name}: ...{text[text.find(MARK) - 80:][:200]}"


def test_url_secrets_of_inference_and_object_storage_never_leak(tmp_path, start_daemon):
    llm, _ = sim_server(SimSettings(ttft_ms=5, itl_ms=1, max_tokens_default=8))
    objects = ObjectServer()
    s = SECRETS
    base = f"http://canary:{s['userinfo password']}@127.0.0.1:{llm.port}/v1?api_key={s['api_key']}&api-version=7"
    closed = f"http://canary:{s['closed-port password']}@127.0.0.1:9/v1?access_token={s['access_token']}"
    obj = (f"http://127.0.0.1:{objects.port}/bucket/o?size=4096&X-Amz-Signature={s['X-Amz-Signature']}"
           f"&X-Amz-Credential={s['X-Amz-Credential']}&token={s['token']}")
    deadline = self_ending_deadline(tmp_path)
    timing = {"interval_seconds": deadline + 2, "timeout_seconds": deadline, "jitter_seconds": 0}
    try:
        d = start_daemon({
            "log_level": "debug",
            "probes": {
                "host_memory_bandwidth": {"enabled": False},
                "inference": {**timing, "params": {"targets": [
                    {"name": "userinfo", "base_url": base, "model": "m", "prefix_words": 16, "stream_max_tokens": 4},
                    {"name": "closed", "base_url": closed, "model": "m", "prefix_words": 16,
                     "stream_max_tokens": 4, "connect_timeout_seconds": 2}]}},
                "object_storage": {**timing, "params": {"repeats": 1, "targets": [
                    {"name": "presigned", "url": obj, "max_bytes": 4096},
                    {"name": "closed", "url": closed.replace("/v1", "/o"), "connect_timeout_seconds": 2}]}}}})

        def ran():
            r = d.results()
            return "inference" in r and "object_storage" in r
        wait_for(ran, timeout=300, what="an inference and an object storage run")
        metrics = d.metrics()
        # the runs did reach the servers: the secrets were in real use, not refused up front
        assert 'fleetcanary_inference_success{target="userinfo"} 1.0' in metrics
        assert 'fleetcanary_inference_success{target="closed"} 0.0' in metrics
        assert 'fleetcanary_object_success{target="presigned"} 1.0' in metrics
        results = http_get(d.url + "/results")[2].decode()
    finally:
        llm.close()
        objects.close()
    d.stop()
    history = "".join(p.read_text(errors="replace") for p in d.state_dir.rglob("*") if p.is_file())
    assert "results.jsonl" in {p.name for p in d.state_dir.rglob("*")} and "presigned" in history
    assert_no_secret({"log": d.log(), "metrics": metrics, "results": results, "state dir": history})
    # what the runs measured is still said: the host, the path, the harmless query parameters
    assert f"127.0.0.1:{llm.port}/v1?api_key=<redacted>&api-version=7" in results
    assert "http://<redacted>@127.0.0.1" in results and "size=4096&X-Amz-Signature=<redacted>" in results


def test_a_url_in_a_crash_message_is_redacted_in_the_record_and_output_tail(tmp_path):
    s = SECRETS
    url = f"https://svc:{s['crash password']}@10.0.0.1/x?sig={s['crash sig']}&n=1"
    d = fault_daemon(tmp_path, {"raises": {"interval_seconds": 60, "timeout_seconds": 30, "jitter_seconds": 0,
                                           "params": {"mode": f"cannot GET {url}"}}},
                     extra={"log_level": "debug"})
    wait_for(lambda: "raises" in d.results(), timeout=120, what="the crash")
    rec = d.results()["raises"]
    results = http_get(d.url + "/results")[2].decode()
    metrics = d.metrics()
    d.stop()
    history = "".join(p.read_text(errors="replace") for p in d.state_dir.rglob("*") if p.is_file())
    assert_no_secret({"detail": rec["detail"], "output tail": rec["output_tail"], "log": d.log(),
                      "metrics": metrics, "results": results, "state dir": history})
    assert rec["outcome"] == "crash" and rec["reason"] == "exception" and "probe bug" in history
    assert rec["detail"] == "RuntimeError: probe bug: cannot GET https://<redacted>@10.0.0.1/x?sig=<redacted>&n=1"
    assert "Traceback" in rec["output_tail"] and "probe bug" in rec["output_tail"]


# what requests, urllib3 and http.client put in their messages, and the URL forms a config holds
REDACTIONS = [
    ("http://user:p%40ss@host:8000/v1", "http://<redacted>@host:8000/v1"),
    ("http://u:p@ss@host/v1", "http://<redacted>@host/v1"),  # a raw @ in the password
    ("HTTPSConnectionPool(host='h', port=443): Max retries exceeded with url: /o?X-Amz-Signature=abc&"
     "X-Amz-Credential=AKIA%2F1&X-Amz-Date=20250101T000000Z (Caused by ...)",
     "HTTPSConnectionPool(host='h', port=443): Max retries exceeded with url: /o?X-Amz-Signature=<redacted>&"
     "X-Amz-Credential=<redacted>&X-Amz-Date=20250101T000000Z (Caused by ...)"),
    ("404 Client Error: Not Found for url: https://h/v1?KEY=k1&Api_Key=k2&apikey=k3&ok=1",
     "404 Client Error: Not Found for url: https://h/v1?KEY=<redacted>&Api_Key=<redacted>&apikey=<redacted>&ok=1"),
    ("https://acct.blob.core.windows.net/c/b?sv=2022&sig=S1&se=2030", "https://acct.blob.core.windows.net/c/b?sv=2022"
     "&sig=<redacted>&se=2030"),
    ("http://h/?password=p&secret=s&client_secret=c&access_token=a&signature=g#frag",
     "http://h/?password=<redacted>&secret=<redacted>&client_secret=<redacted>&access_token=<redacted>&"
     "signature=<redacted>#frag"),
    ("no url here", "no url here"),
    ("http://host/path@v2?limit=10", "http://host/path@v2?limit=10"),
]


def test_redact_url_forms():
    for given, expected in REDACTIONS:
        assert redact_url(given) == expected
        assert redact_url(expected) == expected  # idempotent
