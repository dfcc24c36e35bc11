"""The GPU probes' shared prologue (probes/lib/gpu_probe.py acquire) on fake NVML, and the one
CUDA error classifier (probes/lib/torch_util.py) every GPU probe uses."""
import pytest

from fleetcanary.probes.base import ProbeError, ProbeSkipped
from fleetcanary.probes.collectives.spec import Config as CollectivesConfig
from fleetcanary.probes.gpu_bandwidth import Config as DeviceConfig
from fleetcanary.probes.lib import gpu_probe, nvml, torch_util
from tests.support.gpu import ctx, fake


def oom(message: str):
    """torch's CUDA out-of-memory error, torch imported when the case runs (not at collection, in every worker)."""
    return lambda: torch_util.import_torch().cuda.OutOfMemoryError(message)


def broken_nvml(monkeypatch, no_driver: bool) -> None:
    def backend():
        raise nvml.NvmlUnavailable("NVML init failed: planted", no_driver=no_driver)

    monkeypatch.setattr(nvml, "_backend", backend)


def sessions_seen():
    seen = []
    return seen, lambda session, handles: seen.append(session) or [h.index for h in handles]


def test_gated_access_lists_the_idle_gpus_their_record_and_closes_nvml(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_busy")  # GPUs 0-3 busy, 4-7 idle
    seen, inspect = sessions_seen()
    with pytest.raises(ProbeSkipped) as ei:  # this torch has no CUDA: the gate passed, then a CPU build
        gpu_probe.acquire(DeviceConfig(busy_policy="gpu"), ctx(tmp_path), inspect=inspect)
    assert ei.value.reason == "dependency_missing" and ei.value.detail.endswith(
        "; the gate left GPUs [4, 5, 6, 7] (skipped: "
        "{'0': 'gpu_busy', '1': 'gpu_busy', '2': 'gpu_busy', '3': 'gpu_busy'})"), ei.value.detail
    monkeypatch.setattr(torch_util, "resolve_device_kind", lambda requested: "cuda")  # the CUDA boundary
    gpus = gpu_probe.acquire(DeviceConfig(busy_policy="gpu"), ctx(tmp_path), inspect=inspect)
    assert (gpus.kind, gpus.indices, gpus.facts, gpus.session) == ("cuda", [4, 5, 6, 7], [4, 5, 6, 7], None)
    assert gpus.record() == {"measured_gpus": [4, 5, 6, 7], "skipped_gpus": {str(i): "gpu_busy" for i in range(4)}}
    assert len(seen) == 2 and not any(s.lib.initialised for s in seen), "each session is shut down on the way out"
    with pytest.raises(ProbeSkipped) as ei:
        gpu_probe.acquire(DeviceConfig(), ctx(tmp_path))
    assert ei.value.reason == "gpu_busy", "policy node leaves a node with a busy GPU alone"


def test_min_gpus_skips_single_gpu_on_a_small_node_and_too_few_after_the_gate(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_busy")  # GPUs 0-3 busy, 4-7 idle
    with pytest.raises(ProbeSkipped) as ei:
        gpu_probe.acquire(CollectivesConfig(busy_policy="gpu"), ctx(tmp_path), min_gpus=9)
    assert ei.value.reason == "single_gpu" and "8 GPU(s)" in ei.value.detail
    with pytest.raises(ProbeSkipped) as ei:
        gpu_probe.acquire(CollectivesConfig(busy_policy="gpu"), ctx(tmp_path), min_gpus=5, too_few="gpu_busy")
    assert ei.value.reason == "gpu_busy" and "only 4 usable" in ei.value.detail


def test_device_cpu_reads_nvml_only_when_asked_and_never_gates(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_busy")
    seen, inspect = sessions_seen()
    gpus = gpu_probe.acquire(DeviceConfig(device="cpu"), ctx(tmp_path), inspect=inspect)
    assert (gpus.kind, gpus.handles, gpus.gate, gpus.record(), seen) == ("cpu", [], None, {}, [])
    gpus = gpu_probe.acquire(DeviceConfig(device="cpu"), ctx(tmp_path), nvml_on_cpu=True, inspect=inspect)
    assert gpus.kind == "cpu" and gpus.gate is None and gpus.facts == list(range(8))


def test_a_kept_session_stays_open_until_the_block_ends(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_healthy")
    with gpu_probe.acquire(DeviceConfig(device="cpu"), ctx(tmp_path), nvml_on_cpu=True, keep_session=True,
                           select=lambda handles: handles[:1]) as gpus:
        assert gpus.session.lib.initialised and gpus.indices == [0]
        assert gpus.session.utilization_ratio(gpus.handles[0]) is not None
    assert not gpus.session.lib.initialised


@pytest.mark.parametrize("no_driver, missing, outcome", [
    (True, "fail", "skip no_gpu"),
    (False, "fail", "error nvml_error"),
    (False, "skip", "skip no_gpu"),
    (False, "none", "cpu"),
    (True, "none", "cpu"),
])
def test_where_nvml_cannot_be_used(tmp_path, monkeypatch, no_driver, missing, outcome):
    broken_nvml(monkeypatch, no_driver)
    try:
        gpus = gpu_probe.acquire(CollectivesConfig(), ctx(tmp_path), nvml_missing=missing)
        got = gpus.kind if gpus.session is None and gpus.gate is None else "gated"
    except ProbeSkipped as exc:
        got = f"skip {exc.reason}"
    except ProbeError as exc:
        got = f"error {exc.reason}"
    assert got == outcome


def test_select_returning_none_means_no_gpu_to_use(tmp_path, monkeypatch):
    fake(monkeypatch, "h100_8gpu_healthy")
    gpus = gpu_probe.acquire(CollectivesConfig(), ctx(tmp_path), nvml_missing="none", select=lambda handles: None)
    assert (gpus.kind, gpus.session, gpus.gate) == ("cpu", None, None)


@pytest.mark.parametrize("exc, gpu, want", [
    (oom("CUDA out of memory. Tried to allocate 2.00 GiB\ntrace"), 3,
     ("out_of_memory", "GPU 3: CUDA out of memory. Tried to allocate 2.00 GiB")),
    (oom("CUDA out of memory.\ntrace"), None, ("out_of_memory", "CUDA out of memory.")),
    (RuntimeError("CUDA error: an illegal memory access\nCompile with TORCH_USE_CUDA_DSA"), 1,
     ("cuda_error", "GPU 1: CUDA error: an illegal memory access")),
    (RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx"), None,
     ("cuda_error", "CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx")),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), 0, None),
    (ValueError("cuda in a ValueError is the probe's own bug"), 0, None),
])
def test_cuda_errors_are_classified_once_for_every_probe(exc, gpu, want):
    exc = exc() if callable(exc) else exc
    err = torch_util.classify_cuda_error(exc, gpu)
    assert (None if err is None else (err.reason, err.detail)) == want
    with pytest.raises(ProbeError if want else type(exc)) as ei, torch_util.cuda_errors(gpu):
        raise exc
    if want:
        assert (ei.value.reason, ei.value.detail) == want and ei.value.__suppress_context__
    else:
        assert ei.value is exc


def test_cuda_is_pointed_at_the_gated_gpus_by_uuid_in_nvml_order():
    """The gate left GPUs 1, 4 and 6: CUDA_VISIBLE_DEVICES names their UUIDs, so CUDA device 0 is GPU 1, 1 is 4
    and 2 is 6, whatever the variable said before (an NVML index is not a CUDA ordinal under it)."""
    from fleetcanary.probes.lib import gpu_probe

    env = {"CUDA_VISIBLE_DEVICES": "3,5"}
    uuids = ["GPU-aaaaaaaa-0001", "GPU-aaaaaaaa-0004", "MIG-bbbbbbbb-0006"]
    assert gpu_probe.pin_cuda(uuids, [1, 4, 6], env) == {1: 0, 4: 1, 6: 2}
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    access = gpu_probe.GpuAccess("cuda", ordinals={1: 0, 4: 1, 6: 2})
    assert [access.cuda(i) for i in (1, 4, 6)] == [0, 1, 2]
    env = {}
    assert gpu_probe.pin_cuda(["unknown"], [0], env) == {} and env == {}   # no UUID from NVML: left alone


def test_each_free_mig_device_is_measured_in_its_own_process_pointed_at_its_uuid(monkeypatch):
    """CUDA enumerates one MIG device per process: each gets a fresh process whose CUDA_VISIBLE_DEVICES is its
    MIG UUID, its GPU seconds go to the parent GPU, and this process's variable is as it was."""
    import os
    import time

    from fleetcanary.probes.base import ProbeResult
    from fleetcanary.probes.lib import gpu_probe
    from fleetcanary.probes.testing.mig_echo import cuda_visible

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-before")
    res = ProbeResult()
    res.gpu_seconds["6"] = 1.0
    mig = {6: ["MIG-aaaa-0001", "MIG-aaaa-0002"], 2: ["MIG-bbbb-0001"]}
    out = gpu_probe.measure_mig(mig, cuda_visible, {"cost": 0.25}, res, time.monotonic() + 120)
    assert {u: (o["gpu"], o["seen"]) for u, o in out.items()} == {
        "MIG-aaaa-0001": ("6", "MIG-aaaa-0001"), "MIG-aaaa-0002": ("6", "MIG-aaaa-0002"),
        "MIG-bbbb-0001": ("2", "MIG-bbbb-0001")}
    assert len({o["pid"] for o in out.values()} | {os.getpid()}) == 4      # a process each, none of them this one
    assert res.gpu_seconds == {"6": 1.5, "2": 0.25}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-before"


def test_a_mig_child_that_fails_is_a_cuda_error_with_its_last_line():
    from fleetcanary.probes.base import ProbeError
    from fleetcanary.probes.lib import gpu_probe
    from fleetcanary.probes.testing.mig_echo import cuda_visible

    with pytest.raises(ProbeError) as e:
        gpu_probe.on_mig("MIG-cccc-0001", cuda_visible, {"fail": True}, timeout_seconds=120)
    assert e.value.reason == "cuda_error"
    assert "MIG device MIG-cccc-0001: exit 1: RuntimeError: CUDA error: invalid device ordinal" in str(e.value)


def test_a_preset_cuda_visible_devices_restricts_the_gpus_used(monkeypatch):
    """On the recorded 8-GPU node: a variable the worker found set keeps its restriction (by UUID, UUID prefix
    or number), read as CUDA reads it (up to the first entry that names nothing); none named: no_gpu."""
    import json

    from fleetcanary.probes.base import ProbeSkipped
    from fleetcanary.probes.lib import gpu_probe, nvml
    from fleetcanary.probes.testing.nvml_fake import FACTS_DIR
    from tests.support.gpu import fake

    fake(monkeypatch, "h100_8gpu_healthy")
    uuids = [d["uuid"] for d in json.loads((FACTS_DIR / "h100_8gpu_healthy.json").read_text())["devices"]]
    with nvml.open_session() as s:
        hs = s.handles()

        def kept(value):
            return [h.index for h in gpu_probe.visible(s, hs, {"CUDA_VISIBLE_DEVICES": value})]
        assert [h.index for h in gpu_probe.visible(s, hs, {})] == list(range(8))
        assert kept(f"{uuids[5]},{uuids[2][:12]}") == [2, 5]
        assert kept("1,3,nonsense,6") == [1, 3]
        with pytest.raises(ProbeSkipped) as e:
            kept("")
    assert e.value.reason == "no_gpu" and "names none of the GPUs" in e.value.detail
