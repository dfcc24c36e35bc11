"""The worker: runs one probe in a child process and writes its result as JSON.

Started by ``exporter.isolation`` as ``python -m exporter.worker`` in a new process
group. The job arrives as JSON on stdin; the result goes to the file descriptor in
FLEETCANARY_RESULT_FD, so nothing a probe prints can corrupt it. stdout and stderr
are drained by the parent and only their tail is kept.

This is the only place where torch, NVML and network targets are touched.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
import traceback
from typing import Any

RESULT_FD_ENV = "FLEETCANARY_RESULT_FD"


def _load_class(path: str):
    module, _, qual = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _clean(v: Any) -> Any:
    """JSON-safe: NaN/inf become None so the result stays standard JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


SECRET_KEYS = ("password", "secret", "api_key", "apikey", "token", "authorization")


def redact(v: Any, key: str = "") -> Any:
    if isinstance(v, dict):
        if key == "headers":
            return {str(k): "<redacted>" for k in v}
        return {str(k): redact(x, str(k)) for k, x in v.items()}
    if isinstance(v, list):
        return [redact(x, key) for x in v]
    if isinstance(v, str) and key.lower() in SECRET_KEYS:
        return "<redacted>"
    return v


def _samples(result) -> list[dict[str, Any]]:
    return [{"metric": s.metric, "labels": s.labels, "value": s.value} for s in result.samples]


def execute(job: dict[str, Any]) -> dict[str, Any]:
    from probes.base import ProbeContext, ProbeError, ProbeSkipped, ProbeTimeout

    from . import environment

    t0 = time.monotonic()
    throttle_before = environment.cpu_throttling()
    out: dict[str, Any] = {"probe": job["name"]}
    cls = _load_class(job["class"])
    probe = cls()
    config = cls.Config.model_validate(job.get("params", {}))
    ctx = ProbeContext(**job["context"])
    try:
        result = probe.run(config, ctx)
        out["status"] = "success"
        out["samples"] = _samples(result)
        out["record"] = result.record()
    except ProbeSkipped as exc:
        out.update(status="skipped", reason=exc.reason, detail=exc.detail)
    except ProbeTimeout as exc:
        out.update(status="timeout", reason=exc.reason, detail=exc.detail or str(exc))
    except ProbeError as exc:
        reason = exc.reason if exc.reason in cls.all_failure_reasons() else "other"
        out.update(status="failure", reason=reason, detail=exc.detail or str(exc))
        if exc.result is not None:
            out["samples"] = _samples(exc.result)
            out["record"] = exc.result.record()
    except Exception as exc:  # noqa: BLE001 - a probe bug is classified as a crash, never raised
        out.update(status="crash", reason="exception", detail=f"{type(exc).__name__}: {exc}",
                   traceback=traceback.format_exc(limit=8))
    duration = time.monotonic() - t0
    # The settings the run used, so results say what they measured and `compare` can refuse
    # incomparable pairs; header values and anything named like a secret are redacted.
    out.setdefault("record", {})["config"] = redact(config.model_dump(mode="json"))
    env = environment.collect(with_gpu=job.get("collect_gpu_facts", True))
    env.update(environment.throttling_delta(throttle_before, environment.cpu_throttling()))
    out["environment"] = env
    out["duration_seconds"] = duration
    return _clean(out)


def main() -> int:
    # Under memory pressure the kernel should kill a probe worker, never the daemon that serves
    # /metrics: raising our own OOM score needs no privilege.
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    fd = int(os.environ[RESULT_FD_ENV])
    job = json.load(sys.stdin)
    result = execute(job)
    data = json.dumps(result, allow_nan=False).encode()
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
