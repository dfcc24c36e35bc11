"""torch helpers shared by the GPU probes: one code path for "cuda" and "cpu".

Imported only inside a worker's ``run``. On CUDA, copies are timed with CUDA events
on the stream that runs them; on CPU (tests, and nodes without a GPU) with
perf_counter around a synchronous copy.
"""
from __future__ import annotations

import time
from typing import Callable

from fleetcanary.probes.base import ProbeSkipped


def import_torch():
    try:
        import torch
    except ImportError:
        raise ProbeSkipped("dependency_missing", "torch is not installed (pip install 'fleetcanary[gpu]')") from None
    return torch


def resolve_device_kind(requested: str) -> str:
    """"auto" -> "cuda" when torch sees a GPU, else raises ProbeSkipped(no_gpu)."""
    torch = import_torch()
    if requested == "cpu":
        return "cpu"
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return "cuda"
    raise ProbeSkipped("no_gpu", "torch sees no CUDA device")


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
