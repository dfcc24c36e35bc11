"""A local HTTPS server that speaks the slice of the Kubernetes API fleetcanary uses.

GET /api/v1/nodes/NAME, GET
/api/v1/pods?fieldSelector=... (spec.nodeName= and status.phase!= terms honoured, as the API server does), GET
/api/v1/namespaces/NS/pods?labelSelector=k=v,... (equality terms), PATCH /api/v1/nodes/NAME/status, and POST
/api/v1/namespaces/NS/pods, GET and DELETE /api/v1/namespaces/NS/pods/NAME (a created pod is Pending until the
test sets its phase; 409 if it exists). For the remediation controller: GET /api/v1/nodes (list), PATCH
/api/v1/nodes/NAME (a JSON merge patch; a stale metadata.resourceVersion answers 409), POST
/api/v1/namespaces/NS/events, and GET/POST/PUT coordination.k8s.io/v1 Leases (a PUT with a stale resourceVersion
answers 409). For DRA (resource.k8s.io, the versions in ``resource_versions``; others answer 404): GET
resourceslices?fieldSelector=spec.nodeName=NODE, GET resourceclaims (all namespaces), POST, GET and DELETE
namespaced resourceclaims (a created claim is validated against the first schema kubernetes-validate has with
resource.k8s.io/v1: DRA_SCHEMA_VERSION, see ``valid_dra``). Every node it patches, Event and Lease is validated
against the Kubernetes schema (422 if not valid, kept in ``invalid``). Every request must carry the bearer token
(over HTTPS; or, with plain_http, none is asked for, as `kubectl proxy` on loopback). A test can make an
operation answer 403/500 or hang (until released) to drive the client's error paths.
"""
from __future__ import annotations

import copy
import json
import threading
import urllib.parse

import trustme

from fleetcanary.offline.demo_kube import merge
from harness.servers import JsonHandler, ServerThread, tls_context

TOKEN = "test-service-account-token"
K8S_VERSION = "1.37.0"  # the Kubernetes schemas objects are validated against (kubernetes-validate)


def node(name: str, labels: dict[str, str], gpus: int | None) -> dict:
    cap = {"cpu": "64", "memory": "512Gi"} | ({"nvidia.com/gpu": str(gpus)} if gpus is not None else {})
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"capacity": cap, "allocatable": cap, "conditions": []}}


def pod(ns: str, name: str, node_name: str, gpus: int = 0, phase: str = "Running", init_gpus: int = 0,
        requests_only: bool = False) -> dict:
    def res(n):
        if not n:
            return {}
        return {"requests": {"nvidia.com/gpu": str(n)}} if requests_only else {"limits": {"nvidia.com/gpu": str(n)}}
    spec = {"nodeName": node_name, "containers": [{"name": "main", "image": "x", "resources": res(gpus)}]}
    if init_gpus:
        spec["initContainers"] = [{"name": "init", "image": "x", "resources": res(init_gpus)}]
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec, "status": {"phase": phase}}


class KubeAPI(ServerThread):
    def __init__(self, tmp_path, plain_http: bool = False) -> None:
        """plain_http: serve plain HTTP and take requests without a token, as `kubectl proxy` does on loopback
        (it adds its own credentials); every request's Authorization header is still recorded."""
        self.plain_http = plain_http
        self.ca = trustme.CA()
        cert = self.ca.issue_cert("127.0.0.1")
        self.ca_file = tmp_path / "ca.crt"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.token_file = tmp_path / "token"
        self.token_file.write_text(TOKEN)
        self.nodes: dict[str, dict] = {}
        self.pods: list[dict] = []
        self.fail: dict[str, int] = {}          # operation -> HTTP status to answer
        self.hang: set[str] = set()             # operations that do not answer until release()
        self.patches: list[tuple[str, dict]] = []   # (content type, body)
        self.invalid: list[str] = []            # status patches refused (422), why
        self.requests: list[tuple[str, str, str]] = []  # (method, path+query, authorization)
        self.created: list[dict] = []           # pods created through the API, as stored
        self.deleted: list[str] = []            # names of pods deleted through the API
        self.clock = None                       # a callable for creationTimestamp (default: now)
        self.node_patches: list[tuple[str, dict]] = []  # (node name, merge patch) applied to nodes
        self.events: list[dict] = []            # Events created, as stored
        self.leases: dict[tuple[str, str], dict] = {}   # (namespace, name) -> Lease
        self.lease_writes: list[dict] = []      # Leases created or replaced, as stored
        self.invalid: list[str] = []            # what the schema refused, one line each
        self.resource_versions: tuple[str, ...] = ("v1",)  # resource.k8s.io versions served (() = no DRA)
        self.resource_slices: list[dict] = []
        self.resource_claims: list[dict] = []
        self.claims_created: list[dict] = []
        self._version = 100
        self._write_lock = threading.Lock()     # a read-check-write of a resourceVersion is atomic, as in etcd
        self._release = threading.Event()
        api = self

        class Handler(JsonHandler):

            def _status(self, code: int, reason: str) -> None:
                self._reply(code, {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": reason,
                                   "message": f"{reason} by the test server", "code": code})

            def _handle(self, op: str, fn) -> None:
                api.requests.append((self.command, self.path, self.headers.get("Authorization", "")))
                scheme, _, token = self.headers.get("Authorization", "").partition(" ")
                if not api.plain_http and (scheme.lower() != "bearer" or token != TOKEN):  # case-insensitive
                    self._status(401, "Unauthorized")
                elif op in api.hang:
                    api._release.wait(timeout=60)
                elif op in api.fail:
                    code = api.fail[op]
                    self._status(code, {403: "Forbidden", 500: "InternalError"}.get(code, "Error"))
                else:
                    fn()

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                if url.path == "/api/v1/nodes":
                    self._handle("list_nodes", lambda: self._reply(200, {
                        "apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": str(api._version)},
                        "items": [api.versioned(n) for n in api.nodes.values()]}))
                elif url.path.startswith(LEASES):
                    ns, name = lease_path(url.path)
                    self._handle("read_lease", lambda: self._reply(200, api.leases[(ns, name)])
                                 if (ns, name) in api.leases else self._status(404, "NotFound"))
                elif url.path.startswith("/api/v1/nodes/"):
                    name = url.path.rsplit("/", 1)[1]
                    self._handle("read_node", lambda: self._reply(200, api.versioned(api.nodes[name]))
                                 if name in api.nodes
                                 else self._status(404, "NotFound"))
                elif url.path == "/api/v1/pods":
                    sel = urllib.parse.parse_qs(url.query).get("fieldSelector", [""])[0]
                    self._handle("list_pods", lambda: self._reply(200, {
                        "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"},
                        "items": [p for p in api.pods if selects(sel, p)]}))
                elif url.path.startswith("/api/v1/namespaces/") and url.path.split("/")[5:6] == ["pods"] \
                        and len(url.path.split("/")) == 7:
                    ns, name = url.path.split("/")[4], url.path.split("/")[6]
                    self._handle("read_pod", lambda: self._reply(200, p) if (p := api.pod(ns, name))
                                 else self._status(404, "NotFound"))
                elif url.path.startswith(DRA):
                    self._dra_get(url)
                elif url.path.startswith("/api/v1/namespaces/") and url.path.endswith("/pods"):
                    ns = url.path.split("/")[4]
                    sel = urllib.parse.parse_qs(url.query).get("labelSelector", [""])[0]
                    self._handle("list_namespaced_pods", lambda: self._reply(200, {
                        "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"},
                        "items": [p for p in api.pods if p["metadata"].get("namespace") == ns
                                  and labels_match(sel, p["metadata"].get("labels") or {})]}))
                else:
                    self._status(404, "NotFound")

            def _dra_get(self, url) -> None:
                version, _, rest = url.path.removeprefix(DRA).partition("/")
                if version not in api.resource_versions:   # recorded like any request
                    self._handle("resource_version_not_served", lambda: self._status(404, "NotFound"))
                    return
                sel = urllib.parse.parse_qs(url.query).get("fieldSelector", [""])[0]
                parts = rest.split("/")
                if rest == "resourceslices":
                    self._handle("list_resourceslices", lambda: self._reply(200, {
                        "apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceSliceList",
                        "metadata": {"resourceVersion": "1"},
                        "items": [s for s in api.resource_slices if selects(sel, s)]}))
                elif rest == "resourceclaims":
                    self._handle("list_resourceclaims", lambda: self._reply(200, {
                        "apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaimList",
                        "metadata": {"resourceVersion": "1"}, "items": list(api.resource_claims)}))
                elif len(parts) == 4 and parts[0] == "namespaces" and parts[2] == "resourceclaims":
                    self._handle("read_resourceclaim", lambda: self._reply(200, c) if (
                        c := api.claim(parts[1], parts[3])) else self._status(404, "NotFound"))
                else:
                    self._status(404, "NotFound")

            def _create_claim(self, ns: str, body: dict) -> None:
                if not api.valid_dra(body):
                    self._status(422, "Invalid")
                    return
                name = body["metadata"]["name"]
                if api.claim(ns, name):
                    self._status(409, "AlreadyExists")
                    return
                created = {**body, "metadata": {**body["metadata"], "namespace": ns, "uid": f"uid-claim-{name}",
                                                "creationTimestamp": api.now()}}
                api.resource_claims.append(created)
                api.claims_created.append(created)
                self._reply(201, created)

            def _body(self) -> dict:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")

            def do_POST(self):
                url = urllib.parse.urlsplit(self.path)
                body = self._body()
                ns = url.path.split("/")[4]
                if url.path.startswith(LEASES):
                    self._handle("create_lease", lambda: self._write_lease(lease_path(url.path)[0], body, True))
                    return
                if url.path.startswith(DRA) and url.path.endswith("/resourceclaims"):
                    self._handle("create_resourceclaim", lambda: self._create_claim(url.path.split("/")[5], body))
                    return
                if url.path == f"/api/v1/namespaces/{ns}/events":
                    self._handle("create_event", lambda: self._create_event(ns, body))
                    return

                def create():
                    name = body["metadata"]["name"]
                    if api.pod(ns, name):
                        self._status(409, "AlreadyExists")
                        return
                    created = {**body, "metadata": {**body["metadata"], "namespace": ns, "uid": f"uid-{name}",
                                                    "creationTimestamp": api.now()},
                               "status": {"phase": "Pending"}}
                    api.pods.append(created)
                    api.created.append(created)
                    self._reply(201, created)
                self._handle("create_pod", create)

            def do_DELETE(self):
                url = urllib.parse.urlsplit(self.path)
                if url.path.startswith(DRA):
                    parts = url.path.split("/")   # /apis/resource.k8s.io/V/namespaces/NS/resourceclaims/NAME

                    def delete_claim():
                        c = api.claim(parts[5], parts[7])
                        if not c:
                            self._status(404, "NotFound")
                            return
                        api.resource_claims.remove(c)
                        self._reply(200, c)
                    self._handle("delete_resourceclaim", delete_claim)
                    return
                ns, name = url.path.split("/")[4], url.path.split("/")[6]

                def delete():
                    p = api.pod(ns, name)
                    if not p:
                        self._status(404, "NotFound")
                        return
                    api.pods.remove(p)
                    api.deleted.append(name)
                    self._reply(200, p)
                self._handle("delete_pod", delete)

            def do_PUT(self):
                url = urllib.parse.urlsplit(self.path)
                body = self._body()
                self._handle("update_lease", lambda: self._write_lease(lease_path(url.path)[0], body, False))

            def _write_lease(self, ns: str, body: dict, create: bool) -> None:
                with api._write_lock:
                    key = (ns, (body.get("metadata") or {}).get("name", ""))
                    old = api.leases.get(key)
                    if create and old is not None:
                        self._status(409, "AlreadyExists")
                        return
                    if not create and old is None:
                        self._status(404, "NotFound")
                        return
                    if not create and body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
                        self._status(409, "Conflict")
                        return
                    if not api.valid(body, "Lease"):
                        self._status(422, "Invalid")
                        return
                    stored = {**body, "metadata": {**body["metadata"], "namespace": ns,
                                                   "resourceVersion": api.next_version()}}
                    api.leases[key] = stored
                    api.lease_writes.append(stored)
                self._reply(201 if create else 200, stored)

            def _create_event(self, ns: str, body: dict) -> None:
                with api._write_lock:
                    name = (body.get("metadata") or {}).get("name")
                    if any(e["metadata"]["name"] == name for e in api.events):
                        self._status(409, "AlreadyExists")
                        return
                    if not api.valid(body, "Event"):
                        self._status(422, "Invalid")
                        return
                    stored = {**body, "metadata": {**body["metadata"], "namespace": ns,
                                                   "resourceVersion": api.next_version()}}
                    api.events.append(stored)
                self._reply(201, stored)

            def _patch_node(self, name: str, body: dict) -> None:
                with api._write_lock:
                    if name not in api.nodes:
                        self._status(404, "NotFound")
                        return
                    if self.headers.get("Content-Type") != "application/merge-patch+json":
                        self._status(415, "UnsupportedMediaType")
                        return
                    current = api.versioned(api.nodes[name])
                    want = (body.get("metadata") or {}).get("resourceVersion")
                    if want and want != current["metadata"]["resourceVersion"]:
                        self._status(409, "Conflict")
                        return
                    patched = copy.deepcopy(current)
                    merge(patched, body)
                    patched["metadata"]["resourceVersion"] = api.next_version()
                    if not api.valid(patched, "Node"):
                        self._status(422, "Invalid")
                        return
                    api.nodes[name] = patched
                    api.node_patches.append((name, body))
                self._reply(200, patched)

            def do_PATCH(self):
                url = urllib.parse.urlsplit(self.path)
                body = self._body()
                if url.path.startswith("/api/v1/nodes/") and not url.path.endswith("/status"):
                    name = url.path.split("/")[4]
                    self._handle("patch_node", lambda: self._patch_node(name, body))
                    return
                name = url.path.split("/")[4] if url.path.endswith("/status") else ""

                def ok():
                    api.patches.append((self.headers.get("Content-Type", ""), body))
                    stored = api.nodes.setdefault(name, node(name, {}, None))
                    problem = status_patch_problem(name, body, self.headers.get("Content-Type", ""))
                    if problem:
                        api.invalid.append(problem)
                        self._reply(422, {"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                          "reason": "Invalid", "message": problem, "code": 422})
                        return
                    conds = stored["status"].setdefault("conditions", [])
                    for c in body["status"].get("conditions", []):   # strategic merge: by type
                        old = next((x for x in conds if x["type"] == c["type"]), None)
                        old.update(c) if old is not None else conds.append(dict(c))
                    self._reply(200, stored)
                self._handle("patch_node_status", ok)

        # hung requests end first
        super().__init__(Handler, tls=None if plain_http else tls_context(cert), on_close=[self.release])

    def next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def versioned(self, n: dict) -> dict:
        """The node as the API server holds it: with a resourceVersion (a test's node gets one when first read)."""
        if not n["metadata"].get("resourceVersion"):
            n["metadata"]["resourceVersion"] = self.next_version()
        return n

    def valid(self, obj: dict, kind: str) -> bool:
        import kubernetes_validate

        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            self.invalid.append(f"{kind}: {str(exc).splitlines()[0][:300]}")
            return False
        return True

    def claim(self, ns: str, name: str) -> dict | None:
        return next((c for c in self.resource_claims if c["metadata"].get("namespace") == ns
                     and c["metadata"].get("name") == name), None)

    def valid_dra(self, obj: dict) -> bool:
        """A ResourceClaim (or a pod that uses one) checked against DRA_SCHEMA_VERSION's schema."""
        import kubernetes_validate

        try:
            kubernetes_validate.validate(obj, DRA_SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            self.invalid.append(f"{obj.get('kind')}: {str(exc).splitlines()[0][:300]}")
            return False
        return True

    def pod(self, ns: str, name: str) -> dict | None:
        return next((p for p in self.pods if p["metadata"].get("namespace") == ns
                     and p["metadata"].get("name") == name), None)

    def now(self) -> str:
        import datetime

        t = self.clock() if self.clock else datetime.datetime.now(datetime.timezone.utc).timestamp()
        return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    @property
    def environ(self) -> dict[str, str]:
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.port)}

    def release(self) -> None:
        self._release.set()


LEASES = "/apis/coordination.k8s.io/v1/namespaces/"
DRA = "/apis/resource.k8s.io/"
DRA_SCHEMA_VERSION = "1.34.0"  # the first release with resource.k8s.io/v1 (GA); tests also check the newest


def lease_path(path: str) -> tuple[str, str]:
    """(namespace, name or "") of a Lease URL."""
    parts = path.removeprefix(LEASES).split("/")
    return parts[0], parts[2] if len(parts) > 2 else ""


def status_patch_problem(name: str, body: dict, content_type: str) -> str:
    """Why the API server would refuse this node status patch ("" if it would not): a strategic merge patch
    whose status validates as a Node's against the Kubernetes schema (tests/test_deploy.py's version)."""
    import kubernetes_validate

    if content_type != "application/strategic-merge-patch+json":
        return f"unexpected content type {content_type}"
    if set(body) != {"status"}:
        return f"a status patch touches {sorted(body)}"
    try:
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                                      "status": body["status"]}, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"invalid: {e.message}"
    types = [c.get("type") for c in body["status"].get("conditions", [])]
    if len(types) != len(set(types)):
        return f"duplicate condition types {types}"
    return ""


def selects(selector: str, p: dict) -> bool:
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, val = term.split("!=", 1)
            if field(p, key) == val:
                return False
        else:
            key, val = term.split("=", 1)
            if field(p, key) != val:
                return False
    return True


def labels_match(selector: str, labels: dict) -> bool:
    terms = [t.split("=", 1) for t in filter(None, selector.split(","))]
    return all(labels.get(k) == v for k, v in terms)


def field(p: dict, path: str):
    cur = p
    for part in path.split("."):
        cur = (cur or {}).get(part)
    return cur
