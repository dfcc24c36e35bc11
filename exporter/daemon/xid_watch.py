"""Continuous XID watch: critical XIDs are caught whenever they happen while the exporter runs, not only
during the gpu_health probe's 2-second event wait of each minute (about 3% of the time).

A long-lived reader process (fleetcanary.runner.xid_reader: the kernel log's NVRM Xid records, or NVML's
critical-XID events where the kernel log is not mounted) writes one JSON line per record; this side maps
each Xid's PCI bus ID to the GPU index the node's GPU facts give (the environment record the probe
workers report: the daemon never loads NVML), classes it from the XID catalogue
(probes/lib/xid_catalogue.yaml) and counts it into fleetcanary_gpu_xid_errors_total{gpu, xid, class,
severity} (the counter gpu_health feeds, so the alerts read both); NVSwitch SXids go to
fleetcanary_nvswitch_sxid_errors_total, and adds the seconds it watched to
fleetcanary_gpu_xid_watch_seconds_total, whose rate is the watched share of time. A reader that dies is
restarted with a backoff, and goes on after the last record it read.

The reader starts with the daemon and replays what the kernel log holds, often before any worker has reported
the GPU facts: XidBuffer holds those XIDs (up to PENDING_XIDS) until the facts are known, so that every XID's
gpu label is an index like every other GPU series', and hands each on once.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from fleetcanary.core import environment as envmod

log = logging.getLogger("fleetcanary.xid_watch")
BACKOFF = (1.0, 30.0)   # seconds before a restart: doubling from the first to the second
FLUSH_SECONDS = 15.0     # watched seconds are added to the counter this often
UNAVAILABLE = 3          # the reader's exit status when its source cannot work here (xid_reader.UNAVAILABLE)
PENDING_XIDS = 256  # XIDs read before the GPU facts are known, kept until they are (the rest are dropped)


def pci_key(bus_id: str) -> str:
    """"00000000:18:00.0" (NVML) or "0000:18:00" (the kernel log) -> "0000:18:00"."""
    b = bus_id.lower().split(".", 1)[0]
    parts = b.split(":")
    if len(parts) != 3:
        return b
    return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"


def facts_known(environment: dict[str, Any]) -> bool:
    """The node's environment record (the workers' GPU facts) says which GPUs the node has."""
    return bool(environment.get("gpus")) or environment.get("gpu_count", envmod.UNKNOWN) != envmod.UNKNOWN


def gpu_of(pci: str, environment: dict[str, Any]) -> str:
    """An Xid's gpu label: the index of the GPU at that PCI bus ID in the node's GPU facts, or "pci:<id>"."""
    gpus = environment.get("gpus") or []
    index = next((str(g.get("index")) for g in gpus if isinstance(g, dict) and g.get("pci_bus_id")
                  and pci_key(str(g["pci_bus_id"])) == pci_key(pci)), None)
    return index if index is not None else f"pci:{pci}"


class XidBuffer:
    """The watch's on_xid: an Xid by PCI bus ID, passed to ``count(gpu, code, message, where)`` with its GPU
    index (``environment()``: the node's environment record). One read before the GPU facts are known waits
    in the buffer (PENDING_XIDS at most; the rest are dropped) until ``flush`` finds them known."""

    def __init__(self, environment: Callable[[], dict[str, Any]], count: Callable[[str, int, str, str], None],
                 limit: int = PENDING_XIDS) -> None:
        self.environment = environment
        self.count = count
        self.limit = limit
        self.pending: list[tuple[str, int, str]] = []
        self._lock = threading.Lock()

    def __call__(self, pci: str, code: int, message: str) -> None:
        with self._lock:
            if not facts_known(self.environment()):
                if len(self.pending) < self.limit:
                    self.pending.append((pci, code, message))
                return
        self._count(pci, code, message)

    def flush(self) -> None:
        """Count what waits, once the GPU facts are known (each once)."""
        with self._lock:
            if not facts_known(self.environment()):
                return
            pending, self.pending = self.pending, []
        for xid in pending:
            self._count(*xid)

    def _count(self, pci: str, code: int, message: str) -> None:
        self.count(gpu_of(pci, self.environment()), code, message, f" ({pci})")


class XidWatch:
    def __init__(self, source: str, on_xid: Callable[[str, int, str], None],
                 on_watched: Callable[[float], None], clock: Callable[[], float] = time.monotonic,
                 command: list[str] | None = None,
                 on_sxid: Callable[[str, int, str], None] | None = None) -> None:
        self.source = source
        self.on_xid = on_xid
        self.on_sxid = on_sxid or (lambda pci, code, message: None)
        self.on_watched = on_watched
        self.clock = clock
        self.command = command or [sys.executable, "-m", "fleetcanary.runner.xid_reader"]
        self.last_seq: int | None = None
        self.starts = 0
        self.xids = 0
        self.lost = 0
        self.unavailable = False
        self.proc: subprocess.Popen | None = None
        self._watching_since: float | None = None
        self._unflushed = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- the reader ------------------------------------------------------------------------------------
    def _spawn(self) -> subprocess.Popen:
        cmd = [*self.command, "--source", self.source]
        if self.last_seq is not None:
            cmd += ["--after-seq", str(self.last_seq)]
        self.starts += 1
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, start_new_session=True)

    def _line(self, line: str) -> None:
        try:
            m = json.loads(line)
        except ValueError:
            return
        if "ready" in m:
            with self._lock:
                self._watching_since = self.clock()
            if self.last_seq is None and m["ready"] is not None:
                self.last_seq = int(m["ready"])
            return
        if "lost" in m:
            self.lost += int(m["lost"])
            return
        if "seq" in m:
            self.last_seq = int(m["seq"])
        if "xid" in m:
            try:
                self.on_xid(str(m.get("pci", "")), int(m["xid"]), str(m.get("message", "")))
            finally:  # counted once handled, so whoever waits for the count sees what the handler did
                self.xids += 1
        elif "sxid" in m:
            self.on_sxid(str(m.get("pci", "")), int(m["sxid"]), str(m.get("message", "")))

    def _stopped_watching(self) -> None:
        with self._lock:
            if self._watching_since is not None:
                self._unflushed += self.clock() - self._watching_since
                self._watching_since = None

    def _run(self) -> None:
        delay = BACKOFF[0]
        while not self._stop.is_set():
            try:
                self.proc = self._spawn()
            except OSError as e:
                log.error("xid watch: cannot start the reader: %s", e)
                self._stop.wait(BACKOFF[1])
                continue
            started = self.clock()
            for line in self.proc.stdout:
                self._line(line)
            rc = self.proc.wait()
            self._stopped_watching()
            if self._stop.is_set():
                return
            err = (self.proc.stderr.read() or "").strip().splitlines()
            if rc == UNAVAILABLE:
                log.info("xid watch: %s; critical XIDs are caught in gpu_health's event waits only",
                         err[-1][:200] if err else f"{self.source} is not available here")
                self.unavailable = True
                return
            log.warning("xid watch: the reader ended (exit %s%s); restarting in %.0f s", rc,
                        f": {err[-1][:200]}" if err else "", delay)
            delay = BACKOFF[0] if self.clock() - started > BACKOFF[1] else min(delay * 2, BACKOFF[1])
            self._stop.wait(delay)

    def _flush_loop(self) -> None:
        while not self._stop.wait(FLUSH_SECONDS):
            self.flush()

    # --- the daemon's side ---------------------------------------------------------------------------------
    def watched_seconds(self) -> float:
        """Seconds watched and not yet handed to on_watched."""
        with self._lock:
            open_ = self.clock() - self._watching_since if self._watching_since is not None else 0.0
            return self._unflushed + open_

    def flush(self) -> None:
        with self._lock:
            now = self.clock()
            secs = self._unflushed
            if self._watching_since is not None:
                secs += now - self._watching_since
                self._watching_since = now
            self._unflushed = 0.0
        if secs > 0:
            self.on_watched(secs)

    def watching(self) -> bool:
        with self._lock:
            return self._watching_since is not None

    def start(self) -> None:
        for target, name in ((self._run, "fleetcanary-xid-watch"), (self._flush_loop, "fleetcanary-xid-flush")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        p = self.proc
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        for t in self._threads:
            t.join(timeout=10)
        self.flush()
