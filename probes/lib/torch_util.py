"""torch helpers shared by the GPU probes: one code path for "cuda" and "cpu".

Imported only inside a worker's ``run``. On CUDA, copies are timed with CUDA events
on the stream that runs them; on CPU (tests, and nodes without a GPU) with
perf_counter around a synchronous copy.
"""
from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fleetcanary.probes.base import ProbeError, ProbeSkipped

# A RuntimeError whose message names one of these came from the GPU stack, not from the probe.
CUDA_MARKERS = ("CUDA", "cuda", "CUBLAS")


TORCH_MISSING = "torch is not installed (pip install 'fleetcanary[gpu]')"


def import_torch():
    try:
        import torch
    except ImportError:
        raise ProbeSkipped("dependency_missing", TORCH_MISSING) from None
    return torch


def require_torch() -> None:
    """Skip with dependency_missing unless torch is installed, without importing it (for a
    probe whose rank programs import it, on gloo as on NCCL)."""
    if importlib.util.find_spec("torch") is None:
        raise ProbeSkipped("dependency_missing", TORCH_MISSING)


def resolve_device_kind(requested: str) -> str:
    """"auto" -> "cuda" when torch sees a GPU, else raises ProbeSkipped(no_gpu)."""
    torch = import_torch()
    if requested == "cpu":
        return "cpu"
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return "cuda"
    raise ProbeSkipped("no_gpu", "torch sees no CUDA device")


# The oldest driver each CUDA major version runs on (NVIDIA's CUDA compatibility guide: minor version
# compatibility for 12.x from 525.60.13; CUDA 13.0 needs the R580 branch). docs/image.md has the matrix.
MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}
# torch's words for cudaErrorInsufficientDriver (35) and for its own check of the driver's CUDA version
DRIVER_TOO_OLD_WORDS = ("driver version is insufficient", "driver on your system is too old")


def _major(version: object) -> int | None:
    head = str(version).split(".", 1)[0]
    return int(head) if head.isdigit() else None


def why_no_cuda(torch, driver: tuple[str, str] | None = None) -> tuple[str, str]:
    """Where NVML sees GPUs and torch does not: the skip reason and torch's own words. A CPU build of torch is a
    missing dependency (a GPU node needs the CUDA image); a CUDA build the node's driver is too old for
    (``driver``: NVML's driver version and the CUDA version it supports, "13.0", when the caller read them; or
    torch's error says so) is driver_too_old, with the image to run instead; any other cause (a device node
    missing) is unsupported here."""
    if torch.version.cuda is None:
        return "dependency_missing", (f"torch {torch.__version__} is a CPU build and NVML sees GPUs: a GPU node "
                                      "needs torch with CUDA (the CUDA image, docs/image.md)")
    try:
        torch.cuda.init()
        why = "torch sees no CUDA device"
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError or AssertionError, with its reason
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    driver_version, driver_cuda = driver or ("unknown", "unknown")
    needs, has = _major(torch.version.cuda), _major(driver_cuda)
    if (needs is not None and has is not None and has < needs) or any(w in why.lower()
                                                                      for w in DRIVER_TOO_OLD_WORDS):
        floor = f" (driver {MIN_DRIVER[needs]} or newer)" if needs in MIN_DRIVER else ""
        advice = ("run the cuda12 image (tag <version>-cuda12) or upgrade the driver" if has == 12 and needs != 12
                  else "upgrade the driver")
        return "driver_too_old", (f"driver {driver_version} runs CUDA {driver_cuda}, torch {torch.__version__} "
                                  f"needs CUDA {torch.version.cuda}{floor}: {advice} (docs/image.md); torch: {why}")
    return "unsupported", (f"NVML sees GPUs, torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use "
                           f"them: {why}")


def time_op(torch, device, fn: Callable[[], None]) -> float:
    """Seconds one call of ``fn`` takes on ``device`` (CUDA events, or perf_counter on CPU)."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def l2_cache_bytes(torch, device) -> int | None:
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0)) or None


def fill_random(torch, t) -> None:
    """Non-constant contents: a copy of zeros can be faster than real data on some hardware."""
    t.view(torch.uint8).random_(0, 256) if t.dtype != torch.uint8 else t.random_(0, 256)


def classify_cuda_error(exc: BaseException, gpu: int | None = None) -> ProbeError | None:
    """The failure a GPU error stands for: ``out_of_memory`` for torch's OutOfMemoryError,
    ``cuda_error`` for a RuntimeError from CUDA or cuBLAS; the detail is the message's first
    line, after "GPU n: " where the run was on one known GPU. None for anything else: a bug
    in the probe, which crashes as it should."""
    text = str(exc)
    detail = (f"GPU {gpu}: " if gpu is not None else "") + (text.splitlines()[0] if text else "")
    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return ProbeError("out_of_memory", detail)
    if isinstance(exc, RuntimeError) and any(m in text for m in CUDA_MARKERS):
        return ProbeError("cuda_error", detail)
    return None


@contextmanager
def cuda_errors(gpu: int | None = None) -> Iterator[None]:
    """Raise what ``classify_cuda_error`` makes of a GPU error in the block; others pass."""
    try:
        yield
    except RuntimeError as exc:
        err = classify_cuda_error(exc, gpu)
        if err is None:
            raise
        raise err from None
