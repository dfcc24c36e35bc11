"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it: the holder renews
``renewTime`` every retry period; another replica takes the lease only after it has seen the same record
unchanged for a whole ``leaseDurationSeconds`` on its own monotonic clock (so clocks of different machines never
have to agree); every write carries the resourceVersion it read, so of two replicas racing, the API server lets
one win (409 for the other). A leader that has not renewed within the lease duration stops acting before anyone
else may start: it is the leader only while ``now < last renewal + duration``.

The clock is injected (``Clock``: wall time for the record, monotonic time for expiry), so tests move time."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from .kubeapi import ApiError, KubeAPI
from .ownership import iso

log = logging.getLogger("fleetcanary.remediate.lease")


class Clock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


@dataclass
class _Seen:
    key: tuple   # (holder, renewTime, resourceVersion) of the record last read
    at: float    # monotonic time it was first seen


class Elector:
    def __init__(self, api: KubeAPI | None, namespace: str, name: str, identity: str, duration: float,
                 clock: Clock, on_error=None) -> None:
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.duration = duration
        self.clock = clock
        self.on_error = on_error or (lambda exc: None)
        self._renewed_at: float | None = None   # monotonic time of our last successful write as holder
        self._seen: _Seen | None = None
        self.holder = ""

    def is_leader(self) -> bool:
        return self._renewed_at is not None and self.clock.monotonic() < self._renewed_at + self.duration

    def _body(self, lease: dict | None, transitions: int, acquire: bool) -> dict:
        now = iso(self.clock.time())
        meta = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"].get("resourceVersion", "")
        spec = dict((lease or {}).get("spec") or {})
        spec.update({"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.duration)),
                     "renewTime": now, "leaseTransitions": transitions})
        if acquire:
            spec["acquireTime"] = now
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def tick(self) -> bool:
        """Try to acquire or renew once; whether this replica leads now."""
        was = self.is_leader()
        try:
            lease = self.api.read_lease(self.namespace, self.name)
            if lease is None:
                self.api.create_lease(self.namespace, self._body(None, 0, acquire=True))
                self._won(was)
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            self.holder = holder
            transitions = int(spec.get("leaseTransitions") or 0)
            if holder == self.identity:
                self.api.replace_lease(self.namespace, self._body(lease, transitions, acquire=False))
                self._won(was)
                return True
            key = (holder, spec.get("renewTime"), lease["metadata"].get("resourceVersion"))
            now = self.clock.monotonic()
            if self._seen is None or self._seen.key != key:
                self._seen = _Seen(key, now)
            duration = float(spec.get("leaseDurationSeconds") or self.duration)
            if holder and now < self._seen.at + duration:
                self._lost(was)
                return False
            self.api.replace_lease(self.namespace, self._body(lease, transitions + 1, acquire=True))
            log.info("lease %s/%s taken over from %s (not renewed for %.0f s)", self.namespace, self.name,
                     holder or "nobody", now - self._seen.at)
            self._won(was)
            return True
        except ApiError as exc:
            if exc.reason != "conflict":
                self.on_error(exc)
            # a conflict: another replica wrote first; what we hold stays valid until it expires on our clock
            if not self.is_leader():
                self._lost(was)
            return self.is_leader()

    def _won(self, was: bool) -> None:
        self._renewed_at = self.clock.monotonic()
        self.holder = self.identity
        if not was:
            log.info("leading: lease %s/%s held by %s", self.namespace, self.name, self.identity)

    def _lost(self, was: bool) -> None:
        self._renewed_at = None
        if was:
            log.warning("no longer leading: lease %s/%s held by %s", self.namespace, self.name, self.holder)
