"""`fleetcanary loadtest TARGET`: the highest request rate an OpenAI-compatible
endpoint sustains within a latency SLO (goodput).

Workload: input and output lengths drawn from fixed, uniform or lognormal
distributions (in words, which the prompt is made of; servers count tokens), a
share of requests reusing a common prefix, a share streaming, a share cancelled
part-way. Arrivals: open-loop Poisson at each rate of a ramp, or a closed-loop
concurrency ramp. Each step runs for a fixed time; the requests it started are
waited for (bounded: the drain), then P50/P95/P99 TTFT, ITL and E2E, throughput,
tokens per second and the error rate are reported. Throughput is the requests that
finished (successful, not cancelled) over the step's measured wall time, from its start
to the end of its drain; dividing by the nominal step time instead would count the
drain's completions against too short a time and overstate it.

Scaling: ``--workers N`` runs each step's load in N local processes started together
(concurrency split into whole users, a Poisson rate into N rates), each timing its own
requests; their latency histograms (offline/latency_hist.py: fixed log buckets) merge
exactly, so the percentiles are those of every request. Beyond one machine, Locust's
master/worker mode runs the same client (offline/locustfile.py, docs/loadtest.md).
Goodput is the highest throughput of a step whose P99 TTFT and P99 ITL are within the
SLO and whose error rate is within bound.
Quality is not checked here (the inference probe does that); every request is
timed with probes/lib/llm_client.py, the canary's own definitions.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fleetcanary.core.stats import percentile  # noqa: F401 - re-exported for callers and tests
from fleetcanary.offline.latency_hist import LatencyHistogram
from fleetcanary.probes.lib import llm_client

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima")


@dataclass
class Dist:
    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Dist:
        parts = text.split(":")
        try:
            if parts[0] == "fixed" and len(parts) == 2:
                return cls("fixed", float(parts[1]))
            if parts[0] == "uniform" and len(parts) == 3:
                return cls("uniform", float(parts[1]), float(parts[2]))
            if parts[0] == "lognormal" and len(parts) == 3:
                return cls("lognormal", float(parts[1]), float(parts[2]))
        except ValueError:
            pass
        raise ValueError(f"{text!r}: use fixed:N, uniform:MIN:MAX or lognormal:MEDIAN:SIGMA")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            v = self.a
        elif self.kind == "uniform":
            v = rng.uniform(self.a, self.b)
        else:
            v = rng.lognormvariate(math.log(max(self.a, 1.0)), self.b)
        return max(1, round(v))


class Workload:
    def __init__(self, args: argparse.Namespace) -> None:
        self.rng = random.Random(args.seed)
        self.lock = threading.Lock()
        self.input = Dist.parse(args.input_len)
        self.output = Dist.parse(args.output_len)
        self.prefix_ratio = args.shared_prefix_ratio
        self.stream_ratio = args.stream_ratio
        self.cancel_ratio = args.cancel_ratio
        self.prefix = " ".join(self.rng.choice(WORDS) for _ in range(args.prefix_words))
        self.api = args.api
        self.model = args.model
        self.extra = {"ignore_eos": True, "min_tokens": None} if args.ignore_eos else {}

    def next(self) -> tuple[dict[str, Any], int | None]:
        with self.lock:
            n_in, n_out = self.input.sample(self.rng), self.output.sample(self.rng)
            words = " ".join(self.rng.choice(WORDS) for _ in range(n_in))
            if self.rng.random() < self.prefix_ratio:
                words = self.prefix + " " + words
            stream = self.rng.random() < self.stream_ratio
            cancel = max(1, int(n_out * self.rng.uniform(0.1, 0.9))) if stream and \
                self.rng.random() < self.cancel_ratio else None
        extra = dict(self.extra)
        if extra.get("ignore_eos"):
            extra["min_tokens"] = n_out
        return llm_client.build_body(self.api, self.model, words, n_out, stream, 0.0, extra), cancel


def _split(level: float, n: int, mode: str) -> list[float]:
    """A step's load shared by n processes: concurrency as whole users (the remainder to the
    first ones), a Poisson rate as n rates that sum to it (a sum of Poisson processes is one)."""
    if mode == "poisson":
        return [level / n] * n
    base, extra = divmod(int(level), n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def arrival_offsets(rate: float, seconds: float, seed: int = 0) -> list[float]:
    """An open-loop Poisson step's arrivals, in seconds from its start: fixed by the rate, the step's length
    and the seed. A request is started at its arrival or, on a machine too busy to keep up, as soon as it
    can be; none is dropped, so a step starts the same requests however fast the machine."""
    rng = random.Random(hash((rate, seconds, seed)))
    out, t = [], 0.0
    while (t := t + rng.expovariate(rate)) < seconds:
        out.append(t)
    return out


def run_local(ep: llm_client.Endpoint, wl: Workload, mode: str, level: float, t_start: float, seconds: float,
              drain_seconds: float, max_requests: int, progress=None, seed: int = 0) -> dict[str, Any]:
    """Run one step's share of load in this process, from t_start (time.perf_counter, i.e.
    CLOCK_MONOTONIC, the same in every process of the machine), and return its partial
    result: counts and exact-merge latency histograms (see merge())."""
    results: list[llm_client.RequestResult] = []
    lock = threading.Lock()
    stop = threading.Event()
    started = [0]

    def one() -> None:
        body, cancel = wl.next()
        r = llm_client.request(ep, body, cancel_after_chunks=cancel)
        with lock:
            results.append(r)

    while (left := t_start - time.perf_counter()) > 0:  # the agreed start time of every process
        time.sleep(min(left, 0.05))
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    end = t0 + seconds
    if mode == "concurrency" and level >= 1:
        def worker():
            while not stop.is_set() and time.perf_counter() < end:
                with lock:
                    if started[0] >= max_requests:
                        return
                    started[0] += 1
                one()
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(int(level))]
        for th in threads:
            th.start()
        while time.perf_counter() < end:
            if progress:
                progress(level, len(results), started[0], time.perf_counter() - t0)
            stop.wait(min(0.5, max(end - time.perf_counter(), 0.001)))
        stop.set()
        drain_end = time.perf_counter() + drain_seconds
        for th in threads:
            th.join(timeout=max(drain_end - time.perf_counter(), 0.01))
    elif mode == "poisson" and level > 0:
        pool = ThreadPoolExecutor(max_workers=512)
        last_progress = 0.0
        futures = []
        for offset in arrival_offsets(level, seconds, seed):
            if started[0] >= max_requests:
                break
            nxt = t0 + offset
            while True:
                now = time.perf_counter()
                if now >= nxt:
                    break
                time.sleep(min(nxt - now, 0.05))
                if progress and now - last_progress > 0.5:
                    progress(level, len(results), started[0], now - t0)
                    last_progress = now
            started[0] += 1
            futures.append(pool.submit(one))
        deadline = time.perf_counter() + drain_seconds
        for f in futures:
            try:
                f.result(timeout=max(deadline - time.perf_counter(), 0.01))
            except Exception:  # noqa: BLE001 - a request still running at the drain deadline is left out
                pass
        pool.shutdown(wait=False, cancel_futures=True)
    t_end = time.perf_counter()
    with lock:
        done = list(results)
    out = partial(done, started[0], t0, t_end)
    out["cpu_seconds"] = time.process_time() - cpu0  # this process, every thread: the generator's own cost
    return out


def partial(done: list[llm_client.RequestResult], started: int, t0: float, t_end: float) -> dict[str, Any]:
    ok = [r for r in done if r.outcome == "success"]
    timed = [r for r in ok if not r.cancelled]
    outcomes: dict[str, int] = {}
    for r in done:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    return {"started": started, "completed": len(done), "success": len(ok), "cancelled": sum(r.cancelled for r in ok),
            "finished": len(timed), "outcomes": outcomes, "output_tokens": sum(r.output_tokens for r in ok),
            "retry_after_seen": sum(r.retry_after is not None for r in done), "t0": t0, "t_end": t_end,
            "ttft": LatencyHistogram().extend(r.ttft for r in ok if r.stream and r.ttft is not None).to_json(),
            "itl": LatencyHistogram().extend(r.itl for r in timed if r.stream and r.itl is not None).to_json(),
            "e2e": LatencyHistogram().extend(r.e2e for r in timed if r.e2e is not None).to_json()}


def merge(parts: list[dict[str, Any]], mode: str, level: float, seconds: float, processes: int) -> dict[str, Any]:
    """One step's row from the partial results of every process: counts add, histograms add
    (exact), and the wall time runs from the common start to the last process's end, drain
    included. Throughput = requests finished (successful, not cancelled) / that wall time."""
    started = sum(p["started"] for p in parts)
    completed = sum(p["completed"] for p in parts)
    outcomes: dict[str, int] = {}
    for p in parts:
        for k, v in p["outcomes"].items():
            outcomes[k] = outcomes.get(k, 0) + v
    wall = max(max(p["t_end"] for p in parts) - min(p["t0"] for p in parts), 1e-9)
    errors = sum(v for k, v in outcomes.items() if k != "success") + (started - completed)
    finished = sum(p["finished"] for p in parts)
    row = {"mode": mode, "level": level, "processes": processes, "seconds": seconds, "wall_seconds": wall,
           "started": started, "completed": completed, "success": sum(p["success"] for p in parts),
           "finished": finished, "cancelled": sum(p["cancelled"] for p in parts),
           "outcomes": outcomes, "error_rate": errors / started if started else 0.0,
           "throughput_rps": finished / wall,
           "output_tokens_per_second": sum(p["output_tokens"] for p in parts) / wall,
           "retry_after_seen": sum(p["retry_after_seen"] for p in parts),
           "generator_cpu_seconds": sum(p.get("cpu_seconds", 0.0) for p in parts)}
    for name in ("ttft", "itl", "e2e"):
        h = LatencyHistogram()
        for p in parts:
            h.merge(LatencyHistogram.from_json(p[name]))
        for q in (0.5, 0.95, 0.99):
            row[f"{name}_p{int(q * 100)}"] = h.percentile(q)
        row[f"{name}_histogram"] = h.to_json()
    return row


def run_step(ep: llm_client.Endpoint, wl: Workload, mode: str, level: float, seconds: float,
             drain_seconds: float, max_requests: int, progress) -> dict[str, Any]:
    """One step in this process (--workers 1)."""
    p = run_local(ep, wl, mode, level, time.perf_counter(), seconds, drain_seconds, max_requests, progress)
    return merge([p], mode, level, seconds, 1)


def _endpoint(args: argparse.Namespace) -> llm_client.Endpoint:
    token = os.environ.get(args.token_env) if args.token_env else None
    headers = dict(h.split(":", 1) for h in args.header)
    return llm_client.Endpoint(args.target, api=args.api, token=token, headers=headers,
                               read_timeout=args.read_timeout, total_timeout=args.step_seconds + args.drain_seconds)


def _process_share(args: argparse.Namespace, index: int, mode: str, level: float, t_start: float) -> dict[str, Any]:
    """The body of one worker process: its share of one step (its own workload seed)."""
    wl_args = argparse.Namespace(**{**vars(args), "seed": args.seed * 1000 + index})
    return run_local(_endpoint(args), Workload(wl_args), mode, level, t_start, args.step_seconds,
                     args.drain_seconds, max(args.max_requests // args.workers, 1), None, seed=index)


def run_step_processes(pool, args: argparse.Namespace, mode: str, level: float) -> dict[str, Any]:
    """One step shared by args.workers processes started together (--workers N)."""
    shares = _split(level, args.workers, mode)
    t_start = time.perf_counter() + 0.5  # every process is idle in the pool: 0.5 s is ample to hand out the work
    futs = [pool.submit(_process_share, args, i, mode, share, t_start) for i, share in enumerate(shares)]
    parts = [f.result(timeout=args.step_seconds + args.drain_seconds + 60) for f in futs]
    return merge(parts, mode, level, args.step_seconds, args.workers)


def within_slo(row: dict[str, Any], args: argparse.Namespace) -> bool:
    if row["error_rate"] > args.max_error_rate or not row["success"]:
        return False
    if args.slo_ttft_p99 is not None and (row["ttft_p99"] is None or row["ttft_p99"] > args.slo_ttft_p99):
        return False
    return not (args.slo_itl_p99 is not None and (row["itl_p99"] is None or row["itl_p99"] > args.slo_itl_p99))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="base URL of the OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", default="sim-model")
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--token-env", metavar="VAR", help="environment variable holding the bearer token")
    p.add_argument("--header", action="append", default=[], metavar="NAME:VALUE")
    p.add_argument("--mode", choices=("poisson", "concurrency"), default="poisson")
    p.add_argument("--rates", default=None, help="Poisson request rates per second (comma list; --mode poisson; "
                   "default 1,2,4,8,16)")
    p.add_argument("--concurrency", default=None, help="concurrency ramp (comma list; --mode concurrency; "
                   "default 1,2,4,8,16)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="run the request loop in N processes on this machine; their histograms merge exactly")
    p.add_argument("--step-seconds", type=float, default=20.0)
    p.add_argument("--drain-seconds", type=float, default=30.0, help="wait for a step's requests at most this long")
    p.add_argument("--max-requests", type=int, default=100_000, help="hard bound on requests per step")
    p.add_argument("--input-len", default="fixed:128",
                   help="fixed:N | uniform:MIN:MAX | lognormal:MEDIAN:SIGMA (words)")
    p.add_argument("--output-len", default="fixed:64",
                   help="output tokens: fixed:N | uniform:MIN:MAX | lognormal:MEDIAN:SIGMA")
    p.add_argument("--shared-prefix-ratio", type=float, default=0.0)
    p.add_argument("--prefix-words", type=int, default=512)
    p.add_argument("--stream-ratio", type=float, default=1.0)
    p.add_argument("--cancel-ratio", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true", help="ask for exactly the output length (vLLM extension)")
    p.add_argument("--slo-ttft-p99", type=float, default=None, metavar="SECONDS")
    p.add_argument("--slo-itl-p99", type=float, default=None, metavar="SECONDS")
    p.add_argument("--max-error-rate", type=float, default=0.01)
    p.add_argument("--read-timeout", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")


def _fmt(v: float | None, scale: float = 1e3) -> str:
    return "-" if v is None else f"{v * scale:.1f}"


THROUGHPUT_NOTE = ("req/s = requests finished (successful, not cancelled) / the step's measured wall time, from its "
                   "start to the end of its drain")


def check_args(args: argparse.Namespace) -> list[float]:
    """The step levels; a ValueError (one line) for flags that contradict each other."""
    if args.mode == "poisson" and args.concurrency is not None:
        raise ValueError("--concurrency needs --mode concurrency (the default mode is poisson, which uses --rates)")
    if args.mode == "concurrency" and args.rates is not None:
        raise ValueError("--rates needs --mode poisson (--mode concurrency uses --concurrency)")
    raw = (args.rates if args.mode == "poisson" else args.concurrency) or "1,2,4,8,16"
    try:
        levels = [float(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{raw!r}: levels must be a comma list of numbers") from None
    if not levels or any(v <= 0 for v in levels):
        raise ValueError("levels must be positive")
    if args.mode == "concurrency" and any(v != int(v) for v in levels):
        raise ValueError("--concurrency levels must be whole numbers")
    if not 1 <= args.workers <= 256:
        raise ValueError("--workers must be within 1..256")
    if args.mode == "concurrency" and any(v < args.workers for v in levels):
        raise ValueError(f"every --concurrency level must be at least --workers ({args.workers}): each process "
                         "runs a share of the users")
    if args.step_seconds <= 0 or args.drain_seconds < 0 or args.max_requests < 1:
        raise ValueError("--step-seconds must be positive, --drain-seconds not negative, --max-requests at least 1")
    if any(":" not in h for h in args.header):
        raise ValueError("--header must be NAME:VALUE")
    return levels


def main(args: argparse.Namespace) -> int:
    try:
        levels = check_args(args)
        wl = Workload(args)
        for r in ("shared_prefix_ratio", "stream_ratio", "cancel_ratio"):
            if not 0 <= getattr(args, r) <= 1:
                raise ValueError(f"--{r.replace('_', '-')} must be within 0..1")
    except ValueError as exc:
        print(f"fleetcanary loadtest: {exc}", file=sys.stderr)
        return 2
    if not args.target.startswith(("http://", "https://")):
        print("fleetcanary loadtest: TARGET must be an http(s):// base URL", file=sys.stderr)
        return 2
    ep = _endpoint(args)
    tty = sys.stderr.isatty()

    def progress(level, done, started, elapsed):
        msg = f"  {args.mode} {level:g}: {elapsed:5.1f}/{args.step_seconds:g}s, {done}/{started} requests done"
        sys.stderr.write(("\r" + msg) if tty else "")
        sys.stderr.flush()

    rows = []
    pool = None
    if args.workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn: fresh interpreters, no threads or locks inherited from this one
        pool = ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        for level in levels:
            if not tty or pool is not None:
                sys.stderr.write(f"step {args.mode}={level:g} for {args.step_seconds:g}s"
                                 f"{f' in {args.workers} processes' if pool else ''} ...\n")
            if pool is None:
                row = run_step(ep, wl, args.mode, level, args.step_seconds, args.drain_seconds, args.max_requests,
                               progress)
            else:
                row = run_step_processes(pool, args, args.mode, level)
            row["within_slo"] = within_slo(row, args)
            rows.append(row)
            if tty and pool is None:
                sys.stderr.write("\n")
    except KeyboardInterrupt:
        print("fleetcanary loadtest: interrupted", file=sys.stderr)
        return 130
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    good = [r for r in rows if r["within_slo"]]
    goodput = max(good, key=lambda r: r["throughput_rps"]) if good else None
    out = {"target_host": args.target.split("/")[2], "model": args.model, "mode": args.mode,
           "slo": {"ttft_p99_seconds": args.slo_ttft_p99, "itl_p99_seconds": args.slo_itl_p99,
                   "max_error_rate": args.max_error_rate},
           "workload": {"input_len": args.input_len, "output_len": args.output_len,
                        "shared_prefix_ratio": args.shared_prefix_ratio, "stream_ratio": args.stream_ratio,
                        "cancel_ratio": args.cancel_ratio},
           "workers": args.workers, "throughput_definition": THROUGHPUT_NOTE,
           "steps": rows, "goodput_rps": goodput["throughput_rps"] if goodput else 0.0,
           "goodput_level": goodput["level"] if goodput else None}
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(f"{'level':>7} {'req/s':>7} {'tok/s':>8} {'err%':>6} {'TTFT p50/p95/p99 ms':>24} "
              f"{'ITL p50/p95/p99 ms':>22} {'E2E p50/p99 ms':>17}  SLO")
        for r in rows:
            print(f"{r['level']:>7g} {r['throughput_rps']:>7.2f} {r['output_tokens_per_second']:>8.1f} "
                  f"{r['error_rate'] * 100:>6.2f} "
                  f"{_fmt(r['ttft_p50']):>7}/{_fmt(r['ttft_p95'])}/{_fmt(r['ttft_p99']):<7} "
                  f"{_fmt(r['itl_p50']):>6}/{_fmt(r['itl_p95'])}/{_fmt(r['itl_p99']):<6} "
                  f"{_fmt(r['e2e_p50']):>7}/{_fmt(r['e2e_p99']):<7}  {'ok' if r['within_slo'] else 'MISS'}")
        print(THROUGHPUT_NOTE + (f"; {args.workers} worker processes, latency histograms merged exactly"
                                 if args.workers > 1 else ""))
        if goodput:
            print(f"goodput: {out['goodput_rps']:.2f} requests/s at {args.mode} {goodput['level']:g} "
                  f"(P99 TTFT {_fmt(goodput['ttft_p99'])} ms, P99 ITL {_fmt(goodput['itl_p99'])} ms)")
        else:
            print("goodput: no step met the SLO")
    return 0
