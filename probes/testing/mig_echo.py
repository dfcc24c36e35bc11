"""What a MIG child process sees, for tests of probes/lib/gpu_probe.on_mig (no GPU needed)."""
from __future__ import annotations

import os


def cuda_visible(config: dict) -> dict:
    if config.get("fail"):
        raise RuntimeError("CUDA error: invalid device ordinal")
    return {"gpu_seconds": config.get("cost", 0.0), "seen": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pid": os.getpid()}
