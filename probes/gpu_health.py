"""GPU health from non-invasive NVML reads: PCIe link, throttling, ECC, row remapping,
NVLink, NVLink fabric state, critical XIDs, GPUs visible against expected, persistence and MIG mode.

It creates no CUDA context and runs beside jobs, so it is not gated and runs often.
XID events are caught by an event wait with a timeout inside the worker: the probe
watches for ``xid_wait_seconds`` of every run, and the watched time is published, so
the coverage of the XID counter is known (between runs, the kernel log and DCGM
remain the complete source). While the daemon's continuous XID watch runs (its
context says so), the probe does not wait: the watch counts every XID once.

Current PCIe generation drops at idle on most GPUs (link power management), so the
generation is a fact to compare under load; the width does not drop at idle and a
narrower width than the maximum is a real downtrain.

What an 8-GPU node publishes is kept to what the alerts read (docs/metrics.md, "Series per
node"); the run record (/results) keeps every reading:
- NVLink: per GPU, the links present and the links active (the NVLink-down alert fires when
  fewer are active, and says how many of how many); the error counters summed over each GPU's
  links (4 series per GPU, not 4 x 18: an HGX node's 576 per-link series are read by no rule).
  ``per_link`` publishes the state and the error counters per link as well.
- Throttle reasons: only those active now (value 1); a reason that is not active has no series.
- ECC: the uncorrected volatile count always (the alert reads its increase() from 0); the other
  type and counter combinations, the remapped-row counts and the NVLink error sums while above 0.
- Faults as 0/1 (a GPU lost, a row remap pending or failed): only the 1s; the alerts read == 1.
- Persistence mode, MIG mode and the power limit change rarely: labels of fleetcanary_gpu_info.
- NVLink fabric (NVSwitch systems: state, status, clique, cluster UUID, the health mask): the run record has it
  all (None for a GPU without one); fleetcanary_gpu_info carries its state and NVLink domain (cluster UUID and
  clique) as labels, which the rules read and group by, so it costs no series of its own. The daemon makes a
  not-ready fabric the node condition FleetCanaryGPUFabricNotReady and the reason fabric_not_ready of
  fleetcanary_gpu_health_state.
- NVLink links that cannot be read are down, not absent (nvml.nvlinks, mark_absent_links).
- On a node with an NVLink fabric, fabric manager and IMEX daemon state (probes/lib/fabric_services.py: what a pod
  can read) as one info series; the IMEX node count in the record.
"""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from fleetcanary.probes.base import MetricSpec, Probe, ProbeConfig, ProbeContext, ProbeResult, Sample
from fleetcanary.probes.lib import fabric_services, nvml, xids
from fleetcanary.probes.lib.gpu_gate import open_session

P = "fleetcanary_gpu_"


class Config(ProbeConfig):
    xid_wait_seconds: float = Field(2.0, ge=0, le=30, description="Seconds each run waits for critical XID events.")
    expected_gpus: int | None = Field(
        None, ge=0, description="GPUs this node should have. None: gpu.expected_count, then the node label.")
    host_proc_path: str = Field(
        "/proc", description="The host's /proc, to tell whether nvidia-fabricmanager and nvidia-imex run (only on "
        "nodes whose GPUs have an NVLink fabric): the pod's own /proc with hostPID, else the host's mounted here "
        "read-only. A /proc whose PID 1 is not systemd or init is a container's: the services read unknown.")
    imex_nodes_config: str = Field(
        "/etc/nvidia-imex/nodes_config.cfg", description="The IMEX node list (the IMEX domain), recorded where "
        "readable (the host's /etc/nvidia-imex mounted).")
    per_link: bool = Field(
        False, description="Opt-in: NVLink state and error counters per link (fleetcanary_gpu_nvlink_up, and "
        "fleetcanary_gpu_nvlink_errors_total with its link label: 18 links x 5 series per H100/H200, 720 series on "
        "an 8-GPU node). Off: the links active and present per GPU, and one error series per GPU and counter, "
        "summed over its links, with the link label empty (Prometheus drops it).")


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _nvlink_errors(gi: str, links: list[dict], per_link: bool) -> list[tuple[dict, float]]:
    """(labels, value) of the NVLink error counters: per link, or each counter summed over the GPU's links.
    A sum needs the counter of every link: one that missed a read would make the total drop, which
    increase() takes for a counter reset (and counts the whole total again)."""
    if per_link:
        return [({"gpu": gi, "link": str(link["link"]), "counter": c}, float(v))
                for link in links for c, v in link["errors"].items() if _num(v) is not None]
    out = []
    for c in dict.fromkeys(c for link in links for c in link["errors"]):
        values = [_num(link["errors"].get(c)) for link in links]
        if values and None not in values:
            out.append(({"gpu": gi, "link": "", "counter": c}, sum(values)))
    return out


def fabric_state(fabric: dict | None) -> str:
    """fleetcanary_gpu_info's fabric_state: "" without a fabric; not_started, in_progress, unknown (the read
    failed); completed, or unhealthy where it completed with an error status or an unhealthy health mask."""
    if not fabric or fabric.get("state") in (None, "not_supported"):
        return ""
    if fabric.get("state") == "completed" and nvml.fabric_problems(fabric):
        return "unhealthy"
    return str(fabric.get("state"))


def mark_absent_links(gpus: list[dict]) -> None:
    """A GPU whose every link index answered "not supported" has no links in its record. Where it should have
    links (another GPU of its model on this node has some, or it has an NVLink fabric: NVSwitch and NVL72 GPUs
    have NVLinks), its links are written in as down: as many as its model's other GPUs have, else
    nvml.NVLINK_MAX_LINKS. A GPU whose links all went inactive shows that way (nvidia-smi: "Unable to retrieve
    NVLink information as all links are inActive"); without this it had no NVLink series at all."""
    counts: dict[str, int] = {}
    for g in gpus:
        if not g.get("lost") and g.get("nvlinks"):
            counts[g.get("model", "")] = max(counts.get(g.get("model", ""), 0), len(g["nvlinks"]))
    for g in gpus:
        if g.get("lost") or g.get("nvlinks"):
            continue
        fab = g.get("fabric")
        has_fabric = bool(fab) and fab.get("state") not in (None, "not_supported")
        n = counts.get(g.get("model", "")) or (nvml.NVLINK_MAX_LINKS if has_fabric else 0)
        g["nvlinks"] = [{"link": i, "up": 0, "errors": {}, "remote_pci_bus_id": nvml.UNKNOWN,
                         "error": "no link answered NVML (all links inactive or unreadable)"} for i in range(n)]


class GpuHealth(Probe):
    name = "gpu_health"
    Config = Config
    failure_reasons = ("nvml_error",)
    default_interval_seconds = 60.0
    default_timeout_seconds = 30.0
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(P + "info", "gauge", "GPU identity and its rarely changed settings from NVML: persistence mode "
                   "and MIG mode (enabled, disabled; unknown, or unsupported for MIG, where NVML gives none), the "
                   "enforced power limit in watts, and on GPUs with an NVLink fabric (NVSwitch: HGX, GB200 NVL72) its "
                   "fabric_state (not_started, in_progress, completed; unhealthy: completed with an error status or "
                   "an unhealthy health mask; unknown: the read failed) and nvlink_domain (<cluster UUID>/<clique "
                   "id>: the GPUs of one multi-node NVLink partition share it); both empty without a fabric. "
                   "Value 1.", "info",
                   ("gpu", "uuid", "model", "pci_bus_id", "serial", "vbios", "persistence_mode", "mig_mode",
                    "power_limit_watts", "fabric_state", "nvlink_domain")),
        MetricSpec("fleetcanary_gpus_visible", "gauge", "GPUs NVML enumerates on this node, lost ones included.",
                   "count"),
        MetricSpec("fleetcanary_gpus_healthy", "gauge", "GPUs NVML can query (not lost).", "count"),
        MetricSpec("fleetcanary_gpus_expected", "gauge",
                   "GPUs this node should have, from config or the node label; absent when unknown.", "count"),
        MetricSpec(P + "lost", "gauge", "1 if NVML enumerates the GPU but cannot query it (fell off the bus); a GPU "
                   "that answers has no series (fleetcanary_gpu_info has it).", "boolean", ("gpu",)),
        MetricSpec(P + "pcie_link_generation", "gauge", "Current PCIe link generation (drops at idle on most GPUs).",
                   "count", ("gpu",)),
        MetricSpec(P + "pcie_link_generation_max", "gauge", "Maximum PCIe link generation of the GPU and its slot.",
                   "count", ("gpu",)),
        MetricSpec(P + "pcie_link_width", "gauge", "Current PCIe link width (lanes).", "count", ("gpu",)),
        MetricSpec(P + "pcie_link_width_max", "gauge", "Maximum PCIe link width (lanes).", "count", ("gpu",)),
        MetricSpec(P + "clock_throttle_active", "gauge",
                   "1 for each clock throttle (clocks event) reason active now; a reason that is not active has no "
                   "series.", "boolean", ("gpu", "reason")),
        MetricSpec(P + "ecc_errors_total", "counter",
                   "ECC errors as counted by the device; counter volatile (since driver load) or aggregate (lifetime). "
                   "Uncorrected volatile from 0; the others while above 0.",
                   "total", ("gpu", "type", "counter"), cumulative=True,
                   zero_published=((("type", "uncorrected"), ("counter", "volatile")),)),
        MetricSpec(P + "remapped_rows_total", "counter", "Rows remapped by the device, by cause; while above 0.",
                   "total", ("gpu", "cause"), cumulative=True, zero_published=()),
        MetricSpec(P + "remapped_rows_pending", "gauge", "1 if a row remapping awaits a GPU reset; no series "
                   "while none does.", "boolean", ("gpu",)),
        MetricSpec(P + "remapped_rows_failed", "gauge", "1 if a row remapping failed, the GPU needs service; no "
                   "series while none has.", "boolean", ("gpu",)),
        MetricSpec(P + "nvlink_links_up", "gauge", "NVLink links of the GPU that are active.", "count", ("gpu",)),
        MetricSpec(P + "nvlink_links_down", "gauge", "NVLink links the GPU has that are not active; no series "
                   "while every link is active (series budget).", "count", ("gpu",)),
        MetricSpec(P + "nvlink_up", "gauge", "1 if the NVLink link is active; with per_link only.", "boolean",
                   ("gpu", "link")),
        MetricSpec(P + "nvlink_errors_total", "counter",
                   "NVLink error counters as counted by the device: by default summed over the GPU's links (link "
                   "empty; a GPU's sum is left out of a run that could not read the counter on every link), per "
                   "link with per_link; each while above 0.", "total", ("gpu", "link", "counter"), cumulative=True,
                   zero_published=()),
        MetricSpec(P + "xid_errors_total", "counter",
                   "XID events caught by the exporter's continuous XID watch or gpu_health's event waits, with the "
                   "code's class (hardware, memory, bus, nvlink, driver, thermal, application, unknown) and severity "
                   "(critical, warning, info, ignore) from the XID catalogue (docs/xid-catalogue.md) and the "
                   "site's xid.overrides; a series appears once its XID happened.",
                   "total", ("gpu", "xid", "class", "severity")),
        MetricSpec(P + "xid_escalations_total", "counter",
                   "Application-class XIDs escalated: the same code on one GPU from escalate_processes different "
                   "processes (pid, or process name where the line has no pid) within escalate_window_seconds; "
                   "the GPU, not the job, is then the common factor. Kernel-log watch only (NVML's events carry "
                   "no process); a series appears once it happened.", "total", ("gpu", "xid")),
        MetricSpec("fleetcanary_nvswitch_sxid_errors_total", "counter",
                   "NVSwitch SXid records in the kernel log, by switch (its PCI bus id), code and severity (critical: "
                   "the line says Fatal; warning: Non-fatal); a series appears once it happened.", "total",
                   ("switch", "sxid", "severity")),
        MetricSpec("fleetcanary_nvlink_fabric_services_info", "gauge",
                   "The host services an NVLink fabric needs, on nodes whose GPUs have one: nvidia-fabricmanager "
                   "(HGX/DGX NVSwitch systems; GB200 NVL72 trays do not run it) and the IMEX daemon (multi-node NVLink "
                   "memory sharing), each running, not_running or unknown (the host's processes are not visible: "
                   "hostPID or host_proc_path); value 1. One series; none without a fabric.", "info",
                   ("fabricmanager", "imex")),
        MetricSpec(P + "xid_watch_seconds_total", "counter", "Seconds spent waiting for XID events: the XID coverage.",
                   "seconds"),
    )

    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        import time

        samples: list[Sample] = []
        # The daemon's continuous XID watch sees every XID; an event wait of its own would count each one twice.
        xid_wait = 0.0 if (ctx.gpu or {}).get("xid_watch_running") else config.xid_wait_seconds

        def add(m: str, labels: dict, v: float) -> None:
            samples.append(Sample(m, labels, float(v)))

        session = open_session()
        with session:
            try:
                handles = session.handles()
            except session.lib.NVMLError as exc:
                from fleetcanary.probes.base import ProbeError

                raise ProbeError("nvml_error", f"cannot enumerate GPUs: {exc}") from None
            gpus = []
            for g in handles:
                gi = str(g.index)
                if g.lost:
                    add(P + "lost", {"gpu": gi}, 1)
                    gpus.append({"index": g.index, "lost": True, "error": g.error})
                    continue
                ident = session.identity(g)
                pm, mig, power = session.persistence_mode(g), session.mig_mode(g), session.power_limit_watts(g)
                pcie = session.pcie(g)
                for key, metric in (("gen_current", "pcie_link_generation"), ("gen_max", "pcie_link_generation_max"),
                                    ("width_current", "pcie_link_width"), ("width_max", "pcie_link_width_max")):
                    if _num(pcie[key]) is not None:
                        add(P + metric, {"gpu": gi}, pcie[key])
                reasons = session.throttle_reasons(g)
                if isinstance(reasons, list):
                    for r in nvml.THROTTLE_REASONS.values():
                        if r in reasons:
                            add(P + "clock_throttle_active", {"gpu": gi, "reason": r}, 1)
                ecc = session.ecc_errors(g)
                for key, v in ecc.items():
                    if _num(v) is not None:
                        etype, counter = key.split("_")
                        add(P + "ecc_errors_total", {"gpu": gi, "type": etype, "counter": counter}, v)
                rows = session.remapped_rows(g)
                if _num(rows["pending"]) is not None:
                    add(P + "remapped_rows_total", {"gpu": gi, "cause": "correctable"}, rows["correctable"])
                    add(P + "remapped_rows_total", {"gpu": gi, "cause": "uncorrectable"}, rows["uncorrectable"])
                    for key in ("pending", "failed"):  # the alerts read == 1; 0 is no series
                        if rows[key]:
                            add(P + f"remapped_rows_{key}", {"gpu": gi}, 1)
                gpus.append({**ident, "pcie": pcie, "throttle_reasons": reasons, "ecc": ecc, "remapped_rows": rows,
                             "nvlinks": session.nvlinks(g), "fabric": session.fabric(g), "persistence_mode": pm,
                             "mig_mode": mig, "power_limit_watts": power})
            mark_absent_links(gpus)
            services = None
            if any(fabric_state(g.get("fabric")) for g in gpus if not g.get("lost")):
                services = fabric_services.service_states(config.host_proc_path)
                add("fleetcanary_nvlink_fabric_services_info", services, 1)
                services = {**services, "imex_nodes": fabric_services.imex_nodes(config.imex_nodes_config)}
            for rec in gpus:
                if rec.get("lost"):
                    continue
                gi, power, fab = str(rec["index"]), rec["power_limit_watts"], rec["fabric"]
                add(P + "info", {"gpu": gi, "uuid": rec["uuid"], "model": rec["model"],
                                 "pci_bus_id": rec["pci_bus_id"], "serial": rec["serial"], "vbios": rec["vbios"],
                                 "persistence_mode": rec["persistence_mode"], "mig_mode": rec["mig_mode"],
                                 "power_limit_watts": f"{power:g}" if _num(power) is not None else nvml.UNKNOWN,
                                 "fabric_state": fabric_state(fab), "nvlink_domain": nvml.nvlink_domain(fab)}, 1)
                links = rec["nvlinks"]
                if links:  # a GPU without NVLink (PCIe cards, a VM) has no series
                    up = sum(1 for link in links if link["up"])
                    add(P + "nvlink_links_up", {"gpu": gi}, up)
                    if up < len(links):  # the alert reads > 0; 0 is no series
                        add(P + "nvlink_links_down", {"gpu": gi}, len(links) - up)
                if config.per_link:
                    for link in links:
                        add(P + "nvlink_up", {"gpu": gi, "link": str(link["link"])}, link["up"])
                for labels, v in _nvlink_errors(gi, links, config.per_link):
                    add(P + "nvlink_errors_total", labels, v)

            healthy = [g for g in handles if not g.lost]
            t0 = time.monotonic()
            wait_ms = int(min(xid_wait, max(ctx.deadline_monotonic - time.monotonic() - 2.0, 0)) * 1000)
            events = session.wait_xid_events(healthy, wait_ms) if wait_ms > 0 and healthy else []
            watched = time.monotonic() - t0 if wait_ms > 0 and healthy else 0.0
            overrides = (ctx.gpu or {}).get("xid_overrides") or {}
            critical = []
            for e in events:
                info = xids.lookup(e["xid"], overrides)
                e.update({"class": info.cls, "severity": info.severity})
                if info.severity == "critical":
                    critical.append(e)
                add(P + "xid_errors_total", {"gpu": str(e["gpu"]), "xid": str(e["xid"]), "class": info.cls,
                                             "severity": info.severity}, 1)
            add(P + "xid_watch_seconds_total", {}, watched)

        add("fleetcanary_gpus_visible", {}, len(handles))
        add("fleetcanary_gpus_healthy", {}, len(healthy))
        expected = config.expected_gpus
        if expected is None:
            expected = (ctx.gpu or {}).get("expected_count")
        if expected is None:
            expected = (ctx.kube or {}).get("expected_gpus")
        if expected is not None:
            add("fleetcanary_gpus_expected", {}, expected)
        return ProbeResult(samples=samples, touched={"gpus": [g.index for g in handles], "invasive": False},
                           parameters={"xid_wait_seconds": xid_wait, "expected_gpus": expected,
                                       "per_link": config.per_link},
                           extra={"gpus": gpus, "fabric_services": services, "xid_events": events,
                                  "critical_xid_events": critical, "xid_watch_seconds": watched})
