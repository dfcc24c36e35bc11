"""Scheduled runs through Kubernetes (deploy/overlays/scheduled-runs; kubernetes.claim in the config).

On a node that tenants keep busy, the invasive probes skip for as long as the GPUs are held. With claims on,
when an invasive probe has had no successful run for `after_seconds` and its last run was skipped for a tenant,
the exporter asks the scheduler for GPU time: one pod per node (fleetcanary-claim-NODE), bound to this node by
node affinity, requesting its GPUs, at the lowest priority and with preemptionPolicy Never (its PriorityClass),
so it waits until the GPUs are free, never displaces a tenant, and is the first pod preempted when a tenant
needs them. Once placed, the pod runs the due probes (`fleetcanary claim`, fleetcanary.runner.claim) and leaves
each record in the inbox, a host directory both pods mount; this side reads the inbox, publishes each record as
a fresh run (trigger "claim", charged to the GPU budget) and deletes the pod once it has ended. A claim the
scheduler has not placed within `pending_seconds` is withdrawn. The API calls: create, get and delete pods in
this namespace (the overlay's Role); the claim pod itself has no API access.

The inbox is outside input (the claim pod, or anything else on the host, can write it): each entry is checked
before anything of it is published (claim_inbox.py: this node, a probe a claim asked for, a sane time window,
finite and bounded GPU seconds, bounded series, size and depth); a refused one is moved into inbox/quarantine
(bounded) with one log line and counted, so the inbox always drains. What was asked for, and when, is kept
in memory and learnt again from the claim pod's annotations after a restart.

Each node waits up to `spread_ratio` of `after_seconds` longer, at its own phase: a fleet held since a
rollout asks the API server for its claims over an hour and a half (at the defaults), not in one minute.
Kueue and cluster autoscalers: docs/deploy.md, "Scheduled runs". On a node whose GPUs a DRA driver hands out
(no nvidia.com/gpu in its allocatable), the pod takes them through a ResourceClaim instead (daemon/claim_dra.py),
created before the pod and deleted after it; that needs create and delete on resourceclaims as well.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import Any

from fleetcanary.core.record import RunRecord
from fleetcanary.daemon import claim_dra, claim_inbox, phase
from fleetcanary.daemon import due as duemod
from fleetcanary.daemon.claim_label import TestingLabel
from fleetcanary.daemon.scheduler import budget_window
from fleetcanary.runner import job as jobmod

log = logging.getLogger("fleetcanary.claim")
TICK_SECONDS = 30.0
INBOX_MOUNT = "/inbox"
ENDED = ("Succeeded", "Failed")
CLAIM_APP = "fleetcanary-claim"  # the claim pod's app.kubernetes.io/name


def pod_name(node: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", ("fleetcanary-claim-" + node).lower())
    return name[:63].rstrip("-")


def claim_pod(cfg, node: str, namespace: str, spec: dict, gpus: int, owner: dict | None = None) -> dict:
    """The claim pod (a plain dict, as the API takes it)."""
    meta: dict[str, Any] = {"name": pod_name(node), "namespace": namespace,
                            # Outside the DaemonSet's selector (app.kubernetes.io/name: fleetcanary): its controller
                            # would adopt a matching orphan and delete it as a surplus pod on the node, and the
                            # runbooks' and the fabric probe's lookups of the exporter pod would find two.
                            "labels": {"app.kubernetes.io/name": CLAIM_APP, "app.kubernetes.io/part-of": "fleetcanary",
                                       "app.kubernetes.io/component": "claim"},
                            "annotations": {"fleetcanary.io/node": node,
                                            # never what keeps a node from scaling down
                                            "cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
                                            "fleetcanary.io/probes": ",".join(j["job"]["name"] for j in spec["jobs"])}}
    if owner:
        # Gone with the exporter pod that asked (garbage collection), but not a controller reference: no
        # controller adopts or manages the claim, and deleting the exporter pod never waits on it.
        meta["ownerReferences"] = [{**owner, "controller": False, "blockOwnerDeletion": False}]
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {
            "priorityClassName": cfg.priority_class,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": int(cfg.max_run_seconds),
            "terminationGracePeriodSeconds": 30,
            "serviceAccountName": cfg.service_account,
            "automountServiceAccountToken": False,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "claim", "image": cfg.image, "imagePullPolicy": "IfNotPresent",
                "args": ["claim", "--inbox", INBOX_MOUNT, "--spec", json.dumps(spec, separators=(",", ":"))],
                "env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus), "memory": "8Gi"},
                              "requests": {"cpu": "1", "memory": "2Gi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "inbox", "mountPath": INBOX_MOUNT}, {"name": "tmp", "mountPath": "/tmp"}],
            }],
            "volumes": [{"name": "inbox", "hostPath": {"path": cfg.inbox_host_path, "type": "Directory"}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
        },
    }


class Claimer:
    def __init__(self, daemon, api, namespace: str, owner: dict | None = None, clock=time.time) -> None:
        """daemon: fleetcanary.daemon.service.Daemon; api: a kubernetes CoreV1Api."""
        self.daemon = daemon
        self.api = api
        self.namespace = namespace
        self.owner = owner
        self.clock = clock
        self.started = clock()
        # this node's share of the spread (the same phase the invasive probes' first runs use)
        self.phase = phase.fraction(phase.seed(daemon.settings.state_dir, daemon.settings.node_name), "claim")
        self.last_ask = -float("inf")
        # probe -> unix time a claim asked for it: a record of a probe no claim asked for is refused
        # (learnt again from the pod's annotations after a restart)
        self.asked: dict[str, float] = {}
        self._refused = 0  # entries refused in the pass under way
        self.testing = TestingLabel(api, daemon.settings.node_name, self._call)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def cfg(self):
        return self.daemon.settings.kubernetes.claim

    @property
    def inbox(self) -> Path:
        return Path(self.cfg.inbox or os.path.join(self.daemon.settings.state_dir, "inbox"))

    # --- what is due -------------------------------------------------------------------------------------
    def due(self, now: float | None = None) -> list[str]:
        """Invasive probes a tenant has kept off this node for `after_seconds`, cheapest first: the last run
        skipped for a tenant, and no success (nor a GPU measured, nor this exporter started) since then."""
        now = self.clock() if now is None else now
        last_measured = self.daemon.store.last_measured
        wait = self.cfg.after_seconds * (1 + self.cfg.spread_ratio * self.phase)

        def asked(name: str) -> bool:  # a POST /confirm waits on it: now
            return self.daemon.requests.pending_since(name) is not None
        return duemod.cheapest_first(self.daemon.invasive_candidates(),
                                     lambda c: duemod.held(c, now, last_measured, self.started, wait, asked))

    def spec(self, names: list[str]) -> dict:
        """The jobs the claim pod runs, built as the daemon builds its own (no tenant allocation: the pod's
        GPUs are its own)."""
        d = self.daemon
        settings = d.settings
        entries = settings.probe_entries()
        jobs = []
        for name in names:
            entry = entries[name]
            window = budget_window(entry.interval_seconds)
            left = d.budget.left(window=window, probe=name, interval=entry.interval_seconds)
            context = jobmod.probe_context(settings, left, {"allocation_source": "claim"},
                                           budget_window_seconds=window)
            jobs.append({"job": jobmod.build(name, d.probe_map[name], entry.params.model_dump(mode="json"), context),
                         "timeout_seconds": entry.timeout_seconds})
        return {"node_name": settings.node_name, "kill_grace_seconds": settings.worker_kill_grace_seconds,
                "jobs": jobs}

    def gpus(self) -> int:
        if self.cfg.gpus:
            return self.cfg.gpus
        k = self.daemon.kube.snapshot() if self.daemon.kube is not None else None
        return (k.gpu_capacity if k is not None and k.gpu_capacity else 0) or (k.dra_gpus if k is not None else 0) \
            or len(self.daemon.store.node_environment.get("gpus") or []) or 1

    # --- the inbox -----------------------------------------------------------------------------------------
    def expect(self, now: float) -> claim_inbox.Expect:
        """What a record of this node's claim must match (daemon/claim_inbox.py)."""
        d = self.daemon
        entries = d.settings.probe_entries()
        invasive = frozenset(n for n in entries if getattr(d.probe_map.get(n), "exclusive", None) == "gpu")
        count = self.gpus()
        known = {str(g["index"]) for g in d.store.node_environment.get("gpus") or []
                 if isinstance(g, dict) and "index" in g}
        return claim_inbox.Expect(
            node=d.settings.node_name, invasive=invasive, asked=dict(self.asked),
            gpus=frozenset(known | {str(i) for i in range(count)}), gpu_count=max(count, len(known)),
            lifetime_seconds=self.cfg.pending_seconds + self.cfg.max_run_seconds,
            max_run_seconds=float(self.cfg.max_run_seconds))

    def ingest(self) -> int:
        """Publish every whole record in the inbox and delete it. Each entry named *.json is checked first
        (claim_inbox.check: this node, a probe a claim asked for, a sane time window, bounded GPU seconds and
        series); one that fails, or whose handling raises, is moved aside into inbox/quarantine with one log
        line and counted (fleetcanary_claim_records_rejected_total{reason}), so the inbox always drains. The
        accepted records of one pass are charged to the GPU budget together (its state file written once).
        Partial files (*.tmp) of a claim killed while writing are deleted once older than the claim's
        deadline. The exposition is rendered once after a pass that refused anything, not once per entry."""
        self._refused = 0
        try:
            return self._drain()
        finally:
            if self._refused:
                self.daemon.store.rerender()

    def _drain(self) -> int:
        now = self.clock()
        try:
            with os.scandir(self.inbox) as it:
                names = sorted(e.name for e in it)
        except OSError as exc:
            log.error("claim inbox %s: %s", self.inbox, exc)
            return 0
        expect = self.expect(now)
        accepted: list[tuple[RunRecord, Path]] = []
        for name in names:
            path = self.inbox / name
            if name.endswith(".tmp"):
                try:
                    st = os.lstat(path)
                    if not stat.S_ISREG(st.st_mode) or now - st.st_mtime > self.cfg.max_run_seconds:
                        claim_inbox.remove(path)
                except OSError:
                    pass
                continue
            if not name.endswith(".json"):
                continue
            try:
                rec, reason, detail = claim_inbox.read(path, expect, now)
            except Exception as exc:  # noqa: BLE001 - read never raises; if it did, the inbox still drains
                rec, reason, detail = None, "error", type(exc).__name__
            if rec is None:
                self._reject(path, reason, detail)
            else:
                accepted.append((rec, path))
        if not accepted:
            return 0
        try:
            failed = self.daemon.ingest([rec for rec, _ in accepted])
        except Exception as exc:  # noqa: BLE001 - never a traceback per tick: each file goes aside
            for _, path in accepted:
                self._reject(path, "error", f"{type(exc).__name__} while publishing")
            return 0
        bad = {id(rec): exc for rec, exc in failed}
        n = 0
        for rec, path in accepted:
            if id(rec) in bad:
                self._reject(path, "error", f"{type(bad[id(rec)]).__name__} while publishing")
                continue
            claim_inbox.remove(path)
            n += 1
        return n

    def _reject(self, path: Path, reason: str, detail: str) -> None:
        claim_inbox.REJECTED.count(reason)
        where = claim_inbox.quarantine(self.inbox, path, reason)
        log.error("claim inbox: %s refused (%s: %s); %s", path.name[:120], reason, detail, where)
        self._refused += 1

    # --- the pod -----------------------------------------------------------------------------------------
    def _call(self, operation: str, fn, *args, **kw):
        """An API call, its error counted (fleetcanary_kubernetes_api_errors_total) and re-raised."""
        try:
            return fn(*args, _request_timeout=self.daemon.kube.request_timeout(), **kw)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                self.daemon.kube.count_error(operation, exc)
            raise

    def _delete_claim(self, pod) -> None:
        """The pod's ResourceClaim, where it took its GPUs through one (a 404: gone already)."""
        if not (pod.spec is not None and pod.spec.resource_claims):
            return
        kube = self.daemon.kube
        version = claim_dra.mode(kube.snapshot()) or getattr(kube._dra, "version", None) or "v1"
        self._call("delete_resourceclaim", claim_dra.delete, self.api.api_client, version, self.namespace,
                   pod_name(self.daemon.settings.node_name))

    def _read(self):
        try:
            return self._call("read_pod", self.api.read_namespaced_pod, pod_name(self.daemon.settings.node_name),
                              self.namespace)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise

    def _learn(self, pod) -> None:
        """The probes the existing claim pod was asked to run, and when (after a restart of this exporter)."""
        try:
            meta = pod.metadata
            names = ((meta.annotations or {}).get("fleetcanary.io/probes") or "").split(",")
            created = meta.creation_timestamp
            ts = created.timestamp() if isinstance(created, datetime.datetime) else None
        except AttributeError:
            return
        if ts is None:
            return
        for name in names:
            if name and len(self.asked) < 256:
                self.asked[name] = max(self.asked.get(name, ts), ts)

    def tick(self, now: float | None = None) -> str:
        """One look: ingest, then end, withdraw or make the claim. What it did (for logs and tests)."""
        now = self.clock() if now is None else now
        node = self.daemon.settings.node_name
        try:
            pod, read_error = self._read(), False
        except Exception:  # noqa: BLE001 - counted; the next tick tries again
            pod, read_error = None, True
        if pod is not None:
            self._learn(pod)
        got = self.ingest()
        if read_error:
            return "error"
        if self.cfg.testing_label or self.testing.applied:   # turned off by a reload: what it set goes
            self.testing.sync(self.cfg.testing_label and pod is not None and pod.status is not None
                              and pod.status.phase == "Running")
        if pod is not None:
            phase = (pod.status.phase if pod.status else None) or "Pending"
            created = pod.metadata.creation_timestamp if pod.metadata else None
            age = now - created.timestamp() if isinstance(created, datetime.datetime) else 0.0
            if phase in ENDED or (phase == "Pending" and age > self.cfg.pending_seconds):
                try:
                    self._call("delete_pod", self.api.delete_namespaced_pod, pod_name(node), self.namespace)
                    self._delete_claim(pod)
                except Exception:  # noqa: BLE001 - counted; the next tick tries again
                    return "error"
                log.info("claim pod %s %s; deleted", pod_name(node),
                         phase.lower() if phase in ENDED else f"not placed within {self.cfg.pending_seconds:.0f} s")
                self.ingest()
                return "deleted" if phase in ENDED else "withdrawn"
            return "ingested" if got else "waiting"
        due = self.due(now)
        # a POST /confirm newer than the last claim asks at once (once per request: daemon/requests.py)
        requested = any((self.daemon.requests.pending_since(n) or -1.0) > self.last_ask for n in due)
        if not due or (now - self.last_ask < self.cfg.after_seconds and not requested):
            return "ingested" if got else "none"
        body = claim_pod(self.cfg, node, self.namespace, self.spec(due), self.gpus(), self.owner)
        version = claim_dra.mode(self.daemon.kube.snapshot())
        try:
            if version:  # a DRA node: the GPUs come through a ResourceClaim
                claim_dra.use_claim(body, pod_name(node))
                self._call("create_resourceclaim", claim_dra.create, self.api.api_client, version, self.namespace,
                           claim_dra.resource_claim(pod_name(node), self.namespace, self.gpus(), self.cfg.device_class,
                                                    version, self.owner))
            self._call("create_pod", self.api.create_namespaced_pod, self.namespace, body)
        except Exception:  # noqa: BLE001 - counted (a 409: one exists already; read next tick)
            return "error"
        self.last_ask = now
        for name in due:
            self.asked[name] = now
        log.info("claim pod %s asked for %s GPUs%s to run %s", pod_name(node), self.gpus(),
                 f" (ResourceClaim, resource.k8s.io/{version})" if version else "", ", ".join(due))
        return "created"

    # --- the thread --------------------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            self.inbox.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # the claim pods would have nowhere to leave their records: make none
            log.error("kubernetes.claim: the inbox %s cannot be made (%s); no claims are made", self.inbox,
                      exc.strerror or exc)
            return
        self._thread = threading.Thread(target=self._loop, name="claim", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            try:
                self.tick()
            except Exception:  # never let the claim thread die
                log.exception("claim: unexpected error")
