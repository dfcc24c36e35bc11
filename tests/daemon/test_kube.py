"""fleetcanary.daemon.kube with the real kubernetes client against a local API server (HTTPS, bearer token)."""
import os
import random
import time
import urllib.parse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetcanary.core import config as configmod
from fleetcanary.daemon import hard_faults
from fleetcanary.daemon.kube import Kube, sync_period, wanted
from tests.conftest import ROOT
from tests.support.helpers import wait_for
from tests.support.kube_api import TOKEN, KubeAPI, node, pod

LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "node.kubernetes.io/instance-type": "p5.48xlarge",
          "topology.kubernetes.io/zone": "us-east-1a", "example.com/pool": "train-a"}


@pytest.fixture
def api(tmp_path):
    a = KubeAPI(tmp_path)
    a.nodes["gpu-a"] = node("gpu-a", LABELS, 8)
    a.pods = [pod("team1", "trainer-0", "gpu-a", gpus=4), pod("team2", "notebook", "gpu-a", init_gpus=1),
              pod("team1", "done", "gpu-a", gpus=8, phase="Succeeded"), pod("team3", "other", "gpu-b", gpus=8),
              pod("kube-system", "dns", "gpu-a")]
    yield a
    a.close()


def kube_cfg(**over):
    # 10 s: the stand-in answers in milliseconds, but on a loaded 2-core machine a TLS request once took over 1 s;
    # the test of a hanging API sets its own 0.5 s
    data = {"kubernetes": {"mode": "on", "pool_label": "example.com/pool", "api_timeout_seconds": 10.0, **over}}
    return configmod.settings_model()(**data).kubernetes


def make(api, **over) -> Kube:
    return Kube.in_cluster(kube_cfg(**over), "gpu-a", token_file=str(api.token_file), ca_file=str(api.ca_file),
                           environ=api.environ)


def test_pods_are_listed_from_the_watch_cache_and_the_node_read_only_when_due(api):
    """API load per node stays small: a list with resourceVersion=0 is served from the API server's watch cache (not
    a quorum read of etcd), and the Node, whose labels and capacity rarely change, is read every
    node_refresh_seconds, not at every pod list."""
    k = make(api)
    for _ in range(3):
        assert k.sync() is True
    gets = [q for m, q, _ in api.requests if m == "GET" and q.startswith("/api/v1/nodes/gpu-a")]
    lists = [q for m, q, _ in api.requests if m == "GET" and q.startswith("/api/v1/pods")]
    assert len(gets) == 1 and len(lists) == 3
    assert all(urllib.parse.parse_qs(urllib.parse.urlsplit(q).query).get("resourceVersion") == ["0"] for q in lists)
    assert k.sync(read_node=True) and len([q for m, q, _ in api.requests if q.startswith("/api/v1/nodes/gpu-a")]) == 2


@given(refresh=st.floats(min_value=5, max_value=3600), seed=st.integers(0, 2**32 - 1))
def test_the_sync_schedule_starts_at_a_random_phase_and_stays_within_ten_percent(refresh, seed):
    rng = random.Random(seed)
    assert 0.1 * refresh <= sync_period(refresh, rng, first=True) <= refresh
    assert all(0.9 * refresh <= sync_period(refresh, rng) <= 1.1 * refresh for _ in range(20))


def test_sync_reads_node_labels_capacity_and_this_nodes_gpu_pods(api):
    k = make(api)
    assert k.sync() is True
    s = k.snapshot()
    assert s.labels == {"gpu_product": "NVIDIA-H100-80GB-HBM3", "instance_type": "p5.48xlarge",
                        "zone": "us-east-1a", "pool": "train-a"}
    assert s.gpu_capacity == 8
    # 4 + the init container's 1; the Succeeded pod and gpu-b's pod are filtered by the field selector
    assert s.gpus_requested == 5
    assert s.gpu_pods == ["team1/trainer-0", "team2/notebook"]
    assert k.context() == {"expected_gpus": 8, "allocated_gpu_count": 5, "gpus_allocated": True,
                           "gpu_pods": ["team1/trainer-0", "team2/notebook"]}
    lists = [p for m, p, _ in api.requests if p.startswith("/api/v1/pods")]
    assert "spec.nodeName%3Dgpu-a" in lists[0] and "status.phase%21%3DSucceeded" in lists[0]
    assert all(auth.lower() == f"bearer {TOKEN}" for _, _, auth in api.requests)


def test_policy_ignore_reports_allocation_without_gating(api):
    k = make(api, gpu_allocation_policy="ignore")
    k.sync()
    assert k.context()["gpus_allocated"] is False and k.context()["allocated_gpu_count"] == 5


def test_requests_only_pods_count_and_no_gpu_pods_do_not_gate(api):
    api.pods = [pod("a", "x", "gpu-a", gpus=2, requests_only=True)]
    k = make(api)
    k.sync()
    assert k.context()["allocated_gpu_count"] == 2
    api.pods = [pod("a", "cpu-only", "gpu-a")]
    k.sync()
    assert k.context()["gpus_allocated"] is False


@pytest.mark.parametrize("op,code,reason", [("list_pods", 403, "forbidden"), ("read_node", 500, "server_error"),
                                            ("list_pods", 500, "server_error"), ("read_node", 403, "forbidden")])
def test_api_errors_are_counted_and_the_last_known_state_kept(api, op, code, reason):
    k = make(api)
    assert k.sync()
    before = k.snapshot()
    api.fail[op] = code
    api.pods = []
    api.nodes["gpu-a"] = node("gpu-a", {}, 4)
    assert k.sync(read_node=True) is False
    s = k.snapshot()
    assert s.errors[(op, reason)] == 1 and sum(s.errors.values()) == 1
    if op == "list_pods":
        assert s.gpus_requested == before.gpus_requested == 5
        assert s.gpu_capacity == 4  # the node read still succeeded
    else:
        assert s.labels == before.labels and s.gpu_capacity == 8
        assert s.gpus_requested == 0  # the pod list still succeeded
    assert s.last_success == before.last_success


def test_a_hung_api_server_times_out_within_the_bound(api):
    k = make(api, api_timeout_seconds=0.5)
    api.hang.add("read_node")
    t0 = time.monotonic()
    assert k.sync() is False
    took = time.monotonic() - t0
    # The client's own read timeout ended the call (counted as a timeout, not as the connection the server
    # drops when its 60 s hang ends): not before the configured 0.5 s, and long before the server answered.
    assert k.snapshot().errors[("read_node", "timeout")] == 1
    assert 0.5 <= took < 60, f"sync took {took:.1f}s with a 0.5 s timeout"
    assert k.snapshot().gpus_requested == 5  # the pod list was still read


def test_unreachable_api_server_is_a_connection_error(api, tmp_path):
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"}
    k = Kube.in_cluster(kube_cfg(), "gpu-a", token_file=str(api.token_file), ca_file=str(api.ca_file), environ=env)
    assert k.sync() is False
    errs = k.snapshot().errors
    assert errs[("read_node", "connection")] == 1 and errs[("list_pods", "connection")] == 1


def test_node_condition_goes_false_after_n_failures_and_true_after_a_success(api):
    k = make(api, node_condition={"enabled": True, "consecutive_failures": 2, "probes": ["gpu_bandwidth"]})
    assert k.patch_condition() is True            # starts healthy
    ctype, body = api.patches[-1]
    assert ctype == "application/strategic-merge-patch+json"
    cond = body["status"]["conditions"][0]
    assert cond["type"] == "FleetCanaryHealthy" and cond["status"] == "True"
    k.observe("gpu_bandwidth", "failure", "busbw wrong")
    k.observe("gpu_health", "failure")               # not watched
    k.observe("gpu_bandwidth", "skipped")            # neither counts nor resets
    assert k.patch_condition() is False              # one failure, already True: nothing due
    k.observe("gpu_bandwidth", "timeout", "deadline 120 s")
    assert k.patch_condition() is True
    cond = api.patches[-1][1]["status"]["conditions"][0]
    assert cond["status"] == "False" and cond["reason"] == "ProbeFailing"
    assert "gpu_bandwidth failed 2 consecutive runs" in cond["message"] and "deadline 120 s" in cond["message"]
    assert k.snapshot().condition_status == "False"
    k.observe("gpu_bandwidth", "success")
    assert k.patch_condition() is True
    assert api.patches[-1][1]["status"]["conditions"][0]["status"] == "True"


def test_a_forbidden_status_patch_is_counted_not_fatal(api):
    api.fail["patch_node_status"] = 403
    k = make(api, node_condition={"enabled": True, "consecutive_failures": 1, "probes": ["gpu_health"]})
    k.observe("gpu_health", "crash")
    assert k.patch_condition() is False
    assert k.snapshot().errors[("patch_node_status", "forbidden")] == 1
    assert k.snapshot().condition_status is None


@pytest.mark.parametrize("url", ["http://10.0.0.5:8001", "https://127.0.0.1:6443", "http://127.0.0.1.example.com:80",
                                 "http://localhost", "http://user@127.0.0.1:8001", "http://127.0.0.1:8001/api",
                                 "https://kubernetes.default.svc", "127.0.0.1:8001"])
def test_api_url_other_than_loopback_plain_http_is_one_config_error(tmp_path, url):
    f = tmp_path / "c.yaml"
    f.write_text(f"kubernetes:\n  api_url: '{url}'\n")
    with pytest.raises(configmod.ConfigError) as e:
        configmod.load(f)
    (line,) = e.value.lines
    assert "kubernetes.api_url" in line and repr(url) in line and "in-cluster API server over https" in line, line


@pytest.mark.parametrize("url", ["", "http://127.0.0.1:8001", "http://localhost:8001", "http://[::1]:8001"])
def test_api_url_takes_a_loopback_server(url):
    cfg = kube_cfg(api_url=url, mode="auto")
    assert cfg.api_url == url
    # mode auto uses the API outside a pod once api_url names one
    assert wanted(cfg, environ={}) is bool(url)


def test_a_non_loopback_url_is_refused_by_the_client_too():
    cfg = kube_cfg()
    with pytest.raises(ValueError, match="only a loopback"):
        Kube.at(cfg, "gpu-a", "http://10.0.0.5:8001")


def test_the_client_reaches_a_loopback_api_without_credentials(tmp_path):
    """kubernetes.api_url: the node read, the pod list and a per-fault status PATCH (schema-checked, merged by
    type) against a plain-HTTP loopback server, as through `kubectl proxy`; no token is read or sent."""
    api = KubeAPI(tmp_path, plain_http=True)
    try:
        api.nodes["gpu-a"] = node("gpu-a", LABELS, 8)
        api.nodes["gpu-a"]["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        api.pods = [pod("team1", "trainer-0", "gpu-a", gpus=4)]
        assert api.url.startswith("http://127.0.0.1:")
        cfg = kube_cfg(api_url=api.url, node_condition={"enabled": True, "per_fault": True})
        # the service-account paths and KUBERNETES_SERVICE_HOST point nowhere: none of them is used
        k = Kube.in_cluster(cfg, "gpu-a", token_file=str(tmp_path / "absent"), ca_file=str(tmp_path / "absent"),
                            environ={})
        assert k.sync() is True
        assert k.snapshot().gpu_capacity == 8 and k.snapshot().gpu_pods == ["team1/trainer-0"]
        ecc = hard_faults.Fault("ecc", "6", "UncorrectableECCErrors", "uncorrectable_ecc",
                                "GPU 6 (GPU-x) counted 1 uncorrectable ECC errors since the last reset")
        k.set_faults(hard_faults.conditions("FleetCanary", [ecc]))
        assert k.patch_condition() is True
        assert api.invalid == []
        conds = {c["type"]: c for c in api.nodes["gpu-a"]["status"]["conditions"]}
        assert conds["Ready"]["status"] == "True"   # merged by type: the kubelet's condition stays
        assert conds["FleetCanaryGPUUncorrectableECC"]["status"] == "True"
        assert "GPU 6" in conds["FleetCanaryGPUUncorrectableECC"]["message"]
        assert conds["FleetCanaryGPULost"]["status"] == "False" and conds["FleetCanaryHealthy"]["status"] == "True"
        assert [m for m, _, _ in api.requests] == ["GET", "GET", "PATCH"]
        assert all(auth == "" for _, _, auth in api.requests)
    finally:
        api.close()


def test_unknown_condition_probe_is_a_config_error(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("kubernetes:\n  node_condition:\n    probes: [gpu_helth]\n")
    with pytest.raises(configmod.ConfigError) as e:
        configmod.load(f)
    assert "unknown probe gpu_helth" in e.value.lines[0]


def test_daemon_gates_gpu_probes_and_labels_node_info_from_the_api(api, tmp_path, start_daemon):
    env = {**api.environ, "FLEETCANARY_KUBE_TOKEN_FILE": str(api.token_file),
           "FLEETCANARY_KUBE_CA_FILE": str(api.ca_file), "NODE_NAME": "gpu-a",
           "FLEETCANARY_FAKE_NVML": str(ROOT / "probes/testing/nvml_facts/h100_8gpu_healthy.json")}
    d = start_daemon({"kubernetes": {"pool_label": "example.com/pool",
                                     "node_condition": {"enabled": True, "probes": ["gpu_health"]}},
                      # no jitter and no phase: the first run comes at once instead of at the node's slot
                      "gpu": {"spread_first_runs": False},
                      "probes": {"gpu_bandwidth": {"interval_seconds": 600, "jitter_seconds": 0},
                                 "host_memory_bandwidth": {"enabled": False}}},
                     env=env)
    skip = 'fleetcanary_probe_skips_total{probe="gpu_bandwidth",reason="gpu_allocated"} 1.0'

    def skipped() -> str | None:
        text = d.metrics()
        return text if skip in text else None

    m = wait_for(skipped, timeout=60, what="gpu_bandwidth skipped for gpu_allocated")
    assert "fleetcanary_kubernetes_gpus_requested 5.0" in m
    info = next(line for line in m.splitlines() if line.startswith("fleetcanary_node_info{"))
    for frag in ('gpu_product="NVIDIA-H100-80GB-HBM3"', 'instance_type="p5.48xlarge"', 'zone="us-east-1a"',
                 'pool="train-a"', 'node_name="gpu-a"'):
        assert frag in info
    assert "# TYPE fleetcanary_kubernetes_api_errors_total counter" in m
    assert "fleetcanary_kubernetes_api_errors_total{" not in m  # a reason appears once it has happened
    wait_for(lambda: api.patches, timeout=30, what="the node condition patch")
    assert api.patches[0][1]["status"]["conditions"][0]["status"] == "True"
    assert d.stop() == 0
    assert "Traceback" not in d.log()


def test_daemon_without_in_cluster_credentials_runs_without_the_api(tmp_path, start_daemon):
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1", "NODE_NAME": "gpu-a",
           "FLEETCANARY_KUBE_TOKEN_FILE": str(tmp_path / "missing-token")}
    d = start_daemon({"probes": {"host_memory_bandwidth": {"enabled": False}}}, env=env)
    assert "fleetcanary_kubernetes_api_errors_total" not in d.metrics()
    assert "cannot load the in-cluster config" in d.log() and "Traceback" not in d.log()
    assert os.path.exists(d.config_path)
