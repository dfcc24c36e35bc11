"""Locust user for OpenAI-compatible endpoints, timed by the canary's own client.

    locust -f $(python -c 'import fleetcanary.offline.locustfile as m; print(m.__file__)') \\
        --host http://vllm:8000/v1 --master ...      # and N x `--worker --master-host ...`

Every request goes through probes/lib/llm_client.py (TTFT, ITL and E2E as the canary
defines them). Locust's own statistics get one entry per request ("e2e") and one per
first token ("ttft") for its UI, but Locust rounds and merges its own way; the figures
fleetcanary reports come from its log-bucket histograms (offline/latency_hist.py), which
each worker sends to the master with its regular report and the master adds up, exactly.
At the end the master writes them, with counts and the measured wall time, to
FLEETCANARY_LOCUST_OUT (JSON) and prints a one-line summary.

Workload from the environment: FLEETCANARY_MODEL (sim-model), FLEETCANARY_API (chat),
FLEETCANARY_INPUT_WORDS (128), FLEETCANARY_OUTPUT_TOKENS (64), FLEETCANARY_STREAM (1),
FLEETCANARY_TOKEN_ENV (name of the variable holding the bearer token; never logged),
FLEETCANARY_READ_TIMEOUT (30). Each user is closed-loop (one request at a time, no wait),
so `--users` is the concurrency.
"""
from __future__ import annotations

import json
import os
import random
import threading
import time

from locust import User, events, task

from fleetcanary.offline.latency_hist import LatencyHistogram
from fleetcanary.probes.lib import llm_client

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")


class _Tally:
    """This process's results since the last report (workers) or in total (master)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.hist = {k: LatencyHistogram() for k in ("ttft", "itl", "e2e")}
        self.counts: dict[str, int] = {}
        self.finished = 0
        self.tokens = 0
        self.t0: float | None = None
        self.t_end: float | None = None

    def add(self, r: llm_client.RequestResult, start: float, end: float) -> None:
        with self.lock:
            self.counts[r.outcome] = self.counts.get(r.outcome, 0) + 1
            self.t0 = start if self.t0 is None else min(self.t0, start)
            self.t_end = end if self.t_end is None else max(self.t_end, end)
            if r.outcome != "success":
                return
            self.finished += 1
            self.tokens += r.output_tokens
            for name, v in (("ttft", r.ttft), ("itl", r.itl), ("e2e", r.e2e)):
                if v is not None:
                    self.hist[name].add(v)

    def take(self) -> dict:
        with self.lock:
            out = {"hist": {k: h.to_json() for k, h in self.hist.items()}, "counts": dict(self.counts),
                   "finished": self.finished, "tokens": self.tokens, "t0": self.t0, "t_end": self.t_end}
            self.reset()
        return out

    def merge(self, d: dict) -> None:
        with self.lock:
            for k, h in d["hist"].items():
                self.hist[k].merge(LatencyHistogram.from_json(h))
            for k, v in d["counts"].items():
                self.counts[k] = self.counts.get(k, 0) + v
            self.finished += d["finished"]
            self.tokens += d["tokens"]
            if d["t0"] is not None:
                self.t0 = d["t0"] if self.t0 is None else min(self.t0, d["t0"])
                self.t_end = d["t_end"] if self.t_end is None else max(self.t_end, d["t_end"])


TALLY = _Tally()


class LLMUser(User):
    """One closed-loop user: a request, then the next."""

    def on_start(self) -> None:
        env = os.environ
        token_env = env.get("FLEETCANARY_TOKEN_ENV")
        self.api = env.get("FLEETCANARY_API", "chat")
        self.ep = llm_client.Endpoint(self.host, api=self.api, token=os.environ.get(token_env) if token_env else None,
                                      read_timeout=float(env.get("FLEETCANARY_READ_TIMEOUT", "30")))
        self.model = env.get("FLEETCANARY_MODEL", "sim-model")
        self.words = int(env.get("FLEETCANARY_INPUT_WORDS", "128"))
        self.tokens = int(env.get("FLEETCANARY_OUTPUT_TOKENS", "64"))
        self.stream = env.get("FLEETCANARY_STREAM", "1") != "0"
        self.rng = random.Random()

    @task
    def complete(self) -> None:
        prompt = " ".join(self.rng.choice(WORDS) for _ in range(self.words))
        body = llm_client.build_body(self.api, self.model, prompt, self.tokens, self.stream, 0.0,
                                     {"ignore_eos": True, "min_tokens": self.tokens})
        start = time.time()
        r = llm_client.request(self.ep, body)
        end = time.time()
        TALLY.add(r, start, end)
        fire = self.environment.events.request.fire
        exc = None if r.outcome == "success" else RuntimeError(r.outcome)  # the outcome only: no detail, no token
        fire(request_type="POST", name="e2e", response_time=(r.e2e or end - start) * 1000,
             response_length=r.output_tokens, exception=exc, context={})
        if r.ttft is not None:
            fire(request_type="POST", name="ttft", response_time=r.ttft * 1000, response_length=0, exception=None,
                 context={})


@events.report_to_master.add_listener
def _report(client_id, data, **kw):
    data["fleetcanary"] = TALLY.take()


@events.worker_report.add_listener
def _worker_report(client_id, data, **kw):
    if "fleetcanary" in data:
        TALLY.merge(data["fleetcanary"])


@events.quitting.add_listener
def _write(environment, **kw):
    from locust.runners import WorkerRunner

    if isinstance(environment.runner, WorkerRunner):
        return
    d = TALLY.take()
    wall = (d["t_end"] - d["t0"]) if d["t0"] is not None else 0.0
    out = {"finished": d["finished"], "outcomes": d["counts"], "output_tokens": d["tokens"], "wall_seconds": wall,
           "throughput_rps": d["finished"] / wall if wall > 0 else 0.0,
           "throughput_definition": "requests finished / (last completion - first request start), over all workers"}
    for k, h in d["hist"].items():
        hist = LatencyHistogram.from_json(h)
        out[f"{k}_histogram"] = h
        for q in (0.5, 0.95, 0.99):
            out[f"{k}_p{int(q * 100)}"] = hist.percentile(q)
    path = os.environ.get("FLEETCANARY_LOCUST_OUT")
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    ttft = out["ttft_p50"]
    print(f"fleetcanary: {out['finished']} requests in {wall:.1f}s = {out['throughput_rps']:.1f} req/s, TTFT p50 "
          f"{'-' if ttft is None else f'{ttft * 1e3:.1f} ms'}", flush=True)
