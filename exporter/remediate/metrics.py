"""The controller's metrics (namespace fleetcanary_remediate_), one registry, rendered per scrape (a controller
answers a scrape a minute; there is nothing to cache)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REFUSALS = ("opt_out", "breaker", "not_owner", "hold", "dry_run", "unknown_node", "api_error")


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "fleetcanary_remediate_"
        self.actions = Counter(p + "actions", "Node changes made (quarantine, release), by action.", ["action"],
                               registry=r)
        self.refusals = Counter(p + "refusals", "Actions a rule asked for and the controller did not take, by "
                                "reason (dry_run: it would have; opt_out, breaker, not_owner, unknown_node, "
                                "api_error: it may not or could not; hold: a release waits for the minimum hold "
                                "or quiet period).", ["reason"], registry=r)
        self.breaker_trips = Counter(p + "breaker_trips", "Times a pool's circuit breaker opened.", ["pool"],
                                     registry=r)
        self.breaker_open = Gauge(p + "breaker_open", "1 while a pool's circuit breaker is open: nothing more "
                                  "is quarantined there until a person looks.", ["pool"], registry=r)
        self.quarantined = Gauge(p + "quarantined_nodes", "Nodes the controller holds quarantined (from their "
                                 "records), as of the last look.", registry=r)
        self.webhooks = Counter(p + "webhooks", "Webhook requests, by outcome (accepted, standby: answered but "
                                "not acted on by a replica that does not lead, no_leader: 503 while nobody leads yet, "
                                "bad_request, too_large).",
                                ["outcome"], registry=r)
        self.alerts = Counter(p + "alerts", "Alerts received, by what became of them (matched, no_rule, no_node).",
                              ["outcome"], registry=r)
        self.api_errors = Counter(p + "kubernetes_api_errors", "Failed Kubernetes API calls, by operation and "
                                  "reason.", ["operation", "reason"], registry=r)
        self.audit_errors = Counter(p + "audit_write_errors", "Audit log lines that could not be written.",
                                    registry=r)
        self.leader = Gauge(p + "leader", "1 while this replica holds the lease and acts.", registry=r)
        self.confirmations = Counter(p + "confirmations", "Confirming runs asked of a node's exporter before a "
                                     "performance verdict acts (rules with confirm: true), by outcome: confirmed "
                                     "(it acts), not_confirmed (the fresh run is within the floor, or measured "
                                     "nothing), timeout (no fresh run by the deadline), error (the exporter could "
                                     "not be asked or read: refused, 401, unreachable; the alert carried no peers' "
                                     "value), cancelled (the alert resolved while pending).", ["outcome"],
                                     registry=r)
        self.confirm_pending = Gauge(p + "confirmations_pending", "Alerts waiting for a confirming run.",
                                     registry=r)
        self.dry_run = Gauge(p + "dry_run", "1 when the controller only says what it would do.", registry=r)
