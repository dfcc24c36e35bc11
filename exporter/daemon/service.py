"""The daemon: schedules probes in isolated workers, stores results, serves HTTP.

The main thread only waits for signals (SIGTERM/SIGINT stop, SIGHUP reloads); the
scheduler's threads each run one probe worker at a time; the HTTP server has its
own threads. This process never imports torch and never calls NVML.
"""
from __future__ import annotations

import errno
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
from fleetcanary.daemon import dra, phase, pod_resources, webconfig, xid_watch
from fleetcanary.daemon import due as duemod
from fleetcanary.daemon import kube as kubemod
from fleetcanary.daemon import requests as requestsmod
from fleetcanary.daemon.confirm import Confirmer
from fleetcanary.daemon.http import MetricsServer
from fleetcanary.daemon.node_health import NodeHealth
from fleetcanary.daemon.scheduler import Clock, GpuBudget, Scheduler, budget_window
from fleetcanary.daemon.state import ResultStore
from fleetcanary.daemon.state_files import StateFiles
from fleetcanary.judge import figures as figmod
from fleetcanary.judge.publish import Policy
from fleetcanary.judge.store import FigureStore
from fleetcanary.probes import PROBES
from fleetcanary.probes.base import Probe
from fleetcanary.runner import job as jobmod
from fleetcanary.runner.history import History, HistoryError
from fleetcanary.runner.isolation import (
    become_subreaper,
    kill_all_workers,
    reap_orphans,
    run_isolated,
    track_workers,
)

OPPORTUNISTIC_DELAY_SECONDS = 2.0   # after a GPU is freed: its tenant's processes have exited by then

NVIDIA_DRIVER = "/proc/driver/nvidia/version"  # present while NVIDIA's kernel driver is loaded
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
        self.state_files = StateFiles(settings.state_dir)  # gpu-budget.json, coverage.json
        self.budget = GpuBudget(settings.gpu.budget_ratio, monotonic=self.clock.monotonic)
        self.state_files.restore_budget(self.budget)
        published = self._published(settings)
        self.store = ResultStore(self.probe_map, published, judge=FigureStore(
            settings.state_dir, clock=self.clock, figures=figmod.configured(settings.alerts),
            publish=Policy.from_settings(settings.alerts)))
        self.store.set_enabled(published, self._intervals(settings), self._timeouts(settings))
        # This process never loads NVML: until a worker reports the GPU facts, the node's driver and
        # model are the ones its last runs had (the figure store keeps them), never "unknown" (an
        # exporter restart must not look like a driver change to the fleet's rules).
        self.store.set_environment({**environment.collect(with_gpu=False), **self.store.judge.facts})
        self.state_files.restore_coverage(self.store)
        self.kube = self._kube(settings)
        self.claimer = self._claimer(settings)
        self.pod_resources = self._pod_resources(settings)
        # hard faults at the edge: gpu_health's reads and the XIDs, held and published (daemon/node_health.py)
        self.health = NodeHealth(self._current_settings, self.store, lambda: self.kube, self.clock.monotonic)
        # XIDs of the watch wait here for the GPU facts (daemon/xid_watch.py), then go to the node's health
        self.xid_buffer = xid_watch.XidBuffer(lambda: self.store.node_environment, self.health.xid)
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
    def _current_settings(self):
        with self._settings_lock:
            return self.settings

    @staticmethod
    def _enabled(settings) -> list[str]:
        return [n for n, e in settings.probe_entries().items() if e.enabled]

    def _published(self, settings) -> list[str]:
        """The enabled probes that publish their fleetcanary_probe_* series: not a target probe without targets
        (off in all but name; its runs skip not_configured, in /results)."""
        return [n for n, e in settings.probe_entries().items()
                if e.enabled and self.probe_map[n].configured(e.params)]

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
        return xid_watch.XidWatch(source, self.xid_buffer, self.health.watched, on_sxid=self.health.sxid)

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

    def invasive_candidates(self) -> list[duemod.Candidate]:
        """The enabled invasive GPU probes as daemon/due.py's rules see them: interval, expected GPU seconds a run
        (the order), coverage, newest success and whether the newest run skipped for a tenant."""
        with self._settings_lock:
            entries = self.settings.probe_entries()
            enabled = self._enabled(self.settings)
        out = []
        for name in enabled:
            cls, entry = self.probe_map[name], entries[name]
            if cls.exclusive != "gpu":
                continue
            st = self.store.state.get(name)
            out.append(duemod.Candidate(name, entry.interval_seconds,
                                        getattr(entry.params, "expected_gpu_seconds", entry.timeout_seconds),
                                        per_gpu=cls.coverage == "gpu",
                                        last_success=st.last_success_ts if st else None,
                                        skipped_for_tenant=st is not None and st.skipped_for_tenant))
        return out

    def due_invasive(self, now: float | None = None, freed: set[str] | None = None) -> list[str]:
        """Invasive GPU probes that are due, shortest first (their GPU seconds per run): daemon/due.py."""
        now = time.time() if now is None else now
        return duemod.due(self.invasive_candidates(), now, self.store.last_measured, freed)

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

    def _save_budget(self) -> None:
        self.state_files.save_budget(self.budget)

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
            self.state_files.dir = new.state_dir
            self.budget.ratio = new.gpu.budget_ratio
            if self.kube is not None:
                self.kube.cfg = new.kubernetes
            self.history = self._history(new)
        self.store.set_enabled(self._published(new), self._intervals(new), self._timeouts(new))
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
            self.state_files.save_coverage(self.store)
        if self.xid_buffer.pending:
            self.xid_buffer.flush()
        self.health.observe(name, out)
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
