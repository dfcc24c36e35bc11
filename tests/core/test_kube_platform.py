"""The platform a run ran on (core/kube_platform.py): the Node's nodeInfo, GPU feature discovery's labels, the
NVIDIA components' images on the node and this pod's own image digest, read by the real kubernetes client from
the API stand-in (tests/support/kube_api.py) and written into every run record by the real daemon."""
from __future__ import annotations

import json

import pytest
import yaml

from fleetcanary.core import kube_platform
from fleetcanary.daemon.kube import Kube
from tests.conftest import SMALL_HOST_BW
from tests.support.helpers import free_port
from tests.support.kube_api import KubeAPI, node, pod

NODE = "gb200-a-03"
DIGEST = "ghcr.io/fleetcanary/fleetcanary@sha256:" + "ab" * 32
OPERATOR = "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.3.0"
PLUGIN = "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"
DRA = "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.3.0"
TOOLKIT = "nvcr.io/nvidia/k8s/container-toolkit:v1.17.5-ubuntu20.04"


def with_status(p: dict, *containers: tuple[str, str, str]) -> dict:
    """The pod with containerStatuses (name, image, imageID) as the kubelet reports them."""
    p["status"]["containerStatuses"] = [{"name": n, "image": i, "imageID": d, "ready": True, "restartCount": 0}
                                        for n, i, d in containers]
    return p


@pytest.fixture
def api(tmp_path):
    a = KubeAPI(tmp_path)
    n = node(NODE, {"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.sharing-strategy": "none",
                    "nvidia.com/gpu.deploy.device-plugin": "true"}, 4)
    n["status"]["nodeInfo"] = {"kubeletVersion": "v1.31.4", "containerRuntimeVersion": "containerd://1.7.24",
                               "osImage": "Ubuntu 24.04.1 LTS", "kernelVersion": "6.8.0-1021-nvidia-64k",
                               "architecture": "arm64", "operatingSystem": "linux", "kubeProxyVersion": "",
                               "machineID": "m", "systemUUID": "s", "bootID": "b"}
    a.nodes[NODE] = n
    a.pods = [
        # another node's device plugin (listed first) is not this node's platform
        with_status(pod("gpu-operator", "nvidia-device-plugin-daemonset-zz", "other"),
                    ("nvidia-device-plugin", "nvcr.io/nvidia/k8s-device-plugin:v0.14.0", "sha256:9")),
        with_status(pod("gpu-operator", "nvidia-operator-validator-x1", NODE), ("validator", OPERATOR, "sha256:1")),
        with_status(pod("gpu-operator", "nvidia-device-plugin-daemonset-x2", NODE), ("nvidia-device-plugin", PLUGIN,
                                                                                       "sha256:2")),
        with_status(pod("nvidia-dra-driver-gpu", "kubelet-plugin-x3", NODE), ("gpus", DRA, "sha256:3")),
        with_status(pod("gpu-operator", "nvidia-container-toolkit-x4", NODE), ("toolkit", TOOLKIT, "sha256:4")),
        with_status(pod("fleetcanary", "fleetcanary-abcde", NODE),
                    ("fleetcanary", "ghcr.io/fleetcanary/fleetcanary:0.3.0", "docker-pullable://" + DIGEST)),
        pod("team1", "trainer", NODE, gpus=4),
    ]
    yield a
    a.close()


def kube(api, tmp_path) -> Kube:
    """A Kube on the stand-in; this pod's name and namespace come from POD_NAME and POD_NAMESPACE (monkeypatched)."""
    from fleetcanary.core import config as configmod

    cfg = configmod.settings_model()(kubernetes={"mode": "on", "api_timeout_seconds": 2.0}).kubernetes
    return Kube.in_cluster(cfg, NODE, token_file=str(api.token_file), ca_file=str(api.ca_file), environ=api.environ)


def test_the_platform_comes_from_the_nodes_info_labels_and_the_nvidia_pods_on_it(api, tmp_path, monkeypatch):
    monkeypatch.setenv("POD_NAME", "fleetcanary-abcde")
    monkeypatch.setenv("POD_NAMESPACE", "fleetcanary")
    k = kube(api, tmp_path)
    assert k.sync()
    p = k.snapshot().platform
    assert {key: p[key] for key in ("kubelet_version", "container_runtime", "node_os_image", "node_kernel")} == {
        "kubelet_version": "v1.31.4", "container_runtime": "containerd://1.7.24",
        "node_os_image": "Ubuntu 24.04.1 LTS", "node_kernel": "6.8.0-1021-nvidia-64k"}
    assert p["mig_strategy"] == "mixed" and p["gpu_sharing_strategy"] == "none"
    assert p["image_digest"] == DIGEST
    assert {c: e["version"] for c, e in p["components"].items()} == {
        "gpu_operator": "v25.3.0", "device_plugin": "v0.17.1", "dra_driver": "v25.3.0",
        "container_toolkit": "v1.17.5-ubuntu20.04"}
    rec = kube_platform.record_fields(p)
    assert rec["image"] == DIGEST   # no longer "unknown" on Kubernetes
    assert rec["gpu_operator_version"] == "v25.3.0" and rec["device_plugin_version"] == "v0.17.1"
    assert rec["dra_driver_version"] == "v25.3.0"
    assert "nvidia.com/gpu.deploy.device-plugin" not in json.dumps(rec)   # a switch, not a version


def test_a_node_without_nvidia_pods_or_node_info_records_only_what_it_has():
    assert kube_platform.from_node({"metadata": {"labels": {}}, "status": {}}) == {}
    assert kube_platform.from_pods([{"metadata": {"name": "x"}, "status": {"containerStatuses": None}}], "me") == {}
    assert kube_platform.from_node(None) == {} and kube_platform.from_pods(None, "me") == {}
    assert kube_platform.from_pods([{"metadata": {"name": "me"}, "status": {"containerStatuses": 3}}], "me") == {}
    assert kube_platform.split_image("nvcr.io/nvidia/driver:550.90.07-ubuntu22.04") == ("driver",
                                                                                         "550.90.07-ubuntu22.04")
    assert kube_platform.split_image("reg:5000/a/k8s-device-plugin@sha256:ff") == ("k8s-device-plugin",
                                                                                   "sha256:ff")


def daemon_on(api, tmp_path):
    """A daemon (no API of its own) whose Kubernetes view is the stand-in's, synced once."""
    from fleetcanary.core import config as configmod
    from fleetcanary.daemon.service import Daemon

    cfg = {"node_name": NODE, "state_dir": str(tmp_path / "state"),
           "server": {"listen_address": f"127.0.0.1:{free_port()}"}, "gpu": {"xid_watch": "off"},
           "kubernetes": {"mode": "off"}, "probes": {"host_memory_bandwidth": SMALL_HOST_BW}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    d = Daemon(configmod.load(path, env={}), config_path=str(path))
    d.kube = kube(api, tmp_path)
    assert d.kube.sync()
    return d


def test_every_run_record_of_the_daemon_carries_the_platform(api, tmp_path, monkeypatch):
    monkeypatch.setenv("POD_NAME", "fleetcanary-abcde")
    monkeypatch.setenv("POD_NAMESPACE", "fleetcanary")
    d = daemon_on(api, tmp_path)
    try:
        out = d.run_probe("host_memory_bandwidth")
        assert out is not None and out.environment
        env = out.environment
        assert env["kubelet_version"] == "v1.31.4" and env["container_runtime"] == "containerd://1.7.24"
        assert env["image"] == DIGEST and env["gpu_operator_version"] == "v25.3.0"
        assert env["platform_components"]["device_plugin"]["image"] == PLUGIN
        assert "hca_firmware" in env
    finally:
        d.server.stop()


def test_a_label_removed_from_the_node_leaves_the_platform_at_the_next_node_read(api, tmp_path, monkeypatch):
    monkeypatch.setenv("POD_NAME", "fleetcanary-abcde")
    k = kube(api, tmp_path)
    assert k.sync() and k.snapshot().platform["mig_strategy"] == "mixed"
    del api.nodes[NODE]["metadata"]["labels"]["nvidia.com/mig.strategy"]
    api.pods = [p for p in api.pods if "device-plugin" not in p["metadata"]["name"]]
    assert k.sync(read_node=True)  # the Node is read every node_refresh_seconds, the pods at every sync
    p = k.snapshot().platform
    assert "mig_strategy" not in p and "device_plugin" not in p["components"]
    assert p["kubelet_version"] == "v1.31.4" and p["image_digest"] == DIGEST


def test_a_claim_pods_records_get_the_nodes_platform_but_not_this_pods_image(api, tmp_path, monkeypatch):
    from fleetcanary.core.record import RunRecord

    monkeypatch.setenv("POD_NAME", "fleetcanary-abcde")
    d = daemon_on(api, tmp_path)
    try:
        claimed = RunRecord("host_memory_bandwidth", "success", node=NODE, started_at=1000.0, wall_seconds=1,
                            environment={"image": "unknown", "hostname": "claim-pod"})
        own = RunRecord("host_memory_bandwidth", "success", node=NODE, started_at=1000.0, wall_seconds=1,
                        environment={"image": "registry.example/fleetcanary:pinned"})
        d._add_platform(claimed, own=False)
        d._add_platform(own)
        assert claimed.environment["kubelet_version"] == "v1.31.4" and claimed.environment["image"] == "unknown"
        assert "image_digest" not in claimed.environment
        assert own.environment["image"] == "registry.example/fleetcanary:pinned"   # the deployer's name stays
        assert own.environment["image_digest"] == DIGEST
    finally:
        d.server.stop()
