"""The Kubernetes platform a run ran on, for its record: the guide's "Kubernetes, Runtime, and Operator" and
"image digest" (reference/000_11f6a68df8f1dfcc.txt, "Freeze Variables Before Testing").

In core beside environment.py (the rest of the record) as pure functions; the daemon feeds them what daemon/kube.py
already reads every sync, so no extra API call, and adds the result to each run's record (daemon/service.py):
- the Node's status.nodeInfo (the kubelet reports it): kubelet version, container runtime and version, OS image,
  kernel;
- GPU feature discovery's node labels that say how the GPUs are offered (nvidia.com/mig.strategy,
  nvidia.com/gpu.sharing-strategy, nvidia.com/gpu.replicas) and the CUDA driver it saw;
- the pods on this node: the NVIDIA components' image tags and digests (containerStatuses: image, imageID),
  and this exporter's own pod's imageID, the digest of the image that made the record.

Why pod images and not node labels for versions: a component's running pod on this node is what acts on these
GPUs, and its image tag is its release (the GPU Operator's operands carry its version: the
gpu-operator-validator image is tagged with the operator's release). The operator's labels
nvidia.com/gpu.deploy.* are switches saying what it deploys, not versions; GFD's nvidia.com/cuda.driver.* say the
driver, which NVML already gives. A component that runs elsewhere (the operator's own Deployment) is named by its
operand on this node; one not found is left out, never guessed.

Pure functions of the API objects (kubernetes client models or plain dicts of the same shape); nothing raises on
an odd object: a field that is not there is left out.
"""
from __future__ import annotations

import os
import re
import socket
from typing import Any

NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
# component -> image name pattern (the repository's last path element)
COMPONENTS: dict[str, re.Pattern] = {
    "gpu_operator": re.compile(r"gpu-operator(-validator)?$"),
    "device_plugin": re.compile(r"k8s-device-plugin$"),
    "dra_driver": re.compile(r"k8s-dra-driver(-gpu)?$"),
    "container_toolkit": re.compile(r"(k8s-)?container-toolkit$"),
    "gpu_driver": re.compile(r"^driver$"),   # nvcr.io/nvidia/driver:550.90.07-ubuntu22.04: a containerised driver
    "dcgm_exporter": re.compile(r"dcgm-exporter$"),
    "mig_manager": re.compile(r"k8s-mig-manager$"),
}
# GPU feature discovery's labels of how the GPUs are offered
GFD_LABELS = {"nvidia.com/mig.strategy": "mig_strategy", "nvidia.com/gpu.sharing-strategy": "gpu_sharing_strategy",
              "nvidia.com/gpu.replicas": "gpu_replicas"}
NODE_INFO = {"kubelet_version": "kubeletVersion", "container_runtime": "containerRuntimeVersion",
             "node_os_image": "osImage", "node_kernel": "kernelVersion"}
MAX_VALUE = 256
NODE_KEYS = (*NODE_INFO, *GFD_LABELS.values())            # what from_node gives
POD_KEYS = ("components", "image_digest", "image_ref")    # what from_pods gives


def _get(obj: Any, *names: str) -> Any:
    """obj.a.b or obj["a"]["b"], the attribute in snake_case or the JSON key in camelCase; None if absent."""
    for name in names:
        if obj is None:
            return None
        snake = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).lower()   # imageID -> image_id, nodeInfo -> node_info
        obj = obj.get(name, obj.get(snake)) if isinstance(obj, dict) else getattr(obj, snake, None)
    return obj


def _s(v: Any) -> str | None:
    return str(v)[:MAX_VALUE] if isinstance(v, (str, int)) and str(v) else None


def from_node(node: Any) -> dict[str, Any]:
    """The Node's nodeInfo and GFD labels: {kubelet_version, container_runtime, node_os_image, node_kernel,
    mig_strategy, gpu_sharing_strategy, gpu_replicas}, each where present."""
    out: dict[str, Any] = {}
    info = _get(node, "status", "nodeInfo")
    for key, field in NODE_INFO.items():
        v = _s(_get(info, field))
        if v:
            out[key] = v
    labels = _get(node, "metadata", "labels") or {}
    if isinstance(labels, dict):
        for label, key in GFD_LABELS.items():
            v = _s(labels.get(label))
            if v:
                out[key] = v
    return out


def split_image(image: str) -> tuple[str, str]:
    """(repository name's last element, tag or digest) of an image reference."""
    ref = image.split("@", 1)
    name, digest = ref[0], (ref[1] if len(ref) > 1 else "")
    tag = ""
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        last, tag = last.split(":", 1)
    return last, tag or digest


def own_pod_name(environ=os.environ) -> str:
    """This pod's name: POD_NAME (the downward API), else the hostname (a pod's, unless it uses the host's network)."""
    return environ.get("POD_NAME") or socket.gethostname()


def own_namespace(environ=os.environ) -> str:
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    try:
        with open(NAMESPACE_FILE) as f:
            return f.read(256).strip()
    except OSError:
        return ""


def from_pods(pods: list, own_name: str, own_namespace: str = "") -> dict[str, Any]:
    """The NVIDIA components running on the node, {component: {"image", "version", "image_id"}}, under
    "components"; this exporter's image and digest (its own pod's containerStatuses) as image and image_digest."""
    out: dict[str, Any] = {}
    components: dict[str, dict[str, str]] = {}
    for pod in pods or []:
        name, ns = _get(pod, "metadata", "name"), _get(pod, "metadata", "namespace")
        statuses = _get(pod, "status", "containerStatuses")
        statuses = statuses if isinstance(statuses, list) else []
        if name == own_name and (not own_namespace or ns == own_namespace):
            mine = [c for c in statuses if _get(c, "name") == "fleetcanary"] or statuses[:1]
            for c in mine:
                image_id, image = _s(_get(c, "imageID")), _s(_get(c, "image"))
                if image_id:
                    out["image_digest"] = image_id.removeprefix("docker-pullable://")
                if image:
                    out["image_ref"] = image
        for c in statuses:
            image = _s(_get(c, "image"))
            if not image:
                continue
            repo, version = split_image(image)
            for comp, pattern in COMPONENTS.items():
                if pattern.search(repo) and comp not in components:
                    entry = {"image": image, "version": version}
                    image_id = _s(_get(c, "imageID"))
                    if image_id:
                        entry["image_id"] = image_id
                    components[comp] = entry
    if components:
        out["components"] = dict(sorted(components.items()))
    return out


def record_fields(platform: dict[str, Any]) -> dict[str, Any]:
    """The run record's environment fields from a platform: the flat versions compare reads (gpu_operator_version,
    device_plugin_version, dra_driver_version, ...), the components in full, the image digest as `image`."""
    out = {k: v for k, v in platform.items() if k not in ("components", "image_ref")}
    for comp, entry in (platform.get("components") or {}).items():
        out[f"{comp}_version"] = entry.get("version", "")
    if platform.get("components"):
        out["platform_components"] = platform["components"]
    if platform.get("image_digest"):
        out["image"] = platform["image_digest"]
    return out
