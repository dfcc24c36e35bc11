"""The network-namespace harness (harness/netns.py) that the multi-node tests stand on:
nodes reach each other and the root namespace over the bridge on link-local addresses only,
the rate limit and the cut act on the link, a daemon runs inside a namespace, and nothing is
left behind, not even by an owner killed with SIGKILL."""
from __future__ import annotations

import ipaddress
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.netns import REGISTRY, _links, _netns_list, cleanup_stale
from tests.conftest import SMALL_HOST_BW
from tests.support.helpers import http_get, pid_alive, wait_for
from tests.support.netns import NamespaceNet

ROOT = Path(__file__).resolve().parent.parent
LINK_LOCAL = ipaddress.ip_network("169.254.0.0/16")

# A one-shot TCP echo server inside a namespace: prints "ready" once listening.
ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(8); print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(c.recv(64)); c.close()
"""
CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
c.sendall(b"hello"); print(c.recv(64).decode())
"""


def gone(net: NamespaceNet) -> bool:
    names = {n.netns for n in net.nodes}
    links = {n.host_if for n in net.nodes} | {net.bridge}
    return not (names & set(_netns_list())) and not (links & set(_links()))


@pytest.fixture
def net():
    n = NamespaceNet(3)
    yield n
    n.close()
    assert gone(n)


def echo_server(net: NamespaceNet, node, port: int = 7000) -> subprocess.Popen:
    p = net.popen(node, [sys.executable, "-I", "-c", ECHO, net.node(node).ip, str(port)],
                  stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def client(net: NamespaceNet, node, ip: str, port: int = 7000, timeout: float = 10.0) -> subprocess.CompletedProcess:
    return net.run(node, [sys.executable, "-I", "-c", CLIENT, ip, str(port), str(timeout)], check=False,
                   timeout=timeout + 30)


def test_nodes_reach_each_other_and_the_root_namespace_on_link_local_addresses_only(net):
    a, b, c = net.nodes
    assert len({n.netns for n in net.nodes}) == 3 and all(n.netns.startswith(net.prefix) for n in net.nodes)
    for n in net.nodes:
        addrs = net.run(n, ["ip", "-4", "-o", "addr", "show"]).stdout
        inet = [line.split()[3] for line in addrs.splitlines()]
        assert sorted(inet) == sorted(["127.0.0.1/8", f"{n.ip}/24"]), inet
        assert ipaddress.ip_address(n.ip) in LINK_LOCAL
        routes = net.run(n, ["ip", "-4", "route", "show"]).stdout
        assert "default" not in routes and routes.strip().startswith(f"169.254.{net.subnet}.0/24 dev eth0"), routes
        assert "UP" in net.run(n, ["ip", "-o", "link", "show", "dev", "lo"]).stdout
    assert ipaddress.ip_address(net.bridge_ip) in LINK_LOCAL and net.subnet != 169
    # Nothing of this harness joins a physical interface: the bridge's only ports are the veths.
    ports = subprocess.run(["ip", "-o", "link", "show", "master", net.bridge], capture_output=True, text=True).stdout
    assert sorted(line.split(":")[1].strip().split("@")[0] for line in ports.splitlines()) == \
        sorted(n.host_if for n in net.nodes)

    server = echo_server(net, b)
    assert client(net, a, b.ip).stdout.strip() == "hello"             # namespace to namespace over the bridge
    assert client(net, c, b.ip).stdout.strip() == "hello"
    with socket.create_connection((b.ip, 7000), timeout=10) as s:     # the root namespace (where Prometheus runs)
        s.sendall(b"root")
        assert s.recv(64) == b"root"
    # The namespace's own loopback is its own: b's server is not on a's 127.0.0.1.
    assert client(net, a, "127.0.0.1", timeout=5).returncode != 0
    server.kill()
    server.wait()


def test_rate_limit_sits_on_both_directions_and_cut_link_is_silent_until_restored(net):
    a, b, _ = net.nodes
    net.limit(b, rate_bits=20_000_000)
    inside, bridge_side = net.qdiscs(b)
    assert "tbf" in inside and "rate 20Mbit" in inside, inside
    assert "tbf" in bridge_side and "rate 20Mbit" in bridge_side, bridge_side
    assert "tbf" not in "".join(net.qdiscs(a))
    server = echo_server(net, b)
    assert client(net, a, b.ip).stdout.strip() == "hello"             # limited, not cut
    net.unlimit(b)
    assert "tbf" not in "".join(net.qdiscs(b))
    net.unlimit(b)                                                     # idempotent

    net.cut(b)
    assert not net.link_up(b)
    r = client(net, a, b.ip, timeout=3)
    assert r.returncode != 0 and "timed out" in r.stderr, r.stderr   # silence, not a refusal: a timeout
    net.restore(b)
    assert wait_for(lambda: client(net, a, b.ip).stdout.strip() == "hello", timeout=30, what="link restored")
    server.kill()
    server.wait()


def test_a_daemon_runs_inside_a_namespace_and_close_leaves_nothing(tmp_path):
    net = NamespaceNet(2)
    try:
        d = net.start_daemon(net.nodes[0], {"probes": {"host_memory_bandwidth": SMALL_HOST_BW}}, tmp_path / "d0")
        stray = net.popen(net.nodes[1], ["sleep", "1000"])
        pids = subprocess.run(["ip", "netns", "pids", net.nodes[0].netns], capture_output=True, text=True).stdout
        assert d.proc.pid in [int(x) for x in pids.split()]             # ip netns exec execs: the daemon itself
        assert http_get(d.url + "/healthz")[0] == 200                  # reached from the root namespace
        assert "127.0.0.1" not in d.url
        # The first run comes within one interval (30 s; the first runs are spread by a per-node phase):
        # wait for it, whatever its outcome (a hang bound), then judge it.
        first = wait_for(lambda: d.results().get("host_memory_bandwidth"), timeout=180,
                         what="the first run inside the namespace")
        assert first["outcome"] == "success", (first["outcome"], first["reason"], first["detail"])
        assert d.results()["host_memory_bandwidth"]["environment"]["hostname"]
        registry = REGISTRY / f"{net.tag}.json"
        assert registry.exists()
    finally:
        net.close()
    assert gone(net)
    assert not registry.exists()
    assert d.proc.returncode == 0, d.log()[-2000:]                     # SIGTERM: a clean stop
    assert not pid_alive(stray.pid)
    stray.wait()


def test_leftovers_of_an_owner_killed_with_sigkill_are_removed_and_a_live_owners_net_is_not(tmp_path):
    mine = NamespaceNet(2)        # live while another owner comes, dies and is cleaned up after
    try:
        code = ("import os, signal, subprocess; from tests.support.netns import NamespaceNet\n"
                "n = NamespaceNet(2)\n"
                "n.popen(n.nodes[0], ['sleep', '1000'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
                "print(n.tag, flush=True); os.kill(os.getpid(), signal.SIGKILL)\n")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == -signal.SIGKILL, r.stderr
        tag = r.stdout.strip()
        entry = json.loads((REGISTRY / f"{tag}.json").read_text())
        assert set(entry["netns"]) <= set(_netns_list())                # left behind by the dead owner
        orphan_pids = [int(x) for x in subprocess.run(["ip", "netns", "pids", entry["netns"][0]],
                                                      capture_output=True, text=True).stdout.split()]
        assert orphan_pids

        removed = cleanup_stale()
        assert set(entry["netns"]) | set(entry["links"]) <= set(removed)
        assert not set(entry["netns"]) & set(_netns_list())
        assert not set(entry["links"]) & set(_links())
        assert not (REGISTRY / f"{tag}.json").exists()
        wait_for(lambda: not any(pid_alive(p) for p in orphan_pids), timeout=10, what="the orphan's process gone")
        # The dead owner's start-up cleanup and this one both left the live owner's net alone.
        assert not gone(mine) and all(mine.link_up(n) for n in mine.nodes)
        assert not {n.netns for n in mine.nodes} & set(removed)
    finally:
        mine.close()
    assert gone(mine)


def test_parallel_nets_get_distinct_names_and_subnets():
    nets = [NamespaceNet(1), NamespaceNet(1)]
    try:
        assert nets[0].tag != nets[1].tag and nets[0].subnet != nets[1].subnet
        assert nets[0].bridge != nets[1].bridge
        # Each bridge address is the root namespace's way into its own subnet only.
        for n in nets:
            route = subprocess.run(["ip", "-4", "route", "get", n.nodes[0].ip], capture_output=True, text=True).stdout
            assert f"dev {n.bridge}" in route, route
    finally:
        for n in nets:
            n.close()
    assert all(gone(n) for n in nets)
