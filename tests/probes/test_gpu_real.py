"""The GPU probes on a real CUDA GPU (scripts/gpu-check runs these on a lent GPU).

Elsewhere they skip with the reason; the same code paths run on device "cpu" and fake
NVML in the other GPU probe tests."""
import time

import pytest

from fleetcanary.probes.base import ProbeContext
from tests.support.helpers import unavailable

pytestmark = [pytest.mark.gpu]


@pytest.fixture(autouse=True)
def cuda_gpu():
    """torch with a CUDA GPU, or the skip: checked when a test here runs, not at collection (importing torch there
    cost every test worker ~1.5 CPU-s whatever it ran)."""
    try:
        import torch
    except ImportError:  # the test set-up installs torch: under CI=true its absence fails
        unavailable("torch is not installed (`make venv` installs the pinned CPU build)")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")


def ctx(tmp_path):
    return ProbeContext(node_name="t", state_dir=str(tmp_path), deadline_monotonic=time.monotonic() + 120)


def test_gpu_bandwidth_on_cuda(tmp_path):
    from fleetcanary.probes.gpu_bandwidth import Config, GpuBandwidth

    r = GpuBandwidth().run(Config(repeats=5), ctx(tmp_path))
    figs = {(f.labels["gpu"], f.name): f.median for f in r.figures}
    assert figs[("0", "d2d")] > 5e11          # any datacenter GPU of the last decade
    assert figs[("0", "h2d")] > 5e9 and figs[("0", "d2h")] > 5e9
    assert r.parameters["timer"] == "cuda events"
    assert 0 < r.gpu_seconds["0"] < 5


def test_gpu_health_on_real_nvml(tmp_path):
    from fleetcanary.probes.gpu_health import Config, GpuHealth

    r = GpuHealth().run(Config(xid_wait_seconds=0.5), ctx(tmp_path))
    names = {s.metric for s in r.samples}
    assert {"fleetcanary_gpu_info", "fleetcanary_gpus_visible", "fleetcanary_gpu_pcie_link_width"} <= names
    assert r.extra["gpus"][0]["model"].startswith("NVIDIA")
