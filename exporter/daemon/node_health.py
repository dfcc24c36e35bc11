"""The node's hard faults as the running daemon sees them: what the newest successful gpu_health run read, and
the XIDs of the continuous watch (daemon/xid_watch.py) and of gpu_health's own event waits, kept in the XID
ledger (daemon/xid_ledger.py), classed and held with hysteresis (daemon/hard_faults.py), and published as
the per-GPU health series, the node's summary and, with the Kubernetes API, one node condition per fault.
The XID counters (fleetcanary_gpu_xid_errors_total, _escalations_total, _watch_seconds_total,
fleetcanary_nvswitch_sxid_errors_total) are gpu_health's, fed here between its runs.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fleetcanary.core.record import RunRecord
from fleetcanary.daemon import hard_faults, xid_watch
from fleetcanary.daemon.xid_ledger import XidLedger
from fleetcanary.probes.lib import xids

log = logging.getLogger("fleetcanary.daemon")


class NodeHealth:
    def __init__(self, settings: Callable[[], Any], store, kube: Callable[[], Any],
                 monotonic: Callable[[], float]) -> None:
        """settings(): the daemon's settings now (a reload changes them); store: daemon/state.py's ResultStore;
        kube(): daemon/kube.py's Kube, or None without the API; monotonic: the clock the holds run on."""
        self._settings = settings
        self.store = store
        self._kube = kube
        s = settings()
        self.xid_ledger = XidLedger(s.xid, monotonic)
        nc = s.kubernetes.node_condition
        self.faults = hard_faults.FaultTracker(nc.clear_after_observations, nc.min_hold_seconds, monotonic)
        self._lock = threading.Lock()
        self._hw_faults: list[hard_faults.Fault] = []   # what the newest successful gpu_health run showed
        self._health_gpus: list[str] = []               # the GPU indices it read

    # --- the XID watch's records --------------------------------------------------------------------------
    def xid(self, gpu: str, code: int, message: str, where: str = "") -> None:
        """One XID into the ledger (daemon/xid_ledger.py), its counter with the catalogue's class and severity,
        an escalation's counter, and the node's faults evaluated again."""
        ev, escalated = self.xid_ledger.record(gpu, code, message)
        self.store.add_counter("gpu_health", "fleetcanary_gpu_xid_errors_total",
                               {"gpu": gpu, "xid": str(code), "class": ev.cls, "severity": ev.severity}, 1)
        info = self.xid_ledger.info(code)
        line = f"XID {code} on GPU {gpu}{where}: {ev.describe(info)} | kernel: {message[:200]}"
        (log.warning if ev.severity in ("critical", "warning") else log.info)("%s", line)
        if escalated:
            self.store.add_counter("gpu_health", "fleetcanary_gpu_xid_escalations_total",
                                   {"gpu": gpu, "xid": str(code)}, 1)
            x = self._settings().xid
            log.warning("XID %d on GPU %s came from %d different processes within %.0f s: the GPU is the common "
                        "factor", code, gpu, x.escalate_processes, x.escalate_window_seconds)
        self.evaluate(clean=False)

    def sxid(self, pci: str, code: int, message: str) -> None:
        sev = xids.sxid_severity(message)
        self.store.add_counter("gpu_health", "fleetcanary_nvswitch_sxid_errors_total",
                               {"switch": xid_watch.pci_key(pci), "sxid": str(code), "severity": sev}, 1)
        (log.warning if sev == "critical" else log.info)("NVSwitch SXid %d on %s: %s", code, pci, message[:200])

    def watched(self, seconds: float) -> None:
        self.store.add_counter("gpu_health", "fleetcanary_gpu_xid_watch_seconds_total", {}, seconds)

    # --- runs ---------------------------------------------------------------------------------------------
    def observe(self, name: str, out: RunRecord) -> None:
        """A published run: a gpu_health run's reads and XIDs, then the node's faults evaluated again (a
        successful gpu_health run counts toward clearing them)."""
        if name == "gpu_health":
            self._observe_gpu_health(out)
        self.evaluate(clean=name == "gpu_health" and out.outcome == "success")

    def _gpu_health_fresh(self) -> bool:
        st = self.store.state.get("gpu_health")
        return hard_faults.recent(st.last_success_ts if st is not None else None,
                                  self.store.intervals.get("gpu_health"), self.store.timeouts.get("gpu_health"),
                                  time.time())

    def _observe_gpu_health(self, out: RunRecord) -> None:
        """A gpu_health run: its faults (a successful one's), and the XIDs of its own NVML event wait."""
        extra = out.result.get("extra") or {}
        for e in extra.get("xid_events") or []:
            if isinstance(e, dict) and "gpu" in e and "xid" in e:
                self.xid_ledger.record(str(e["gpu"]), int(e["xid"]))
        if out.outcome != "success":
            return
        expected = (out.result.get("parameters") or {}).get("expected_gpus")
        with self._lock:
            self._hw_faults = hard_faults.from_gpu_health(extra, expected if isinstance(expected, int) else None)
            self._health_gpus = [str(g.get("index")) for g in extra.get("gpus") or [] if isinstance(g, dict)]

    def evaluate(self, clean: bool) -> None:
        """The node's hard faults now: held with hysteresis, published as health states and, with
        node_condition.per_fault, as node conditions. ``clean``: a gpu_health observation (counts toward
        clearing); an XID between runs only sets."""
        nc = self._settings().kubernetes.node_condition
        measured = self._gpu_health_fresh()
        with self._lock:
            self.faults.clear_after, self.faults.min_hold = nc.clear_after_observations, nc.min_hold_seconds
            xid_faults = hard_faults.from_xids(self.xid_ledger.recent(), self.xid_ledger.info)
            held = self.faults.observe(self._hw_faults + xid_faults, clean_observation=clean)
            gpus = sorted(set(self._health_gpus) | {f.gpu for f in held + xid_faults if f.gpu.isdigit()}, key=int)
            states = hard_faults.gpu_states(gpus, held, [f for f in xid_faults if not f.kind], measured)
            node = hard_faults.node_state(states, held, measured)
        self.store.set_health(states, node)
        kube = self._kube()
        if kube is not None:
            kube.set_faults(hard_faults.conditions(nc.per_fault_prefix, held))
