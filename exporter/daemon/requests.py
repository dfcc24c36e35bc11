"""Requested runs: POST /confirm asks for a fresh run of one probe (server.confirm_requests, off by default).

`fleetcanary remediate` asks before it quarantines a node on a performance verdict (docs/remediation.md,
"Confirming runs"); a person may ask too. The body is JSON, at most MAX_BODY bytes:

    {"probe": "gpu_bandwidth"}            or   {"figure": "gpu_memory_bandwidth", "gpu": "3"}

(a figure names its probe: fleetcanary.judge.figures). The answer is 202 with the request's id, when it was
asked (this node's wall clock) and the earliest time its run can end (now plus the probe's timeout; the run
starts at once unless its exclusive class is busy). GET /confirm/ID then says "pending" until a run of the probe
that started after the request has ended (the requested run itself, or a scheduled one that came first: either
is fresh), and "done" with that run's outcome, reason, start and end, and its judged figures (figure, series,
GPU, value: what fleetcanary.judge.figures.extract reads from its samples), so the asker reads the very run and
not a median that older runs still hold.

The run goes through the scheduler as any run does (its probe's lock and exclusive class, the GPU budget, and
the per-GPU allocation: an invasive probe skips the GPUs tenants hold). Where tenants hold the GPUs the run
skips for a tenant; with kubernetes.claim on, the request then stays pending and the probe is made due for a
claim pod at once (daemon/claim.py: a pod that waits for the GPUs at the lowest priority), whose record
completes the request; without claims, the skipped run completes it (no figure: the asker cannot confirm).

Rate limits, on the daemon's monotonic clock: one request per probe per its confirm_delay_seconds, and
server.confirm_requests_per_hour in all; past either, 429 with Retry-After. Requests are kept in memory
(the newest KEEP); a restart forgets them (the asker's poll then gets 404 and gives up: not confirmed)."""
from __future__ import annotations

import json
import math
import re
import secrets
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from fleetcanary.daemon.state import TENANT_REASONS
from fleetcanary.judge import figures as figmod

MAX_BODY = 4096      # bytes of a request body; larger: 413 without reading it
KEEP = 256           # requests remembered (pending and done)
HOUR = 3600.0
_GPU = re.compile(r"^[0-9]{1,3}$")


class BadRequest(Exception):
    """One line saying what is wrong with the request."""


class Limited(Exception):
    def __init__(self, why: str, retry_after: float) -> None:
        super().__init__(why)
        self.retry_after = retry_after


@dataclass
class Request:
    id: str
    probe: str
    figure: str
    gpu: str
    requested_at: float          # wall clock
    earliest_finish: float
    state: str = "pending"       # pending, done
    run: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "probe": self.probe, "figure": self.figure, "gpu": self.gpu,
                "requested_at": self.requested_at, "earliest_finish": self.earliest_finish, "state": self.state,
                **({"run": self.run} if self.run else {})}


def parse(body: bytes) -> dict[str, str]:
    """The request body as {probe, figure, gpu}; BadRequest with one line otherwise."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadRequest(f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"a JSON object is wanted, not a {type(data).__name__}")
    unknown = sorted(set(data) - {"probe", "figure", "gpu"})
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(k[:40] for k in unknown[:5])} (probe, figure, gpu)")
    for k, v in data.items():
        if not isinstance(v, str) or len(v) > 128:
            raise BadRequest(f"{k} must be a string of at most 128 characters")
    probe, figure, gpu = data.get("probe", ""), data.get("figure", ""), data.get("gpu", "")
    if figure:
        fig = figmod.BY_KEY.get(figure)
        if fig is None:
            raise BadRequest(f"figure {figure[:60]!r} is not a judged figure")
        if probe and probe != fig.probe:
            raise BadRequest(f"figure {figure} is measured by probe {fig.probe}, not {probe[:60]}")
        probe = fig.probe
    if not probe:
        raise BadRequest("name a probe or a figure")
    if gpu and not _GPU.match(gpu):
        raise BadRequest("gpu must be a GPU index (digits)")
    return {"probe": probe, "figure": figure, "gpu": gpu}


class Requests:
    def __init__(self, monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._by_id: OrderedDict[str, Request] = OrderedDict()
        self._last: dict[str, float] = {}        # probe -> monotonic time of its last accepted request
        self._accepted: deque[float] = deque()  # monotonic times of accepted requests within the hour

    def admit(self, probe: str, gap: float, per_hour: int) -> None:
        """Count a request against the limits, or raise Limited."""
        now = self._monotonic()
        with self._lock:
            while self._accepted and self._accepted[0] <= now - HOUR:
                self._accepted.popleft()
            last = self._last.get(probe)
            if last is not None and now - last < gap:
                raise Limited(f"probe {probe} was asked {now - last:.0f} s ago; one request per {gap:g} s",
                              gap - (now - last))
            if len(self._accepted) >= per_hour:
                raise Limited(f"{per_hour} requests within the hour already", self._accepted[0] + HOUR - now)
            self._last[probe] = now
            self._accepted.append(now)

    def add(self, probe: str, figure: str, gpu: str, requested_at: float, earliest_finish: float) -> Request:
        req = Request(secrets.token_hex(8), probe, figure, gpu, requested_at, earliest_finish)
        with self._lock:
            self._by_id[req.id] = req
            while len(self._by_id) > KEEP:
                self._by_id.popitem(last=False)
        return req

    def get(self, rid: str) -> Request | None:
        with self._lock:
            return self._by_id.get(rid)

    def pending_since(self, probe: str) -> float | None:
        """When the newest pending request for ``probe`` was made (wall clock); None without one."""
        with self._lock:
            return max((r.requested_at for r in self._by_id.values() if r.state == "pending" and r.probe == probe),
                       default=None)

    def observe(self, out, samples: list[dict[str, Any]], wait_for_claim: bool = False) -> list[Request]:
        """A run has ended: the pending requests of its probe that it answers (it started at or after them) are
        done. ``wait_for_claim``: a run skipped for a tenant leaves them pending (a claim pod will run it).
        The requests it completed."""
        if wait_for_claim and out.outcome == "skipped" and out.reason in TENANT_REASONS:
            return []
        started = out.started_at if isinstance(out.started_at, (int, float)) and math.isfinite(out.started_at) \
            else None
        done, values = [], None
        with self._lock:
            for req in self._by_id.values():
                if req.state != "pending" or req.probe != out.probe or started is None or started < req.requested_at:
                    continue
                if values is None:  # the run's figures, read once for every request it answers
                    values = figmod.extract(out.probe, samples)
                req.run = {"outcome": out.outcome, "reason": out.reason, "trigger": out.trigger,
                           "started_at": started, "finished_at": out.finished_at,
                           "figures": [{"figure": f, "series": s, "gpu": g, "value": v}
                                       for (f, s, g), v in sorted(values.items())
                                       if (not req.figure or f == req.figure) and (not req.gpu or g in ("", req.gpu))]}
                req.state = "done"
                done.append(req)
        return done
