#!/usr/bin/env python3
"""The fabric probe between network namespaces against plain TCP on the same links, and what
one slot of the probe costs.

Four network namespaces on one Linux bridge (harness/netns.py: link-local
169.254.x.0/24, no route off the machine) stand in for nodes. For every pair of them (the
pair sweep), in one run:

- TCP on that link (this file's own socket code: no iperf3 dependency, and each figure is
  computed exactly as stated here):
  - stream: one connection, the sender writes 1 MiB buffers for --seconds, the receiver
    counts bytes from the first byte to end of stream;
  - pingpong: one connection, a --message-bytes message each way per iteration, figure
    2 x message / round trip (median) - the fabric probe's send/recv formula;
- the fabric probe itself, both sides as real isolated workers (the daemon's runner) with a
  two-member list, gloo over TCP, the probe's default sweep (sendrecv_bytes = --message-bytes):
  its send/recv bandwidth, and per side the slot's cost - wall time of the worker, CPU
  seconds of the worker (RUSAGE_CHILDREN of a driver that starts only it), and the bytes
  that crossed the namespace's eth0 (rx + tx, every header and retransmit included).

Then the first pair again under a token-bucket limit (tc tbf at --rate-mbit on both
directions of one end): TCP and the probe on the limited link. Pairs run one after another,
TCP before and after each probe run (the reference is their mean), so two measurements never
share the CPU. Prints tables and writes benchmarks/results/fabric.json. Needs root and
iproute2 (ip, tc).

    python -m benchmarks.fabric [--nodes 4] [--rate-mbit 200] [--seconds 3] [--rounds 3]
                                [--message-bytes 16777216] [--tcp-only]
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
import tempfile
import time
from pathlib import Path

from benchmarks.common import write_result

ROOT = Path(__file__).resolve().parent.parent

SECRET = "benchmark-fabric-secret-3c9e81f0"

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


def _eth0_bytes() -> int:
    """rx + tx bytes of this namespace's eth0 (ip netns exec mounts the namespace's own /sys)."""
    base = Path("/sys/class/net/eth0/statistics")
    return int((base / "rx_bytes").read_text()) + int((base / "tx_bytes").read_text())


def probe_side(name: str, params: dict, timeout: float, state_dir: str) -> dict:
    """One side of a pair: the fabric probe in a real isolated worker, as the daemon runs it; its record
    and the slot's cost on this side."""
    import resource

    from fleetcanary.probes.fabric import Fabric
    from fleetcanary.runner import job
    from fleetcanary.runner.isolation import run_isolated

    j = job.build("fabric", Fabric, params, {"node_name": name, "state_dir": state_dir, "gpu": {}, "kube": {}},
                  collect_gpu_facts=False)
    ru0, b0 = resource.getrusage(resource.RUSAGE_CHILDREN), _eth0_bytes()
    rec = run_isolated(j, timeout, 2.0, env={"FLEETCANARY_FABRIC_SECRET": SECRET})
    ru1, b1 = resource.getrusage(resource.RUSAGE_CHILDREN), _eth0_bytes()
    return {"record": rec.to_json(), "cpu_seconds": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
            "eth0_bytes": b1 - b0}


def slot_plan(now: float, lead: float) -> tuple[float, float]:
    """A slot length whose current slot started less than 10 s ago, and a meeting `lead` seconds from
    now, so both sides (started together) meet in this slot without waiting for a boundary."""
    for s in range(120, 4000):
        if now % s < 10:
            return float(s), now % s + lead
    raise SystemExit("benchmark: no slot length found")


def probe_pair(net, a, b, message: int, timeout: float, workdir: Path) -> dict:
    """The fabric probe between two namespaces (a hosts): both sides' records and costs."""
    slot, offset = slot_plan(time.time(), lead=10.0)
    me = [sys.executable, str(Path(__file__).resolve())]
    procs = {}
    for n in (a, b):
        params = {"members": [{"name": x.name, "address": f"{x.ip}:29400"} for x in (a, b)], "member_name": n.name,
                  "backend": "gloo", "slot_seconds": slot, "meet_offset_seconds": offset,
                  "rendezvous_wait_seconds": 30.0, "sendrecv_bytes": message}
        procs[n.name] = net.popen(n, me + ["_probe-side", n.name, json.dumps(params), str(timeout),
                                           str(workdir / n.name)], stdout=subprocess.PIPE, text=True)
    out = {}
    for name, p in procs.items():
        text, _ = p.communicate(timeout=timeout + 120)
        out[name] = json.loads(text.strip().splitlines()[-1])
    return out


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


def sendrecv(rec: dict) -> float | None:
    figs = [f for f in (rec.get("result") or {}).get("figures", []) if f["name"] == "sendrecv_bandwidth"]
    return figs[0]["median"] if figs else None


def sweep_pairs(net, pairs, args, state: str, workdir: Path) -> list[dict]:
    """Per pair: TCP pingpong and stream before and after one probe run on the same link."""
    rows = []
    for a, b in pairs:
        tcp = {"pingpong": [], "stream": []}
        for mode in ("pingpong", "stream"):
            tcp[mode].append(tcp_figure(net, b, a, mode, args.seconds, args.message_bytes))
        sides = probe_pair(net, a, b, args.message_bytes, args.timeout, workdir)
        for mode in ("pingpong", "stream"):
            tcp[mode].append(tcp_figure(net, b, a, mode, args.seconds, args.message_bytes))
        recs = {n: s["record"] for n, s in sides.items()}
        fig = sendrecv(recs[a.name])
        ref_pp = statistics.mean(tcp["pingpong"])
        ref_st = statistics.mean(tcp["stream"])
        rows.append({
            "pair": f"{a.name}<->{b.name}", "state": state, "message_bytes": args.message_bytes,
            "tcp_pingpong": tcp["pingpong"], "tcp_stream": tcp["stream"],
            "fabric_sendrecv": fig, "fabric_sendrecv_repeats": next(
                (f["repeats"] for f in recs[a.name]["result"].get("figures", []) if f["name"] == "sendrecv_bandwidth"),
                []) if fig else [],
            "ratio_to_pingpong": fig / ref_pp if fig else None, "ratio_to_stream": fig / ref_st if fig else None,
            "outcomes": {n: (r["outcome"], r["reason"], r["detail"][:200]) for n, r in recs.items()},
            "cost": {n: {"role": (s["record"].get("result") or {}).get("extra", {}).get("role"),
                         "wall_seconds": s["record"]["wall_seconds"],
                         "probe_seconds": s["record"]["probe_seconds"],
                         "sweep_seconds": (s["record"].get("result") or {}).get("extra", {}).get("sweep_seconds"),
                         "handshake_seconds": (s["record"].get("result") or {}).get("extra", {}).get(
                             "handshake_seconds"),
                         "cpu_seconds": s["cpu_seconds"], "eth0_bytes": s["eth0_bytes"]}
                     for n, s in sides.items()}})
        r = rows[-1]
        print(f"  {r['pair']} ({state}): fabric {human(fig) if fig else r['outcomes']}, "
              f"tcp pingpong {human(ref_pp)}, stream {human(ref_st)}", flush=True)
    return rows


def print_sweep(rows: list[dict]) -> None:
    print(f"\nfabric probe send/recv ({rows[0]['message_bytes'] >> 20} MiB ping-pong, median of the probe's repeats) "
          "against TCP on the same link (mean of before and after)")
    print(f"{'pair':16} {'link':9} {'fabric':>12} {'tcp pingpong':>13} {'ratio':>6} {'tcp stream':>12} {'ratio':>6}")
    for r in rows:
        pp, st = statistics.mean(r["tcp_pingpong"]), statistics.mean(r["tcp_stream"])
        fab = human(r["fabric_sendrecv"]) if r["fabric_sendrecv"] else "-"
        rp = f"{r['ratio_to_pingpong']:.2f}" if r["ratio_to_pingpong"] else "-"
        rs = f"{r['ratio_to_stream']:.2f}" if r["ratio_to_stream"] else "-"
        print(f"{r['pair']:16} {r['state']:9} {fab:>12} {human(pp):>13} {rp:>6} {human(st):>12} {rs:>6}")
    print("\ncost of one slot, per side (worker: start to exit; CPU: the worker and its threads; bytes: eth0 rx+tx)")
    print(f"{'pair':16} {'link':9} {'side':7} {'wall':>7} {'sweep':>7} {'CPU':>7} {'bytes':>10}")
    for r in rows:
        for n, c in r["cost"].items():
            sweep = f"{c['sweep_seconds']:.1f}s" if c["sweep_seconds"] is not None else "-"
            print(f"{r['pair']:16} {r['state']:9} {(c['role'] or n):7} {c['wall_seconds']:6.1f}s {sweep:>7} "
                  f"{c['cpu_seconds']:6.2f}s {c['eth0_bytes'] / 2**20:7.1f} MiB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4, help="namespaces; every pair is swept")
    ap.add_argument("--rate-mbit", type=float, default=200.0, help="tbf rate of the limited state, Mbit/s")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of one TCP measurement")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the TCP-only table")
    ap.add_argument("--message-bytes", type=int, default=16 << 20,
                    help="pingpong message and the probe's sendrecv_bytes (its default)")
    ap.add_argument("--timeout", type=float, default=150.0, help="the probe run's deadline (its default is 120 s)")
    ap.add_argument("--tcp-only", action="store_true", help="only the TCP table (no probe runs)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/fabric.json"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("benchmark: network namespaces need root")
    from harness.netns import NamespaceNet

    result: dict = {"machine": machine(), "settings": vars(args)}
    t0 = time.monotonic()
    with NamespaceNet(args.nodes) as net, tempfile.TemporaryDirectory(prefix="fc-bench-fabric-") as work:
        a, b = net.nodes[:2]
        print(f"{args.nodes} namespaces on bridge {net.bridge} (169.254.{net.subnet}.0/24); "
              f"{os.cpu_count()} cores, load {result['machine']['loadavg_at_start']}", flush=True)
        rows = measure_links(net, [(a, b)], int(args.rate_mbit * 1e6), args.seconds, args.rounds, args.message_bytes)
        print_tcp(rows)
        result["tcp"] = rows
        if not args.tcp_only:
            pairs = [(x, y) for i, x in enumerate(net.nodes) for y in net.nodes[i + 1:]]
            print(f"\npair sweep over {len(pairs)} pairs, free links:", flush=True)
            sweep = sweep_pairs(net, pairs, args, "free", Path(work))
            print(f"{a.name}<->{b.name} with tbf {args.rate_mbit:g} Mbit/s on {b.name}:", flush=True)
            net.limit(b, int(args.rate_mbit * 1e6))
            try:
                sweep += sweep_pairs(net, [(a, b)], args, f"tbf{args.rate_mbit:g}", Path(work))
            finally:
                net.unlimit(b)
            print_sweep(sweep)
            result["sweep"] = sweep
    with open("/proc/loadavg") as f:
        result["machine"]["loadavg_at_end"] = f.read().split()[:3]
    result["wall_seconds"] = time.monotonic() - t0
    write_result(args.out, result)
    return 0


def _side(argv: list[str]) -> int:
    """The ends, run by the benchmark inside a namespace: _tcp-server IP PORT MODE MESSAGE,
    _tcp-client IP PORT MODE SECONDS MESSAGE, _probe-side NAME PARAMS_JSON TIMEOUT STATE_DIR."""
    if argv[0] == "_tcp-server":
        print(json.dumps(tcp_server(argv[1], int(argv[2]), argv[3], int(argv[4]))))
    elif argv[0] == "_tcp-client":
        print(json.dumps(tcp_client(argv[1], int(argv[2]), argv[3], float(argv[4]), int(argv[5]))))
    else:
        Path(argv[4]).mkdir(parents=True, exist_ok=True)
        print(json.dumps(probe_side(argv[1], json.loads(argv[2]), float(argv[3]), argv[4])))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        sys.exit(_side(sys.argv[1:]))
    sys.exit(main())
