"""`fleetcanary demo`: a small simulated GPU fleet on this machine, with one bad GPU, and the alerts that find it.

Several exporters, each a simulated HGX H100 node on recorded NVML facts (demo_fleet.py), one of them with
a failing GPU; the reference LLM server their inference canaries probe; Prometheus with the shipped rules;
Alertmanager with the shipped routes and inhibit rules, whose notifications come back to this process and
are printed as they arrive, with the time each took; `fleetcanary remediate` with dry-run off gets the same
notifications and quarantines the bad node on the demo's small Kubernetes API (demo_kube.py), where each exporter
also writes its node conditions (kubernetes.api_url); the summary shows the nodes' taints, conditions and Events.
Everything listens on loopback. Ends on SIGINT/SIGTERM, after --duration, or (--until-fired) once the bad GPU's
alerts have all arrived; stops everything it started; the work directory goes too unless --keep or --workdir.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from fleetcanary.core import resources
from fleetcanary.offline import demo_fleet as fleet
from fleetcanary.offline import demo_host, demo_kube
from fleetcanary.offline import local_services as svc
from fleetcanary.offline.simulate_llm import SimSettings, start_in_thread
from fleetcanary.probes.lib.nvml import FAKE_ENV
from fleetcanary.probes.lib.spawn import module_command

START_SECONDS = 90  # each component's time to answer, on a busy 2-core machine
ACT_SECONDS = 30    # after the bad node's alerts arrived: the time remediate has to quarantine it


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=6, metavar="N",
                   help="simulated nodes, one of them with a failing GPU (default 6: 5 healthy peers)")
    p.add_argument("--prometheus-listen", default="127.0.0.1:9090", metavar="HOST:PORT",
                   help="Prometheus's address (taken or port 0: any free port)")
    p.add_argument("--alertmanager-listen", default="127.0.0.1:9093", metavar="HOST:PORT",
                   help="Alertmanager's address (taken or port 0: any free port)")
    p.add_argument("--workdir", metavar="DIR", help="configs, state, logs and data (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory at exit")
    p.add_argument("--fast", action="store_true", help="probe, scrape and evaluate every few seconds")
    p.add_argument("--duration", type=float, default=0.0, metavar="SECONDS", help="stop after this long (0: never)")
    p.add_argument("--this-host", action="store_true",
                   help="instead: one exporter measuring this machine (CPU probes, storage, collectives on gloo, "
                        "the inference canary) with Prometheus, for Grafana against real data")
    p.add_argument("--listen", default="127.0.0.1:9835", metavar="HOST:PORT",
                   help="--this-host: the exporter's address (port 0: any free port)")
    p.add_argument("--no-prometheus", action="store_true", help="--this-host: do not start Prometheus")
    p.add_argument("--until-fired", nargs="?", const="all", metavar="ALERT[,ALERT]",
                   help="stop once the bad GPU's alerts (all, or these) have reached Alertmanager's receiver; "
                        "exit 1 if --duration passes first or a healthy node alerts")


class Notifications:
    """What Alertmanager's webhook delivered: each alert once when it fires, and when it resolves."""

    def __init__(self, started: float, expected: list[fleet.Expected], bad_node: str) -> None:
        self.started = started
        self.expected = expected
        self.bad_node = bad_node
        self.fired: dict[int, float] = {}   # index in expected -> seconds after the start
        self.unexpected: list[str] = []
        self.seen: set[tuple] = set()
        self.lock = threading.Lock()
        self.changed = threading.Event()

    def take(self, payload: dict) -> None:
        for a in payload.get("alerts") or []:
            labels = {str(k): str(v) for k, v in (a.get("labels") or {}).items()}
            status = str(a.get("status", ""))
            key = (status, tuple(sorted(labels.items())))
            with self.lock:
                if key in self.seen:
                    continue
                self.seen.add(key)
                at = time.monotonic() - self.started
                hit = [i for i, e in enumerate(self.expected) if fleet.matches(e, labels.get("alertname", ""), labels)]
                for i in hit:
                    if status == "firing":
                        self.fired.setdefault(i, at)
                wrong = status == "firing" and labels.get("node") != self.bad_node
                if wrong:
                    self.unexpected.append(labels.get("alertname", "?") + f" on {labels.get('node', '?')}")
            where = labels.get("node", "?") + (f" GPU {labels['gpu']}" if "gpu" in labels else "")
            extra = "".join(f" {k}={labels[k]}" for k in ("xid", "figure") if k in labels)
            note = "   <- a healthy node: this should not happen" if wrong else ""
            desc = str((a.get("annotations") or {}).get("description", ""))
            with self.lock:  # notifications arrive on several threads: one whole line each
                print(f"[{_clock(at)}] {status.upper():8} {labels.get('severity', ''):8} "
                      f"{labels.get('alertname', '?')}  {where}{extra}: {desc}{note}", flush=True)
        self.changed.set()


def _clock(seconds: float) -> str:
    return f"+{int(seconds) // 60}:{int(seconds) % 60:02d}"


def _webhook(notes: Notifications) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            try:
                body = self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 4 << 20))
                notes.take(json.loads(body))
                self.send_response(200)
            except (ValueError, TypeError, AttributeError):
                self.send_response(400)
            self.end_headers()

        def log_message(self, *_args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="demo-webhook", daemon=True).start()
    return server


class Demo:
    def __init__(self, args, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        # Its own session: Ctrl-C in the terminal signals the demo alone, which then prints its summary from a
        # Prometheus that is still up, and stops each child itself (stop_all)
        with open(self.workdir / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs[name] = proc
        return proc

    def wait_ready(self, name: str, url: str) -> None:
        if not svc.ready(url, time.monotonic() + START_SECONDS, self.procs[name]):
            raise DemoError(f"{name} did not start; see {self.workdir / (name + '.log')}")

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            svc.stop(proc)


class DemoError(Exception):
    pass


def main(args) -> int:
    if args.this_host:
        return demo_host.main(args)
    if args.nodes < 2:
        print("fleetcanary demo: --nodes must be at least 2 (a bad node needs peers)", file=sys.stderr)
        return 2
    binaries = {"prometheus": shutil.which("prometheus"),
                "alertmanager": shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")}
    missing = [k for k, v in binaries.items() if not v]
    if missing:
        print(f"fleetcanary demo: {' and '.join(missing)} not installed (Debian: apt-get install prometheus "
              "prometheus-alertmanager; `make demo` installs them)", file=sys.stderr)
        return 1
    bad = fleet.degraded_node(fleet.node_names(args.nodes))
    try:
        wanted = _wanted(args.until_fired, fleet.expected_alerts(bad))
    except DemoError as exc:
        print(f"fleetcanary demo: {exc}", file=sys.stderr)
        return 1
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fleetcanary-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the terminal closed: stop the children too
        signal.signal(sig, lambda *_: stop.set())
    demo = Demo(args, workdir)
    llm = None
    try:
        with resources.rule_files() as rule_files, resources.dashboards_dir() as dashboards:
            llm, _ = start_in_thread(SimSettings(ttft_ms=40, itl_ms=8, max_tokens_default=16))
            return _run(demo, binaries, rule_files, dashboards, llm, wanted, stop)
    except DemoError as exc:
        print(f"fleetcanary demo: {exc}", file=sys.stderr)
        return 1
    finally:
        demo.stop_all()
        if llm is not None:
            llm.shutdown()
            llm.server_close()
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(demo: Demo, binaries: dict[str, str], rule_files: list[Path], dashboards: Path, llm,
         wanted: set[int] | None, stop) -> int:
    args, workdir = demo.args, demo.workdir
    started = time.monotonic()
    names = fleet.node_names(args.nodes)
    bad = fleet.degraded_node(names)
    expected = fleet.expected_alerts(bad)
    notes = Notifications(started, expected, bad)
    hook = _webhook(notes)
    # remediate talks to Kubernetes through the kubernetes client (the `kube` extra, which `make demo` installs)
    cluster = demo_kube.Cluster(names).start() if importlib.util.find_spec("kubernetes") else None
    try:
        llm_url = f"http://127.0.0.1:{llm.server_address[1]}/v1"
        targets = {}
        for i, node in enumerate(names, 1):
            ndir = workdir / node
            ndir.mkdir(parents=True, exist_ok=True)
            facts = ndir / "nvml-facts.json"
            facts.write_text(json.dumps(fleet.node_facts(i, node == bad), indent=1))
            listen = svc.free_address("127.0.0.1:0")
            cfg = ndir / "fleetcanary.yaml"
            cfg.write_text(yaml.safe_dump(fleet.exporter_config(ndir, node, listen, llm_url, args.fast,
                                                                cluster.url if cluster else ""), sort_keys=False))
            demo.start(node, [*module_command("fleetcanary"), "run", "--config", str(cfg)],
                       env={FAKE_ENV: str(facts), "NODE_NAME": node})
            targets[node] = listen
        rem = svc.free_address("127.0.0.1:0")
        if cluster is not None:
            rcfg = workdir / "remediate.yaml"
            rcfg.write_text(yaml.safe_dump(fleet.remediate_config(rem, cluster.url,
                                                                  str(workdir / "remediate-audit.jsonl")),
                                           sort_keys=False))
            demo.start("remediate", [*module_command("fleetcanary"), "remediate", "--config", str(rcfg)])
        am = svc.free_address(args.alertmanager_listen)
        amcfg = workdir / "alertmanager.yml"
        amcfg.write_text(yaml.safe_dump(fleet.alertmanager_config(resources.alertmanager_example(),
                                                                  f"http://127.0.0.1:{hook.server_address[1]}/",
                                                                  f"http://{rem}/webhook" if cluster else ""),
                                        sort_keys=False))
        demo.start("alertmanager", [binaries["alertmanager"], f"--config.file={amcfg}",
                                    f"--storage.path={workdir / 'alertmanager'}", f"--web.listen-address={am}",
                                    "--cluster.listen-address=", "--log.level=warn"])
        prom = svc.free_address(args.prometheus_listen)
        pcfg = workdir / "prometheus.yml"
        if args.fast:
            rule_files = svc.fast_rule_files(rule_files, workdir / "rules")
        pcfg.write_text(yaml.safe_dump(fleet.prometheus_config(targets, am, rule_files, args.fast), sort_keys=False))
        demo.start("prometheus", [binaries["prometheus"], f"--config.file={pcfg}",
                                  f"--storage.tsdb.path={workdir / 'prometheus'}", f"--web.listen-address={prom}",
                                  "--log.level=warn"])
        for node, listen in targets.items():
            demo.wait_ready(node, f"http://{listen}/healthz")
        if cluster is not None:
            demo.wait_ready("remediate", f"http://{rem}/healthz")
        demo.wait_ready("alertmanager", f"http://{am}/-/ready")
        demo.wait_ready("prometheus", f"http://{prom}/-/ready")
        groups = svc.rule_groups(prom)
        if not groups:
            raise DemoError(f"Prometheus loaded no rule group; see {workdir / 'prometheus.log'}")
        _intro(names, bad, expected, targets, llm_url, prom, am, len(groups), dashboards, workdir, started)
        print(f"Remediate:    http://{rem}/metrics  (dry-run off: the bad node's hard-fault alerts taint it on the "
              f"demo's Kubernetes API {cluster.url}, where each exporter writes its node conditions)" if cluster else
              "Remediate:    not started: it needs the kubernetes client (pip install 'fleetcanary[kube]')", flush=True)
        return _watch(demo, notes, wanted, prom, dashboards, stop, started, cluster)
    finally:
        hook.shutdown()
        hook.server_close()
        if cluster is not None:
            cluster.stop()


def _wanted(until: str | None, expected: list[fleet.Expected]) -> set[int] | None:
    if until is None:
        return None
    if until == "all":
        return set(range(len(expected)))
    names = {n.strip() for n in until.split(",") if n.strip()}
    unknown = names - {e.alert for e in expected}
    if unknown:
        raise DemoError(f"--until-fired: {', '.join(sorted(unknown))} is not one of the bad GPU's alerts "
                        f"({', '.join(sorted({e.alert for e in expected}))})")
    return {i for i, e in enumerate(expected) if e.alert in names}


def _intro(names, bad, expected, targets, llm_url, prom, am, groups, dashboards, workdir, started) -> None:
    g = fleet.DEGRADED_GPU
    print(f"fleetcanary demo: {len(names)} simulated HGX H100 nodes (pool {fleet.POOL}, cluster {fleet.CLUSTER}), "
          f"each on NVML facts recorded from such a node; ready in {time.monotonic() - started:.0f} s")
    print(f"  the bad one: {bad} GPU {g}, as NVML reports a failing GPU: XIDs 63 (warning) and 94 "
          "(critical), an uncorrectable ECC error, a row remap waiting for a reset")
    print(f"  the other {len(names) - 1} are healthy and must stay silent")
    print("  GPU performance probes are off: they need CUDA, which the demo does not fake")
    for node, listen in targets.items():
        print(f"  {node}: http://{listen}/metrics" + ("   <- the bad node" if node == bad else ""))
    print(f"LLM server:   {llm_url} (the reference server every node's inference canary probes)")
    print(f"Prometheus:   http://{prom}  (the shipped rules, {groups} groups; firing alerts under /alerts)")
    print(f"Alertmanager: http://{am}  (the shipped routes and inhibit rules; its notifications come back here)")
    print(f"Grafana:      add a Prometheus data source with URL http://{prom}, import {dashboards}/*.json, then open")
    print(f"              fleetcanary / Fleet overview (the firing-alerts table) and fleetcanary / Node detail "
          f"with node={bad} (the GPU errors panel)")
    print(f"Work dir:     {workdir} (configs, logs, each node's facts and state)")
    print("Expected on the bad GPU:")
    for e in expected:
        print(f"  {e.alert}: {e.why}")
    print("Alerts as Alertmanager sends them (Ctrl-C stops everything):", flush=True)


def _watch(demo: Demo, notes: Notifications, wanted: set[int] | None, prom: str, dashboards: Path, stop,
           started, cluster: demo_kube.Cluster | None) -> int:
    args = demo.args
    deadline = started + args.duration if args.duration > 0 else None
    code = 0
    while not stop.is_set():
        dead = [name for name, p in demo.procs.items() if p.poll() is not None]
        if dead:
            print(f"fleetcanary demo: {', '.join(dead)} exited; logs in {demo.workdir}", file=sys.stderr)
            return 1
        with notes.lock:
            done = wanted is not None and wanted <= set(notes.fired)
        if done:
            if cluster is not None:
                _await_quarantine(cluster, notes.bad_node, stop)
            break
        if deadline is not None and time.monotonic() >= deadline:
            if wanted is not None:
                code = 1
            break
        notes.changed.wait(0.5)
        notes.changed.clear()
    _summary(notes, prom, notes.bad_node, dashboards)
    for line in demo_kube.report(cluster, notes.bad_node) if cluster else []:
        print(line)
    with notes.lock:
        if wanted is not None and notes.unexpected:
            code = 1
    return code


def _await_quarantine(cluster: demo_kube.Cluster, bad: str, stop) -> None:
    """remediate got the notifications that ended the wait at the same moment as the demo: give it a moment to
    taint the node and post its Event (it does within a second; ACT_SECONDS on a busy machine). The exporters
    wrote their node conditions long before (each after its first gpu_health run, before any alert could fire);
    the bad node's are waited for too, and every node's, so the summary never reads a half-written fleet."""
    deadline = time.monotonic() + ACT_SECONDS
    want = {demo_kube.FAULT_PREFIX + t for t in fleet.EXPECTED_CONDITIONS}
    while time.monotonic() < deadline and not stop.is_set():
        with cluster.lock:
            node = cluster.nodes[bad]
            done = bool((node.get("spec") or {}).get("taints")) and any(
                (e.get("involvedObject") or {}).get("name") == bad for e in cluster.events)
            nodes = list(cluster.nodes.values())
        conds = demo_kube.fault_conditions(node)
        done = done and all(conds.get(t, {}).get("status") == "True" for t in want) and all(
            demo_kube.fault_conditions(n) for n in nodes)
        if done:
            return
        stop.wait(0.2)


def _summary(notes: Notifications, prom: str, bad: str, dashboards: Path) -> None:
    with notes.lock:
        fired = dict(notes.fired)
        unexpected = list(notes.unexpected)
    print("Summary:")
    for i, e in enumerate(notes.expected):
        labels = ", ".join(f"{k}={v}" for k, v in e.labels.items())
        state = f"fired, notified {_clock(fired[i])} after the start" if i in fired else "not fired"
        print(f"  {e.alert} ({labels}): {state}")
    print(f"  alerts on healthy nodes: {len(unexpected)}" + (f" ({'; '.join(unexpected)})" if unexpected else ""))
    for line in _panels(prom, bad, dashboards):
        print(line)


PANELS = (("node-detail.json", "GPU errors: XIDs, uncorrectable ECC, pending row remaps"),
          ("fleet-overview.json", "Firing fleetcanary alerts: which node, since when, how bad"))


def _legend(fmt: str, labels: dict[str, str]) -> str:
    """A panel's legend for one series, as Grafana writes it ({{gpu}} -> the label's value)."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), "?"), fmt)


def _panels(prom: str, bad: str, dashboards: Path) -> list[str]:
    """What two shipped panels show now, from their own queries: the bad node's GPU errors, and the fleet's
    firing alerts (whichever node they are on)."""
    out = []
    for board, title in PANELS:
        panel = next(p for p in json.loads((dashboards / board).read_text())["panels"] if p["title"] == title)
        shown = []
        for target in panel["targets"][:1] if board == "fleet-overview.json" else panel["targets"]:
            q = target["expr"].replace("$node", bad).replace("$__rate_interval", "1m")
            for var in ("$cluster", "$pool", "$figure"):
                q = q.replace(f'"{var}"', '".*"')
            try:
                query = urllib.parse.urlencode({"query": q})
                rows = svc.get_json(f"http://{prom}/api/v1/query?{query}")["data"]["result"]
            except (OSError, ValueError, KeyError) as exc:
                shown.append(f"no answer ({exc})")
                continue
            for r in rows:
                labels = r["metric"]
                if float(r["value"][1]) == 0:
                    continue
                if board == "fleet-overview.json":
                    since = time.strftime("%H:%M:%S", time.gmtime(float(r["value"][1]) / 1000))
                    shown.append(f"{labels.get('alertname')} on {labels.get('node')}"
                                 + (f" GPU {labels['gpu']}" if "gpu" in labels else "")
                                 + (f" XID {labels['xid']}" if "xid" in labels else "") + f" since {since} UTC")
                else:
                    legend = _legend(target.get("legendFormat") or "", labels)
                    shown.append(f"{legend}: {r['value'][1]}")
        where = f" (node={bad})" if board == "node-detail.json" else ""
        empty = "nothing" if board == "node-detail.json" else (
            "nothing yet (Prometheus writes the ALERTS series once each rule group has restored its state, "
            "after its second evaluation: 1-2 minutes after it starts)")
        out.append(f"  panel {board[:-5]} / {title}{where}: " + ("; ".join(sorted(shown)) or empty))
    return out
