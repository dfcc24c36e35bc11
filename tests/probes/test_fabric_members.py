"""Fabric members: the static list's addresses, and the DaemonSet's pods from a local
Kubernetes API server (tests/support/kube_api.py)."""
import pytest

from fleetcanary.probes.base import ProbeError
from fleetcanary.probes.fabric import members
from fleetcanary.probes.fabric.spec import Config, parse_address
from tests.support.kube_api import KubeAPI


def test_addresses_parse_with_and_without_ports():
    assert parse_address("10.0.0.1", 29400) == ("10.0.0.1", 29400)
    assert parse_address("node-1:1234", 29400) == ("node-1", 1234)
    assert parse_address("[fd00::1]:5", 29400) == ("fd00::1", 5)
    assert parse_address("fd00::1", 7) == ("fd00::1", 7)
    for bad in ("", ":80", "h:0", "h:x", "[fd00::1]x"):
        with pytest.raises(ValueError, match="bad address"):
            parse_address(bad, 1)


def test_static_members_are_sorted_by_name():
    cfg = Config(members=[{"name": "b", "address": "127.0.0.2"}, {"name": "a", "address": "127.0.0.1:9"}], port=7)
    assert members.members(cfg) == [members.Endpoint("a", "127.0.0.1", 9), members.Endpoint("b", "127.0.0.2", 7)]


def pod(name, node, ip, phase="Running", ns="fleetcanary", app="fleetcanary", deleting=False):
    meta = {"name": name, "namespace": ns, "labels": {"app.kubernetes.io/name": app}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": phase, "podIP": ip}}


@pytest.fixture
def api(tmp_path):
    a = KubeAPI(tmp_path)
    yield a
    a.close()


def env(api):
    return {**api.environ, "FLEETCANARY_KUBE_TOKEN_FILE": str(api.token_file),
            "FLEETCANARY_KUBE_CA_FILE": str(api.ca_file)}


def test_members_come_from_the_daemonsets_running_pods(api):
    api.pods += [pod("fc-2", "node-b", "10.1.0.2"), pod("fc-1", "node-a", "10.1.0.1"),
                 pod("fc-3", "node-c", "10.1.0.3", phase="Pending"),
                 pod("fc-4", "node-d", "10.1.0.4", deleting=True),
                 pod("fc-0", "node-b", "10.1.0.9"),              # two pods on node-b: the first name wins
                 pod("other", "node-e", "10.1.0.5", app="something-else"),
                 pod("fc-5", "node-f", "10.1.0.6", ns="elsewhere")]
    cfg = Config(members_from="kubernetes", kubernetes_namespace="fleetcanary", port=29555)
    got = members.from_kubernetes(cfg, environ=env(api))
    assert got == [members.Endpoint("node-a", "10.1.0.1", 29555), members.Endpoint("node-b", "10.1.0.9", 29555)]
    _, path, auth = api.requests[-1]
    assert path.startswith("/api/v1/namespaces/fleetcanary/pods?labelSelector=") and auth.startswith("Bearer ")


def test_an_api_error_is_a_one_line_failure_without_the_token(api):
    api.fail["list_namespaced_pods"] = 403
    cfg = Config(members_from="kubernetes", kubernetes_namespace="fleetcanary")
    with pytest.raises(ProbeError) as ei:
        members.from_kubernetes(cfg, environ=env(api))
    assert ei.value.reason == "members_unavailable" and "403" in str(ei.value)
    assert "test-service-account-token" not in str(ei.value) and "\n" not in str(ei.value)
    with pytest.raises(ProbeError, match="KUBERNETES_SERVICE_HOST"):
        members.from_kubernetes(cfg, environ={})
