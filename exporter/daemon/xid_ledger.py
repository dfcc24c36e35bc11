"""What the node's XIDs mean now: each one classed by the catalogue, kept for a while per GPU, and the
escalation of application-class codes.

An application-class XID (13, 31, 43, ...) is usually the job's own doing: alone it never pages. When one
GPU logs the same code from ``escalate_processes`` different processes within ``escalate_window_seconds``
(a process is its pid, or its name where the line has none; NVML's events carry neither and never
escalate), the GPU, not the job, is the common factor: the ledger escalates, once per window, and
the GPU counts as failed for ``fault_hold_seconds``. The same holds for hardware-side critical XIDs; a
warning one leaves the GPU degraded for that long. All of it on the clock it is given (tests step it).
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from fleetcanary.probes.lib import xids


@dataclass(frozen=True)
class XidEvent:
    at: float
    gpu: str
    code: int
    cls: str
    severity: str
    detail: dict = field(default_factory=dict, compare=False)
    message: str = field(default="", compare=False)

    def describe(self, info: xids.XidInfo | None = None) -> str:
        """XID 79 (bus, critical: GPU has fallen off the bus; first action: ...)."""
        extra = ", ".join(f"{k} {v}" for k, v in self.detail.items() if k in ("link", "recovery_action"))
        words = f"XID {self.code} ({self.cls}, {self.severity}"
        if info is not None:
            words += f": {info.name}"
        words += f"{'; ' + extra if extra else ''})"
        if info is not None:
            words += f"; first action: {info.action}"
        return words


class XidLedger:
    def __init__(self, cfg, clock) -> None:
        """cfg: the config's `xid` section (XidConfig); clock: () -> seconds (monotonic in the daemon)."""
        self.cfg = cfg
        self.clock = clock
        self._lock = threading.Lock()
        self._events: deque[XidEvent] = deque(maxlen=4096)
        self._procs: dict[tuple[str, int], dict[str, float]] = {}   # (gpu, code) -> process -> last seen
        self._escalated: dict[tuple[str, int], float] = {}          # (gpu, code) -> when it last escalated

    def info(self, code: int) -> xids.XidInfo:
        return xids.lookup(code, self.cfg.override_map())

    def record(self, gpu: str, code: int, message: str = "") -> tuple[XidEvent, bool]:
        """Class one XID and keep it; whether it escalated (an application-class code's Nth process)."""
        info = self.info(code)
        detail = xids.details(code, message)
        ev = XidEvent(self.clock(), gpu, code, info.cls, xids.severity_of(info, detail), detail, message[:300])
        escalated = False
        with self._lock:
            self._events.append(ev)
            if info.cls == "application" and ev.severity != "ignore":
                process = detail.get("pid") or detail.get("name")
                if process:
                    escalated = self._escalate(ev, process)
        return ev, escalated

    def _escalate(self, ev: XidEvent, process: str) -> bool:
        key = (ev.gpu, ev.code)
        window = self.cfg.escalate_window_seconds
        seen = {p: t for p, t in self._procs.get(key, {}).items() if ev.at - t <= window}
        seen[process] = ev.at
        self._procs[key] = seen
        last = self._escalated.get(key)
        if len(seen) >= self.cfg.escalate_processes and (last is None or ev.at - last > window):
            self._escalated[key] = ev.at
            return True
        return False

    def recent(self) -> list[tuple[XidEvent, bool]]:
        """The XIDs that still count (within fault_hold_seconds), newest last, with whether each is one of an
        escalated application-class code (its GPU then counts as failed)."""
        now = self.clock()
        hold = self.cfg.fault_hold_seconds
        with self._lock:
            while self._events and now - self._events[0].at > hold:
                self._events.popleft()
            escalated = {k for k, t in self._escalated.items() if now - t <= hold}
            return [(e, (e.gpu, e.code) in escalated) for e in self._events]
