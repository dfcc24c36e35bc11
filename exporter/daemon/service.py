"""The daemon: schedules probes in isolated workers, stores results, serves HTTP.

The main thread only waits for signals (SIGTERM/SIGINT stop, SIGHUP reloads); the
scheduler's threads each run one probe worker at a time; the HTTP server has its
own threads. This process never imports torch and never calls NVML.
"""
from __future__ import annotations

import errno
import json
import logging
import math
import os
import signal
import threading
import time

from fleetcanary.core import config as configmod
from fleetcanary.core import environment, kube_platform, statefile
from fleetcanary.core.record import RunRecord
from fleetcanary.daemon import claim as claimmod
from fleetcanary.daemon import dra, hard_faults, phase, pod_resources, webconfig, xid_watch
from fleetcanary.daemon import kube as kubemod
from fleetcanary.daemon import requests as requestsmod
from fleetcanary.daemon.confirm import Confirmer
from fleetcanary.daemon.http import MetricsServer
from fleetcanary.daemon.scheduler import Clock, GpuBudget, Scheduler, budget_window
from fleetcanary.daemon.state import ResultStore
from fleetcanary.daemon.xid_ledger import XidLedger
from fleetcanary.judge import figures as figmod
from fleetcanary.judge.store import FigureStore
from fleetcanary.probes import PROBES
from fleetcanary.probes.base import Probe
from fleetcanary.probes.lib import xids
from fleetcanary.runner import job as jobmod
from fleetcanary.runner.history import History, HistoryError
from fleetcanary.runner.isolation import (
    become_subreaper,
    kill_all_workers,
    reap_orphans,
    run_isolated,
    track_workers,
)

BUDGET_FILE = "gpu-budget.json"  # the GPU-time charges of the last day, kept across restarts
COVERAGE_FILE = "coverage.json"   # when each GPU was last measured by each invasive probe
OPPORTUNISTIC_DELAY_SECONDS = 2.0   # after a GPU is freed: its tenant's processes have exited by then

NVIDIA_DRIVER = "/proc/driver/nvidia/version"  # present while NVIDIA's kernel driver is loaded
PENDING_XIDS = 256  # XIDs read before the GPU facts are known, kept until they are (the rest are dropped)
log = logging.getLogger("fleetcanary.daemon")


class Daemon:
    def __init__(self, settings, config_path: str | None = None,
                 probe_map: dict[str, type[Probe]] | None = None, reap_everything: bool = False,
                 clock: Clock | None = None) -> None:
        """reap_everything: this process starts no children but workers (true for `run`).
        clock: where the schedule's and the GPU budget's time comes from (tests pass a fake one)."""
        # First: a bad web config is the one line the operator sees, before any state is read or logged.
        web = webconfig.load(settings.server.web_config_file)  # WebConfigError: the caller reports it
        # Then the state directory: one another user could plant files in is refused (StateDirError: the
        # caller prints its one line and exits non-zero), before any file of it is read.
        statefile.check_dir(settings.state_dir)
        self.dir_lock = statefile.DirLock(settings.state_dir)
        self.reap_everything = reap_everything
        self._settings_lock = threading.Lock()
        self.settings = settings
        self.config_path = config_path
        self.probe_map = dict(probe_map or PROBES)
        self.clock = clock or Clock()
        self.budget = GpuBudget(settings.gpu.budget_ratio, monotonic=self.clock.monotonic)
        self._restore_budget()
        self.store = ResultStore(self.probe_map, self._enabled(settings), judge=FigureStore(settings.state_dir,
                                                                                       clock=self.clock,
                                                                                       figures=figmod.configured(
                                                                                           settings.alerts)))
        self.store.set_enabled(self._enabled(settings), self._intervals(settings), self._timeouts(settings))
        # This process never loads NVML: until a worker reports the GPU facts, the node's driver and
        # model are the ones its last runs had (the figure store keeps them), never "unknown" (an
        # exporter restart must not look like a driver change to the fleet's rules).
        self.store.set_environment({**environment.collect(with_gpu=False), **self.store.judge.facts})
        self._restore_coverage()
        self.kube = self._kube(settings)
        self.claimer = self._claimer(settings)
        self.pod_resources = self._pod_resources(settings)
        self._xid_lock = threading.Lock()
        self._pending_xids: list[tuple[str, int, str]] = []
        self.xid_ledger = XidLedger(settings.xid, self.clock.monotonic)
        nc = settings.kubernetes.node_condition
        self.faults = hard_faults.FaultTracker(nc.clear_after_observations, nc.min_hold_seconds, self.clock.monotonic)
        self._faults_lock = threading.Lock()
        self._hw_faults: list[hard_faults.Fault] = []   # what the newest successful gpu_health run showed
        self._health_gpus: list[str] = []               # the GPU indices it read
        self.xid_watch = self._xid_watch(settings)
        if self.kube is not None:
            self._kube_changed()
        else:
            self.store.set_node_extra_labels(self._extra_node_labels(settings))
        self.history = self._history(settings)
        self.confirmer = Confirmer()
        self.requests = requestsmod.Requests(self.clock.monotonic)
        self.scheduler = Scheduler(self.run_probe, workers=max(4, len(self.probe_map) + 2), clock=self.clock)
        self.scheduler.on_clock_jump = lambda step: self.store.count_clock_jump()
        host, port = configmod.parse_listen_address(settings.server.listen_address)
        self.server = MetricsServer(self.store, host, port, health=self.healthy, ready=self.ready,
                                    request_timeout=settings.server.request_timeout_seconds, web=web,
                                    confirm=self)
        self._stopping = threading.Event()

    # --- settings -------------------------------------------------------------
    @staticmethod
    def _enabled(settings) -> list[str]:
        return [n for n, e in settings.probe_entries().items() if e.enabled]

    @staticmethod
    def _intervals(settings) -> dict[str, float]:
        return {n: e.interval_seconds for n, e in settings.probe_entries().items()}

    @staticmethod
    def _timeouts(settings) -> dict[str, float]:
        return {n: e.timeout_seconds for n, e in settings.probe_entries().items()}

    def _extra_node_labels(self, settings) -> dict[str, str]:
        kube = self.kube.snapshot().labels if self.kube else {}
        return {"pool": settings.pool or kube.get("pool", ""), "node_name": settings.node_name,
                "gpu_product": kube.get("gpu_product", ""), "instance_type": kube.get("instance_type", ""),
                "zone": kube.get("zone", "")}

    def _kube(self, settings):
        """The Kubernetes integration, when wanted and possible; never fatal."""
        if not kubemod.wanted(settings.kubernetes):
            return None
        if not settings.node_name:
            log.error("kubernetes: node_name is empty (set NODE_NAME from the downward API); running without the API")
            return None
        try:
            kube = kubemod.Kube.in_cluster(settings.kubernetes, settings.node_name, on_change=self._kube_changed)
        except Exception as exc:  # noqa: BLE001 - no in-cluster config: run without the API
            log.error("kubernetes: cannot load the in-cluster config: %s; running without the API",
                      str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return None
        return kube

    def _claimer(self, settings):
        """Scheduled runs through Kubernetes (daemon/claim.py): with the API and kubernetes.claim on."""
        c = settings.kubernetes.claim
        if not c.enabled or self.kube is None:
            if c.enabled:
                log.error("kubernetes.claim: no Kubernetes API here; no claims are made")
            return None
        namespace = c.namespace or os.environ.get("POD_NAMESPACE", "")
        if not namespace or not c.image:
            log.error("kubernetes.claim: %s unset; no claims are made",
                      "the namespace (POD_NAMESPACE)" if not namespace else "the image")
            return None
        name, uid = os.environ.get("POD_NAME", ""), os.environ.get("POD_UID", "")
        owner = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid} if name and uid else None
        return claimmod.Claimer(self, self.kube.api, namespace, owner)

    def _xid_watch(self, settings):
        g = settings.gpu
        if g.xid_watch == "off":
            return None
        source = g.xid_log
        if source != "nvml" and g.xid_watch == "auto" and not os.path.exists(NVIDIA_DRIVER):
            # no NVIDIA driver loaded: the kernel log has no Xid to read; NVML's side says so and stops
            source = "nvml"
        elif source != "nvml" and not os.access(source, os.R_OK):
            (log.error if g.xid_watch == "on" else log.info)(
                "xid watch: %s is not readable here; watching NVML's XID events instead", source)
            source = "nvml"
        return xid_watch.XidWatch(source, self._xid, self._xid_watched, on_sxid=self._sxid)

    def _xid(self, pci: str, code: int, message: str) -> None:
        """An Xid from the watch: its GPU by PCI bus ID (the GPU facts the workers reported). One read before
        any worker has reported them (the reader starts with the daemon, and replays what the kernel log
        holds) waits for them, so that its GPU label is an index like every other GPU series'."""
        with self._xid_lock:
            if not self._gpu_facts_known():
                if len(self._pending_xids) < PENDING_XIDS:
                    self._pending_xids.append((pci, code, message))
                return
        self._count_xid(pci, code, message)

    def _gpu_facts_known(self) -> bool:
        env = self.store.node_environment
        return bool(env.get("gpus")) or env.get("gpu_count", environment.UNKNOWN) != environment.UNKNOWN

    def _flush_pending_xids(self) -> None:
        with self._xid_lock:
            if not self._gpu_facts_known():
                return
            pending, self._pending_xids = self._pending_xids, []
        for xid in pending:
            self._count_xid(*xid)

    def _count_xid(self, pci: str, code: int, message: str) -> None:
        gpus = self.store.node_environment.get("gpus") or []
        index = next((str(g.get("index")) for g in gpus if isinstance(g, dict) and g.get("pci_bus_id")
                      and xid_watch.pci_key(str(g["pci_bus_id"])) == xid_watch.pci_key(pci)), None)
        gpu = index if index is not None else f"pci:{pci}"
        self._classify_xid(gpu, code, message, f" ({pci})")

    def _classify_xid(self, gpu: str, code: int, message: str, where: str = "") -> None:
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
            log.warning("XID %d on GPU %s came from %d different processes within %.0f s: the GPU is the common "
                        "factor", code, gpu, self.settings.xid.escalate_processes,
                        self.settings.xid.escalate_window_seconds)
        self._evaluate_faults(clean=False)

    def _sxid(self, pci: str, code: int, message: str) -> None:
        sev = xids.sxid_severity(message)
        self.store.add_counter("gpu_health", "fleetcanary_nvswitch_sxid_errors_total",
                               {"switch": xid_watch.pci_key(pci), "sxid": str(code), "severity": sev}, 1)
        (log.warning if sev == "critical" else log.info)("NVSwitch SXid %d on %s: %s", code, pci, message[:200])

    # --- hard faults at the edge (daemon/hard_faults.py) ---------------------------------------------------------
    def _gpu_health_fresh(self) -> bool:
        st = self.store.state.get("gpu_health")
        interval = self.store.intervals.get("gpu_health")
        if st is None or st.last_success_ts is None or not interval:
            return False
        return time.time() - st.last_success_ts <= 3 * interval + self.store.timeouts.get("gpu_health", 0.0)

    def _observe_gpu_health(self, out: RunRecord) -> None:
        """A gpu_health run: its faults (a successful one's), and the XIDs of its own NVML event wait."""
        extra = out.result.get("extra") or {}
        for e in extra.get("xid_events") or []:
            if isinstance(e, dict) and "gpu" in e and "xid" in e:
                self.xid_ledger.record(str(e["gpu"]), int(e["xid"]))
        if out.outcome != "success":
            return
        expected = (out.result.get("parameters") or {}).get("expected_gpus")
        with self._faults_lock:
            self._hw_faults = hard_faults.from_gpu_health(extra, expected if isinstance(expected, int) else None)
            self._health_gpus = [str(g.get("index")) for g in extra.get("gpus") or [] if isinstance(g, dict)]

    def _evaluate_faults(self, clean: bool) -> None:
        """The node's hard faults now: held with hysteresis, published as health states and, with
        node_condition.per_fault, as node conditions. ``clean``: a gpu_health observation (counts toward
        clearing); an XID between runs only sets."""
        with self._settings_lock:
            nc = self.settings.kubernetes.node_condition
        measured = self._gpu_health_fresh()
        with self._faults_lock:
            self.faults.clear_after, self.faults.min_hold = nc.clear_after_observations, nc.min_hold_seconds
            xid_faults = hard_faults.from_xids(self.xid_ledger.recent(), self.xid_ledger.info)
            held = self.faults.observe(self._hw_faults + xid_faults, clean_observation=clean)
            gpus = sorted(set(self._health_gpus) | {f.gpu for f in held + xid_faults if f.gpu.isdigit()}, key=int)
            states = hard_faults.gpu_states(gpus, held, [f for f in xid_faults if not f.kind], measured)
            node = hard_faults.node_state(states, held, measured)
        self.store.set_health(states, node)
        if self.kube is not None:
            self.kube.set_faults(hard_faults.conditions(nc.per_fault_prefix, held))

    def _xid_watched(self, seconds: float) -> None:
        self.store.add_counter("gpu_health", "fleetcanary_gpu_xid_watch_seconds_total", {}, seconds)

    def _pod_resources(self, settings):
        """The kubelet's per-GPU allocation, where the socket is configured and Kubernetes is not off."""
        k = settings.kubernetes
        if k.mode == "off" or not k.pod_resources_socket or k.gpu_allocation_policy == "ignore":
            return None
        client = pod_resources.Client(k.pod_resources_socket, timeout_seconds=min(k.api_timeout_seconds, 5.0),
                                      resource_names=k.gpu_resource_names, dra_drivers=k.dra_gpu_drivers)
        return pod_resources.Watcher(client, k.pod_resources_refresh_seconds, on_change=self._gpus_changed,
                                     slices=self._resource_slices)

    def _resource_slices(self):
        """This node's DRA ResourceSlices as the API thread last read them (None without the API)."""
        kube = getattr(self, "kube", None)
        return kube.slices() if kube is not None else None

    def _gpus_changed(self, before, after) -> None:
        """The watcher's thread: a pod let go of GPUs, so the gaps between tenants' jobs get used."""
        if before is None:
            return
        freed = sorted(set(before.devices) - set(after.devices))
        freed_dra = [d for d in before.dra if d not in after.dra]
        if freed_dra:  # DRA devices the slices place: their GPUs' UUIDs
            freed += sorted(dra.resolve(freed_dra, self._resource_slices()).gpu_uuids)
            freed += [d.key for d in freed_dra]
        if freed:
            due = self.run_opportunistic(self._gpu_indices(freed))
            log.info("GPU devices freed (%s); due now: %s", ", ".join(freed), ", ".join(due) or "none")

    def _gpu_indices(self, devices: list[str]) -> set[str]:
        """The GPU indices of device-plugin IDs (GPU UUIDs, time-slicing replicas GPU-...::N), from the GPU facts
        the workers reported; IDs it cannot place (MIG devices) are left out."""
        by_uuid = {str(g.get("uuid")): str(g["index"]) for g in self.store.node_environment.get("gpus") or []
                   if isinstance(g, dict) and "index" in g and g.get("uuid")}
        return {by_uuid[d.split("::", 1)[0]] for d in devices if d.split("::", 1)[0] in by_uuid}

    def invasive_where(self, due) -> list[str]:
        """The enabled invasive GPU probes for which ``due(name, entry, state)`` holds, cheapest first (their
        expected GPU seconds a run)."""
        with self._settings_lock:
            entries = self.settings.probe_entries()
            enabled = self._enabled(self.settings)
        out = []
        for name in enabled:
            entry = entries[name]
            if self.probe_map[name].exclusive == "gpu" and due(name, entry, self.store.state.get(name)):
                out.append((getattr(entry.params, "expected_gpu_seconds", entry.timeout_seconds), name))
        return [n for _, n in sorted(out)]

    def due_invasive(self, now: float | None = None, freed: set[str] | None = None) -> list[str]:
        """Invasive GPU probes that are due, shortest first (their GPU seconds per run): the last run skipped for
        a tenant (gpu_allocated, gpu_busy), no success within the interval, or (``freed``: GPU indices a pod
        just let go of) a freed GPU the probe has not measured within its interval (its runs measured the
        others while a tenant held it)."""
        now = time.time() if now is None else now

        def due(name, entry, st) -> bool:
            ok_at = st.last_success_ts if st else None
            stale = ok_at is None or now - ok_at >= entry.interval_seconds
            unmeasured = bool(freed) and self.probe_map[name].coverage == "gpu" and any(
                now - self.store.last_measured.get((g, name), 0.0) >= entry.interval_seconds for g in freed)
            return (st is not None and st.skipped_for_tenant) or stale or unmeasured
        return self.invasive_where(due)

    def run_opportunistic(self, freed: set[str] | None = None) -> list[str]:
        """Queue one run of each due invasive probe within seconds, shortest first (staggered a second apart;
        the exclusive "gpu" class serializes them, the gate and the budget decide on each GPU)."""
        due = self.due_invasive(freed=freed)
        for i, name in enumerate(due):
            self.scheduler.run_once(name, OPPORTUNISTIC_DELAY_SECONDS + i, trigger="opportunistic")
        return due

    def gpu_allocation(self) -> dict | None:
        """The kube context a probe's job gets: the API server's node-wide view, with the kubelet's per-GPU
        allocation over it while that is fresh (then one allocated GPU no longer blinds the node)."""
        ctx = self.kube.context() if self.kube else None
        per_gpu = self.pod_resources.context() if self.pod_resources else None
        if per_gpu is None:
            return ctx
        ctx = dict(ctx or {})
        ctx.pop("gpus_allocated", None)
        ctx.update(per_gpu)
        return ctx

    def _kube_changed(self) -> None:
        if self.kube is None:
            return
        with self._settings_lock:
            settings = self.settings
        self.store.set_kube(self.kube.snapshot(), settings.kubernetes.node_condition.type,
                            self._extra_node_labels(settings))

    @staticmethod
    def _history(settings) -> History | None:
        h = settings.history
        return History(settings.state_dir, h.max_bytes, h.backups) if h.enabled else None

    def _jobs(self) -> dict[str, tuple[float, float, str | None]]:
        jobs = {}
        for name, entry in self.settings.probe_entries().items():
            if entry.enabled:
                jobs[name] = (entry.interval_seconds, entry.effective_jitter_seconds, self.probe_map[name].exclusive)
        self.scheduler.aligned = {n for n in jobs if getattr(self.probe_map[n], "slot_aligned", False)}
        return jobs

    def _read_state(self, name: str, what: str, lost: str) -> list:
        """A JSON list the daemon keeps in its state directory; [] when absent or set aside (core/statefile:
        counted in fleetcanary_state_errors_total, one line). Never raises."""
        data = statefile.read_json(os.path.join(self.settings.state_dir, name), name, f"{what}: {lost}", expect=list)
        return data if data is not None else []

    def _dropper(self, name: str, what: str):
        """drop(kind, detail) for a restore: each entry refused is counted; one line for the file."""
        seen = [0]

        def drop(kind: str, detail: str) -> None:
            statefile.ERRORS.count(name, kind)
            seen[0] += 1
            if seen[0] == 1:
                log.warning("state %s: %s set aside (%s: %s; more are counted, not logged); %s",
                            name, what, kind, detail, "the rest is restored")
        return drop

    def _keep_state(self, name: str, what: str, data: list) -> None:
        path = os.path.join(self.settings.state_dir, name)
        try:
            statefile.write_atomic(path, json.dumps(data, allow_nan=False))
        except (OSError, ValueError) as e:
            log.warning("%s: cannot keep it in %s: %s", what, path, getattr(e, "strerror", None) or e)

    def _restore_budget(self) -> None:
        charges = self._read_state(BUDGET_FILE, "GPU budget", "starting from nothing spent")
        kept = self.budget.restore(charges, time.time(), drop=self._dropper(BUDGET_FILE, "a GPU budget charge"))
        log.info("GPU budget: %d charges of the last day restored", kept)

    def _save_budget(self) -> None:
        self._keep_state(BUDGET_FILE, "GPU budget", self.budget.dump(time.time()))

    def _restore_coverage(self) -> None:
        self.store.restore_coverage(self._read_state(COVERAGE_FILE, "coverage",
                                                     "every GPU counts as unmeasured until its next run"),
                                    drop=self._dropper(COVERAGE_FILE, "a coverage entry"))

    def _save_coverage(self) -> None:
        self._keep_state(COVERAGE_FILE, "coverage", self.store.dump_coverage())

    def first_delays(self, jobs: dict, now: float | None = None) -> dict[str, float | None]:
        """Invasive GPU probes start at the node's slot of their interval (daemon/phase.py: no herd after a
        rollout, no second daily burn after a restart); the rest within seconds (None: the scheduler's jitter)."""
        if not self.settings.gpu.spread_first_runs:
            return {}
        now = time.time() if now is None else now
        node_seed = phase.seed(self.settings.state_dir, self.settings.node_name)
        return {name: phase.first_delay(now, interval, phase.fraction(node_seed, name))
                for name, (interval, _, cls) in jobs.items() if cls == "gpu"}

    def reload(self) -> bool:
        # Whatever the file holds (a hostile one included), a reload that cannot take it keeps the running
        # config, says so in one line and in fleetcanary_config_last_reload_successful; it never ends the daemon.
        try:
            new = configmod.load(self.config_path, probe_map=self.probe_map)
            web = webconfig.load(new.server.web_config_file)
        except Exception as exc:  # noqa: BLE001 - a reload never ends the running daemon, whatever the file
            if isinstance(exc, configmod.ConfigError):
                why = "; ".join(exc.lines)
            elif isinstance(exc, webconfig.WebConfigError):
                why = "web config: " + " ".join(str(exc).split())
            else:
                why = f"{type(exc).__name__}: " + " ".join(str(exc).split())
            log.error("config reload failed, keeping the running config: %s", why[:2000])
            self.store.set_config_reload(False)
            return False
        self.server.set_web(web)
        self._set_limits(new)  # read at each accept: a reload applies them to the next connection
        with self._settings_lock:
            if new.server.listen_address != self.settings.server.listen_address:
                log.warning("server.listen_address changed; it takes effect at the next restart")
            self.settings = new
            self.budget.ratio = new.gpu.budget_ratio
            if self.kube is not None:
                self.kube.cfg = new.kubernetes
            self.history = self._history(new)
        self.store.set_enabled(self._enabled(new), self._intervals(new), self._timeouts(new))
        self.store.set_node_extra_labels(self._extra_node_labels(new))
        jobs = self._jobs()
        self.scheduler.set_jobs(jobs, delays=self.first_delays(jobs))
        self.store.set_config_reload(True)
        log.info("config reloaded: %d probes enabled", len(self._enabled(new)))
        return True

    # --- running probes ---------------------------------------------------------
    def run_probe(self, name: str, trigger: str = "schedule") -> RunRecord | None:
        if self._stopping.is_set():
            return None
        started = time.time()
        out = None
        try:
            with self._settings_lock:
                settings = self.settings
                history = self.history
            entry = settings.probe_entries()[name]
            window = budget_window(entry.interval_seconds)
            left = self.budget.left(window=window, probe=name, interval=entry.interval_seconds)
            context = jobmod.probe_context(settings, left, self.gpu_allocation(), budget_window_seconds=window,
                                           xid_watch_running=self.xid_watch is not None and self.xid_watch.watching())
            job = jobmod.build(name, self.probe_map[name], entry.params.model_dump(mode="json"), context)
            out = run_isolated(job, entry.timeout_seconds, settings.worker_kill_grace_seconds)
            self._add_platform(out)
            self._charge(out, window)
        except Exception as exc:  # noqa: BLE001 - a scheduler-side failure is a counted crash, never a silent gap
            out = self._internal_crash(name, exc, started, out)
            history = self.history
            entry = None
        if self._stopping.is_set():
            # Killed by our own shutdown: not a result, not a crash of the probe.
            log.info("probe %s: stopped by the shutdown after %.1fs; not recorded", name, out.wall_seconds)
            return None
        out.trigger = trigger
        self._publish(name, out, history)
        self._answer_requests(out)
        if entry is not None and out.reason not in ("spawn_failed", "internal"):
            try:
                self._maybe_confirm(name, entry, out)
            except Exception:  # the run is recorded; a confirmation is a nicety
                log.exception("probe %s: planning a confirmation run failed", name)
        return out

    def _add_platform(self, out: RunRecord, own: bool = True) -> None:
        """The Kubernetes platform of the run into its record (core/kube_platform.py): what the worker cannot
        know (the Node's nodeInfo, the NVIDIA components on the node, this pod's image digest)."""
        if self.kube is None or not out.environment:
            return
        platform = self.kube.snapshot().platform
        if platform:
            fields = kube_platform.record_fields(platform)
            if not own or out.environment.get("image", environment.UNKNOWN) != environment.UNKNOWN:
                fields.pop("image", None)        # the deployer named the image; or a claim pod ran its own
            if not own:
                fields.pop("image_digest", None)
            out.environment.update(fields)

    def _internal_crash(self, name: str, exc: BaseException, started: float, out: RunRecord | None) -> RunRecord:
        """The crash record of a run the daemon itself failed: spawn_failed when the system is out of
        descriptors, processes or memory, internal for anything else (logged with its traceback)."""
        spawn = isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN)
        if not spawn:
            log.error("probe %s: the daemon failed running it", name, exc_info=exc)
        crash = RunRecord(name, "crash", "spawn_failed" if spawn else "internal",
                          f"{type(exc).__name__}: {exc}"[:300], node=self.settings.node_name, started_at=started,
                          wall_seconds=max(0.0, time.time() - started))
        if out is not None:  # the run itself finished; what failed came after it (budget, state)
            crash.node, crash.exit_status = out.node, out.exit_status
        return crash

    def _publish(self, name: str, out: RunRecord, history) -> None:
        counted: list[bool] = []
        try:
            self._publish_record(name, out, history, counted)
        except Exception as exc:  # storing the record failed: the run is counted as an internal crash, once
            log.error("probe %s: storing its %s run failed", name, out.outcome, exc_info=exc)
            if counted or (out.outcome == "crash" and out.reason == "internal"):
                return
            self._publish_record(name, self._internal_crash(name, exc, out.started_at or time.time(), out),
                                 None, [])

    def _publish_record(self, name: str, out: RunRecord, history, counted: list[bool]) -> None:
        measured = self.store.apply(out)
        counted.append(True)  # the metrics have the run: a later failure must not count it again
        if measured:  # it measured GPUs: the coverage kept across restarts moved
            self._save_coverage()
        if self._pending_xids:
            self._flush_pending_xids()
        if name == "gpu_health":
            self._observe_gpu_health(out)
        self._evaluate_faults(clean=name == "gpu_health" and out.outcome == "success")
        if self.kube is not None:
            self.kube.observe(name, out.outcome, out.detail)
        if out.outcome in ("success", "skipped"):
            log.debug("probe %s: %s %s (%.2fs)", name, out.outcome, out.reason, out.wall_seconds)
        else:
            log.warning("probe %s: %s %s: %s (%.2fs)", name, out.outcome, out.reason, out.detail[:300],
                        out.wall_seconds)
        if history is not None:
            try:
                history.append(out)
            except HistoryError as exc:
                self.store.count_history_error()
                log.error("results history: %s", exc)

    def ingest(self, records) -> list[tuple[RunRecord, Exception]]:
        """Run records from a claim pod (daemon/claim.py, checked there), one or a list: charged to the GPU
        budget together (its state file written once, not once per record: a flood of records stays linear)
        and each published as a fresh run, as if this process's own worker had made it. The records whose
        publishing raised, with the error (the others are published)."""
        if isinstance(records, RunRecord):
            records = [records]
        with self._settings_lock:
            settings = self.settings
            history = self.history
        entries = settings.probe_entries()
        charged = False
        for out in records:
            self._add_platform(out, own=False)
            entry = entries.get(out.probe)   # gone by a reload since the claim asked: the shortest window
            charged |= self._charge(out, budget_window(entry.interval_seconds if entry else 0.0), save=False)
        if charged:
            self._save_budget()
        failed = []
        for out in records:
            try:
                self._publish(out.probe, out, history)
            except Exception as exc:  # noqa: BLE001 - the caller sets that record aside; the rest go on
                failed.append((out, exc))
                continue
            self._answer_requests(out)
        return failed

    def _charge(self, out: RunRecord, window: float, save: bool = True) -> bool:
        """The run's GPU seconds against the GPU-time budget, kept in the state directory (at once, or by the
        caller when ``save`` is false). Whether anything was charged. Only finite, non-negative seconds count:
        one infinite charge would leave the GPU no budget for a day."""
        charged = False
        for gpu, secs in out.gpu_seconds.items():
            if math.isfinite(secs) and secs >= 0:
                self.budget.add(gpu, secs, window=window, probe=out.probe)
                charged = True
        if charged and save:
            self._save_budget()
        return charged

    def _maybe_confirm(self, name: str, entry, out: RunRecord) -> None:
        # the fast-path figures' gauges (judge/figures.py); a probe with none of them (a test's) may name its own
        metrics = figmod.confirm_metrics(name) or getattr(self.probe_map[name], "confirm_metrics", ())
        if not metrics or entry.confirm_change <= 0 or entry.confirm_runs <= 0:
            return
        why = self.confirmer.jumped(out, metrics, entry.confirm_change, entry.confirm_runs)
        if why and self.scheduler.run_once(name, entry.effective_confirm_delay_seconds):
            log.info("probe %s: %s, in %.0f s", name, why, entry.effective_confirm_delay_seconds)

    # --- requested runs (POST /confirm, daemon/requests.py) ------------------------------------------------------
    def confirm_request(self, body: bytes) -> tuple[int, dict, dict[str, str]]:
        """A POST /confirm body (authorized, within MAX_BODY): (HTTP status, JSON answer, extra headers).
        Raises requests.BadRequest (400) or requests.Limited (429)."""
        with self._settings_lock:
            settings = self.settings
        ask = requestsmod.parse(body)
        name = ask["probe"]
        entry = settings.probe_entries().get(name)
        if entry is None or name not in self._enabled(settings):
            raise requestsmod.BadRequest(f"probe {name[:60]} is not enabled on this node")
        self.requests.admit(name, entry.effective_confirm_delay_seconds, settings.server.confirm_requests_per_hour)
        now = time.time()
        req = self.requests.add(name, ask["figure"], ask["gpu"], now, now + entry.timeout_seconds)
        if not self.scheduler.run_once(name, 0.0, trigger="requested"):
            raise requestsmod.BadRequest(f"probe {name} is not scheduled here")
        log.info("probe %s: a fresh run requested over HTTP (request %s%s)", name, req.id,
                 f", figure {req.figure}" if req.figure else "")
        return 202, req.to_json(), {"Location": f"/confirm/{req.id}"}

    def confirm_enabled(self) -> bool:
        with self._settings_lock:
            return self.settings.server.confirm_requests

    def confirm_status(self, rid: str) -> dict | None:
        req = self.requests.get(rid)
        return None if req is None else req.to_json()

    def _answer_requests(self, out: RunRecord) -> None:
        try:
            for req in self.requests.observe(out, out.samples, wait_for_claim=self.claimer is not None):
                log.info("probe %s: request %s answered by a %s run (%s)", out.probe, req.id, out.trigger,
                         out.outcome)
        except Exception:  # the run is recorded; the asker's deadline ends its wait
            log.exception("probe %s: answering requested runs failed", out.probe)

    # --- health -------------------------------------------------------------------
    def healthy(self) -> bool:
        return self.scheduler.running and not self._stopping.is_set()

    def ready(self) -> bool:
        return self.healthy() and bool(self.store.exposition)

    # --- lifecycle ------------------------------------------------------------------
    def _set_limits(self, settings) -> None:
        srv = settings.server
        self.server.set_limits(srv.max_connections, srv.max_connections_per_client, srv.header_timeout_seconds)

    def start(self) -> None:
        become_subreaper(self.reap_everything)
        track_workers(self.settings.state_dir)  # kill what a killed predecessor's workers left; record ours
        self._set_limits(self.settings)
        self.server.start()
        if self.kube is not None:
            self.kube.start()
        if self.pod_resources is not None:
            self.pod_resources.start()
        if self.xid_watch is not None:
            self.xid_watch.start()
        if self.claimer is not None:
            self.claimer.start()
        jobs = self._jobs()
        self.scheduler.set_jobs(jobs, delays=self.first_delays(jobs))
        self.store.rerender()  # the state files set aside by now (phase.json is read just above) are counted
        self.scheduler.start()
        host, _ = configmod.parse_listen_address(self.settings.server.listen_address)
        log.info("fleetcanary listening on %s:%d; probes: %s", host or "0.0.0.0", self.server.port,
                 ", ".join(self._enabled(self.settings)) or "none")

    def stop(self) -> None:
        self._stopping.set()
        self.scheduler.shutdown()
        if self.kube is not None:
            self.kube.stop()
        if self.pod_resources is not None:
            self.pod_resources.stop()
        if self.xid_watch is not None:
            self.xid_watch.stop()
        if self.claimer is not None:
            self.claimer.stop()
        kill_all_workers(self.settings.worker_kill_grace_seconds)
        reap_orphans()
        self.server.stop()

    def serve_forever(self) -> int:
        """Run until SIGTERM or SIGINT; SIGHUP reloads. Returns the exit code."""
        # The kernel may deliver a signal to any thread; Python runs handlers only in the main
        # thread, which would sleep on in read() meanwhile. The wakeup fd gets the signal number
        # written from whichever thread caught it, so the main thread always wakes.
        try:  # one daemon per state directory: a second one would overwrite the first's budget and figures
            self.dir_lock.acquire()
        except statefile.StateLocked as exc:
            log.error("%s", exc)
            self.server.stop()
            return 1
        r, w = os.pipe()
        os.set_blocking(w, False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: None)
        old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self.start()
        try:
            while True:
                cmd = os.read(r, 1)
                if cmd[0] == signal.SIGHUP:
                    log.info("SIGHUP: reloading %s", self.config_path or "embedded defaults")
                    self.reload()
                else:
                    log.info("stopping")
                    break
        finally:
            t0 = time.monotonic()
            self.stop()
            log.info("stopped in %.2fs", time.monotonic() - t0)
            signal.set_wakeup_fd(old_wakeup)
            os.close(r)
            os.close(w)
            self.dir_lock.release()
        return 0
