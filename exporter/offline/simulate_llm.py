"""`fleetcanary simulate-llm`: a reference OpenAI-compatible streaming server.

Tests, benchmarks and the demo use it instead of a GPU model server. It:
- emits tokens at absolute deadlines: first token at TTFT, then one step per ITL
  (with optional jitter, k tokens per chunk), so its timing is known exactly;
- models capacity: up to ``batch_size`` requests decode at full speed; beyond it,
  the decode step (ITL) and the prefill (TTFT) stretch by active/batch_size, as a
  saturated continuous-batching server's do. Throughput caps at
  batch_size / ITL tokens per second;
- models a prefix cache: a prompt whose first ``prefix_chars`` were seen before skips
  that share of its prefill;
- injects faults: errors, 429/503 with Retry-After, stalls, mid-stream error events,
  errors in a 200 stream, non-JSON data, no [DONE], CRLF delimiters, comments,
  split and coalesced events, empty output;
- records its own receive and emit times (perf_counter_ns: CLOCK_MONOTONIC, the clock a
  client on the same machine reads) per response id: GET /sim/emits (per serving process);
  a request's receive time, from which its TTFT runs, is the kernel's stamp of its arrival
  (see Handler.setup);
- reports the truth a load test is judged against: GET /sim/stats gives requests
  received, streams/answers completed, output tokens sent, requests active now, and the
  capacity the model implies (batch_size / ITL tokens per second), summed over every
  serving process;
- serves load from several processes (``--processes N``: pre-forked, one listening
  socket, the capacity model's active count shared between them), so the server is
  not the first thing to saturate when a test drives it hard.

Per-request overrides of any setting: an ``X-Sim`` header holding a JSON object.
It answers golden arithmetic prompts ("What is 17 + 25?") and a few facts correctly;
other prompts get deterministic filler text.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FACTS = {r"capital of france": "Paris", r"capital of japan": "Tokyo", r"largest planet": "Jupiter"}
WORDS = ("the", "model", "serves", "tokens", "at", "steady", "pace", "while", "canary", "checks", "each", "step")


@dataclass
class SimSettings:
    ttft_ms: float = 50.0              # prefill time at no load, for an empty prompt
    prefill_ms_per_token: float = 0.0  # extra prefill per input token
    itl_ms: float = 10.0               # decode step at no load
    jitter_ms: float = 0.0             # uniform +- jitter on each step
    tokens_per_chunk: int = 1
    batch_size: int = 16
    max_tokens_default: int = 64
    prefix_chars: int = 256            # prompt prefix length the cache keys on
    prefix_cache_speedup: float = 0.8  # share of prefill skipped on a prefix hit
    # faults
    status: int = 200                  # answer every request with this status
    retry_after: float | None = None
    error_rate: float = 0.0            # share of requests answered 500
    stall_after_tokens: int | None = None
    error_event_after: int | None = None
    data_error_after: int | None = None
    non_json_after: int | None = None
    no_done: bool = False
    crlf: bool = False
    comments: bool = False
    split_events: bool = False         # each event in several writes
    coalesce: int = 1                  # events per write
    empty: bool = False                # role chunk only, no content
    role_chunk: bool = True            # first chunk carries only the role (as OpenAI's does)
    usage: bool = True                 # honour stream_options.include_usage
    wrong_answers: bool = False        # answer golden prompts wrongly (quality failure)
    api_key: str | None = None         # require this bearer token
    seed: int = 0


def answer(prompt: str, wrong: bool) -> str | None:
    m = re.search(r"(-?\d+)\s*([+*-])\s*(-?\d+)", prompt)
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        v = a + b if op == "+" else a - b if op == "-" else a * b
        return str(v + 1 if wrong else v)
    for pat, ans in FACTS.items():
        if re.search(pat, prompt, re.IGNORECASE):
            return "Lyon" if wrong else ans
    return None


ACTIVE, REQUESTS, COMPLETIONS, TOKENS = range(4)


class Simulator:
    def __init__(self, settings: SimSettings, processes: int = 1) -> None:
        self.settings = settings
        self.processes = processes
        # counters shared by every serving process (fork-inherited shared memory)
        self.shared = multiprocessing.get_context("fork").Array("q", 4)
        self.lock = threading.Lock()
        self.emits: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.prefixes: deque[str] = deque(maxlen=4096)
        self.prefix_set: set[str] = set()
        self.requests = 0
        self.rng = random.Random(settings.seed)

    def record(self, rid: str, entry: dict[str, Any]) -> None:
        with self.lock:
            self.emits[rid] = entry
            while len(self.emits) > 20000:
                self.emits.popitem(last=False)

    def prefix_hit(self, prompt: str, n: int) -> bool:
        key = hashlib.sha256(prompt[:n].encode()).hexdigest()
        with self.lock:
            if len(prompt) >= n and key in self.prefix_set:
                return True
            if len(prompt) >= n:
                if len(self.prefixes) == self.prefixes.maxlen:
                    self.prefix_set.discard(self.prefixes[0])
                self.prefixes.append(key)
                self.prefix_set.add(key)
        return False

    @property
    def active(self) -> int:
        return self.shared[ACTIVE]

    def count(self, what: int, n: int = 1) -> None:
        with self.shared.get_lock():
            self.shared[what] += n

    def load_factor(self) -> float:
        return max(1.0, self.shared[ACTIVE] / self.settings.batch_size)

    def stats(self) -> dict[str, Any]:
        with self.shared.get_lock():
            active, requests, completions, tokens = self.shared[:]
        s = self.settings
        return {"processes": self.processes, "active": active, "requests": requests, "completions": completions,
                "output_tokens": tokens, "batch_size": s.batch_size, "ttft_ms": s.ttft_ms, "itl_ms": s.itl_ms,
                "capacity_tokens_per_second": s.batch_size / (s.itl_ms / 1000) if s.itl_ms > 0 else None,
                "capacity_note": "requests/s for N output tokens = batch_size / (ttft + (N - 1) * itl); beyond "
                                 "batch_size active requests, TTFT and ITL stretch by active / batch_size"}


# SO_TIMESTAMPNS: the kernel stamps each received segment (CLOCK_REALTIME); Linux has it on TCP
# sockets too. Python's socket module does not name it; 35 is its value on Linux.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)


def _arrival_ns(sock: socket.socket) -> int | None:
    """When the next request's first byte reached this host, on the perf_counter_ns clock, from
    the kernel's receive timestamp (a peek: the bytes stay for the HTTP parser). Waits for the
    byte as the parser would. None where the kernel gives no timestamp or the peer closed."""
    try:
        data, anc, _, _ = sock.recvmsg(1, 64, socket.MSG_PEEK)
    except OSError:
        return None
    now_real, now_mono = time.time_ns(), time.perf_counter_ns()
    for level, kind, raw in anc:
        if data and level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
            sec, nsec = struct.unpack("qq", raw[:16])
            return min(sec * 1_000_000_000 + nsec - (now_real - now_mono), now_mono)
    return None


def _sleep_until(deadline_ns: int) -> None:
    while True:
        left = deadline_ns - time.perf_counter_ns()
        if left <= 0:
            return
        time.sleep(min(left / 1e9, 0.05))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    sim: Simulator
    # TCP_NODELAY: every token is its own small write and must leave at once, not wait for the
    # ACK of the previous one (Nagle), as a real streaming server's do
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    # --- the clock of a request starts when it arrived -----------------------------------
    # The injected TTFT runs from the request's receipt. Taking the time when the handler
    # gets to it would start the clock late by this server's own overhead (a thread started
    # per connection, the request line and headers parsed): measured at 0.3-0.6 ms median on
    # a busy 2-core machine, which the client then sees as TTFT error. So the first request of
    # a connection (the buffer is empty then) is stamped with the kernel's receive time of
    # its first byte; later requests on a kept-alive connection with the time its request
    # line was read.
    def setup(self) -> None:
        super().setup()
        self._arrival: int | None = None
        if SO_TIMESTAMPNS is not None:
            try:
                self.connection.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                self._arrival = _arrival_ns(self.connection)
            except OSError:
                pass

    def parse_request(self) -> bool:
        self.recv_ns = self._arrival if self._arrival is not None else time.perf_counter_ns()
        self._arrival = None
        return super().parse_request()

    # --- helpers --------------------------------------------------------------------
    def _json(self, code: int, obj: Any, extra: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _settings(self) -> SimSettings:
        s = self.sim.settings
        raw = self.headers.get("X-Sim")
        if raw:
            try:
                over = json.loads(raw)
                names = {f.name for f in fields(SimSettings)}
                s = replace(s, **{k: v for k, v in over.items() if k in names})
            except (ValueError, TypeError):
                pass
        return s

    def do_GET(self):
        if self.path.startswith("/v1/models"):
            self._json(200, {"object": "list", "data": [{"id": "sim-model", "object": "model"}]})
        elif self.path.startswith("/sim/emits"):
            with self.sim.lock:
                data = dict(self.sim.emits)
                if "clear=1" in self.path:
                    self.sim.emits.clear()
            self._json(200, data)
        elif self.path.startswith("/sim/stats"):
            self._json(200, self.sim.stats())
        elif self.path.startswith("/health"):
            self._json(200, {"status": "ok", "active": self.sim.active})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self):
        recv_ns = self.recv_ns
        s = self._settings()
        try:
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            if not isinstance(body, dict):
                raise ValueError
        except (ValueError, UnicodeDecodeError):
            self._json(400, {"error": {"message": "invalid JSON body", "type": "invalid_request_error"}})
            return
        if s.api_key and self.headers.get("Authorization") != f"Bearer {s.api_key}":
            self._json(401, {"error": {"message": "invalid api key", "type": "authentication_error"}})
            return
        chat = self.path.rstrip("/").endswith("/chat/completions")
        if not chat and not self.path.rstrip("/").endswith("/completions"):
            self._json(404, {"error": {"message": "unknown endpoint"}})
            return
        if s.status != 200:
            extra = {"Retry-After": f"{s.retry_after:g}"} if s.retry_after is not None else {}
            self._json(s.status, {"error": {"message": f"simulated {s.status}", "type": "server_error"}}, extra)
            return
        self.sim.count(REQUESTS)
        with self.sim.lock:
            fail = self.sim.rng.random() < s.error_rate
        if fail:
            self._json(500, {"error": {"message": "simulated failure", "type": "server_error"}})
            return
        if chat:
            msgs = body.get("messages") or []
            prompt = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
        else:
            prompt = str(body.get("prompt", ""))
        max_tokens = int(body.get("max_tokens") or s.max_tokens_default)
        ans = answer(prompt, s.wrong_answers)
        if ans is not None:
            tokens = [ans]
        else:
            seed = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16)
            tokens = [WORDS[(seed + i * 7) % len(WORDS)] for i in range(max_tokens)]
        tokens = tokens[:max_tokens] if not s.empty else []
        input_tokens = len(prompt.split())
        hit = self.sim.prefix_hit(prompt, s.prefix_chars)
        prefill = s.ttft_ms + s.prefill_ms_per_token * input_tokens
        if hit:
            prefill *= 1 - s.prefix_cache_speedup * min(1.0, s.prefix_chars / max(len(prompt), 1))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.sim.count(ACTIVE)
        try:
            if body.get("stream"):
                usage = s.usage and bool((body.get("stream_options") or {}).get("include_usage"))
                self._stream(s, rid, chat, tokens, prefill, recv_ns, usage, input_tokens, hit)
            else:
                _sleep_until(recv_ns + int(prefill * self.sim.load_factor() * 1e6))
                t = recv_ns + int(prefill * 1e6)
                for _ in tokens[1:]:
                    t += int(s.itl_ms * self.sim.load_factor() * 1e6)
                _sleep_until(t)
                text = " ".join(tokens)
                msg = {"role": "assistant", "content": text} if chat else None
                choice = {"index": 0, "finish_reason": "stop" if ans else "length",
                          **({"message": msg} if chat else {"text": text})}
                self.sim.record(rid, {"recv_ns": recv_ns, "emit_ns": [time.perf_counter_ns()], "tokens": [len(tokens)],
                                      "stream": False, "prefix_hit": hit})
                self._json(200, {"id": rid, "object": "chat.completion" if chat else "text_completion",
                                 "model": body.get("model", "sim-model"), "choices": [choice],
                                 "usage": {"prompt_tokens": input_tokens, "completion_tokens": len(tokens),
                                           "total_tokens": input_tokens + len(tokens)}})
                self.sim.count(COMPLETIONS)
                self.sim.count(TOKENS, len(tokens))
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self.sim.count(ACTIVE, -1)

    def _stream(self, s: SimSettings, rid: str, chat: bool, tokens: list[str], prefill_ms: float, recv_ns: int,
                usage: bool, input_tokens: int, hit: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        nl = "\r\n" if s.crlf else "\n"
        pending: list[bytes] = []
        model = "sim-model"

        def write(raw: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
            self.wfile.flush()

        def send(text: str, force: bool = False) -> None:
            data = text.encode()
            if s.split_events and len(data) > 2:
                mid = len(data) // 2
                write(data[:mid])
                write(data[mid:])
                return
            pending.append(data)
            if force or len(pending) >= s.coalesce:
                write(b"".join(pending))
                pending.clear()

        def event(obj: Any, name: str | None = None) -> str:
            head = f"event: {name}{nl}" if name else ""
            payload = obj if isinstance(obj, str) else json.dumps(obj)
            return f"{head}data: {payload}{nl}{nl}"

        def chunk(delta_text: str | None, role: bool = False) -> dict[str, Any]:
            if chat:
                delta = {"role": "assistant", "content": ""} if role else {"content": delta_text}
                return {"id": rid, "object": "chat.completion.chunk", "model": model,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            return {"id": rid, "object": "text_completion", "model": model,
                    "choices": [{"index": 0, "text": delta_text or "", "finish_reason": None}]}

        if s.role_chunk and chat:
            send(event(chunk(None, role=True)), force=True)
        if s.comments:
            send(f": keep-alive{nl}{nl}", force=True)
        emits: list[int] = []
        counts: list[int] = []
        deadline = recv_ns + int(prefill_ms * self.sim.load_factor() * 1e6)
        sent = 0
        k = max(1, s.tokens_per_chunk)
        i = 0
        while i < len(tokens):
            group = tokens[i:i + k]
            _sleep_until(deadline)
            if s.stall_after_tokens is not None and sent >= s.stall_after_tokens:
                if pending:
                    write(b"".join(pending))
                    pending.clear()
                time.sleep(3600)  # a stalled server; the client's read timeout ends it
            if s.error_event_after is not None and sent >= s.error_event_after:
                send(event({"message": "simulated mid-stream failure"}, name="error"), force=True)
                break
            if s.data_error_after is not None and sent >= s.data_error_after:
                send(event({"error": {"message": "simulated error in a 200 stream", "type": "server_error"}}),
                     force=True)
                break
            if s.non_json_after is not None and sent >= s.non_json_after:
                send(f"data: this is not json{nl}{nl}", force=True)
                s = replace(s, non_json_after=None)
            text = "".join((" " if (sent + j) else "") + t for j, t in enumerate(group))
            send(event(chunk(text)))
            if s.comments:
                send(f": ping{nl}{nl}")
            now = time.perf_counter_ns()
            if not pending:
                emits.append(now)
                counts.append(len(group))
            else:  # coalesced: the write happens later; record that time instead
                emits.append(-1)
                counts.append(len(group))
            sent += len(group)
            i += k
            step = s.itl_ms * k * self.sim.load_factor()
            if s.jitter_ms:
                step = max(0.0, step + random.uniform(-s.jitter_ms, s.jitter_ms))
            deadline += int(step * 1e6)
        if pending:
            write(b"".join(pending))
            pending.clear()
            t = time.perf_counter_ns()
            emits = [t if e == -1 else e for e in emits]
        if usage:
            send(event({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "model": model,
                        "choices": [], "usage": {"prompt_tokens": input_tokens, "completion_tokens": sent,
                                                 "total_tokens": input_tokens + sent}}), force=True)
        if not s.no_done:
            send(f"data: [DONE]{nl}{nl}", force=True)
        self.sim.record(rid, {"recv_ns": recv_ns, "emit_ns": emits, "tokens": counts, "stream": True,
                              "prefix_hit": hit})
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.sim.count(COMPLETIONS)  # the whole stream was written (a client that cancelled breaks the pipe first)
        self.sim.count(TOKENS, sent)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True

    def server_bind(self) -> None:
        # on the listening socket, so that accepted sockets stamp a request that arrives before
        # their handler thread runs (Linux copies the flag to them)
        if SO_TIMESTAMPNS is not None:
            try:
                self.socket.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            except OSError:
                pass
        super().server_bind()


def serve(settings: SimSettings, host: str = "127.0.0.1", port: int = 0,
          processes: int = 1) -> tuple[_Server, Simulator]:
    sim = Simulator(settings, processes)
    handler = type("SimHandler", (Handler,), {"sim": sim})
    server = _Server((host, port), handler)
    return server, sim


def start_in_thread(settings: SimSettings, host: str = "127.0.0.1", port: int = 0):
    server, sim = serve(settings, host, port)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    return server, sim


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default="127.0.0.1:8000", metavar="HOST:PORT")
    p.add_argument("--processes", type=int, default=1, metavar="N",
                   help="serve from N pre-forked processes sharing the socket and the capacity model")
    for f in fields(SimSettings):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool) or isinstance(f.default, bool):
            # --usage / --no-usage: a flag whose default is true must be able to turn it off
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        elif f.name == "retry_after":
            p.add_argument(flag, type=float, default=None)
        elif f.name in ("stall_after_tokens", "error_event_after", "data_error_after", "non_json_after"):
            p.add_argument(flag, type=int, default=None)
        elif f.name == "api_key":
            p.add_argument("--api-key-env", default=None, metavar="VAR",
                           help="require the bearer token held in this environment variable")
        else:
            p.add_argument(flag, type=type(f.default), default=f.default)


def main(args: argparse.Namespace) -> int:
    names = {f.name for f in fields(SimSettings)}
    values = {k: v for k, v in vars(args).items() if k in names and k != "api_key"}
    if getattr(args, "api_key_env", None):
        values["api_key"] = os.environ.get(args.api_key_env) or None
    if not 1 <= args.processes <= 64:
        print("fleetcanary simulate-llm: --processes must be within 1..64", file=sys.stderr)
        return 2
    if values["batch_size"] < 1 or values["itl_ms"] < 0 or values["ttft_ms"] < 0 or values["tokens_per_chunk"] < 1:
        print("fleetcanary simulate-llm: --batch-size and --tokens-per-chunk must be at least 1, --ttft-ms and "
              "--itl-ms not negative", file=sys.stderr)
        return 2
    settings = SimSettings(**values)
    host, _, port = args.listen.rpartition(":")
    try:
        server, _ = serve(settings, host or "127.0.0.1", int(port), args.processes)
    except (OSError, ValueError) as exc:
        print(f"fleetcanary simulate-llm: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 1
    children = []
    for _ in range(args.processes - 1):  # pre-fork: every process accepts on the one listening socket
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            try:
                server.serve_forever()
            finally:
                os._exit(0)
        children.append(pid)
    print(f"simulate-llm listening on http://{host or '127.0.0.1'}:{server.server_address[1]}/v1 "
          f"(TTFT {settings.ttft_ms:g} ms, ITL {settings.itl_ms:g} ms, batch {settings.batch_size}, "
          f"{args.processes} process{'es' if args.processes > 1 else ''})", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except OSError:
                pass
        server.server_close()
    return 0


__all__ = ["SimSettings", "Simulator", "serve", "start_in_thread"]
