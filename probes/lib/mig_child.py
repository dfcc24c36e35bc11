"""The child process of probes/lib/gpu_probe.on_mig: reads {"module", "function", "config"} as JSON on stdin,
calls module.function(config) with CUDA pointed at one MIG device (CUDA_VISIBLE_DEVICES, set by the parent), and
writes its result as one JSON line on stdout. Only fleetcanary.probes modules are called."""
from __future__ import annotations

import importlib
import json
import sys


def main() -> int:
    job = json.loads(sys.stdin.read())
    module = str(job["module"])
    if not module.startswith("fleetcanary.probes."):
        print(f"refused: {module} is not a fleetcanary probe module", file=sys.stderr)
        return 2
    fn = getattr(importlib.import_module(module), str(job["function"]))
    print(json.dumps(fn(job["config"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
