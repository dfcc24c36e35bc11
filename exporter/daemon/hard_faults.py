"""Hard faults decided at the edge: what gpu_health read and what the XID watch saw, classed into faults
per GPU, held with hysteresis, and said as a health state per GPU, a node summary and (daemon/kube.py)
one node condition per fault class.

A fault class is one node condition (node-problem-detector style: True while the fault is present):

    kind         condition (after the prefix)  present while (the same series and thresholds as the alerts)
    lost         GPULost               fleetcanary_gpu_lost == 1, or fewer GPUs visible than expected
    xid          GPUHardwareXid        a critical XID of class hardware, memory, bus or nvlink, or an escalated
                                       application-class XID, within xid.fault_hold_seconds
    ecc          GPUUncorrectableECC   uncorrected volatile ECC count above 0 (since the last reset)
    remap        GPURowRemapFailure    a row remap failed, or one waits for a reset
    pcie         GPUPCIeDegraded       width below its maximum, or generation below its maximum while not idle
    nvlink       GPUNVLinkDown         NVLink links present but not active
    fabric       GPUFabricNotReady     a GPU with an NVLink fabric (NVSwitch: HGX, NVL72) whose fabric state
                                       is completed with an error status or an unhealthy health mask, that is
                                       in another NVLink domain (cluster UUID, clique) than its node's other
                                       GPUs, or whose state is not completed for FABRIC_PENDING_RUNS
                                       consecutive runs

A fault is set at its first observation (a fabric still registering: at the FABRIC_PENDING_RUNS-th consecutive
one) and clears after ``clear_after`` consecutive observations
without it and at least ``min_hold`` seconds after it was set (FaultTracker, on the clock it is given).
A GPU's state: failed (lost, XID, ECC, a failed remap), degraded (a pending remap, PCIe, NVLink, fabric,
a warning-level XID of a non-application class), unmeasured (gpu_health has no recent successful run),
else healthy; one reason, the first of REASONS that applies.
"""
from __future__ import annotations

from dataclasses import dataclass

from fleetcanary.probes.lib import nvml  # its pure helpers only (fabric_problems, nvlink_domain): NVML is not loaded

KINDS = {   # kind -> (condition type after the prefix, reason while clear)
    "lost": ("GPULost", "NoGPULost"),
    "xid": ("GPUHardwareXid", "NoHardwareXid"),
    "ecc": ("GPUUncorrectableECC", "NoUncorrectableECC"),
    "remap": ("GPURowRemapFailure", "NoRowRemapFailure"),
    "pcie": ("GPUPCIeDegraded", "PCIeLinksAtMaximum"),
    "nvlink": ("GPUNVLinkDown", "NVLinksUp"),
    "fabric": ("GPUFabricNotReady", "FabricReady"),
}
# GPU health reasons, worst first: (reason label, state)
REASONS = (("lost", "failed"), ("hardware_xid", "failed"), ("application_xid_repeated", "failed"),
           ("uncorrectable_ecc", "failed"), ("row_remap_failed", "failed"), ("gpus_missing", "failed"),
           ("nvlink_down", "degraded"), ("fabric_not_ready", "degraded"), ("pcie_degraded", "degraded"),
           ("row_remap_pending", "degraded"), ("xid_warning", "degraded"),
           ("no_recent_run", "unmeasured"), ("", "healthy"))
STATES = ("failed", "degraded", "unmeasured", "healthy")
# A fabric still registering (not_started, in_progress) is normal for a short while after a boot, a driver load or a
# fabric manager restart, and the exporter often starts in that window; it becomes a fault once this many
# consecutive gpu_health runs (60 s apart by default) show it. Completed with an error is set at once.
FABRIC_PENDING_RUNS = 3
# gpu_health's newest success measures the node for this many of its intervals plus its timeout; after that
# every GPU is unmeasured (no_recent_run)
RECENT_INTERVALS = 3
_RANK = {r: i for i, (r, _) in enumerate(REASONS)}
_STATE = dict(REASONS)


@dataclass(frozen=True)
class Fault:
    kind: str          # one of KINDS
    gpu: str           # the GPU index, or "" for the node (GPUs missing)
    reason: str        # the condition's CamelCase reason
    health: str        # the GPU health reason (REASONS)
    evidence: str      # what was read, in words
    confirm: int = 1   # consecutive gpu_health runs that must show it before it is set


def _n(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def who(g: dict) -> str:
    """GPU 3 (GPU-5a7c..., 0000:3a:00.0)."""
    ids = [str(g[k]) for k in ("uuid", "pci_bus_id") if g.get(k) and g.get(k) != "unknown"]
    return f"GPU {g.get('index')}" + (f" ({', '.join(ids)})" if ids else "")


def from_gpu_health(extra: dict, expected: int | None) -> list[Fault]:
    """The faults one gpu_health record shows (its ``extra``: the GPUs as read)."""
    out: list[Fault] = []
    gpus = [g for g in extra.get("gpus") or [] if isinstance(g, dict)]
    for g in gpus:
        gi = str(g.get("index"))
        if g.get("lost"):
            out.append(Fault("lost", gi, "GPUFellOffTheBus", "lost",
                             f"{who(g)} is enumerated but does not answer NVML ({g.get('error') or 'lost'})"))
            continue
        ecc = (g.get("ecc") or {}).get("uncorrected_volatile")
        if (_n(ecc) or 0) > 0:
            out.append(Fault("ecc", gi, "UncorrectableECCErrors", "uncorrectable_ecc",
                             f"{who(g)} counted {int(ecc)} uncorrectable ECC errors since the last reset"))
        rows = g.get("remapped_rows") or {}
        if rows.get("failed") == 1:
            out.append(Fault("remap", gi, "RowRemapFailed", "row_remap_failed",
                             f"{who(g)} failed a row remap ({rows.get('uncorrectable')} rows remapped for "
                             "uncorrectable errors); it needs service"))
        elif rows.get("pending") == 1:
            out.append(Fault("remap", gi, "RowRemapPending", "row_remap_pending",
                             f"{who(g)} has a row remap waiting for a GPU reset"))
        pcie = g.get("pcie") or {}
        w, wmax = _n(pcie.get("width_current")), _n(pcie.get("width_max"))
        gen, genmax = _n(pcie.get("gen_current")), _n(pcie.get("gen_max"))
        idle = isinstance(g.get("throttle_reasons"), list) and "gpu_idle" in g["throttle_reasons"]
        if w is not None and wmax is not None and w < wmax:
            out.append(Fault("pcie", gi, "PCIeWidthDegraded", "pcie_degraded",
                             f"{who(g)} PCIe link at x{w:g} of x{wmax:g}"))
        elif gen is not None and genmax is not None and gen < genmax and not idle:
            out.append(Fault("pcie", gi, "PCIeGenerationDegraded", "pcie_degraded",
                             f"{who(g)} PCIe link at Gen{gen:g} of Gen{genmax:g} while not idle"))
        links = [link for link in g.get("nvlinks") or [] if isinstance(link, dict)]
        down = [str(link.get("link")) for link in links if not link.get("up")]
        if down:
            out.append(Fault("nvlink", gi, "NVLinkDown", "nvlink_down",
                             f"{who(g)} has {len(down)} of {len(links)} NVLinks down (links {', '.join(down[:18])})"))
        fab = g.get("fabric") or {}
        state = fab.get("state")
        problems = nvml.fabric_problems(fab)
        if state == "completed" and problems:
            # an error status, or a health mask with degraded bandwidth, an unhealthy route, no partition or a
            # wrong configuration
            out.append(Fault("fabric", gi, "FabricNotReady", "fabric_not_ready",
                             f"{who(g)} fabric state completed but not healthy: {', '.join(problems)} "
                             f"(clique {fab.get('clique_id', '?')}, cluster {fab.get('cluster_uuid', '?')})"))
        elif state not in (None, "not_supported", "unknown", "completed"):
            # not_started, in_progress: what every such GPU shows for a while after a boot or a driver load
            out.append(Fault("fabric", gi, "FabricNotReady", "fabric_not_ready",
                             f"{who(g)} fabric state {state}, still not completed after {FABRIC_PENDING_RUNS} "
                             "consecutive gpu_health runs", confirm=FABRIC_PENDING_RUNS))
    out += _clique_split(gpus)
    if expected is not None and len(gpus) < expected:
        out.append(Fault("lost", "", "GPUsMissing", "gpus_missing",
                         f"{len(gpus)} of {expected} expected GPUs visible to NVML"))
    return out


def _clique_split(gpus: list[dict]) -> list[Fault]:
    """The GPUs of one node belong to one NVLink domain (an NVL72 tray's 4 GPUs to their rack's partition): a GPU
    registered in another domain than most of its node's (another clique or cluster UUID; ties go to the domain of
    the lowest GPU index) left its clique. Only GPUs whose registration completed count."""
    domains = {str(g.get("index")): nvml.nvlink_domain(g.get("fabric")) for g in gpus if not g.get("lost")
               and (g.get("fabric") or {}).get("state") == "completed"}
    if len(set(domains.values())) < 2:
        return []
    counts: dict[str, int] = {}
    for d in domains.values():
        counts[d] = counts.get(d, 0) + 1
    node_domain = max(counts, key=lambda d: counts[d])   # dict order: the lowest GPU index first among ties
    by_index = {str(g.get("index")): g for g in gpus}
    return [Fault("fabric", gi, "FabricCliqueMismatch", "fabric_not_ready",
                  f"{who(by_index[gi])} is in NVLink domain {d or 'none'} (cluster UUID/clique), not in its node's "
                  f"{node_domain or 'none'}")
            for gi, d in domains.items() if d != node_domain]


def from_xids(recent, info) -> list[Fault]:
    """The faults the XID ledger's recent XIDs make: (event, escalated) pairs; ``info(code)``: its entry."""
    out = []
    for ev, escalated in recent:
        i = info(ev.code)
        if escalated:
            out.append(Fault("xid", ev.gpu, "RepeatedApplicationXid", "application_xid_repeated",
                             f"GPU {ev.gpu}: {ev.describe(i)}, repeated across different processes"))
        elif ev.cls in ("hardware", "memory", "bus", "nvlink") and ev.severity == "critical":
            out.append(Fault("xid", ev.gpu, "HardwareXid", "hardware_xid", f"GPU {ev.gpu}: {ev.describe(i)}"))
        elif ev.severity in ("critical", "warning") and ev.cls != "application":
            out.append(Fault("", ev.gpu, "", "xid_warning", f"GPU {ev.gpu}: {ev.describe(i)}"))
    return out


class FaultTracker:
    """Hysteresis per (kind, GPU): set at once (a fault with ``confirm`` N: once N consecutive clean observations
    showed it), cleared after ``clear_after`` consecutive clean observations
    and ``min_hold`` seconds since it was set."""

    def __init__(self, clear_after: int, min_hold: float, clock) -> None:
        self.clear_after = clear_after
        self.min_hold = min_hold
        self.clock = clock
        self.held: dict[tuple[str, str], dict] = {}   # (kind, gpu) -> {"fault", "since", "clean"}
        self.pending: dict[tuple[str, str], int] = {}  # (kind, gpu) -> consecutive runs seen, of a fault to confirm

    def observe(self, faults: list[Fault], clean_observation: bool = True) -> list[Fault]:
        """One look at the node; ``clean_observation`` False (an XID between runs) may set, never counts
        toward clearing. The faults held now."""
        now = self.clock()
        seen: dict[tuple[str, str], Fault] = {}
        for f in faults:
            if not f.kind:
                continue
            k = (f.kind, f.gpu)
            if k not in seen or _RANK[f.health] < _RANK[seen[k].health]:
                seen[k] = f
        for k, f in seen.items():
            h = self.held.get(k)
            if h is not None:
                h["fault"], h["clean"] = f, 0
                continue
            if f.confirm > 1:   # only a gpu_health run counts; an XID between runs shows its last faults again
                n = self.pending.get(k, 0) + (1 if clean_observation else 0)
                self.pending[k] = n
                if n < f.confirm:
                    continue
            self.pending.pop(k, None)
            self.held[k] = {"fault": f, "since": now, "clean": 0}
        if clean_observation:
            for k in [k for k in self.pending if k not in seen or seen[k].confirm <= 1]:
                del self.pending[k]
            for k in [k for k in self.held if k not in seen]:
                h = self.held[k]
                h["clean"] += 1
                if h["clean"] >= self.clear_after and now - h["since"] >= self.min_hold:
                    del self.held[k]
        return self.faults()

    def faults(self) -> list[Fault]:
        return [h["fault"] for _, h in sorted(self.held.items())]


def recent(last_success: float | None, interval: float | None, timeout: float | None, now: float) -> bool:
    """gpu_health measured the node recently: a success within RECENT_INTERVALS of its interval plus its timeout
    (``measured`` below). Never without a success or a known interval."""
    if last_success is None or not interval:
        return False
    return now - last_success <= RECENT_INTERVALS * interval + (timeout or 0.0)


def gpu_states(gpus: list[str], held: list[Fault], warnings: list[Fault], measured: bool) -> dict[str, tuple]:
    """GPU index -> (state, reason): the worst reason that applies to it."""
    out = {}
    for gi in gpus:
        reasons = [f.health for f in held + warnings if f.gpu == gi]
        if not measured:
            reasons.append("no_recent_run")
        best = min(reasons, key=_RANK.__getitem__, default="")
        out[gi] = (_STATE[best], best)
    return out


def node_state(states: dict[str, tuple], held: list[Fault], measured: bool) -> tuple[str, str]:
    """The node's summary: its worst GPU's state and reason, GPUs missing counted as failed."""
    reasons = [r for _, r in states.values()] + [f.health for f in held if f.gpu == ""]
    if not measured:
        reasons.append("no_recent_run")
    best = min(reasons, key=_RANK.__getitem__, default="no_recent_run")
    return _STATE[best], best


def conditions(prefix: str, held: list[Fault]) -> dict[str, tuple[str, str, str]]:
    """Condition type -> (status, reason, message), one per kind: True with the evidence while held."""
    out = {}
    for kind, (ctype, clear_reason) in KINDS.items():
        mine = [f for f in held if f.kind == kind]
        if mine:
            reasons = sorted({f.reason for f in mine})
            msg = "; ".join(f.evidence for f in mine)
            out[prefix + ctype] = ("True", reasons[0] if len(reasons) == 1 else "MultipleFaults", msg[:1024])
        else:
            out[prefix + ctype] = ("False", clear_reason, "fleetcanary sees no such fault")
    return out
