"""The pair's measurement: a 2-rank process group over the authenticated session, the
sweep, the element-by-element check.

Runs inside the probe's worker (one rank per node; the worker is already an isolated,
killable process). The host opens a torch TCPStore on an ephemeral port only after the
handshake and sends its port inside the session; both wrap it in a PrefixStore whose
prefix derives from the session key. gloo binds to this node's member address (not the
hostname's); NCCL gets only the allow-listed NCCL_* variables.

Definitions (nccl-tests): all_reduce size = the buffer, busbw = algbw x 2(n-1)/n = algbw for
2 ranks; all_gather size = the gathered output, busbw = algbw x (n-1)/n = algbw / 2.
Time per operation = the slower rank's, per iteration; the median is published.
send/recv: a ping-pong of ``sendrecv_bytes`` (host sends, guest answers); bandwidth =
2 x bytes / round trip, latency = round trip / 2, timed on the host.
After timing, each collective and the ping-pong run once more on fresh data and every
element is compared with its exact expected value.
"""
from __future__ import annotations

import functools
import os
import re
import time
from datetime import timedelta
from typing import Any

from fleetcanary.probes.base import ProbeError, ProbeTimeout
from fleetcanary.probes.fabric.spec import ELEMENT, FAULT_ENV

_TIMEOUT = re.compile(r"timed? ?out|timeout|deadline", re.IGNORECASE)
_LOST = re.compile(r"closed by peer|reset by peer|connection (closed|reset|refused)|broken pipe|EOF", re.IGNORECASE)


def bus_factor(collective: str, n: int = 2) -> float:
    return 2 * (n - 1) / n if collective == "all_reduce" else (n - 1) / n


def _exchange(ops, rank: int, mine, theirs) -> None:
    """One ping-pong: rank 0 sends then receives, rank 1 the other way round."""
    if rank == 0:
        ops.send(mine, 1)
        ops.recv(theirs, 1)
    else:
        ops.recv(theirs, 0)
        ops.send(mine, 0)


def _pattern(torch, rank: int, start: int, count: int, device, salt: int = 0):
    idx = torch.arange(start, start + count, device=device, dtype=torch.int64)
    return ((rank + 1) * 3 + salt + idx % 11).to(torch.float32)


class Ops:
    """all_reduce / all_gather / send / recv on gloo (a ProcessGroupGloo bound to an address)
    or NCCL (the default group), each bounded by what is left before ``until``."""

    def __init__(self, torch, dist, backend: str, pg, device, until: float, op_timeout: float) -> None:
        self.torch, self.dist, self.backend, self.pg, self.device = torch, dist, backend, pg, device
        self.until, self.op_timeout = until, op_timeout

    def _bound(self) -> timedelta:
        left = self.until - time.monotonic()
        if left <= 0.5:
            raise TimeoutError("deadline reached between operations")
        t = timedelta(seconds=min(self.op_timeout, left))
        if self.backend == "gloo":
            self.pg.set_timeout(t)
        return t

    def _run(self, gloo_call, nccl_call) -> None:
        t = self._bound()
        if self.backend == "gloo":
            gloo_call().wait()
        else:
            # async, then a bounded wait: a hung NCCL kernel raises here (the communicator is
            # aborted, TORCH_NCCL_ASYNC_ERROR_HANDLING=2) instead of blocking a synchronize
            nccl_call().wait(t)

    def sync(self) -> None:
        if self.backend == "nccl":
            self.torch.cuda.synchronize(self.device)

    def all_reduce(self, t) -> None:
        self._run(lambda: self.pg.allreduce([t]), lambda: self.dist.all_reduce(t, async_op=True))

    def all_gather(self, out, inp) -> None:
        self._run(lambda: self.pg._allgather_base(out, inp),
                  lambda: self.dist.all_gather_into_tensor(out, inp, async_op=True))

    def send(self, t, dst: int) -> None:
        self._run(lambda: self.pg.send([t], dst, 0), lambda: self.dist.isend(t, dst))

    def recv(self, t, src: int) -> None:
        self._run(lambda: self.pg.recv([t], src, 0), lambda: self.dist.irecv(t, src))


def classify(exc: BaseException) -> ProbeError:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    if isinstance(exc, TimeoutError) or _TIMEOUT.search(text):
        return ProbeTimeout("collective_timeout", text)
    if _LOST.search(text):
        return ProbeError("peer_lost", text)
    return ProbeError("rank_failed", text)


def connect(session, role: str, my_ip: str, backend: str, device, until: float, op_timeout: float):
    """The store and process group of the pair; (torch, Ops, the store kept alive)."""
    import torch
    import torch.distributed as dist

    rank = 0 if role == "host" else 1
    timeout = timedelta(seconds=max(1.0, min(op_timeout, until - time.monotonic())))
    if role == "host":
        base = dist.TCPStore(my_ip, 0, 2, True, timeout, wait_for_workers=False)
        session.send("store", port=int(base.port))
    else:
        msg = session.recv("store", until)
        port = msg.get("port")
        if not isinstance(port, int) or not 1 <= port <= 65535:
            raise ProbeError("rendezvous_failed", "the partner sent no valid store port")
        base = dist.TCPStore(session.peer_ip, port, 2, False, timeout)
    store = dist.PrefixStore(session.store_prefix, base)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=my_ip)]
        opts._timeout = timeout
        pg = dist.ProcessGroupGloo(store, rank, 2, opts)
    else:
        torch.cuda.set_device(device)   # before the communicator exists
        dist.init_process_group("nccl", store=store, rank=rank, world_size=2, timeout=timeout, device_id=device)
        pg = None
    return torch, Ops(torch, dist, backend, pg, device, until, op_timeout), base


def sweep(torch, ops: Ops, rank: int, collectives, sizes, sendrecv_bytes: int, warmup: int, iterations: int,
          sr_iterations: int, device) -> dict[str, Any]:
    """Timings (this rank's) and wrong-element counts; the caller merges both ranks' timings."""
    fault = os.environ.get(FAULT_ENV, "")
    out: dict[str, Any] = {"results": []}
    for coll in collectives:
        for size in sizes:
            total = max(size // ELEMENT, 2)
            total -= total % 2
            times = []
            for i in range(warmup + iterations):
                if coll == "all_reduce":
                    buf = _pattern(torch, rank, 0, total, device)
                    op = functools.partial(ops.all_reduce, buf)
                else:
                    inp = _pattern(torch, rank, 0, total // 2, device)
                    res = torch.empty(total, device=device)
                    op = functools.partial(ops.all_gather, res, inp)
                ops.sync()
                t0 = time.perf_counter()
                op()
                ops.sync()
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
            # the check: fresh inputs, one more operation, every element compared
            if coll == "all_reduce":
                got = _pattern(torch, rank, 0, total, device, salt=7)
                ops.all_reduce(got)
                exp = _pattern(torch, 0, 0, total, device, salt=7) + _pattern(torch, 1, 0, total, device, salt=7)
            else:
                inp = _pattern(torch, rank, 0, total // 2, device, salt=7)
                got = torch.empty(total, device=device)
                ops.all_gather(got, inp)
                exp = torch.cat([_pattern(torch, r, 0, total // 2, device, salt=7) for r in (0, 1)])
            ops.sync()
            if fault == "corrupt" and rank == 1:
                got.view(-1)[0] += 1.0
            out["results"].append({"collective": coll, "size_bytes": size, "bytes": total * ELEMENT, "count": total,
                                   "times": times, "wrong": int((got != exp).sum().item())})
    # send/recv ping-pong
    n = max(sendrecv_bytes // ELEMENT, 1)
    mine = _pattern(torch, rank, 0, n, device)
    theirs = torch.empty(n, device=device)
    rtts = []
    if fault == "hang" and rank == 1:
        time.sleep(3600)   # a partner that stops answering mid-sweep, its sockets still open
    for i in range(1 + sr_iterations):
        ops.sync()
        t0 = time.perf_counter()
        _exchange(ops, rank, mine, theirs)
        ops.sync()
        if i >= 1:
            rtts.append(time.perf_counter() - t0)
    mine = _pattern(torch, rank, 0, n, device, salt=5)
    _exchange(ops, rank, mine, theirs)
    ops.sync()
    exp = _pattern(torch, 1 - rank, 0, n, device, salt=5)
    out["sendrecv"] = {"bytes": n * ELEMENT, "round_trip_seconds": rtts, "wrong": int((theirs != exp).sum().item())}
    return out


def exchange(torch, ops: Ops, mine: dict, device) -> list[dict[str, list[float]]]:
    """Both ranks' timings (collectives then round trips) and wrong-element counts, exchanged
    over the pair, so both sides publish the same figures and both see a wrong result."""
    times = [t for r in mine["results"] for t in r["times"]] + mine["sendrecv"]["round_trip_seconds"]
    wrong = [float(r["wrong"]) for r in mine["results"]] + [float(mine["sendrecv"]["wrong"])]
    flat = times + wrong
    t = torch.tensor(flat, dtype=torch.float64, device=device)
    both = torch.empty(2 * len(flat), dtype=torch.float64, device=device)
    ops.all_gather(both, t)
    ops.sync()
    vals = both.cpu().tolist()
    out = []
    for r in range(2):
        v = vals[r * len(flat):(r + 1) * len(flat)]
        out.append({"times": v[: len(times)], "wrong": v[len(times):]})
    return out
