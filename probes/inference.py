"""Inference canary for OpenAI-compatible LLM endpoints: TTFT, ITL, E2E, output
tokens per second, quality and output stability, from a few requests per run.

Per target and run:
- golden prompts at temperature 0 with an expected answer (a regex): quality;
- one streaming request with stream_options.include_usage: TTFT, ITL, E2E, tokens/s,
  and output stability (the greedy output's hash against the first one seen for the
  same model, kept in the state directory);
- one non-streaming request: E2E;
- a pair of requests sharing a long prefix, unique to the run: the TTFT of the second
  against the first shows whether the prefix cache works.

Timing definitions are those of probes/lib/llm_client.py. A request that returns but
fails its quality check counts as outcome quality_fail, and quality-failed requests
are never observed into the latency histograms: performance without quality does
not enter the figures.

Deadlines: the targets run one after another, and each gets a fair share of the time
left before the probe's deadline (time left / targets not yet run; what a fast target
leaves over goes to the ones after it), never less than ``min_target_seconds``: targets
beyond what the deadline holds at that share are not tried in this run (extra.not_tried,
reason deadline) and take their turn in the next runs (a round-robin cursor), rather than
every target's share being too small for its first request. Every request of a target is bounded by what
is left of its share, reads included, so a stalled or slow target times out on its own
and the other targets' figures of the run are kept. A request its target's share has
no time left for is not sent (recorded, not counted). When any target fails, the run
is a failure (ProbeError) that still publishes everything measured; the per-target
outcomes are in the record (extra.targets).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetcanary.probes.base import (
    Figure,
    MetricSpec,
    Probe,
    ProbeConfig,
    ProbeContext,
    ProbeError,
    ProbeResult,
    ProbeSkipped,
    Sample,
)
from fleetcanary.probes.lib import fanout, llm_client, safefile
from fleetcanary.probes.lib.kube_pods import DaemonSetPods

P = "fleetcanary_inference_"
LABELS = ("target", "model")
# MLPerf Inference LLM limits (Llama 2 70B / Llama 3.1 8B / 405B: interactive TTFT 0.45-0.5 s,
# TPOT 30-40 ms; server TTFT 2-6 s, TPOT 100-200 ms) are bucket edges, so the SLO ratios are exact.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.45, 0.5, 1.0, 2.0, 4.0, 6.0, 10.0, 30.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.175, 0.2, 0.5, 1.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
MARGIN = 0.5  # seconds of the deadline kept for the worker to report
MIN_REQUEST_SECONDS = 0.05  # a request with less time left than this is not sent
FILLER = ("Fleet canaries measure what users feel: the first token, the pace of the rest, and whether the "
          "answer is still right. ")


class Golden(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    check: str = Field(..., pattern=r"^[a-z0-9_]{1,40}$", description="Label value of this quality check.")
    prompt: str = Field(..., min_length=1, description="Prompt sent at temperature 0.")
    expect: str = Field(..., description="Regular expression the answer must match.")
    max_tokens: int = Field(16, ge=1, le=4096, description="Output token limit.")

    @field_validator("expect")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return v


DEFAULT_GOLDEN = (
    Golden(check="arithmetic", prompt="What is 17 + 25? Reply with the number only.", expect=r"\b42\b"),
    Golden(check="capital", prompt="What is the capital of France? Answer in one word.", expect=r"(?i)\bparis\b"),
)


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(..., pattern=r"^[a-zA-Z0-9_.:-]{1,64}$", description="Label value for this endpoint.")
    base_url: str = Field(..., description="OpenAI-compatible base URL, e.g. http://vllm:8000/v1.")
    model: str = Field(..., min_length=1, max_length=128, description="Model name sent in requests; a label value.")
    api: Literal["chat", "completions"] = Field("chat", description="chat/completions or completions.")
    token_env: str | None = Field(None, description="Environment variable holding the bearer token.")
    token_file: str | None = Field(None, description="File holding the bearer token.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra request headers (values never logged).")
    ca_file: str | None = Field(None, description="CA bundle for TLS verification.")
    verify_tls: bool = Field(True, description="Verify the server certificate.")
    connect_timeout_seconds: float = Field(5.0, gt=0, le=60, description="TCP and TLS connect timeout.")
    read_timeout_seconds: float = Field(30.0, gt=0, le=600, description="Longest silence in a stream (a stall).")
    request_timeout_seconds: float = Field(120.0, gt=0, le=3600, description="Whole-request timeout.")
    golden: tuple[Golden, ...] = Field(DEFAULT_GOLDEN, description="Quality checks.")
    stream_prompt: str = Field("Write a short paragraph about GPU clusters.", description="The streaming request.")
    stream_max_tokens: int = Field(64, ge=2, le=8192, description="Output tokens of the streaming request.")
    non_streaming: bool = Field(True, description="Send the non-streaming request.")
    prefix_cache_pair: bool = Field(True, description="Send the shared-prefix pair.")
    prefix_words: int = Field(1024, ge=16, le=100_000, description="Words of the shared prefix.")
    extra_body: dict = Field(default_factory=dict, description="Extra request body fields (e.g. vLLM's ignore_eos).")
    probe_from_pods: str = Field(
        "", description="A label selector of the endpoint's own pods: only nodes hosting them probe it "
        "(probers_per_target of them); empty: any member.")
    probe_from_namespace: str = Field("", description="Namespace of those pods; empty: the service account's own.")
    max_line_bytes: int = Field(1 << 20, ge=1024, le=256 << 20, description="Longest SSE line or event (bytes) "
                                "accepted; a longer one is a stream_error, not an unbounded buffer.")

    @model_validator(mode="after")
    def _token_source(self) -> Target:
        if self.token_env and self.token_file:
            raise ValueError("give at most one of token_env, token_file")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        return self


class Config(ProbeConfig, DaemonSetPods):
    targets: tuple[Target, ...] = Field((), description="Endpoints to probe. None configured: the probe skips.")
    probers_per_target: int = Field(
        3, ge=0, le=1000, description="Nodes that probe each target, chosen by rendezvous hashing over the members "
        "(probes/lib/fanout.py), so requests per endpoint stay the same at any fleet size; 0: every node probes "
        "every target.")
    members_from: Literal["auto", "kubernetes", "static", "self"] = Field(
        "auto", description="The members probers are chosen from. kubernetes: the pods of this DaemonSet "
        "(`kubernetes_label_selector` in `kubernetes_namespace`), by node; static: `members`; self: this node "
        "only (it probes every target); auto: kubernetes in a pod, else self.")
    members: tuple[str, ...] = Field((), description="Member node names (members_from static); this node among them.")
    min_target_seconds: float = Field(
        1.0, gt=0, le=600, description="The least share of the run's deadline a target is given, room for its "
        "first request. Targets beyond what the deadline holds at this share are not tried in this run (recorded "
        "as not_tried, reason deadline) and come first in the next runs, round-robin, so every target is tried.")


def assigned(config: Config, node: str) -> list[Target]:
    """The targets this node probes: those whose k probers (rendezvous hashing over the members, or over the
    nodes hosting the target's pods) include it. ProbeError members_unavailable when the members cannot be
    read: every node then stays off rather than all probing at once."""
    k = config.probers_per_target
    source = config.members_from
    if source == "auto":
        source = "kubernetes" if os.environ.get("KUBERNETES_SERVICE_HOST") else "self"
    if k == 0 or (source == "self" and not any(t.probe_from_pods for t in config.targets)):
        return list(config.targets)
    if not node:
        raise ProbeError("members_unavailable", "node_name is empty: this node cannot find itself among the members")
    fleet: list[str] | None = None
    out = []
    for t in config.targets:
        if t.probe_from_pods:
            pool = fanout.nodes_of_pods(t.probe_from_namespace, t.probe_from_pods,
                                        config.kubernetes_api_timeout_seconds)
        else:
            if fleet is None:
                fleet = members(config, source, node)
            pool = fleet
        if node in fanout.choose(t.name, pool, k):
            out.append(t)
    return out


def members(config: Config, source: str, node: str) -> list[str]:
    if source == "self":
        return [node]
    if source == "static":
        if not config.members:
            raise ProbeError("members_unavailable", "members_from is static and members is empty")
        return list(config.members)
    return fanout.nodes_of_pods(config.kubernetes_namespace, config.kubernetes_label_selector,
                                config.kubernetes_api_timeout_seconds)


def read_token(t: Target) -> str | None:
    if t.token_env:
        v = os.environ.get(t.token_env)
        if not v:
            raise ProbeError("other", f"target {t.name}: environment variable {t.token_env} is not set")
        return v.strip()
    if t.token_file:
        try:
            return Path(t.token_file).read_text().strip()
        except OSError as exc:
            raise ProbeError("other", f"target {t.name}: cannot read token_file: {exc.strerror}") from None
    return None


class Inference(Probe):
    name = "inference"
    needs_targets = True
    Config = Config
    failure_reasons = ("http_4xx", "http_429", "http_5xx", "connect_error", "timeout", "stream_error", "empty",
                       "truncated", "quality_fail", "members_unavailable")
    # what produces each request outcome; also the run's failure reason (docs/metrics.md)
    reason_docs: ClassVar[dict[str, str]] = dict(llm_client.OUTCOME_DOCS)
    default_interval_seconds = 60.0
    default_timeout_seconds = 50.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(P + "time_to_first_token_seconds", "histogram", "Send to the first chunk with content, reasoning "
                   "content or tool calls (role-only and empty chunks excluded); streaming canary requests.",
                   "seconds", LABELS, TTFT_BUCKETS),
        MetricSpec(P + "inter_token_latency_seconds", "histogram", "(E2E - TTFT) / (output tokens - 1), tokens from "
                   "usage.completion_tokens or else the chunk count.", "seconds", LABELS, ITL_BUCKETS),
        MetricSpec(P + "request_duration_seconds", "histogram", "Send to the last content chunk (streaming) or the "
                   "whole response (non-streaming).", "seconds", LABELS, E2E_BUCKETS),
        MetricSpec(P + "requests_total", "counter", "Canary requests by outcome: success, http_4xx, http_429, "
                   "http_5xx, connect_error, timeout, stream_error, empty, truncated, quality_fail (each explained "
                   "under Outcomes below).", "total",
                   ("target", "model", "outcome")),
        MetricSpec(P + "output_tokens_total", "counter", "Output tokens received by successful canary requests.",
                   "total", LABELS),
        MetricSpec(P + "output_tokens_per_second", "gauge", "Output tokens per second of the streaming request "
                   "(tokens / E2E).", "tokens_per_second", LABELS),
        MetricSpec(P + "quality_pass", "gauge", "1 if the golden prompt's answer matched its expected pattern.",
                   "boolean", ("target", "check")),
        MetricSpec(P + "output_stable", "gauge", "1 if the greedy output is unchanged since it was first seen for "
                   "this model; 0 if it changed.", "boolean", ("target",)),
        MetricSpec(P + "prefix_cache_ttft_ratio", "gauge", "TTFT of the second request of a shared-prefix pair over "
                   "the first's; well under 1 when the prefix cache works.", "ratio", ("target",)),
        MetricSpec(P + "retry_after_seconds", "gauge", "Retry-After of the last 429/503 answer.", "seconds",
                   ("target",)),
        MetricSpec(P + "success", "gauge", "1 if every canary request of the target succeeded in the last run.",
                   "boolean", ("target",)),
    )

    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        if not config.targets:
            raise ProbeSkipped("not_configured", "no inference targets")
        mine = assigned(config, ctx.node_name)
        if not mine:
            raise ProbeSkipped("not_assigned", f"other nodes probe the {len(config.targets)} targets "
                               f"({config.probers_per_target} nodes each)")
        res = ProbeResult(touched={"targets": []})
        failures = {}
        per_target = res.extra.setdefault("targets", {})
        res.extra["not_assigned"] = [t.name for t in config.targets if t not in mine]
        order = _rotated(mine, ctx.state_dir)
        tried: list[Target] = []
        try:
            for i, t in enumerate(order):
                start = time.monotonic()
                share = _share(ctx.deadline_monotonic - MARGIN - start, len(order) - i, config.min_target_seconds,
                               first=not tried)
                if share is None:
                    break  # the rest cannot have their least share: deferred to the next runs, not starved
                tried.append(t)
                res.touched["targets"].append({"target": t.name, "model": t.model, "api": t.api,
                                               "host": t.base_url.split("/")[2].rsplit("@", 1)[-1]})
                try:
                    outcome, detail = self._target(t, ctx, res, start + share)
                except ProbeError as exc:  # this target's setup is broken (its token); the others still run
                    outcome, detail = exc.reason, exc.detail
                per_target[t.name] = {"outcome": outcome, "detail": detail, "budget_seconds": round(share, 3),
                                      "seconds": round(time.monotonic() - start, 3)}
                res.samples.append(Sample(P + "success", {"target": t.name}, 1.0 if outcome == "success" else 0.0))
                if outcome != "success":
                    failures[t.name] = (outcome, detail)
        finally:
            _advance(ctx.state_dir, order, len(tried))
        n = len(tried)
        deferred = order[n:]
        if deferred:
            res.extra["not_tried"] = {"reason": "deadline", "count": len(deferred),
                                      "targets": [t.name for t in deferred[:50]]}
        if not tried:
            raise ProbeError("timeout", f"no time left before the deadline for any of the {len(order)} targets",
                             result=res)
        res.extra["failures"] = {k: {"outcome": o, "detail": d} for k, (o, d) in failures.items()}
        if failures:
            outcome, _ = next(iter(failures.values()))
            summary = "; ".join(f"{k}: {o} ({d})" for k, (o, d) in failures.items())
            raise ProbeError(outcome, f"{len(failures)} of {n} targets failed: {summary}"[:1000], result=res)
        return res

    def _target(self, t: Target, ctx: ProbeContext, res: ProbeResult, deadline: float) -> tuple[str, str]:
        """Probe one target; every request ends before ``deadline`` (time.monotonic())."""
        token = read_token(t)
        labels = {"target": t.name, "model": t.model}
        requests: list[dict] = []
        worst = ("success", "")

        def note(kind: str, r: llm_client.RequestResult, outcome: str | None = None) -> None:
            nonlocal worst
            outcome = outcome or r.outcome
            res.samples.append(Sample(P + "requests_total", {**labels, "outcome": outcome}, 1))
            if r.retry_after is not None:
                res.samples.append(Sample(P + "retry_after_seconds", {"target": t.name}, r.retry_after))
            rec = {"kind": kind, **r.record(), "outcome": outcome}
            requests.append(rec)
            if outcome != "success" and worst[0] == "success":
                worst = (outcome, f"{kind}: {r.detail or outcome}")
            if outcome == "success":
                res.samples.append(Sample(P + "output_tokens_total", labels, r.output_tokens))
                if r.stream and r.ttft is not None:
                    res.samples.append(Sample(P + "time_to_first_token_seconds", labels, r.ttft))
                    if r.itl is not None:
                        res.samples.append(Sample(P + "inter_token_latency_seconds", labels, r.itl))
                if r.e2e is not None:
                    res.samples.append(Sample(P + "request_duration_seconds", labels, r.e2e))

        not_sent: list[str] = []

        def call(kind: str, prompt: str, max_tokens: int, stream: bool) -> llm_client.RequestResult | None:
            nonlocal worst
            left = deadline - time.monotonic()
            if left < MIN_REQUEST_SECONDS:
                not_sent.append(kind)
                if worst[0] == "success":
                    worst = ("timeout", f"{kind}: the target's share of the deadline was spent before it was sent")
                return None
            ep = llm_client.Endpoint(base_url=t.base_url, api=t.api, token=token, headers=dict(t.headers),
                                     ca_file=t.ca_file, verify_tls=t.verify_tls,
                                     connect_timeout=t.connect_timeout_seconds, read_timeout=t.read_timeout_seconds,
                                     total_timeout=min(t.request_timeout_seconds, left),
                                     max_line_bytes=t.max_line_bytes)
            body = llm_client.build_body(t.api, t.model, prompt, max_tokens, stream, 0.0, t.extra_body)
            return llm_client.request(ep, body)

        # 1. golden prompts: quality
        for g in t.golden:
            r = call(f"golden:{g.check}", g.prompt, g.max_tokens, True)
            if r is None:
                continue
            passed = r.outcome == "success" and re.search(g.expect, r.text) is not None
            if r.outcome == "success":
                res.samples.append(Sample(P + "quality_pass", {"target": t.name, "check": g.check},
                                          1.0 if passed else 0.0))
            note(f"golden:{g.check}", r, None if r.outcome != "success" else ("success" if passed else "quality_fail"))
            requests[-1]["quality"] = {"check": g.check, "pass": passed}
        # 2. the streaming request: latency, tokens/s and stability
        r = call("stream", t.stream_prompt, t.stream_max_tokens, True)
        if r is not None:
            note("stream", r)
        if r is not None and r.outcome == "success":
            tps = r.tokens_per_second()
            if tps:
                res.samples.append(Sample(P + "output_tokens_per_second", labels, tps))
                res.figures.append(Figure("output_tokens_per_second", "tokens_per_second", [tps], dict(labels)))
            res.figures.append(Figure("ttft", "seconds", [r.ttft], dict(labels), higher_is_better=False))
            if r.itl is not None:
                res.figures.append(Figure("itl", "seconds", [r.itl], dict(labels), higher_is_better=False))
                res.figures.append(Figure("chunk_gap", "seconds", r.gaps or [r.itl], dict(labels),
                                          higher_is_better=False))
            stable = _stability(ctx.state_dir, t, r.text)
            res.samples.append(Sample(P + "output_stable", {"target": t.name}, 1.0 if stable else 0.0))
            res.extra.setdefault("stability", {})[t.name] = stable
        # 3. non-streaming
        if t.non_streaming:
            r = call("non_stream", t.stream_prompt, t.stream_max_tokens, False)
            if r is not None:
                note("non_stream", r)
        # 4. shared-prefix pair, unique to this run so the first request is cold
        if t.prefix_cache_pair:
            prefix = f"[canary {uuid.uuid4().hex}] " + " ".join((FILLER * (t.prefix_words // 15 + 1)).split()[
                :t.prefix_words])
            a = call("prefix_first", prefix + " Question one: summarise.", 4, True)
            if a is not None:
                note("prefix_first", a)
            b = call("prefix_second", prefix + " Question two: summarise again.", 4, True) if a is not None else None
            if b is not None:
                note("prefix_second", b)
            if a is not None and b is not None and a.ttft and b.ttft:
                res.samples.append(Sample(P + "prefix_cache_ttft_ratio", {"target": t.name}, b.ttft / a.ttft))
        res.extra.setdefault("requests", {})[t.name] = requests
        if not_sent:
            res.extra.setdefault("not_sent", {})[t.name] = not_sent
        return worst


def _share(left: float, remaining: int, min_share: float, first: bool) -> float | None:
    """The next target's share of the ``left`` seconds: a fair share of them among the ``remaining`` targets,
    or among as many as the time holds at ``min_share`` each, whichever is fewer, so a share never falls
    under ``min_share`` (room for the target's first request) however many targets there are. None: no
    room for another target (the first one of a run still gets what is left, if a request fits)."""
    fit = int(left // min_share) if left > 0 else 0
    if fit <= 0:
        return left if first and left >= MIN_REQUEST_SECONDS else None
    return left / min(remaining, fit)


def _cursor_path(state_dir: str) -> Path:
    return Path(state_dir) / "inference" / "rotation.json"


def _rotated(mine: list[Target], state_dir: str) -> list[Target]:
    """The targets from where the last run stopped (a cursor in the state directory, by target name), so the
    targets a short deadline could not hold come first in the next run."""
    raw, _, _ = safefile.read_raw(_cursor_path(state_dir), 1 << 16)
    try:
        after = json.loads(raw)["next"] if raw is not None else None
    except (ValueError, KeyError, TypeError, RecursionError):
        return list(mine)
    names = [t.name for t in mine]
    if after not in names:
        return list(mine)
    i = names.index(after)
    return list(mine[i:]) + list(mine[:i])


def _advance(state_dir: str, order: list[Target], tried: int) -> None:
    path = _cursor_path(state_dir)
    if not order or (tried >= len(order) and not path.exists()):
        return  # every target had its turn and nothing was ever deferred: no file needed
    try:  # never through a link planted in the state directory (probes/lib/safefile)
        if safefile.private_dir(path.parent):
            safefile.write_atomic(path, json.dumps({"next": order[tried % len(order)].name}), fsync=False)
    except OSError:
        pass


def _stability(state_dir: str, t: Target, text: str) -> bool:
    """Compare the greedy output with the first one seen for this target, model and prompt."""
    d = Path(state_dir) / "inference"
    key = hashlib.sha256(f"{t.name}\0{t.model}\0{t.stream_prompt}\0{t.stream_max_tokens}".encode()).hexdigest()[:24]
    path = d / f"{key}.json"
    digest = hashlib.sha256(text.encode()).hexdigest()
    raw, _, _ = safefile.read_raw(path, 1 << 16)
    try:
        first = json.loads(raw)["output_sha256"] if raw is not None else None
    except (ValueError, KeyError, TypeError, RecursionError):
        first = None
    if first is None:
        try:  # never through a link planted in the state directory (probes/lib/safefile)
            if safefile.private_dir(d):
                safefile.write_atomic(path, json.dumps({"target": t.name, "model": t.model, "output_sha256": digest,
                                                        "first_seen": time.time()}))
        except OSError:
            pass
        return True
    return first == digest
