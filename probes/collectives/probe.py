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
- published: the bus bandwidth per collective and size (what the fleet compares); the
  algorithm bandwidth and the time per operation are in the run record, and series only
  with ``detail`` (they follow from busbw by constant factors of the collective and rank count).
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
import shutil
import subprocess
import tempfile
import time
from typing import ClassVar

from fleetcanary.probes.base import (
    Figure,
    MetricSpec,
    Probe,
    ProbeContext,
    ProbeError,
    ProbeResult,
    ProbeSkipped,
    ProbeTimeout,
    Sample,
)
from fleetcanary.probes.collectives.spec import ALGBW, BUSBW, LABELS, LAT, MAX_TOPO_BYTES, Config, bus_factor
from fleetcanary.probes.lib import safefile
from fleetcanary.probes.lib.spawn import module_command


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
        MetricSpec(ALGBW, "gauge", "Collective algorithm bandwidth: size / time per operation, median over iterations; "
                   "with detail only.", "bytes_per_second", LABELS, opt_in="detail"),
        MetricSpec(LAT, "gauge", "Time per collective operation on the slowest rank, median over iterations; with "
                   "detail only.", "seconds", LABELS, opt_in="detail"),
    )

    # ------------------------------------------------------------------ run
    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        backend, ranks, gate = self._plan(config, ctx)
        if config.nccl_tests_dir and backend == "nccl":
            from fleetcanary.probes.collectives import nccl_tests

            return nccl_tests.run(config, ctx, ranks, gate)
        sizes = self._sizes(config, backend)
        deadline_left = ctx.deadline_monotonic - time.monotonic()
        coll_timeout = max(min(config.collective_timeout_seconds, deadline_left - 5.0), 1.0)
        spec = {"backend": backend, "world": ranks, "collectives": list(config.collectives), "sizes": sizes,
                "warmup": config.warmup_iterations, "iterations": config.iterations, "timeout": coll_timeout}
        per_rank, topo = _launch_ranks(spec, config.topology_dump and backend == "nccl", ctx)
        return self._reduce(per_rank, spec, topo, gate, config.detail)

    @staticmethod
    def _sizes(config: Config, backend: str) -> list[int]:
        """The sizes to sweep: with gloo those up to gloo_max_bytes; none left is a not_configured skip."""
        sizes = [s for s in config.sizes_bytes if backend == "nccl" or s <= config.gloo_max_bytes]
        if not sizes:
            raise ProbeSkipped("not_configured", "no message size within gloo_max_bytes")
        return sizes

    @staticmethod
    def _plan(config: Config, ctx: ProbeContext):
        """(backend, number of ranks, gate record) or ProbeSkipped."""
        from fleetcanary.probes.lib import gpu_probe, torch_util

        torch_util.require_torch()  # first: the ranks are torch programs, on gloo as on NCCL
        if config.backend == "gloo":
            return "gloo", config.cpu_ranks, None

        # auto without NVML: gloo on the CPU; nccl without it: no_gpu
        gpus = gpu_probe.acquire(config, ctx, nvml_missing="skip" if config.backend == "nccl" else "none",
                                 min_gpus=config.min_gpus, too_few="gpu_busy")
        if gpus.kind == "cpu":
            return "gloo", config.cpu_ranks, None
        torch = torch_util.import_torch()
        if torch.cuda.device_count() < len(gpus.handles):
            raise ProbeSkipped("no_gpu", "torch sees fewer CUDA devices than NVML")
        if not torch.distributed.is_nccl_available():
            raise ProbeSkipped("dependency_missing", "this torch build has no NCCL")
        return "nccl", len(gpus.handles), gpus.gate

    @staticmethod
    def _reduce(per_rank: list[dict], spec: dict, topo: str | None, gate, detail: bool = False) -> ProbeResult:
        n = spec["world"]
        backend = spec["backend"]
        res = ProbeResult(parameters={**{k: spec[k] for k in ("backend", "world", "collectives", "sizes", "warmup",
                                                              "iterations", "timeout")}, "detail": detail},
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
            res.samples.append(Sample(BUSBW, labels, bus.median))
            if detail:
                res.samples += [Sample(LAT, labels, lat.median), Sample(ALGBW, labels, alg.median)]
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
def _run_dir(state_dir: str) -> str:
    """A fresh directory for this run's ranks, <state_dir>/collectives/run-<worker pid>-<random>, after removing
    those whose worker is gone (killed at a deadline, it could not remove its own). Where something else than
    this user's directory is in collectives/'s place (a planted link), a private one in the system's temporary
    directory."""
    root = os.path.join(state_dir, "collectives")
    if not safefile.private_dir(root):
        return tempfile.mkdtemp(prefix="fleetcanary-ranks-")
    for name in os.listdir(root):
        pid = name.split("-")[1] if name.startswith("run-") and name.count("-") >= 2 else ""
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=root)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _launch_ranks(spec: dict, want_topo: bool, ctx: ProbeContext) -> tuple[list[dict], str | None]:
    """The ranks meet through a file store in a directory of this run's own (torch's file:// init method), not a
    TCP port: a port picked free here and bound by rank 0 only after its torch import (seconds) could be taken
    by any other process in between, and the other ranks then waited on whatever held it until the collective
    timeout. The ranks are on this node, so a file is all the rendezvous needs; gloo's and NCCL's own
    connections bind their ports themselves. The directory (the store, NCCL's topology dump) is the run's own
    under the state directory; one a run killed at its deadline left is removed by the next run."""
    world = spec["world"]
    procs, pipes = [], []
    run_dir = _run_dir(ctx.state_dir)
    spec = {**spec, "store": os.path.join(run_dir, "store")}
    topo_dir = run_dir if want_topo else None
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if topo_dir and "NCCL_TOPO_DUMP_FILE" not in env:
        env["NCCL_TOPO_DUMP_FILE"] = os.path.join(topo_dir, "topo.xml")
    try:
        for rank in range(world):
            r, w = os.pipe()
            p = subprocess.Popen(module_command("fleetcanary.probes.collectives.rank"),
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 pass_fds=(w,), env={**env, "FLEETCANARY_RANK_RESULT_FD": str(w)})
            os.close(w)
            p.stdin.write(json.dumps({**spec, "rank": rank}).encode())
            p.stdin.close()
            procs.append(p)
            pipes.append(r)
        results: list[dict | None] = [None] * world
        errors: list[str] = []
        for rank, (p, r) in enumerate(zip(procs, pipes, strict=True)):
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
        shutil.rmtree(run_dir, ignore_errors=True)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"
