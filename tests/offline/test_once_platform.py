"""`fleetcanary once` in a pod records the platform as the daemon does: the real kubernetes client against the API
stand-in (tests/support/kube_api.py, with the in-cluster token and CA), the real worker for the run."""
from __future__ import annotations

import yaml

from fleetcanary.core import config as configmod
from fleetcanary.offline import once
from fleetcanary.probes import PROBES
from tests.conftest import SMALL_HOST_BW
from tests.core.test_kube_platform import DIGEST, NODE, api  # noqa: F401 - the stand-in fixture with its node


def settings(tmp_path, **kube):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"node_name": NODE, "state_dir": str(tmp_path / "state"),
                                 "kubernetes": {"api_timeout_seconds": 2.0, **kube},
                                 "probes": {"host_memory_bandwidth": SMALL_HOST_BW}}))
    return configmod.load(p, env={})


def test_once_in_a_pod_records_the_nodes_platform(api, tmp_path):  # noqa: F811 - the fixture
    environ = {**api.environ, "FLEETCANARY_KUBE_TOKEN_FILE": str(api.token_file),
               "FLEETCANARY_KUBE_CA_FILE": str(api.ca_file), "POD_NAME": "fleetcanary-abcde",
               "POD_NAMESPACE": "fleetcanary"}
    platform = once.platform_facts(settings(tmp_path), environ=environ)
    assert platform["kubelet_version"] == "v1.31.4" and platform["image_digest"] == DIGEST
    [run] = once.run_probes(settings(tmp_path), PROBES, ["host_memory_bandwidth"], platform=platform)
    assert run.environment["container_runtime"] == "containerd://1.7.24"
    assert run.environment["gpu_operator_version"] == "v25.3.0" and run.environment["image"] == DIGEST


def test_once_outside_kubernetes_or_with_an_unreachable_api_records_none_and_says_so_once(api, tmp_path):  # noqa: F811
    assert once.platform_facts(settings(tmp_path), environ={}) == {}
    assert once.platform_facts(settings(tmp_path, mode="off"), environ=api.environ) == {}
    said = []
    bad = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "9",
           "FLEETCANARY_KUBE_TOKEN_FILE": str(api.token_file), "FLEETCANARY_KUBE_CA_FILE": str(api.ca_file)}
    assert once.platform_facts(settings(tmp_path), environ=bad, warn=lambda m, end: said.append(m)) == {}
    assert len(said) == 1 and said[0].startswith("warning: the Kubernetes platform is not recorded: ")
    assert "\n" not in said[0]
