"""Locust user for OpenAI-compatible endpoints, timed by the canary's own client.

    locust -f $(python -c 'import fleetcanary.offline.locustfile as m; print(m.__file__)') \\
        --host http://vllm:8000/v1 --master ...      # and N x `--worker --master-host ...`

Every request goes through probes/lib/llm_client.py (TTFT, ITL and E2E as the canary
defines them). Locust's own statistics get one entry per request ("e2e") and one per
first token ("ttft") for its UI, but Locust rounds and merges its own way; the figures
fleetcanary reports come from its log-bucket histograms (offline/latency_hist.py).

The end of a run, counted the way `fleetcanary loadtest` counts a step: when the master
begins to stop (the run time is up, or a stop from the UI or a signal), before Locust
stops any user it sends every worker ``fleetcanary_stop``. Each worker then starts no new
request, waits for the ones in flight (the drain, at most FLEETCANARY_DRAIN_SECONDS) and
sends the master its whole tally (``fleetcanary_final``: counts and histograms since the
start, the first request's start and the drain's end). The master waits for every
worker's final message (bounded: the drain plus 15 s), adds them up (exact) and writes
FLEETCANARY_LOCUST_OUT (JSON; "-" prints it on one line of standard output) and a one-line
summary. Throughput = requests finished /
(from the first request's start to the end of the last worker's drain), as in
`loadtest`; requests still running at the drain's end are reported as ``unfinished``.
A worker whose final message never came is named in ``workers_missing`` and the master
exits 1: its requests are not in the figures. A local run (no --master) drains and writes
the same way. Times are wall-clock (time.time) so workers
on several machines share them; keep their clocks synchronised (NTP) as usual.

Workload from the environment: FLEETCANARY_MODEL (sim-model), FLEETCANARY_API (chat),
FLEETCANARY_INPUT_WORDS (128), FLEETCANARY_OUTPUT_TOKENS (64), FLEETCANARY_STREAM (1),
FLEETCANARY_TOKEN_ENV (name of the variable holding the bearer token; never logged),
FLEETCANARY_READ_TIMEOUT (30), FLEETCANARY_DRAIN_SECONDS (30; the master's value is
sent to the workers). Each user is closed-loop (one request at a time, no wait), so
`--users` is the concurrency.
"""
from __future__ import annotations

import json
import os
import random
import sys
import threading
import time

from locust import User, events, task
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

from fleetcanary.offline.latency_hist import LatencyHistogram
from fleetcanary.probes.lib import llm_client

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
STOP_MSG, FINAL_MSG = "fleetcanary_stop", "fleetcanary_final"
FINAL_MARGIN_SECONDS = 15.0  # the master waits this long beyond the drain for the workers' final messages


def _drain_seconds() -> float:
    try:
        v = float(os.environ.get("FLEETCANARY_DRAIN_SECONDS", "30"))
    except ValueError:
        v = -1.0
    if not 0 <= v <= 3600:
        raise SystemExit("fleetcanary locustfile: FLEETCANARY_DRAIN_SECONDS must be a number of seconds within 0..3600")
    return v


class _Tally:
    """One process's results since the start (a worker's own, or the master's sum of finals)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hist = {k: LatencyHistogram() for k in ("ttft", "itl", "e2e")}
        self.counts: dict[str, int] = {}
        self.started = 0
        self.inflight = 0
        self.finished = 0
        self.tokens = 0
        self.unfinished = 0
        self.t0: float | None = None
        self.t_end: float | None = None
        self.last_done: float | None = None
        self.stopping = False  # a worker: the drain began, no new request starts

    def begin(self, start: float) -> bool:
        """Count a request about to start; False once the drain began (start none)."""
        with self.lock:
            if self.stopping:
                return False
            self.started += 1
            self.inflight += 1
            self.t0 = start if self.t0 is None else min(self.t0, start)
            return True

    def add(self, r: llm_client.RequestResult, end: float) -> None:
        with self.lock:
            self.inflight -= 1
            self.counts[r.outcome] = self.counts.get(r.outcome, 0) + 1
            self.last_done = end if self.last_done is None else max(self.last_done, end)
            if r.outcome != "success":
                return
            self.finished += 1
            self.tokens += r.output_tokens
            for name, v in (("ttft", r.ttft), ("itl", r.itl), ("e2e", r.e2e)):
                if v is not None:
                    self.hist[name].add(v)

    def final(self, t_end: float) -> dict:
        """The whole tally, once the drain is over: later completions are not counted."""
        with self.lock:
            self.stopping = True
            return {"hist": {k: h.to_json() for k, h in self.hist.items()}, "counts": dict(self.counts),
                    "started": self.started, "unfinished": self.inflight, "finished": self.finished,
                    "tokens": self.tokens, "t0": self.t0, "t_end": t_end}

    def merge(self, d: dict) -> None:
        with self.lock:
            for k, h in d["hist"].items():
                self.hist[k].merge(LatencyHistogram.from_json(h))
            for k, v in d["counts"].items():
                self.counts[k] = self.counts.get(k, 0) + v
            self.started += d["started"]
            self.unfinished += d["unfinished"]
            self.finished += d["finished"]
            self.tokens += d["tokens"]
            if d["t0"] is not None:
                self.t0 = d["t0"] if self.t0 is None else min(self.t0, d["t0"])
                self.t_end = d["t_end"] if self.t_end is None else max(self.t_end, d["t_end"])


TALLY = _Tally()   # this process's own requests
MERGED = _Tally()  # the master's (or a local run's) sum of the final tallies


class _Master:
    """The master's side: which workers owe a final message, which sent one, and the result."""

    def __init__(self) -> None:
        self.expected: set[str] = set()
        self.reported: set[str] = set()
        self.asked = False
        self.written = False


MASTER = _Master()


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
        if not TALLY.begin(start):
            time.sleep(0.2)  # draining: idle until Locust stops this user (gevent: yields to the others)
            return
        r = llm_client.request(self.ep, body)
        end = time.time()
        TALLY.add(r, end)
        fire = self.environment.events.request.fire
        exc = None if r.outcome == "success" else RuntimeError(r.outcome)  # the outcome only: no detail, no token
        fire(request_type="POST", name="e2e", response_time=(r.e2e or end - start) * 1000,
             response_length=r.output_tokens, exception=exc, context={})
        if r.ttft is not None:
            fire(request_type="POST", name="ttft", response_time=r.ttft * 1000, response_length=0, exception=None,
                 context={})


# --- a worker: drain on the master's word, then send the whole tally ----------------------
def _drain(drain: float) -> dict:
    """Start no new request, wait for those in flight (at most drain seconds), return the tally."""
    with TALLY.lock:
        TALLY.stopping = True
    deadline = time.time() + drain
    while time.time() < deadline:
        with TALLY.lock:
            if TALLY.inflight == 0:
                break
        time.sleep(0.02)
    with TALLY.lock:
        drained = TALLY.inflight == 0
        last = TALLY.last_done
    # the drain's end: the last completion when every request finished, else the deadline
    return TALLY.final(last if drained and last is not None else time.time())


def _on_stop(environment, msg, **kw) -> None:
    drain = float((msg.data or {}).get("drain_seconds", _drain_seconds()))
    environment.runner.send_message(FINAL_MSG, _drain(drain))


# --- the master: ask for the finals before Locust stops the users, wait, write -------------
def _on_final(environment, msg, **kw) -> None:
    if msg.node_id in MASTER.reported:
        return  # one final per worker; a repeat would count its requests twice
    MASTER.reported.add(msg.node_id)
    MERGED.merge(msg.data)


def _collect(environment) -> None:
    runner = environment.runner
    if MASTER.asked:
        return
    MASTER.asked = True
    drain = _drain_seconds()
    if not isinstance(runner, MasterRunner):  # a local run (no workers): this process's own tally
        MASTER.expected = MASTER.reported = {"local"}
        MERGED.merge(_drain(drain))
        _write(environment)
        return
    MASTER.expected = {c.id for c in runner.clients.all if c.state != STATE_MISSING}
    for cid in MASTER.expected:
        runner.send_message(STOP_MSG, {"drain_seconds": drain}, client_id=cid)
    deadline = time.time() + drain + FINAL_MARGIN_SECONDS
    while not MASTER.expected <= MASTER.reported and time.time() < deadline:
        time.sleep(0.05)
    _write(environment)


def _write(environment) -> None:
    if MASTER.written:
        return
    MASTER.written = True
    missing = sorted(MASTER.expected - MASTER.reported)
    with MERGED.lock:
        t0, t_end = MERGED.t0, MERGED.t_end
        wall = (t_end - t0) if t0 is not None and t_end is not None else 0.0
        out = {"finished": MERGED.finished, "started": MERGED.started, "unfinished": MERGED.unfinished,
               "outcomes": dict(MERGED.counts), "output_tokens": MERGED.tokens, "wall_seconds": wall,
               "throughput_rps": MERGED.finished / wall if wall > 0 else 0.0,
               "throughput_definition": "requests finished / (from the first request's start to the end of the "
                                        "last worker's drain), over all workers",
               "drain_seconds": _drain_seconds(), "workers": len(MASTER.expected),
               "workers_reported": len(MASTER.reported), "workers_missing": missing}
        hists = {k: h.to_json() for k, h in MERGED.hist.items()}
    for k, h in hists.items():
        hist = LatencyHistogram.from_json(h)
        out[f"{k}_histogram"] = h
        for q in (0.5, 0.95, 0.99):
            out[f"{k}_p{int(q * 100)}"] = hist.percentile(q)
    path = os.environ.get("FLEETCANARY_LOCUST_OUT")
    if path == "-":  # standard output (a pod's log), one line
        print(json.dumps(out), flush=True)
    elif path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    ttft = out["ttft_p50"]
    print(f"fleetcanary: {out['finished']} requests in {wall:.1f}s = {out['throughput_rps']:.1f} req/s, TTFT p50 "
          f"{'-' if ttft is None else f'{ttft * 1e3:.1f} ms'}, {out['unfinished']} unfinished at the drain's end",
          flush=True)
    if missing:
        print(f"fleetcanary: no final tally from {len(missing)} of {len(MASTER.expected)} workers "
              f"({', '.join(missing)}); their requests are not counted", file=sys.stderr, flush=True)
        environment.process_exit_code = 1


@events.init.add_listener
def _init(environment, **kw) -> None:
    _drain_seconds()  # a bad value stops here, in one line, before any load
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        runner.register_message(STOP_MSG, _on_stop, concurrent=True)  # drains while the worker keeps listening
    elif runner is not None:  # the master, or a local run
        if isinstance(runner, MasterRunner):
            runner.register_message(FINAL_MSG, _on_final)
        environment.events.test_stopping.add_listener(lambda environment, **_: _collect(environment))


@events.quitting.add_listener
def _quitting(environment, **kw) -> None:
    if environment.runner is not None and not isinstance(environment.runner, WorkerRunner) and not MASTER.written:
        _collect(environment)  # quit before any stop (a signal): ask now, while the workers still listen
