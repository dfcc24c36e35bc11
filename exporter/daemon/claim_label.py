"""The TESTING label (kubernetes.claim.testing_label, off by default): while this node's claim pod runs (placed,
holding the node's GPUs for a measurement), the node carries ``fleetcanary.io/testing=true``, as IBM autopilot's
``gpuhealth: TESTING`` does, so a scheduler, a queue or a person can tell a node under a canary run from one a
tenant holds. Set and removed with merge patches through the exporter's Kubernetes client (nodes: patch, which
the deployer grants with the option; docs/deploy.md, "Scheduled runs").

Only what the exporter set is removed: the annotation ``fleetcanary.io/testing-set-by`` records that it set the
label (on the node, so a restarted exporter still knows); a label someone else put there is left alone.
An API failure is counted by the caller and retried on the next look."""
from __future__ import annotations

import logging

from fleetcanary.daemon.kube import MERGE_PATCH

log = logging.getLogger("fleetcanary.claim")
LABEL = "fleetcanary.io/testing"
MARK = "fleetcanary.io/testing-set-by"


class TestingLabel:
    def __init__(self, api, node: str, call) -> None:
        """api: a kubernetes CoreV1Api; call(operation, fn, *args, **kw): the claimer's counted, bounded call."""
        self.api = api
        self.node = node
        self.call = call
        self.applied: bool | None = None   # what the node was last brought to (None: not looked yet)

    def sync(self, running: bool) -> None:
        """Bring the node to ``running`` (the claim pod runs) if it is not there already. Never raises."""
        if running == self.applied:
            return
        try:
            node = self.call("read_node", self.api.read_node, self.node)
            meta = node.metadata
            labels, notes = meta.labels or {}, meta.annotations or {}
            ours = MARK in notes
            patch = None
            if running and not ours and labels.get(LABEL) != "true":
                patch = {"labels": {LABEL: "true"}, "annotations": {MARK: "claim"}}
            elif not running and ours:
                patch = {"annotations": {MARK: None}, **({"labels": {LABEL: None}} if LABEL in labels else {})}
            if patch is not None:
                patch["resourceVersion"] = meta.resource_version
                self.call("patch_node", self.api.patch_node, self.node, {"metadata": patch},
                          _content_type=MERGE_PATCH)
                log.info("node %s: %s %s (claim pod %s)", self.node, "labelled" if running else "removed the label",
                         f"{LABEL}=true", "running" if running else "gone")
        except Exception:  # noqa: BLE001 - counted by call(); the next look tries again
            return
        self.applied = running
