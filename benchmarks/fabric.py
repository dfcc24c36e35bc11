#!/usr/bin/env python3
"""The fabric between network namespaces: a plain TCP throughput figure per link, free and
under a token-bucket (tc tbf) rate limit.

Two (or more) network namespaces on one Linux bridge (tests/support/netns.py: link-local
169.254.x.0/24, no route off the machine) stand in for nodes. On each link, in each state
(free, then limited with tbf to --rate-mbit on both directions of one end), --rounds times:

- stream: one TCP connection, the sender writes 1 MiB buffers for --seconds, the receiver
  counts bytes from the first byte to end of stream (this file's own socket code: no iperf3
  dependency, and the figure is computed exactly as stated here);
- pingpong: one TCP connection, a --message-bytes message each way per iteration, figure
  2 x message / round trip (median) - the same formula as the fabric probe's send/recv
  bandwidth, so the two compare like for like.

Prints a table (median and min..max over rounds) and writes benchmarks/results/fabric.json.
Needs root and iproute2 (ip, tc).

    python benchmarks/fabric.py [--rate-mbit 200] [--seconds 3] [--rounds 3] [--message-bytes 16777216]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import write_result  # noqa: E402

PORT = 5201
CHUNK = 1 << 20


# --------------------------------------------------------------------- the two ends (run inside a namespace)
def tcp_server(ip: str, port: int, mode: str, message: int) -> dict:
    """Accept one connection. stream: count bytes to EOF; pingpong: echo `message`-byte messages to EOF."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((ip, port))
    srv.listen(1)
    print("ready", flush=True)
    conn, _ = srv.accept()
    buf = bytearray(CHUNK if mode == "stream" else message)
    view = memoryview(buf)
    n, first, iters = 0, None, 0
    while True:
        if mode == "stream":
            k = conn.recv_into(view)
            if not k:
                break
            if first is None:
                first = time.perf_counter()
            n += k
            continue
        got = 0
        while got < message:
            k = conn.recv_into(view[got:])
            if not k:
                break
            got += k
        if got < message:
            break
        conn.sendall(view)
        iters += 1
    end = time.perf_counter()
    conn.close()
    srv.close()
    return {"bytes": n, "seconds": (end - first) if first else 0.0, "iterations": iters}


def tcp_client(ip: str, port: int, mode: str, seconds: float, message: int) -> dict:
    conn = socket.create_connection((ip, port), timeout=60)
    size = CHUNK if mode == "stream" else message
    data = memoryview(bytearray((os.urandom(1024) * (size // 1024 + 1))[:size]))
    rtts: list[float] = []
    t0 = time.perf_counter()
    sent = 0
    if mode == "stream":
        while time.perf_counter() - t0 < seconds:
            conn.sendall(data)
            sent += len(data)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)                     # EOF once the receiver has read everything
    else:
        back = memoryview(bytearray(len(data)))
        conn.sendall(data)               # one untimed warm-up round trip (slow start)
        _recv_exact(conn, back)
        while len(rtts) < 3 or time.perf_counter() - t0 < seconds:
            t = time.perf_counter()
            conn.sendall(data)
            _recv_exact(conn, back)
            rtts.append(time.perf_counter() - t)
        conn.shutdown(socket.SHUT_WR)
    conn.close()
    return {"bytes": sent, "rtts": rtts, "message_bytes": len(data)}


def _recv_exact(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = conn.recv_into(view[got:])
        if not k:
            raise ConnectionError("peer closed mid-message")
        got += k


# --------------------------------------------------------------------- driving them from the root namespace
def tcp_figure(net, server, client, mode: str, seconds: float, message: int) -> float:
    """Bytes per second on the link between two nodes: stream (receiver's count / time) or pingpong
    (2 x message / median round trip)."""
    me = [sys.executable, str(Path(__file__).resolve())]
    srv = net.popen(server, me + ["_tcp-server", server.ip, str(PORT), mode, str(message)],
                    stdout=subprocess.PIPE, text=True)
    try:
        if srv.stdout.readline().strip() != "ready":
            raise SystemExit("benchmark: the TCP server did not start")
        cli = net.run(client, me + ["_tcp-client", server.ip, str(PORT), mode, str(seconds), str(message)],
                      timeout=seconds * 10 + 120)
        out = json.loads(srv.communicate(timeout=120)[0].strip().splitlines()[-1])
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    c = json.loads(cli.stdout.strip().splitlines()[-1])
    if mode == "stream":
        return out["bytes"] / out["seconds"]
    return 2 * c["message_bytes"] / statistics.median(c["rtts"])


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def human(v: float) -> str:
    return f"{v / 1e9:7.3f} GB/s" if v >= 1e9 else f"{v / 1e6:7.1f} MB/s"


def machine() -> dict:
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "kernel": platform.release(), "python": platform.python_version(), "loadavg_at_start": load}


def measure_links(net, pairs, rate_bits: int, seconds: float, rounds: int, message: int) -> list[dict]:
    """TCP figures per link, free and limited, rounds interleaved so drift hits both states alike."""
    rows = []
    for a, b in pairs:
        figs: dict[tuple[str, str], list[float]] = {}
        for _ in range(rounds):
            for state in ("free", "limited"):
                if state == "limited":
                    net.limit(b, rate_bits)
                try:
                    for mode in ("stream", "pingpong"):
                        figs.setdefault((state, mode), []).append(tcp_figure(net, b, a, mode, seconds, message))
                finally:
                    if state == "limited":
                        net.unlimit(b)
        for (state, mode), vals in figs.items():
            rows.append({"link": f"{a.name}<->{b.name}", "state": state, "mode": mode,
                         "rate_limit_bits": rate_bits if state == "limited" else None,
                         "message_bytes": message if mode == "pingpong" else None, **spread(vals)})
    return rows


def print_tcp(rows: list[dict]) -> None:
    print(f"{'link':18} {'state':16} {'mode':9} {'median':>13} {'min .. max':>27}")
    for r in rows:
        state = r["state"] if r["state"] == "free" else f"tbf {r['rate_limit_bits'] / 1e6:g} Mbit/s"
        print(f"{r['link']:18} {state:16} {r['mode']:9} {human(r['median']):>13} "
              f"{human(r['min']):>13} .. {human(r['max'])}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate-mbit", type=float, default=200.0, help="tbf rate of the limited state, Mbit/s")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of one TCP measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--message-bytes", type=int, default=16 << 20, help="pingpong message (the probe's sendrecv_bytes)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/fabric.json"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("benchmark: network namespaces need root")
    from tests.support.netns import NamespaceNet

    result: dict = {"machine": machine(), "settings": vars(args)}
    t0 = time.monotonic()
    with NamespaceNet(2) as net:
        a, b = net.nodes
        print(f"namespaces {a.netns} ({a.ip}) and {b.netns} ({b.ip}) on bridge {net.bridge}; "
              f"{os.cpu_count()} cores, load {result['machine']['loadavg_at_start']}")
        rows = measure_links(net, [(a, b)], int(args.rate_mbit * 1e6), args.seconds, args.rounds, args.message_bytes)
    print_tcp(rows)
    result["tcp"] = rows
    result["wall_seconds"] = time.monotonic() - t0
    write_result(args.out, result)
    return 0


def _side(argv: list[str]) -> int:
    """The ends, run by the benchmark inside a namespace: _tcp-server IP PORT MODE MESSAGE,
    _tcp-client IP PORT MODE SECONDS MESSAGE."""
    if argv[0] == "_tcp-server":
        print(json.dumps(tcp_server(argv[1], int(argv[2]), argv[3], int(argv[4]))))
    else:
        print(json.dumps(tcp_client(argv[1], int(argv[2]), argv[3], float(argv[4]), int(argv[5]))))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        sys.exit(_side(sys.argv[1:]))
    sys.exit(main())
