"""The demo's Kubernetes side: the smallest API server `fleetcanary remediate` needs, on loopback over plain HTTP
(as `kubectl proxy` serves one), holding the demo's nodes. It answers what the controller asks of a real one:
read and list Nodes, merge-patch a Node (RFC 7386; a patch from a stale resourceVersion gets 409), create an
Event. Anything else is 404; a bad body is 400 with a Status. The demo reads back what was done to each node.

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
EVENTS = re.compile(r"^/api/v1/namespaces/([a-z0-9-]+)/events$")


def merge(target: dict, patch: dict) -> None:
    """A JSON merge patch (RFC 7386) applied in place: null removes, objects merge, anything else replaces."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


class Cluster:
    """The nodes (by name), the Events created, and the server that serves them on 127.0.0.1."""

    def __init__(self, names: list[str], labels: dict[str, str] | None = None) -> None:
        self.nodes = {n: {"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": n, "uid": f"demo-{i:04d}", "resourceVersion": "1",
                                       "labels": {"kubernetes.io/hostname": n, **(labels or {})}, "annotations": {}},
                          "spec": {}} for i, n in enumerate(names, 1)}
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
            m = NODE.match(self.path.split("?", 1)[0])
            if m is None:
                self._reply(404, status(404, "NotFound", f"{self.path} not found"))
                return
            if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/merge-patch+json":
                self._reply(415, status(415, "UnsupportedMediaType", "only merge patches are served"))
                return
            body = self._body()
            if body is not None:
                self._reply(*cluster.patch(m.group(1), body))

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


def report(cluster: Cluster, bad: str) -> list[str]:
    """The summary's lines: what the bad node carries and the Events about it, and the healthy nodes untouched."""
    with cluster.lock:
        nodes = copy.deepcopy(cluster.nodes)
        events = copy.deepcopy(cluster.events)
    out = [f"  remediate (dry-run off) on {bad}: " + (", ".join(touched(nodes[bad])) or "nothing")]
    for e in events:
        if (e.get("involvedObject") or {}).get("name") == bad:
            out.append(f"    Event {e.get('type')} {e.get('reason')}: {e.get('message')}")
    healthy = [n for n in nodes if n != bad]
    changed = [n for n in healthy if touched(nodes[n]) or any(
        (e.get("involvedObject") or {}).get("name") == n for e in events)]
    out.append(f"  remediate on healthy nodes: {len(healthy) - len(changed)} of {len(healthy)} untouched"
               + (f" ({', '.join(changed)} changed)" if changed else ""))
    return out
