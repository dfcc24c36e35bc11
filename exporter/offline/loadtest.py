"""`fleetcanary loadtest TARGET`: the highest request rate an OpenAI-compatible
endpoint sustains within a latency SLO (goodput).

Workload: input and output lengths drawn from fixed, uniform or lognormal
distributions (in words, which the prompt is made of; servers count tokens), a
share of requests reusing a common prefix, a share streaming, a share cancelled
part-way. Arrivals: open-loop Poisson at each rate of a ramp, or a closed-loop
concurrency ramp. Each step runs for a fixed time; the requests it started are
waited for (bounded), then P50/P95/P99 TTFT, ITL and E2E, throughput, tokens per
second and the error rate are reported. Goodput is the highest throughput of a step
whose P99 TTFT and P99 ITL are within the SLO and whose error rate is within bound.
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

from fleetcanary.core.stats import percentile
from fleetcanary.probes.lib import llm_client

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima")


@dataclass
class Dist:
    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "Dist":
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
        return max(1, int(round(v)))


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


def run_step(ep: llm_client.Endpoint, wl: Workload, mode: str, level: float, seconds: float,
             drain_seconds: float, max_requests: int, progress) -> dict[str, Any]:
    results: list[llm_client.RequestResult] = []
    lock = threading.Lock()
    stop = threading.Event()
    started = [0]

    def one() -> None:
        body, cancel = wl.next()
        r = llm_client.request(ep, body, cancel_after_chunks=cancel)
        with lock:
            results.append(r)

    t0 = time.perf_counter()
    end = t0 + seconds
    if mode == "concurrency":
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
            progress(level, len(results), started[0], time.perf_counter() - t0)
            stop.wait(0.5)
        stop.set()
        for th in threads:
            th.join(timeout=drain_seconds)
    else:
        pool = ThreadPoolExecutor(max_workers=512)
        rng = random.Random(hash((level, seconds)))
        nxt = time.perf_counter()
        last_progress = 0.0
        futures = []
        while True:
            nxt += rng.expovariate(level)
            if nxt >= end or started[0] >= max_requests:
                break
            while True:
                now = time.perf_counter()
                if now >= nxt:
                    break
                time.sleep(min(nxt - now, 0.05))
                if now - last_progress > 0.5:
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
    wall = max(time.perf_counter() - t0, 1e-9)
    with lock:
        done = list(results)
    return summarize(done, mode, level, seconds, wall, started[0])


def summarize(done: list[llm_client.RequestResult], mode: str, level: float, seconds: float, wall: float,
              started: int) -> dict[str, Any]:
    ok = [r for r in done if r.outcome == "success"]
    timed = [r for r in ok if not r.cancelled]
    ttft = [r.ttft for r in ok if r.stream and r.ttft is not None]
    itl = [r.itl for r in timed if r.stream and r.itl is not None]
    e2e = [r.e2e for r in timed if r.e2e is not None]
    outcomes: dict[str, int] = {}
    for r in done:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    errors = sum(v for k, v in outcomes.items() if k != "success") + (started - len(done))
    row = {"mode": mode, "level": level, "seconds": seconds, "wall_seconds": wall, "started": started,
           "completed": len(done), "success": len(ok), "cancelled": sum(r.cancelled for r in ok),
           "outcomes": outcomes, "error_rate": errors / started if started else 0.0,
           "throughput_rps": len(timed) / seconds,
           "output_tokens_per_second": sum(r.output_tokens for r in ok) / seconds,
           "retry_after_seen": sum(r.retry_after is not None for r in done)}
    for name, vals in (("ttft", ttft), ("itl", itl), ("e2e", e2e)):
        for q in (0.5, 0.95, 0.99):
            row[f"{name}_p{int(q * 100)}"] = percentile(vals, q)
    return row


def within_slo(row: dict[str, Any], args: argparse.Namespace) -> bool:
    if row["error_rate"] > args.max_error_rate or not row["success"]:
        return False
    if args.slo_ttft_p99 is not None and (row["ttft_p99"] is None or row["ttft_p99"] > args.slo_ttft_p99):
        return False
    if args.slo_itl_p99 is not None and (row["itl_p99"] is None or row["itl_p99"] > args.slo_itl_p99):
        return False
    return True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="base URL of the OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", default="sim-model")
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--token-env", metavar="VAR", help="environment variable holding the bearer token")
    p.add_argument("--header", action="append", default=[], metavar="NAME:VALUE")
    p.add_argument("--mode", choices=("poisson", "concurrency"), default="poisson")
    p.add_argument("--rates", default="1,2,4,8,16", help="Poisson request rates per second (comma list)")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="concurrency ramp (comma list)")
    p.add_argument("--step-seconds", type=float, default=20.0)
    p.add_argument("--drain-seconds", type=float, default=30.0, help="wait for a step's requests at most this long")
    p.add_argument("--max-requests", type=int, default=100_000, help="hard bound on requests per step")
    p.add_argument("--input-len", default="fixed:128", help="fixed:N | uniform:MIN:MAX | lognormal:MEDIAN:SIGMA (words)")
    p.add_argument("--output-len", default="fixed:64", help="output tokens: fixed:N | uniform:MIN:MAX | lognormal:MEDIAN:SIGMA")
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


def main(args: argparse.Namespace) -> int:
    try:
        levels = [float(x) for x in (args.rates if args.mode == "poisson" else args.concurrency).split(",") if x]
        if not levels or any(v <= 0 for v in levels):
            raise ValueError("levels must be positive")
        wl = Workload(args)
        for r in ("shared_prefix_ratio", "stream_ratio", "cancel_ratio"):
            if not 0 <= getattr(args, r) <= 1:
                raise ValueError(f"--{r.replace('_', '-')} must be within 0..1")
        headers = dict(h.split(":", 1) for h in args.header)
    except ValueError as exc:
        print(f"fleetcanary loadtest: {exc}", file=sys.stderr)
        return 2
    if not args.target.startswith(("http://", "https://")):
        print("fleetcanary loadtest: TARGET must be an http(s):// base URL", file=sys.stderr)
        return 2
    token = os.environ.get(args.token_env) if args.token_env else None
    ep = llm_client.Endpoint(args.target, api=args.api, token=token, headers=headers, read_timeout=args.read_timeout,
                             total_timeout=args.step_seconds + args.drain_seconds)
    tty = sys.stderr.isatty()

    def progress(level, done, started, elapsed):
        msg = f"  {args.mode} {level:g}: {elapsed:5.1f}/{args.step_seconds:g}s, {done}/{started} requests done"
        sys.stderr.write(("\r" + msg) if tty else "")
        sys.stderr.flush()

    rows = []
    for level in levels:
        if not tty:
            sys.stderr.write(f"step {args.mode}={level:g} for {args.step_seconds:g}s ...\n")
        row = run_step(ep, wl, args.mode, level, args.step_seconds, args.drain_seconds, args.max_requests, progress)
        row["within_slo"] = within_slo(row, args)
        rows.append(row)
        if tty:
            sys.stderr.write("\n")
    good = [r for r in rows if r["within_slo"]]
    goodput = max(good, key=lambda r: r["throughput_rps"]) if good else None
    out = {"target_host": args.target.split("/")[2], "model": args.model, "mode": args.mode,
           "slo": {"ttft_p99_seconds": args.slo_ttft_p99, "itl_p99_seconds": args.slo_itl_p99,
                   "max_error_rate": args.max_error_rate},
           "workload": {"input_len": args.input_len, "output_len": args.output_len,
                        "shared_prefix_ratio": args.shared_prefix_ratio, "stream_ratio": args.stream_ratio,
                        "cancel_ratio": args.cancel_ratio},
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
        if goodput:
            print(f"goodput: {out['goodput_rps']:.2f} requests/s at {args.mode} {goodput['level']:g} "
                  f"(P99 TTFT {_fmt(goodput['ttft_p99'])} ms, P99 ITL {_fmt(goodput['itl_p99'])} ms)")
        else:
            print("goodput: no step met the SLO")
    return 0
