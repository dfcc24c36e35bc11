"""One rank of the collectives sweep: `python -I -m fleetcanary.probes.collectives.rank`.

Started by the collectives probe inside its worker; reads its spec as JSON on stdin
and writes its timings and element check to the file descriptor in
FLEETCANARY_RANK_RESULT_FD.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

from fleetcanary.probes.collectives.spec import ELEMENT, FAULT_ENV


def _pattern(torch, rank: int, start: int, count: int, device):
    idx = torch.arange(start, start + count, device=device, dtype=torch.int64)
    return ((rank + 1) * 3 + idx % 11).to(torch.float32)


def _buffers(torch, coll: str, size: int, n: int, rank: int, device) -> dict[str, Any]:
    """Input/output tensors, their element counts and the exact expected output."""
    total = max(size // ELEMENT, n)
    total -= total % n  # divisible by the ranks, as nccl-tests rounds
    chunk = total // n
    if coll == "all_reduce":
        inp = _pattern(torch, rank, 0, total, device)
        exp = sum(_pattern(torch, r, 0, total, device) for r in range(n))
        return {"in": inp, "out": inp, "expected": exp, "count": total}
    if coll == "broadcast":
        inp = _pattern(torch, rank, 0, total, device)
        return {"in": inp, "out": inp, "expected": _pattern(torch, 0, 0, total, device), "count": total}
    if coll == "all_gather":
        inp = _pattern(torch, rank, 0, chunk, device)
        exp = torch.cat([_pattern(torch, r, 0, chunk, device) for r in range(n)])
        return {"in": inp, "out": torch.empty(total, device=device), "expected": exp, "count": total}
    if coll == "reduce_scatter":
        inp = _pattern(torch, rank, 0, total, device)
        exp = sum(_pattern(torch, r, rank * chunk, chunk, device) for r in range(n))
        return {"in": inp, "out": torch.empty(chunk, device=device), "expected": exp, "count": total}
    if coll == "all_to_all":
        inp = _pattern(torch, rank, 0, total, device)
        exp = torch.cat([_pattern(torch, r, rank * chunk, chunk, device) for r in range(n)])
        return {"in": inp, "out": torch.empty(total, device=device), "expected": exp, "count": total}
    raise ValueError(coll)


def _op(dist, coll: str, b: dict):
    if coll == "all_reduce":
        return lambda: dist.all_reduce(b["out"])
    if coll == "broadcast":
        return lambda: dist.broadcast(b["out"], 0)
    if coll == "all_gather":
        return lambda: dist.all_gather_into_tensor(b["out"], b["in"])
    if coll == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(b["out"], b["in"])
    return lambda: dist.all_to_all_single(b["out"], b["in"])


def _rank_main() -> int:
    from datetime import timedelta

    spec = json.load(sys.stdin)
    fd = int(os.environ["FLEETCANARY_RANK_RESULT_FD"])
    rank, n, backend = spec["rank"], spec["world"], spec["backend"]
    fault_kind, _, fault_rank = os.environ.get(FAULT_ENV, "").partition(":")
    out: dict[str, Any] = {"rank": rank, "results": []}
    import torch
    import torch.distributed as dist

    if fault_kind == "stall" and fault_rank == str(rank):
        time.sleep(3600)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        out["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    else:
        device = torch.device("cpu")
    out["torch"] = torch.__version__
    try:
        dist.init_process_group(backend, init_method=f"file://{spec['store']}", rank=rank, world_size=n,
                                timeout=timedelta(seconds=spec["timeout"]),
                                **({"device_id": device} if backend == "nccl" else {}))
        untimed = 0.0
        for coll in spec["collectives"]:
            for size in spec["sizes"]:
                b = _buffers(torch, coll, size, n, rank, device)
                op = _op(dist, coll, b)
                for _ in range(spec["warmup"]):
                    op()
                times = []
                for _ in range(spec["iterations"]):
                    if backend == "nccl":
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        op()
                        e.record()
                        e.synchronize()
                        times.append(s.elapsed_time(e) / 1e3)
                    else:
                        t0 = time.perf_counter()
                        op()
                        times.append(time.perf_counter() - t0)
                # Check: fresh inputs, one more operation, every element compared exactly.
                b = _buffers(torch, coll, size, n, rank, device)
                _op(dist, coll, b)()
                if backend == "nccl":
                    torch.cuda.synchronize()
                if fault_kind == "corrupt" and fault_rank == str(rank):
                    b["out"].view(-1)[0] += 1.0
                wrong = int((b["out"] != b["expected"]).sum().item())
                out["results"].append({"collective": coll, "size_bytes": size, "bytes": b["count"] * ELEMENT,
                                       "count": b["count"], "times": times, "wrong": wrong})
        dist.barrier()
        out["untimed_gpu_seconds"] = untimed
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - reported to the probe, which classifies it
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        kind = "timeout" if re.search(r"timed? ?out|Timeout", text) else "error"
        out["error"] = {"kind": kind, "detail": text}
    with os.fdopen(fd, "wb") as f:
        f.write(json.dumps(out).encode())
    return 0


if __name__ == "__main__":
    sys.exit(_rank_main())
