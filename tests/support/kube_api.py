"""The Kubernetes API stand-in lives in harness/kube_api.py (benchmarks/kube_api_load.py drives it too); tests keep
importing it from here."""
from harness.kube_api import *  # noqa: F403
from harness.kube_api import DRA_SCHEMA_VERSION, TOKEN, KubeAPI, node, pod  # noqa: F401
