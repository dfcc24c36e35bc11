"""The demo's Kubernetes side: the smallest API server `fleetcanary remediate` and the exporters need, on loopback
over plain HTTP (as `kubectl proxy` serves one), holding the demo's nodes. It answers what they ask of a real one:
read and list Nodes, merge-patch a Node (RFC 7386; a patch from a stale resourceVersion gets 409), create an
Event (the controller); read this Node, list the pods on it (the demo's nodes run none), and strategic-merge-patch
the Node's status, whose conditions merge by type as the API server merges them (each exporter's node
conditions). Anything else is 404; a bad body is 400 with a Status. The demo reads back what was done to each node.

Why not the test suite's stand-in (tests/support/kube_api.py): it is test code, with TLS from trustme and schema
checks from kubernetes-validate, neither of which an installed fleetcanary has; this one has no dependency.
"""
from __future__ import annotations

import copy
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 1 << 20
NODE = re.compile(r"^/api/v1/nodes/([a-z0-9]([-a-z0-9.]*[a-z0-9])?)$")
NODE_STATUS = re.compile(r"^/api/v1/nodes/([a-z0-9]([-a-z0-9.]*[a-z0-9])?)/status$")
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
# The exporters' conditions (demo_fleet sets these in their configs): a health condition, True while the probes
# pass, and one per hard-fault class with this prefix, True while the fault is present (docs/node-conditions.md)
HEALTH_CONDITION = "FleetCanaryHealthy"
FAULT_PREFIX = "FleetCanary"
CAPACITY = {"cpu": "192", "memory": "2063937852Ki", "nvidia.com/gpu": "8"}  # an HGX H100's, as its kubelet says
EVENTS = re.compile(r"^/api/v1/namespaces/([a-z0-9-]+)/events$")


def merge(target: dict, patch: dict) -> None:
    """A JSON merge patch (RFC 7386) applied in place: null removes, objects merge (into an empty one where the
    target has none, so a null inside removes nothing and is not kept), anything else (lists too) replaces."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict):
            if not isinstance(target.get(k), dict):
                target[k] = {}
            merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


class Cluster:
    """The nodes (by name), the Events created, and the server that serves them on 127.0.0.1."""

    def __init__(self, names: list[str], labels: dict[str, str] | None = None) -> None:
        self.nodes = {n: {"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": n, "uid": f"demo-{i:04d}", "resourceVersion": "1",
                                       "labels": {"kubernetes.io/hostname": n, **(labels or {})}, "annotations": {}},
                          "spec": {},
                          "status": {"capacity": dict(CAPACITY), "allocatable": dict(CAPACITY),
                                     "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                                     "message": "kubelet is posting ready status"}]}}
                      for i, n in enumerate(names, 1)}
        self.events: list[dict] = []
        self.version = 1
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> Cluster:
        threading.Thread(target=self.server.serve_forever, name="demo-kube", daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def node(self, name: str) -> dict:
        with self.lock:
            return copy.deepcopy(self.nodes[name])

    def patch(self, name: str, body: dict) -> tuple[int, dict]:
        with self.lock:
            node = self.nodes.get(name)
            if node is None:
                return 404, status(404, "NotFound", f'nodes "{name}" not found')
            want = (body.get("metadata") or {}).get("resourceVersion")
            if want not in (None, "", node["metadata"]["resourceVersion"]):
                return 409, status(409, "Conflict", "the object has been modified; read it again")
            merge(node, body)
            self.version += 1
            node["metadata"]["resourceVersion"] = str(self.version)
            return 200, copy.deepcopy(node)


    def patch_status(self, name: str, body: dict) -> tuple[int, dict]:
        """A strategic merge patch of a Node's status: conditions merge by type (a type not in the patch stays),
        anything else as a merge patch. Only status changes, as through the real /status subresource."""
        st = body.get("status")
        conds = st.get("conditions", []) if isinstance(st, dict) else None
        if set(body) != {"status"} or not isinstance(conds, list) or not all(
                isinstance(c, dict) and isinstance(c.get("type"), str) and c.get("status") in ("True", "False",
                                                                                                 "Unknown")
                for c in conds):
            return 422, status(422, "Invalid", "a status patch holds only status, its conditions each with a type "
                                               "and a status of True, False or Unknown")
        with self.lock:
            node = self.nodes.get(name)
            if node is None:
                return 404, status(404, "NotFound", f'nodes "{name}" not found')
            stored = node.setdefault("status", {})
            merge(stored, {k: v for k, v in st.items() if k != "conditions"})
            have = stored.setdefault("conditions", [])
            for c in conds:
                old = next((x for x in have if x.get("type") == c["type"]), None)
                if old is None:
                    have.append(copy.deepcopy(c))
                else:
                    old.update(copy.deepcopy(c))
            self.version += 1
            node["metadata"]["resourceVersion"] = str(self.version)
            return 200, copy.deepcopy(node)


def status(code: int, reason: str, message: str) -> dict:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": reason, "message": message,
            "code": code}


def _handler(cluster: Cluster):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args) -> None:
            pass

        def _reply(self, code: int, obj: dict) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> dict | None:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY:
                self.rfile.read(min(length, MAX_BODY))
                self._reply(400, status(400, "BadRequest", f"a body of 1 to {MAX_BODY} bytes is required"))
                return None
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError:
                body = None
            if not isinstance(body, dict):
                self._reply(400, status(400, "BadRequest", "the body is not a JSON object"))
                return None
            return body

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            with cluster.lock:
                if path == "/api/v1/pods":   # the exporters' pod list: the demo's nodes run no pods
                    self._reply(200, {"apiVersion": "v1", "kind": "PodList",
                                      "metadata": {"resourceVersion": str(cluster.version)}, "items": []})
                    return
                if path == "/api/v1/nodes":
                    self._reply(200, {"apiVersion": "v1", "kind": "NodeList",
                                      "metadata": {"resourceVersion": str(cluster.version)},
                                      "items": copy.deepcopy(list(cluster.nodes.values()))})
                    return
                m = NODE.match(path)
                node = cluster.nodes.get(m.group(1)) if m else None
                if node is not None:
                    self._reply(200, copy.deepcopy(node))
                    return
            self._reply(404, status(404, "NotFound", f"{path} not found"))

        def do_PATCH(self) -> None:
            path = self.path.split("?", 1)[0]
            ctype = self.headers.get("Content-Type", "").split(";")[0].strip()
            m, ms = NODE.match(path), NODE_STATUS.match(path)
            if m is None and ms is None:
                self._reply(404, status(404, "NotFound", f"{self.path} not found"))
                return
            want = MERGE_PATCH if m is not None else STRATEGIC_PATCH
            if ctype != want:
                self._reply(415, status(415, "UnsupportedMediaType", f"only {want} is served here"))
                return
            body = self._body()
            if body is not None:
                self._reply(*(cluster.patch(m.group(1), body) if m is not None
                              else cluster.patch_status(ms.group(1), body)))

        def do_POST(self) -> None:
            m = EVENTS.match(self.path.split("?", 1)[0])
            if m is None:
                self._reply(404, status(404, "NotFound", f"{self.path} not found"))
                return
            body = self._body()
            if body is None:
                return
            with cluster.lock:
                body.setdefault("metadata", {})["namespace"] = m.group(1)
                cluster.events.append(copy.deepcopy(body))
            self._reply(201, body)

    return Handler


def touched(node: dict) -> list[str]:
    """What a controller set on a node, in words: taints, fleetcanary.io labels, a cordon."""
    spec, meta = node.get("spec") or {}, node.get("metadata") or {}
    out = [f"taint {t.get('key')}:{t.get('effect')}" for t in spec.get("taints") or []]
    out += [f"label {k}={v}" for k, v in sorted((meta.get("labels") or {}).items()) if k.startswith("fleetcanary.io/")]
    return out + (["cordoned"] if spec.get("unschedulable") else [])


def fault_conditions(node: dict) -> dict[str, dict]:
    """The exporter's per-fault conditions on a node, by type (the health condition and the kubelet's left out)."""
    return {c["type"]: c for c in (node.get("status") or {}).get("conditions") or []
            if c.get("type", "").startswith(FAULT_PREFIX) and c.get("type") != HEALTH_CONDITION}


def report(cluster: Cluster, bad: str) -> list[str]:
    """The summary's lines: what the bad node carries (the controller's taint and labels, its exporter's node
    conditions) and the Events about it; the healthy nodes untouched, and none with a fault condition True."""
    with cluster.lock:
        nodes = copy.deepcopy(cluster.nodes)
        events = copy.deepcopy(cluster.events)
    out = [f"  remediate (dry-run off) on {bad}: " + (", ".join(touched(nodes[bad])) or "nothing")]
    for e in events:
        if (e.get("involvedObject") or {}).get("name") == bad:
            out.append(f"    Event {e.get('type')} {e.get('reason')}: {e.get('message')}")
    faults = fault_conditions(nodes[bad])
    true = {t: c for t, c in faults.items() if c.get("status") == "True"}
    out.append(f"  node conditions on {bad} (from its exporter): {len(true)} of {len(faults)} fault conditions True"
               if faults else f"  node conditions on {bad}: none written by its exporter")
    for t, c in sorted(true.items()):
        out.append(f"    {t}=True {c.get('reason')}: {c.get('message')}")
    healthy = [n for n in nodes if n != bad]
    changed = [n for n in healthy if touched(nodes[n]) or any(
        (e.get("involvedObject") or {}).get("name") == n for e in events)]
    out.append(f"  remediate on healthy nodes: {len(healthy) - len(changed)} of {len(healthy)} untouched"
               + (f" ({', '.join(changed)} changed)" if changed else ""))
    odd = []
    for n in healthy:
        conds = fault_conditions(nodes[n])
        not_false = [f"{t}={c.get('status')}" for t, c in sorted(conds.items()) if c.get("status") != "False"]
        if not conds or not_false:
            odd.append(f"{n}: {', '.join(not_false) or 'none written'}")
    out.append(f"  node conditions on healthy nodes: {len(healthy) - len(odd)} of {len(healthy)} with every fault "
               "condition False" + (f" ({'; '.join(odd)})" if odd else ""))
    return out
