"""Network namespaces joined by a Linux bridge: a small multi-node fleet on one machine.

    with NamespaceNet(4) as net:
        a, b = net.nodes[:2]
        net.run(a, ["ip", "-br", "addr"])
        p = net.popen(a, [...])               # a process inside a's namespace (close() kills what is left)
        net.limit(b, rate_bits=50_000_000)    # tc tbf on b's link, both directions
        net.cut(b); net.restore(b)            # the cable out and back in

Tests use tests/support/netns.py's subclass, which adds ``start_daemon`` (a real `fleetcanary run`
inside a node's namespace) and turns a missing prerequisite into a skip; benchmarks/fabric.py uses
this class directly.

Layout (everything is created, owned and removed by one NamespaceNet):

- a bridge ``fc<tag>br`` in the root namespace holding ``169.254.<x>.1/24``, so the root
  namespace (where a test's Prometheus runs) reaches every node;
- per node a namespace ``fcnet-<tag>-<i>`` with loopback up and ``eth0`` =
  ``169.254.<x>.<10+i>/24``, the far end of a veth pair whose root-side end ``fc<tag>h<i>``
  is a port of the bridge.

Addresses come only from link-local 169.254.0.0/16, one /24 per NamespaceNet that no
address of the root namespace and no other live NamespaceNet uses (never 169.254.169.x,
the cloud metadata address). Nothing is routed: the namespaces have no default route and
the bridge has no physical port, so no packet leaves the machine.

``<tag>`` is four random hex digits chosen under a lock so that parallel test runs never
collide. A registry file per NamespaceNet (/run/fleetcanary-netns/<tag>.json: owner pid and
start time, the names it created) is written before anything is created; ``close()`` (also
called at interpreter exit) stops daemons, kills every process left in the namespaces,
deletes namespaces, veths and bridge, waits until they are gone and removes the file.
``cleanup_stale()`` (run by every new NamespaceNet) removes what an owner that died without
closing (SIGKILL, a crashed runner) left behind: the registry's names, and any namespace or
link with this harness's name pattern that no live registry claims.

Needs root and the iproute2 binaries ``ip`` and ``tc``; missing: ``Unavailable`` (tests turn it
into a skip, or a failure under CI=true).
"""
from __future__ import annotations

import atexit
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .poll import wait_for

REGISTRY = Path("/run/fleetcanary-netns")
NS_PREFIX = "fcnet-"
_NS_RE = re.compile(r"^fcnet-([0-9a-f]{4})-\d+$")
_LINK_RE = re.compile(r"^fc([0-9a-f]{4})(br|h\d+|n\d+)$")  # n: a veth end not yet moved
NS_IF = "eth0"
DAEMON_PORT = 9835


class Unavailable(RuntimeError):
    """What the harness needs is missing on this machine: root, or an iproute2 binary."""


def _require_binary(name: str) -> None:
    if not shutil.which(name):
        raise Unavailable(f"{name} is not installed (Debian package iproute2; `make test` installs it as root)")


@dataclass(frozen=True)
class Node:
    index: int
    name: str          # the member / node name daemons run under (node-<i> unless given)
    netns: str         # the network namespace
    ip: str            # eth0's address inside the namespace
    host_if: str       # the root-side veth end (a bridge port)


def _run(argv: list[str], check: bool = True, timeout: float = 30.0, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (pid + start time name a process; a pid alone
    may be reused)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _owner_alive(entry: dict) -> bool:
    return entry.get("start_time") is not None and _start_time(int(entry.get("pid", 0))) == entry["start_time"]


def _netns_list() -> list[str]:
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).stdout.splitlines() if line.strip()]


def _links() -> list[str]:
    out = _run(["ip", "-o", "link", "show"]).stdout
    return [line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines() if line.strip()]


def _netns_pids(netns: str) -> list[int]:
    r = _run(["ip", "netns", "pids", netns], check=False)
    return [int(x) for x in r.stdout.split() if x.isdigit()]


def _kill_netns_processes(netns: str, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, every process inside one of this harness's namespaces (all were started in
    it by this harness: daemons and their workers)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _netns_pids(netns)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for p in _netns_pids(netns) if _alive(p)]
            if pids:
                time.sleep(0.05)
        if not pids:
            return


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _remove(netns: list[str], links: list[str]) -> None:
    """Delete namespaces (their processes first) and root-side links; wait until all are gone. Deleting a
    namespace destroys its veth end and so the pair, but asynchronously: delete the root-side ends too."""
    for ns in netns:
        if ns in _netns_list():
            _kill_netns_processes(ns)
            _run(["ip", "netns", "del", ns], check=False)
    for link in links:
        _run(["ip", "link", "del", link], check=False)
    wait_for(lambda: not (set(netns) & set(_netns_list())) and not (set(links) & set(_links())),
             timeout=30, interval=0.05, what=f"namespaces {netns} and links {links} to disappear")


class _Lock:
    """An exclusive lock over the registry (tag and subnet choice, stale cleanup)."""

    def __enter__(self):
        REGISTRY.mkdir(parents=True, exist_ok=True)
        self.f = open(REGISTRY / ".lock", "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def _registry_entries() -> dict[str, dict]:
    out = {}
    for p in REGISTRY.glob("*.json"):
        try:
            out[p.stem] = json.loads(p.read_text())
        except (OSError, ValueError):
            out[p.stem] = {}
    return out


def cleanup_stale() -> list[str]:
    """Remove what dead owners left: registry entries whose owner process is gone, and namespaces or links
    of this harness's name pattern that no live registry entry claims. The names removed."""
    removed: list[str] = []
    with _Lock():
        entries = _registry_entries()
        live = {tag for tag, e in entries.items() if _owner_alive(e)}
        for tag, e in entries.items():
            if tag in live:
                continue
            ns, links = list(e.get("netns", [])), list(e.get("links", []))
            _remove(ns, links)
            removed += ns + links
            (REGISTRY / f"{tag}.json").unlink(missing_ok=True)
        orphans_ns = [n for n in _netns_list() if (m := _NS_RE.match(n)) and m.group(1) not in live]
        orphans_links = [n for n in _links() if (m := _LINK_RE.match(n)) and m.group(1) not in live]
        if orphans_ns or orphans_links:
            _remove(orphans_ns, orphans_links)
            removed += orphans_ns + orphans_links
    return removed


def _used_subnets() -> set[int]:
    """Third octets of 169.254.x.0/24 in use: any root-namespace address there, and every registry."""
    used = {169}
    for line in _run(["ip", "-4", "-o", "addr", "show"]).stdout.splitlines():
        m = re.search(r"inet (169\.254\.(\d+)\.\d+)/", line)
        if m:
            used.add(int(m.group(2)))
    for e in _registry_entries().values():
        if "subnet" in e:
            used.add(int(e["subnet"]))
    return used


class NamespaceNet:
    """N network namespaces on one bridge; see the module docstring."""

    def __init__(self, n: int, names: list[str] | None = None) -> None:
        if os.geteuid() != 0:
            raise Unavailable("network namespaces need root")
        _require_binary("ip")
        _require_binary("tc")
        if n < 1 or n > 200:
            raise ValueError("1..200 namespaces")
        names = list(names) if names else [f"node-{i}" for i in range(n)]
        if len(names) != n or len(set(names)) != n:
            raise ValueError("one unique name per namespace")
        cleanup_stale()
        self.daemons: list = []   # processes with a stop() (tests' daemons), stopped first by close()
        self._closed = False
        with _Lock():
            existing_ns, existing_links = set(_netns_list()), set(_links())
            taken = set(_registry_entries())
            while True:
                tag = secrets.token_hex(2)
                if tag not in taken and f"fc{tag}br" not in existing_links and \
                        not any(x.startswith(f"{NS_PREFIX}{tag}-") for x in existing_ns):
                    break
            free = [x for x in range(64, 251) if x not in _used_subnets()]
            if not free:
                raise RuntimeError("no free 169.254.x.0/24 left")
            self.subnet = secrets.choice(free)
            self.tag = tag
            self.prefix = f"{NS_PREFIX}{tag}"
            self.bridge = f"fc{tag}br"
            self.bridge_ip = f"169.254.{self.subnet}.1"
            self.nodes = [Node(i, names[i], f"{self.prefix}-{i}", f"169.254.{self.subnet}.{10 + i}", f"fc{tag}h{i}")
                          for i in range(n)]
            self._registry = REGISTRY / f"{tag}.json"
            # Written before anything exists, so a crash at any point leaves a claim that cleanup_stale() honours.
            self._registry.write_text(json.dumps({
                "pid": os.getpid(), "start_time": _start_time(os.getpid()), "subnet": self.subnet,
                "netns": [x.netns for x in self.nodes], "links": [self.bridge] + [x.host_if for x in self.nodes]}))
        atexit.register(self.close)
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        for ip in [self.bridge_ip] + [x.ip for x in self.nodes]:
            assert ipaddress.ip_address(ip) in ipaddress.ip_network("169.254.0.0/16")

    # ------------------------------------------------------------------ build
    def _create(self) -> None:
        ip = ["ip"]
        _run(ip + ["link", "add", self.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        _run(ip + ["addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge])
        _run(ip + ["link", "set", self.bridge, "up"])
        for node in self.nodes:
            peer = f"fc{self.tag}n{node.index}"   # renamed eth0 once inside the namespace
            _run(ip + ["netns", "add", node.netns])
            _run(ip + ["link", "add", node.host_if, "type", "veth", "peer", "name", peer])
            _run(ip + ["link", "set", peer, "netns", node.netns])
            _run(ip + ["-n", node.netns, "link", "set", peer, "name", NS_IF])
            _run(ip + ["-n", node.netns, "link", "set", "lo", "up"])
            _run(ip + ["-n", node.netns, "addr", "add", f"{node.ip}/24", "dev", NS_IF])
            _run(ip + ["-n", node.netns, "link", "set", NS_IF, "up"])
            _run(ip + ["link", "set", node.host_if, "master", self.bridge])
            _run(ip + ["link", "set", node.host_if, "up"])
        wait_for(lambda: all(self.link_up(n) for n in self.nodes), timeout=30, what="every veth up")

    def __enter__(self) -> NamespaceNet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def node(self, which: int | str | Node) -> Node:
        if isinstance(which, Node):
            return which
        if isinstance(which, int):
            return self.nodes[which]
        return next(n for n in self.nodes if which in (n.name, n.netns))

    # ------------------------------------------------------------------ commands
    def exec_argv(self, node, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.node(node).netns, *argv]

    def run(self, node, argv: list[str], check: bool = True, timeout: float = 60.0,
            **kw) -> subprocess.CompletedProcess:
        """Run a command inside the node's namespace; its CompletedProcess (text)."""
        return _run(self.exec_argv(node, argv), check=check, timeout=timeout, **kw)

    def popen(self, node, argv: list[str], **kw) -> subprocess.Popen:
        """Start a command inside the node's namespace, in its own session. `ip netns exec` execs the
        command, so the Popen's pid is the command's; close() kills whatever is still in the namespace."""
        return subprocess.Popen(self.exec_argv(node, argv), start_new_session=True, **kw)

    # ------------------------------------------------------------------ link faults
    def limit(self, node, rate_bits: int, burst_bytes: int | None = None, latency_ms: int = 100) -> None:
        """A tc token-bucket (tbf) rate limit on the node's link in both directions: egress of eth0 inside
        the namespace (what the node sends) and egress of the bridge-side veth (what it receives)."""
        n = self.node(node)
        burst = burst_bytes or max(16 * 1024, rate_bits // 8 // 100)   # >= rate / HZ for any HZ <= 100
        spec = ["root", "tbf", "rate", f"{rate_bits}bit", "burst", str(burst), "latency", f"{latency_ms}ms"]
        self.run(n, ["tc", "qdisc", "replace", "dev", NS_IF, *spec])
        _run(["tc", "qdisc", "replace", "dev", n.host_if, *spec])

    def unlimit(self, node) -> None:
        n = self.node(node)
        for argv in (self.exec_argv(n, ["tc", "qdisc", "del", "dev", NS_IF, "root"]),
                     ["tc", "qdisc", "del", "dev", n.host_if, "root"]):
            r = _run(argv, check=False)
            if r.returncode != 0 and "No such file" not in r.stderr and "Cannot delete qdisc with handle of zero" \
                    not in r.stderr:
                raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")

    def qdiscs(self, node) -> tuple[str, str]:
        """`tc qdisc show` of (the namespace's eth0, the bridge-side veth)."""
        n = self.node(node)
        return (self.run(n, ["tc", "qdisc", "show", "dev", NS_IF]).stdout,
                _run(["tc", "qdisc", "show", "dev", n.host_if]).stdout)

    def cut(self, node) -> None:
        """Pull the node's cable: the bridge-side veth goes down. Inside, eth0 keeps its address and route
        (NO-CARRIER), so the node's sockets see silence, not an error: TCP retransmits until a timeout."""
        _run(["ip", "link", "set", "dev", self.node(node).host_if, "down"])

    def restore(self, node) -> None:
        n = self.node(node)
        _run(["ip", "link", "set", "dev", n.host_if, "up"])
        wait_for(lambda: self.link_up(n), timeout=30, what=f"{n.name}'s link up again")

    def link_up(self, node) -> bool:
        n = self.node(node)
        out = self.run(n, ["ip", "-o", "link", "show", "dev", NS_IF]).stdout
        return "LOWER_UP" in out and ",UP" in out

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            for d in self.daemons:
                d.stop()
        finally:
            try:
                _remove([n.netns for n in self.nodes], [n.host_if for n in self.nodes] + [self.bridge])
            finally:
                self._registry.unlink(missing_ok=True)
                atexit.unregister(self.close)
