"""Property tests of the parsers of outside input added for the platform and the NVLink fabric: the API's Node and
Pod objects (core/kube_platform.py), an image reference, NVML's fabric health mask, a /proc tree and an IMEX node
list (probes/lib/fabric_services.py). Whatever they are given, they return their documented shapes and never raise."""
from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetcanary.core import kube_platform
from fleetcanary.probes.lib import fabric_services, nvml

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                             HealthCheck.function_scoped_fixture])
leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40)
json_like = st.recursive(leaf, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.sampled_from(["metadata", "status", "name", "namespace", "labels",
                                                            "nodeInfo", "containerStatuses", "image", "imageID",
                                                            "kubeletVersion", "osImage", "x"]), inner, max_size=5),
                         max_leaves=25)


@SETTINGS
@given(json_like)
def test_from_node_takes_any_object(obj):
    out = kube_platform.from_node(obj)
    assert isinstance(out, dict) and set(out) <= set(kube_platform.NODE_KEYS)
    assert all(isinstance(v, str) and len(v) <= kube_platform.MAX_VALUE for v in out.values())


@SETTINGS
@given(st.lists(json_like, max_size=5) | json_like, st.text(max_size=10))
def test_from_pods_takes_any_list(pods, me):
    """Any pod-shaped objects: a containerStatuses that is a number or a string, statuses without names."""
    out = kube_platform.from_pods(pods if isinstance(pods, list) else [pods], me)
    assert set(out) <= set(kube_platform.POD_KEYS)
    assert set(out.get("components", {})) <= set(kube_platform.COMPONENTS)
    kube_platform.record_fields(out)


@SETTINGS
@given(st.text(alphabet=string.printable, max_size=80))
def test_split_image_takes_any_reference(ref):
    name, version = kube_platform.split_image(ref)
    assert isinstance(name, str) and isinstance(version, str)


@SETTINGS
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_the_fabric_health_mask_decodes_to_known_fields(mask):
    health = nvml.fabric_health(mask)
    assert set(health) <= set(nvml.FABRIC_HEALTH_FIELDS)
    fab = {"state": "completed", "status": "success", "clique_id": 1, "cluster_uuid": "x", "health": health}
    assert all(isinstance(p, str) for p in nvml.fabric_problems(fab))


@SETTINGS
@given(st.dictionaries(st.text(alphabet=string.digits + "abc", min_size=1, max_size=6),
                       st.binary(max_size=300), max_size=12),
       st.binary(max_size=2000))
def test_fabric_services_take_any_proc_tree_and_config(tmp_path_factory, procs, cfg):
    root = tmp_path_factory.mktemp("proc")
    for pid, comm in procs.items():
        (root / pid).mkdir(exist_ok=True)
        (root / pid / "comm").write_bytes(comm)
    states = fabric_services.service_states(str(root))
    assert set(states) == set(fabric_services.PROCESSES)
    assert set(states.values()) <= {"running", "not_running", "unknown"}
    (root / "nodes.cfg").write_bytes(cfg)
    n = fabric_services.imex_nodes(str(root / "nodes.cfg"))
    assert isinstance(n, int) and n >= 0
