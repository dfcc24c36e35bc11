"""The decisions: an alert firing on a node quarantines it by its rule's actions, an alert resolved starts the
node's way back, and a periodic tick releases nodes whose alerts stayed resolved for the quiet period once their
minimum hold passed. Every decision reads the node first (its labels, its record) and writes with the
resourceVersion it read, so the node is the only state that matters; this process keeps nothing a successor
would need.

Refused, in this order (each counted by reason, logged on one line, written to the audit log):
  not a leader       -> nothing at all (the webhook still answers 200; the leader got the same notification)
  unknown_node       -> the alert names a node the API does not know
  not_owner          -> the record annotation is there but unreadable: someone else's, hands off
  opt_out            -> the node carries the opt-out label (new actions and releases alike)
  breaker            -> the pool's circuit breaker is open (new quarantines only; a node already held may
                        still gain an alert or be released)
  dry_run            -> everything above passed: an Event and a log line say what would be done
  hold               -> a release waits for the minimum hold or the quiet period

A rule with ``confirm: true`` (a performance verdict) puts one more gate after opt-out and ownership: the alert is
held pending (no action; an Event ConfirmRequested), the node's exporter is asked for a fresh run (POST /confirm)
and polled at each tick until it has one or the deadline passes; only a run that is still past the rule's floor
against the peers' value the alert carried lets the alert go on through the breaker and dry-run to an action,
whose Event says "confirmed by a fresh run at T: X against peers' Y". Otherwise an Event NotConfirmed and nothing
else; a resolved notification while pending cancels it (remediate/confirm.py). Pending confirmations live in this
process only: a new leader learns them again from Alertmanager's next notification (repeat_interval).
"""
from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass

from . import breaker, confirm, ownership, policy
from .audit import Audit
from .config import Settings
from .kubeapi import ApiError, KubeAPI
from .lease import Clock, Elector
from .metrics import Metrics
from .ownership import ForeignRecord, Record, iso
from .webhook import Alert, Payload

log = logging.getLogger("fleetcanary.remediate")
COMPONENT = "fleetcanary-remediate"
EVIDENCE_LABELS = ("figure", "path", "gpu", "series", "baseline", "class", "probe")
MAX_EVENT_MESSAGE = 1024  # the API server truncates longer Event messages
RETRIES = 3               # a patch refused for a stale resourceVersion is read and made again
RELIST_SECONDS = 300.0    # tick lists the nodes at least this often (a record edited by someone else)


@dataclass
class _DryQuarantine:
    pool: str
    since: float


class Controller:
    def __init__(self, settings: Settings, api: KubeAPI, identity: str, clock: Clock | None = None,
                 metrics: Metrics | None = None, namespace: str = "fleetcanary") -> None:
        self.s = settings
        self.api = api
        self.identity = identity
        self.clock = clock or Clock()
        self.metrics = metrics or Metrics()
        self.audit = Audit(settings.audit_log, on_error=self.metrics.audit_errors.inc)
        self.elector = (Elector(api, namespace, settings.lease.name, identity, settings.lease.duration_seconds,
                                self.clock, on_error=self._api_error) if settings.lease.enabled else None)
        self._lock = threading.Lock()
        self._dry: dict[str, _DryQuarantine] = {}
        self._open_pools: set[str] = set()
        self._pending: dict[str, confirm.Pending] = {}   # alert fingerprint -> its confirmation
        self._relist_at = -math.inf   # when tick next lists the nodes (see tick)
        self._was_leading = False
        self.confirm_client = confirm.Client(settings.confirm)
        self.metrics.dry_run.set(1 if settings.dry_run else 0)
        self.metrics.leader.set(0)

    # --- leadership --------------------------------------------------------------------------------------
    def leading(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def tick(self) -> None:
        """Renew or take the lease; while leading, release what may be released. Never raises.

        The nodes are listed only when a release may be due: at the earliest time a record whose alerts all
        resolved may go (its hold and quiet period), after any notification, on taking the lease, and at least
        every RELIST_SECONDS (a record someone else edited). A list of every node every tick_seconds is a
        fleet's worth of Node objects from the API server every few seconds on a 500-node cluster."""
        if self.elector is not None:
            self.elector.tick()
        leading = self.leading()
        self.metrics.leader.set(1 if leading else 0)
        if leading and not self._was_leading:
            self._relist_at = -math.inf   # a new leader reconciles from the nodes at once
        self._was_leading = leading
        if not leading:
            return
        with self._lock:
            now = self.clock.time()
            if now < self._relist_at:
                self._poll_confirmations()
                return
            try:
                nodes = self.api.list_nodes()
            except ApiError as exc:
                self._api_error(exc)
                return
            held, due = 0, now + RELIST_SECONDS
            for n in nodes:
                try:
                    record = ownership.read(n)
                except ForeignRecord:
                    continue
                if record is None:
                    continue
                held += 1
                if self._releasable(record):
                    try:
                        self._release(n["metadata"]["name"])
                    except _Stop:
                        continue
                elif record.all_resolved():
                    due = min(due, max(record.hold_until, record.last_resolved() + self.s.release.quiet_seconds))
            self._relist_at = due
            self.metrics.quarantined.set(held)
            self._poll_confirmations()

    # --- webhooks ----------------------------------------------------------------------------------------
    def handle(self, payload: Payload) -> str:
        """Apply one notification: 'accepted'; 'standby' (another replica leads and got the same notification);
        'no_leader' (nobody is known to lead yet: the server answers 503 so Alertmanager retries it)."""
        if not self.leading():
            if self.elector is not None and not self.elector.holder:
                log.warning("no leader yet: asking Alertmanager to retry %d alert(s)", len(payload.alerts))
                return "no_leader"
            log.info("standby: not acting on %d alert(s); the leader %s does", len(payload.alerts),
                     self.elector.holder if self.elector else "")
            return "standby"
        with self._lock:
            self._relist_at = -math.inf   # what the notification did may make a release due: look at the next tick
            for alert in payload.alerts:
                node = alert.labels.get(self.s.node_label, "")
                if not node:
                    self.metrics.alerts.labels("no_node").inc()
                    continue
                try:
                    if alert.status == "resolved":
                        self.metrics.alerts.labels("matched").inc()
                        self._cancel_confirmation(alert)
                        self._resolve(node, alert)
                        continue
                    rule = policy.rule_for(self.s, alert)
                    if rule is None:
                        self.metrics.alerts.labels("no_rule").inc()
                        continue
                    self.metrics.alerts.labels("matched").inc()
                    self._fire(node, alert, rule)
                except _Stop:
                    continue
        return "accepted"

    # --- firing ------------------------------------------------------------------------------------------
    def _fire(self, name: str, alert: Alert, rule, confirmed: str = "") -> None:
        """``confirmed``: the words of the fresh run that confirmed it (a confirm: true rule acts only with them)."""
        for _ in range(RETRIES):
            now = self.clock.time()
            node = self._read(name, alert)
            if node is None:
                return
            try:
                record = ownership.read(node)
            except ForeignRecord as exc:
                self._refuse("not_owner", name, alert, str(exc), node)
                return
            if self._opted_out(node):
                self._refuse("opt_out", name, alert, f"the node is labelled {self.s.opt_out_label}="
                             f"{self.s.opt_out_value}", node)
                return
            if record is not None and alert.fingerprint in record.alerts:
                held = record.alerts[alert.fingerprint]
                if not held.get("resolved"):
                    log.debug("%s: %s already holds it", name, alert.name)
                    return
                held["resolved"] = None   # firing again inside the quiet period: the node stays, the wait restarts
                if self._patch(name, ownership.note(node, record), alert):
                    log.info("%s: %s fires again; the node stays quarantined and the quiet period starts over",
                             name, alert.name)
                    self._audit("refire", name, alert, rule=rule.name)
                    return
                continue
            if rule.confirm and not confirmed:
                self._ask_confirmation(name, node, alert, rule)
                return
            wanted = policy.Wanted()
            wanted.add(rule)
            if record is None and not self._breaker_allows(name, node, alert, now):
                return
            if self.s.dry_run:
                self._dry.setdefault(name, _DryQuarantine(self._pool(node), now))
                would = (f"would {wanted.describe(self.s.taint_key)} (rule {rule.name}, "
                         f"hold {rule.min_hold_seconds:g} s)")
                self._refuse("dry_run", name, alert, f"{confirmed + '; ' if confirmed else ''}{would}", node,
                             event_reason="WouldQuarantine")
                return
            if record is None:
                record = Record(since=now, hold_until=now + rule.min_hold_seconds)
            record.hold_until = max(record.hold_until, now + rule.min_hold_seconds)
            record.alerts[alert.fingerprint] = {"alertname": alert.name, "rule": rule.name, "fired": iso(now),
                                                "resolved": None}
            patch, changes = ownership.quarantine(node, wanted, record, self.s.taint_key)
            if not self._patch(name, patch, alert):
                continue
            self.metrics.actions.labels("quarantine").inc()
            what = ", ".join(changes) or "nothing new (already as the rule wants); recorded the alert"
            msg = (f"{confirmed + '; ' if confirmed else ''}quarantined by rule {rule.name}: {what}; held at least "
                   f"until {iso(record.hold_until)}")
            log.warning("%s: %s (%s)", name, msg, alert.name)
            self._event(node, "Quarantined", msg, alert, "Warning")
            self._audit("quarantine", name, alert, rule=rule.name, changes=changes)
            return
        self._refuse("api_error", name, alert, f"the node changed under {RETRIES} attempts")

    def _breaker_allows(self, name: str, node: dict, alert: Alert, now: float) -> bool:
        pool = self._pool(node)
        try:
            nodes = self.api.list_nodes()
        except ApiError as exc:
            self._api_error(exc)
            self._refuse("api_error", name, alert, "cannot count the pool's quarantines: not acting blind")
            return False
        members = [n for n in nodes if self._pool(n) == pool]
        starts = []
        for n in members:
            try:
                rec = ownership.read(n)
            except ForeignRecord:
                continue
            if rec is not None:
                starts.append(rec.since)
        if self.s.dry_run:
            starts += [d.since for n, d in self._dry.items() if d.pool == pool and n != name]
        v = breaker.judge(self.s.breaker, pool, len(members), starts, now)
        if not v.open:
            if pool in self._open_pools:
                self._open_pools.discard(pool)
                log.warning("circuit breaker closed for pool %s (%d of %d)", pool, v.quarantined, v.limit)
            self.metrics.breaker_open.labels(pool).set(0)
            return True
        if pool not in self._open_pools:
            self._open_pools.add(pool)
            self.metrics.breaker_trips.labels(pool).inc()
        self.metrics.breaker_open.labels(pool).set(1)
        log.error("circuit breaker open for pool %s: %d of its %d nodes quarantined within %g s (limit %d); "
                  "not touching %s", pool, v.quarantined, v.pool_size, self.s.breaker.window_seconds, v.limit, name)
        self._refuse("breaker", name, alert, f"circuit breaker open for pool {pool}: {v.quarantined} nodes "
                     f"quarantined within {self.s.breaker.window_seconds:g} s, limit {v.limit}", node,
                     event_reason="QuarantineRefused")
        return False

    # --- confirming runs (remediate/confirm.py) -------------------------------------------------------------
    def _ask_confirmation(self, name: str, node: dict, alert: Alert, rule) -> None:
        if alert.fingerprint in self._pending:
            log.debug("%s: %s already waits for its confirming run", name, alert.name)
            return
        cfg = self.s.confirm
        now = self.clock.time()
        try:
            fig = confirm.figure_of(alert)
            peers = confirm.peers_value(alert, cfg.peers_annotation)
            url = confirm.url_for(cfg, alert, name)
        except confirm.Failed as exc:
            self._confirm_done("error", name, node, alert, f"cannot ask for a confirming run: {exc}")
            return
        gpu = alert.labels.get("gpu", "")
        self._event(node, "ConfirmRequested", f"rule {rule.name} acts only on a confirmed verdict: asking {url} for "
                    f"a fresh run of {fig.key}{' on GPU ' + gpu if gpu else ''}; no action until it ends (deadline "
                    f"{iso(now + cfg.deadline_seconds)})", alert, "Normal")
        self._audit("confirm_requested", name, alert, rule=rule.name, url=url)
        try:
            answer = self.confirm_client.ask(url, fig, gpu)
        except confirm.Failed as exc:
            self._confirm_done("error", name, node, alert, f"the confirming run could not be asked for: {exc}")
            return
        self._pending[alert.fingerprint] = confirm.Pending(
            name, alert, rule.name, url, answer["id"], now, now + cfg.deadline_seconds, now, fig, peers)
        self.metrics.confirm_pending.set(len(self._pending))
        log.info("%s: %s pending: fresh run %s asked of %s", name, alert.name, answer["id"], url)

    def _poll_confirmations(self) -> None:
        """At each tick while leading: look at each pending confirmation that is due. Called with the lock held."""
        now = self.clock.time()
        for fp, p in list(self._pending.items()):
            if now < p.next_poll:
                continue
            p.next_poll = now + self.s.confirm.poll_seconds
            try:
                status = self.confirm_client.status(p.url, p.request_id)
            except confirm.Failed as exc:
                if now >= p.deadline:
                    self._settle(fp, "timeout", f"no fresh run by {iso(p.deadline)} (last look: {exc})")
                continue
            run = status.get("run") if status.get("state") == "done" else None
            if not isinstance(run, dict):
                if now >= p.deadline:
                    self._settle(fp, "timeout", f"no fresh run by {iso(p.deadline)}")
                continue
            self._judge(fp, p, run)

    def _judge(self, fp: str, p: confirm.Pending, run: dict) -> None:
        at = run.get("started_at")
        when = iso(at) if isinstance(at, (int, float)) and math.isfinite(at) else "?"
        rule = next((r for r in self.s.rules if r.name == p.rule), None)
        series, gpu = p.alert.labels.get("series", ""), p.alert.labels.get("gpu", "")
        value = confirm.fresh_value(run, p.figure, series, gpu)
        if value is None or rule is None:
            self._settle(fp, "not_confirmed", f"the fresh run at {when} measured no {p.figure.key}"
                         f"{' ' + series if series else ''}{' on GPU ' + gpu if gpu else ''} "
                         f"({run.get('outcome', '?')} {str(run.get('reason', ''))[:60]})".rstrip())
            return
        off = confirm.worse(p.figure, value, p.peers)
        words = (f"a fresh run at {when}: {value:.4g} against peers' {p.peers:.4g} ({off:+.1%} worse, floor "
                 f"{rule.confirm_floor:.1%})")
        if off <= rule.confirm_floor:
            self._settle(fp, "not_confirmed", f"not confirmed by {words}")
            return
        self._settle(fp, "confirmed", "")
        log.warning("%s: %s confirmed by %s", p.node, p.alert.name, words)
        self._audit("confirmed", p.node, p.alert, rule=rule.name, value=value, peers=p.peers)
        try:
            self._fire(p.node, p.alert, rule, confirmed=f"confirmed by {words}")
        except _Stop:
            pass

    def _settle(self, fp: str, outcome: str, why: str) -> None:
        p = self._pending.pop(fp)
        self.metrics.confirm_pending.set(len(self._pending))
        if outcome == "confirmed":
            self.metrics.confirmations.labels(outcome).inc()
            return
        try:
            node = self.api.read_node(p.node)
        except ApiError as exc:
            self._api_error(exc)
            node = None
        self._confirm_done(outcome, p.node, node, p.alert, why)

    def _confirm_done(self, outcome: str, name: str, node: dict | None, alert: Alert, why: str) -> None:
        """A confirmation that ends without an action: counted, logged, audited, an Event NotConfirmed."""
        self.metrics.confirmations.labels(outcome).inc()
        (log.info if outcome == "not_confirmed" else log.warning)("%s: %s %s: %s; no action", name, alert.name,
                                                                  outcome.replace("_", " "), why)
        if node is not None:
            self._event(node, "NotConfirmed", f"{outcome.replace('_', ' ')}: {why}; no action", alert,
                        "Normal" if outcome == "not_confirmed" else "Warning")
        self._audit("not_confirmed", name, alert, outcome=outcome, detail=why)

    def _cancel_confirmation(self, alert: Alert) -> None:
        if alert.fingerprint in self._pending:
            self._settle(alert.fingerprint, "cancelled", "the alert resolved while its confirming run was pending")

    # --- resolved and released -----------------------------------------------------------------------------
    def _resolve(self, name: str, alert: Alert) -> None:
        if self.s.dry_run:
            if name in self._dry:
                log.info("%s: %s resolved; would release after %g s quiet", name, alert.name,
                         self.s.release.quiet_seconds)
            return
        for _ in range(RETRIES):
            node, record = self._owned(name, alert)
            if record is None or alert.fingerprint not in record.alerts:
                return   # never ours: nothing to undo
            held = record.alerts[alert.fingerprint]
            if held.get("resolved"):
                return
            held["resolved"] = iso(self.clock.time())
            if self._patch(name, ownership.note(node, record), alert):
                self._audit("resolved", name, alert, rule=held.get("rule"))
                if self._releasable(record):
                    self._release(name)
                elif record.all_resolved():
                    self.metrics.refusals.labels("hold").inc()
                    log.info("%s: %s resolved; released no earlier than %s", name, alert.name,
                             iso(max(record.hold_until, record.last_resolved() + self.s.release.quiet_seconds)))
                return

    def _owned(self, name: str, alert: Alert | None) -> tuple[dict | None, Record | None]:
        """The node and the record of what this controller did to it: (None, None) when the node cannot be read
        or its record is another's (never undone), (node, None) when there is none."""
        node = self._read(name, alert)
        if node is None:
            return None, None
        try:
            return node, ownership.read(node)
        except ForeignRecord:
            return None, None

    def _releasable(self, record: Record) -> bool:
        now = self.clock.time()
        return (record.all_resolved() and now >= record.hold_until
                and now >= record.last_resolved() + self.s.release.quiet_seconds)

    def _release(self, name: str) -> None:
        for _ in range(RETRIES):
            node, record = self._owned(name, None)
            if record is None or not self._releasable(record):
                return
            if self._opted_out(node):
                self._refuse("opt_out", name, None, "a release waits: the node is opted out", node)
                return
            patch, changes = ownership.release(node, record, self.s.taint_key)
            if not self._patch(name, patch, None):
                continue
            self.metrics.actions.labels("release").inc()
            alerts = ", ".join(sorted({a.get("alertname", "?") for a in record.alerts.values()}))
            msg = (f"released: {', '.join(changes) or 'nothing left to undo'}; {alerts} resolved since "
                   f"{iso(record.last_resolved())}, quarantined since {iso(record.since)}")
            log.warning("%s: %s", name, msg)
            self._event(node, "Released", msg, None, "Normal")
            self._audit("release", name, None, changes=changes)
            return

    # --- helpers -------------------------------------------------------------------------------------------
    def _pool(self, node: dict) -> str:
        if not self.s.pool_label:
            return "all"
        return ownership.labels(node).get(self.s.pool_label, "") or "(none)"

    def _opted_out(self, node: dict) -> bool:
        return ownership.labels(node).get(self.s.opt_out_label) == self.s.opt_out_value

    def _read(self, name: str, alert: Alert | None) -> dict | None:
        try:
            return self.api.read_node(name)
        except ApiError as exc:
            self._api_error(exc)
            self._refuse("unknown_node" if exc.reason == "not_found" else "api_error", name, alert, str(exc))
            return None

    def _patch(self, name: str, patch: dict, alert: Alert | None) -> bool:
        try:
            self.api.patch_node(name, patch)
            return True
        except ApiError as exc:
            if exc.reason == "conflict":
                log.info("%s changed since it was read; reading it again", name)
                return False
            self._api_error(exc)
            self._refuse("api_error", name, alert, str(exc))
            raise _Stop from None

    def _api_error(self, exc: ApiError) -> None:
        self.metrics.api_errors.labels(exc.operation, exc.reason).inc()
        log.warning("%s", exc)

    def _refuse(self, reason: str, name: str, alert: Alert | None, why: str, node: dict | None = None,
                event_reason: str = "QuarantineRefused") -> None:
        self.metrics.refusals.labels(reason).inc()
        what = f"{alert.name} " if alert else ""
        (log.info if reason == "dry_run" else log.warning)("%s: %s%s: %s", name, what,
                                                           "dry run" if reason == "dry_run" else "refused", why)
        if node is not None and reason in ("dry_run", "breaker", "opt_out"):
            self._event(node, event_reason, ("dry run: " if reason == "dry_run" else "") + why, alert,
                        "Normal" if reason == "dry_run" else "Warning")
        self._audit("dry_run" if reason == "dry_run" else "refused", name, alert, reason=reason, detail=why)

    def _event(self, node: dict, reason: str, message: str, alert: Alert | None, kind: str) -> None:
        now = self.clock.time()
        name = node["metadata"]["name"]
        text = message + (f". Evidence: {evidence(alert)}" if alert is not None else "")
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"name": f"{name}.{int(now * 1e9):x}{abs(hash((reason, text))) % 4096:03x}",
                              "namespace": self.s.kubernetes.event_namespace},
                 "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name,
                                    **({"uid": node["metadata"]["uid"]} if node["metadata"].get("uid") else {})},
                 "reason": reason, "message": text[:MAX_EVENT_MESSAGE], "type": kind,
                 "source": {"component": COMPONENT}, "reportingComponent": "fleetcanary.io/remediate",
                 "reportingInstance": self.identity[:128], "action": reason,
                 "firstTimestamp": iso(now)[:19] + "Z", "lastTimestamp": iso(now)[:19] + "Z", "count": 1}
        try:
            self.api.create_event(self.s.kubernetes.event_namespace, event)
        except ApiError as exc:
            self._api_error(exc)

    def _audit(self, decision: str, name: str, alert: Alert | None, **extra) -> None:
        rec = {"time": iso(self.clock.time()), "by": self.identity, "dry_run": self.s.dry_run, "node": name,
               "decision": decision, **extra}
        if alert is not None:
            rec["alert"] = {"alertname": alert.name, "fingerprint": alert.fingerprint, "status": alert.status,
                            "labels": dict(alert.labels), "startsAt": alert.startsAt}
        self.audit.write(rec)


class _Stop(Exception):
    """An API failure other than a conflict: this decision ends here (counted and logged already)."""


def evidence(alert: Alert) -> str:
    """The alert's words and numbers: its name and severity, the labels that place it (figure, path, GPU,
    series), and its summary and description (which carry the figure, the peers' median and the baseline)."""
    labels = ", ".join(f"{k}={alert.labels[k]}" for k in EVIDENCE_LABELS if alert.labels.get(k))
    parts = [f"{alert.name} ({alert.labels.get('severity', 'no severity')}{', ' + labels if labels else ''})"]
    parts += [" ".join(alert.annotations[k].split()) for k in ("summary", "description") if alert.annotations.get(k)]
    return "; ".join(parts)
