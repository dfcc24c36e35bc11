"""An API key given to the inference canary appears nowhere: logs, /metrics, /results, history, state."""
import json

from fleetcanary.offline.simulate_llm import SimSettings
from tests.support.helpers import http_get, wait_for
from tests.support.llm import sim_server
from tests.support.timeline import self_ending_deadline

KEY = "sk-live-FLEETCANARYSECRET-7f3a9c"


def test_api_key_never_leaks(tmp_path, start_daemon):
    server, _ = sim_server(SimSettings(ttft_ms=5, itl_ms=1, api_key=KEY))
    base = f"{server.url}/v1"
    token_file = tmp_path / "token"
    token_file.write_text(KEY + "\n")
    # the run ends on its own (three quick targets): its deadline only bounds a hang, sized from a worker
    # start-up measured now, so a loaded machine's run is a failure as the test expects, never a timeout
    deadline = self_ending_deadline(tmp_path)
    timing = {"interval_seconds": deadline + 2, "timeout_seconds": deadline, "jitter_seconds": 0}
    try:
        d = start_daemon({
            "log_level": "debug",
            "probes": {
                "host_memory_bandwidth": {"enabled": False},
                "inference": {**timing, "params": {
                    "targets": [
                        {"name": "with-env", "base_url": base, "model": "m", "token_env": "LLM_KEY",
                         "prefix_words": 32, "stream_max_tokens": 8},
                        {"name": "with-file", "base_url": base, "model": "m", "token_file": str(token_file),
                         "prefix_words": 32, "stream_max_tokens": 8},
                        {"name": "no-key", "base_url": base, "model": "m", "prefix_words": 32,
                         "stream_max_tokens": 8, "headers": {"X-Api-Key": KEY}},
                    ]}}}}, env={"LLM_KEY": KEY})

        # The keyless target is refused (401), so every run is a failure that still publishes the
        # other targets' figures: the key travels in headers and must leak nowhere either way.
        def two_runs():
            text = d.metrics()
            return text.count('fleetcanary_inference_success{target="with-env"} 1.0') and \
                'fleetcanary_probe_runs_total{outcome="failure",probe="inference"} 2.0' in text
        wait_for(two_runs, timeout=300, what="two inference runs")
        metrics = d.metrics()
        assert 'fleetcanary_inference_success{target="with-file"} 1.0' in metrics
        assert 'fleetcanary_inference_requests_total{model="m",outcome="http_4xx",target="no-key"}' in metrics
        results = http_get(d.url + "/results")[2].decode()
        assert json.loads(results)["inference"]["outcome"] == "failure"
        assert "no-key" in json.loads(results)["inference"]["detail"]
    finally:
        server.close()
    d.stop()
    history = "".join(p.read_text() for p in d.state_dir.rglob("*") if p.is_file())
    for name, text in (("log", d.log()), ("metrics", metrics), ("results", results), ("state dir", history)):
        assert KEY not in text, f"the API key leaked into the {name}"
        assert "FLEETCANARYSECRET" not in text, f"part of the API key leaked into the {name}"
    assert "inference" in history and len(history) > 1000  # the records are there, only the key is not
