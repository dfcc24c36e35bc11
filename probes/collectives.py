"""Collective sweeps: all_reduce, all_gather, reduce_scatter, all_to_all (broadcast
optional) over a configured list of message sizes, one rank per GPU with NCCL, or
gloo with CPU ranks where there is no GPU.

Definitions follow nccl-tests (doc/PERFORMANCE.md there):
- size: the bytes of the whole buffer: all_reduce and broadcast the buffer; all_gather
  the gathered output; reduce_scatter the input before scattering; all_to_all the
  buffer each rank sends.
- time per operation: each timed iteration's duration on the slowest rank (the
  maximum over ranks); the median over iterations is published and all kept.
- algbw = size / time; busbw = algbw x factor, factor 2(n-1)/n for all_reduce,
  (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 for broadcast.
- correctness: after timing, every rank fills its input with a rank- and
  index-dependent integer pattern, runs the collective once more and compares every
  output element with the exact expected value. Any wrong element fails the probe
  (reason wrong_result); wrong numbers are never published.

The ranks are processes spawned inside the worker, so they share its process group
and die with it at the deadline. Collective timeouts are set below the deadline; a
collective that times out ends the probe as a timeout.

Test hook: FLEETCANARY_COLLECTIVES_FAULT=corrupt:R makes rank R corrupt one output
element before the check; stall:R makes rank R sleep instead of joining.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, ClassVar, Literal

from pydantic import Field

from .base import (Figure, MetricSpec, Probe, ProbeConfig, ProbeContext, ProbeError, ProbeResult, ProbeSkipped,
                   ProbeTimeout, Sample)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
DEFAULT_SIZES = (8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
ELEMENT = 4  # float32
FAULT_ENV = "FLEETCANARY_COLLECTIVES_FAULT"
LABELS = ("collective", "size_bytes", "ranks", "backend")
BUSBW = "fleetcanary_collective_bus_bandwidth_bytes_per_second"
ALGBW = "fleetcanary_collective_algorithm_bandwidth_bytes_per_second"
LAT = "fleetcanary_collective_latency_seconds"
MAX_TOPO_BYTES = 256 << 10


def bus_factor(collective: str, n: int) -> float:
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


class Config(ProbeConfig):
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="auto: NCCL with one rank per GPU where GPUs exist, else gloo with cpu_ranks ranks.")
    cpu_ranks: int = Field(2, ge=2, le=64, description="gloo ranks (processes) when running on the CPU.")
    min_gpus: int = Field(2, ge=1, le=64, description="Fewer usable GPUs than this skips with single_gpu.")
    collectives: tuple[Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"], ...] = Field(
        ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"), description="Collectives to sweep.")
    sizes_bytes: tuple[int, ...] = Field(
        DEFAULT_SIZES, description="Message sizes, bytes (nccl-tests' size definition); each a label value.")
    gloo_max_bytes: int = Field(
        4 << 20, ge=8, description="With gloo, sizes above this are left out (CPU ranks over loopback are slow).")
    warmup_iterations: int = Field(5, ge=0, le=100, description="Untimed iterations per size.")
    iterations: int = Field(20, ge=1, le=1000, description="Timed iterations per size.")
    collective_timeout_seconds: float = Field(
        60.0, gt=0, description="Timeout of one collective; capped below the probe's deadline.")
    busy_policy: Literal["node", "gpu"] = Field("node", description="node: any busy GPU skips the run.")
    expected_gpu_seconds: float = Field(5.0, gt=0, description="GPU seconds a run is assumed to cost, per GPU.")
    nccl_tests_dir: str | None = Field(
        None, description="A directory with nccl-tests binaries (all_reduce_perf, ...): run those instead.")
    topology_dump: bool = Field(True, description="Keep the topology NCCL chose (NCCL_TOPO_DUMP_FILE) in the record.")


class Collectives(Probe):
    name = "collectives"
    Config = Config
    exclusive = "gpu"
    failure_reasons = ("wrong_result", "rank_failed", "nccl_tests_failed", "nvml_error", "cuda_error")
    default_interval_seconds = 1800.0
    default_timeout_seconds = 180.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(BUSBW, "gauge", "Collective bus bandwidth (nccl-tests busbw: algbw x 2(n-1)/n for all_reduce, "
                   "x (n-1)/n for all_gather, reduce_scatter, all_to_all), median over iterations.",
                   "bytes_per_second", LABELS),
        MetricSpec(ALGBW, "gauge", "Collective algorithm bandwidth: size / time per operation, median over iterations.",
                   "bytes_per_second", LABELS),
        MetricSpec(LAT, "gauge", "Time per collective operation on the slowest rank, median over iterations.",
                   "seconds", LABELS),
    )

    # ------------------------------------------------------------------ run
    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        backend, ranks, gate = self._plan(config, ctx)
        if config.nccl_tests_dir and backend == "nccl":
            from . import nccl_tests

            return nccl_tests.run(config, ctx, ranks, gate)
        sizes = [s for s in config.sizes_bytes if backend == "nccl" or s <= config.gloo_max_bytes]
        if not sizes:
            raise ProbeSkipped("not_configured", "no message size within gloo_max_bytes")
        deadline_left = ctx.deadline_monotonic - time.monotonic()
        coll_timeout = max(min(config.collective_timeout_seconds, deadline_left - 5.0), 1.0)
        spec = {"backend": backend, "world": ranks, "collectives": list(config.collectives), "sizes": sizes,
                "warmup": config.warmup_iterations, "iterations": config.iterations, "timeout": coll_timeout,
                "port": _free_port()}
        per_rank, topo = _launch_ranks(spec, config.topology_dump and backend == "nccl", ctx)
        return self._reduce(per_rank, spec, topo, gate)

    @staticmethod
    def _plan(config: Config, ctx: ProbeContext):
        """(backend, number of ranks, gate record) or ProbeSkipped."""
        if config.backend == "gloo":
            return "gloo", config.cpu_ranks, None
        from . import gpu_gate, nvml

        try:
            session = nvml.open_session()
        except nvml.NvmlUnavailable as exc:
            if config.backend == "nccl":
                raise ProbeSkipped("no_gpu", str(exc)) from None
            return "gloo", config.cpu_ranks, None
        with session:
            handles = session.handles()
            if len(handles) < config.min_gpus:
                raise ProbeSkipped("single_gpu", f"{len(handles)} GPU(s); min_gpus is {config.min_gpus}")
            gate = gpu_gate.gate(session, handles, ctx.gpu, ctx.kube, config.expected_gpu_seconds, config.busy_policy)
        if len(gate.usable) < config.min_gpus:
            raise ProbeSkipped("gpu_busy", f"{len(gate.usable)} usable GPU(s): {gate.skipped}")
        from . import torch_util

        torch = torch_util.import_torch()
        if not torch.cuda.is_available() or torch.cuda.device_count() < len(gate.usable):
            raise ProbeSkipped("no_gpu", "torch sees fewer CUDA devices than NVML")
        if not torch.distributed.is_nccl_available():
            raise ProbeSkipped("dependency_missing", "this torch build has no NCCL")
        return "nccl", len(gate.usable), gate

    @staticmethod
    def _reduce(per_rank: list[dict], spec: dict, topo: str | None, gate) -> ProbeResult:
        n = spec["world"]
        backend = spec["backend"]
        res = ProbeResult(parameters={k: spec[k] for k in ("backend", "world", "collectives", "sizes", "warmup",
                                                           "iterations", "timeout")},
                          touched={"ranks": n, "invasive": backend == "nccl", **(gate.record() if gate else {})})
        wrong = []
        sweep = []
        r0 = per_rank[0]
        for i, entry in enumerate(r0["results"]):
            coll, size = entry["collective"], entry["size_bytes"]
            for r in per_rank:
                if r["results"][i]["wrong"]:
                    wrong.append(f"{coll} size {size} rank {r['rank']}: {r['results'][i]['wrong']} wrong elements")
            # Slowest rank per iteration, as nccl-tests reports the maximum over ranks.
            iters = [max(r["results"][i]["times"][k] for r in per_rank) for k in range(len(entry["times"]))]
            nbytes = entry["bytes"]
            factor = bus_factor(coll, n)
            labels = {"collective": coll, "size_bytes": str(size), "ranks": str(n), "backend": backend}
            lat = Figure(f"{coll}_latency", "seconds", iters, labels, higher_is_better=False)
            alg = Figure(f"{coll}_algbw", "bytes_per_second", [nbytes / t for t in iters], labels)
            bus = Figure(f"{coll}_busbw", "bytes_per_second", [nbytes / t * factor for t in iters], labels)
            # algbw is size / time (nccl-tests): from the median time, so the three published
            # figures agree exactly; the per-iteration bandwidths keep the dispersion.
            alg.median = alg.dispersion["median"] = nbytes / lat.median
            bus.median = bus.dispersion["median"] = alg.median * factor
            res.figures += [bus, alg, lat]
            sweep.append({"collective": coll, "size_bytes": size, "bytes": nbytes, "count": entry["count"],
                          "bus_factor": factor, "time_seconds": iters, "per_rank_time_seconds":
                          [r["results"][i]["times"] for r in per_rank]})
            res.samples += [Sample(LAT, labels, lat.median), Sample(ALGBW, labels, alg.median),
                            Sample(BUSBW, labels, bus.median)]
        if wrong:
            raise ProbeError("wrong_result", "; ".join(wrong[:5]))
        gpu_seconds = {}
        if backend == "nccl":
            for r in per_rank:
                gpu = str(gate.usable[r["rank"]].index) if gate else str(r["rank"])
                gpu_seconds[gpu] = sum(sum(x["times"]) for x in r["results"]) + r.get("untimed_gpu_seconds", 0.0)
        res.gpu_seconds = gpu_seconds
        res.extra = {"sweep": sweep, "nccl_version": r0.get("nccl_version"), "torch": r0.get("torch"),
                     "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
                     "topology_xml": topo}
        return res


# ---------------------------------------------------------------------- launching
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_ranks(spec: dict, want_topo: bool, ctx: ProbeContext) -> tuple[list[dict], str | None]:
    world = spec["world"]
    procs, pipes = [], []
    topo_dir = tempfile.mkdtemp(prefix="fleetcanary-nccl-") if want_topo else None
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if topo_dir and "NCCL_TOPO_DUMP_FILE" not in env:
        env["NCCL_TOPO_DUMP_FILE"] = os.path.join(topo_dir, "topo.xml")
    try:
        for rank in range(world):
            r, w = os.pipe()
            p = subprocess.Popen([sys.executable, "-m", "probes.collectives", "--rank"],
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 pass_fds=(w,), env={**env, "FLEETCANARY_RANK_RESULT_FD": str(w)})
            os.close(w)
            p.stdin.write(json.dumps({**spec, "rank": rank}).encode())
            p.stdin.close()
            procs.append(p)
            pipes.append(r)
        results: list[dict | None] = [None] * world
        errors: list[str] = []
        for rank, (p, r) in enumerate(zip(procs, pipes)):
            with os.fdopen(r, "rb") as f:
                data = f.read(64 << 20)
            pipes[rank] = -1
            stderr = p.stderr.read()[-4000:].decode("utf-8", "replace")
            code = p.wait()
            if data:
                try:
                    results[rank] = json.loads(data)
                except ValueError:
                    errors.append(f"rank {rank}: unreadable result")
            else:
                errors.append(f"rank {rank} exited {code}: {_last_line(stderr)}")
        timeouts = [e for e in errors if re.search(r"timed? ?out|Timeout|DistStoreError", e)]
        if timeouts:
            raise ProbeTimeout("collective_timeout", timeouts[0][:500])
        if errors or any(x is None for x in results):
            raise ProbeError("rank_failed", "; ".join(errors)[:1000])
        for res in results:
            if res.get("error"):
                kind = res["error"]["kind"]
                if kind == "timeout":
                    raise ProbeTimeout("collective_timeout", f"rank {res['rank']}: {res['error']['detail']}"[:500])
                raise ProbeError("rank_failed", f"rank {res['rank']}: {res['error']['detail']}"[:500])
        topo = None
        if topo_dir:
            path = env["NCCL_TOPO_DUMP_FILE"]
            if os.path.exists(path):
                with open(path, "rb") as f:
                    topo = f.read(MAX_TOPO_BYTES).decode("utf-8", "replace")
        return results, topo  # type: ignore[return-value]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for r in pipes:
            if r >= 0:
                os.close(r)
        if topo_dir:
            import shutil

            shutil.rmtree(topo_dir, ignore_errors=True)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


# ---------------------------------------------------------------------- one rank
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
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank, world_size=n,
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


if __name__ == "__main__" and "--rank" in sys.argv:
    sys.exit(_rank_main())
