"""The live run: every node's exposition served on 127.0.0.1, a real Prometheus scraping it and evaluating the
rules, each group's evaluations recorded until every group has run its cycles."""
from __future__ import annotations

import json
import signal
import statistics
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from benchmarks.common import proc_stats
from harness.backfill import binary
from harness.poll import wait_http
from harness.ports import free_port


# --------------------------------------------------------------------------- serving the fleet
class FleetServer:
    """Every node's exposition at /metrics/<node> on 127.0.0.1, rendered once; the clock's values (Node.body)
    filled in at each scrape, as value() gives them."""

    def __init__(self, bodies: dict[str, bytes]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = bodies.get(self.path.rsplit("/", 1)[-1])
                if body:
                    now = time.time()
                    body = body.replace(b" NOW\n", f" {int(now)}\n".encode()).replace(
                        b" MINUTE\n", f" {int(now / 60) % 100000}\n".encode())
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                try:
                    self.wfile.write(body or b"")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # Prometheus gave up on a slow scrape (its timeout); it counts it itself

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --------------------------------------------------------------------------- live evaluation
def prom_metrics(url: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    # A long timeout: a Prometheus starved of CPU by its own rule groups answers /metrics late.
    with urllib.request.urlopen(url + "/metrics", timeout=300) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(("prometheus_rule_group", "prometheus_tsdb_head_series",
                                  "prometheus_rule_evaluation_failures_total", "process_resident_memory_bytes")):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def query(url: str, expr: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=600) as r:
        body = json.loads(r.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def slowest_rules(url: str) -> list[dict]:
    """Every rule, the slowest first, with its group and its last evaluation's seconds (/api/v1/rules: each
    rule's evaluationTime): where a group's seconds go."""
    try:
        with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=600) as r:
            body = json.loads(r.read())
        rows = [{"group": g["name"], "rule": rule["name"], "seconds": round(float(rule.get("evaluationTime", 0)), 4)}
                for g in body["data"]["groups"] for rule in g["rules"]]
    except (OSError, ValueError, KeyError, TypeError) as e:  # a detail: never the run's result lost for it
        return [{"error": f"{type(e).__name__}: {e}"}]
    return sorted(rows, key=lambda x: -x["seconds"])


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def by_group(m: dict, name: str) -> dict[str, float]:
    return {dict(k[1])["rule_group"]: v for k, v in m.items() if k[0] == name}


def live(work: Path, data: Path, args, server: FleetServer, node_names: list[str], rule_files: list[Path]) -> dict:
    cfg = {"global": {"scrape_interval": f"{args.scrape_interval}s", "evaluation_interval": "1m"},
           "rule_files": [str(f) for f in rule_files],
           "scrape_configs": [{"job_name": "fleetcanary", "static_configs": [
               {"targets": [server.address], "labels": {"__metrics_path__": f"/metrics/{n}", "node": n}}
               for n in node_names],
               "relabel_configs": [{"source_labels": ["node"], "target_label": "instance"}]}]}
    (work / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(work / "prometheus.log", "wb") as log:  # Prometheus keeps its own descriptor
        proc = subprocess.Popen([binary("prometheus"), f"--config.file={work / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
                                 "--storage.tsdb.retention.time=30d", "--log.level=warn",
                                 # No leveled compaction of the backfilled 2-hour blocks while measuring.
                                 "--storage.tsdb.max-block-duration=2h"],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"rule_scale: prometheus exited {proc.returncode}: "
                                 f"{(work / 'prometheus.log').read_text()[-3000:]}")
            try:
                wait_http(url + "/-/ready", timeout=5)
                break
            except SystemExit:
                if time.monotonic() - t0 > 900:
                    raise
        ready_s = time.monotonic() - t0
        deadline = time.monotonic() + args.max_wait
        while time.monotonic() < deadline:
            up = query(url, 'count(up{job="fleetcanary"} == 1)')
            if up and int(float(up[0]["value"][1])) == len(node_names):
                break
            time.sleep(2)
        else:
            raise SystemExit("rule_scale: not every target came up")
        all_up = time.monotonic()
        print(f"prometheus ready in {ready_s:.0f}s; all {len(node_names)} targets up after {all_up - t0:.0f}s; "
              f"measuring after a warm-up of {args.warmup:.0f}s", flush=True)
        first = prom_metrics(url)
        interval = by_group(first, "prometheus_rule_group_interval_seconds")
        seen = by_group(first, "prometheus_rule_group_last_evaluation_timestamp_seconds")
        evals: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (seconds after all up, duration)
        missed0, cpu0, m = None, None, first
        # cycles of the judged groups' interval (the rule settings' `interval`, 5 minutes): each group that many
        # periods' evaluations, and a slower group (the peers' spread, every 15 minutes) one; three of it would
        # triple the run to measure what one does
        from alerts.build import SETTINGS, seconds
        period = args.cycles * seconds(SETTINGS.interval)
        need = {g: max(1.0, period / interval[g]) for g in interval}
        while time.monotonic() < deadline:
            m = prom_metrics(url)
            now = time.monotonic() - all_up
            if missed0 is None and now >= args.warmup:
                missed0 = by_group(m, "prometheus_rule_group_iterations_missed_total")
                cpu0, t_cpu0 = proc_stats(proc.pid)[0], time.monotonic()
            last = by_group(m, "prometheus_rule_group_last_evaluation_timestamp_seconds")
            dur = by_group(m, "prometheus_rule_group_last_duration_seconds")
            for g, ts in last.items():
                if ts > seen.get(g, 0):
                    seen[g] = ts
                    evals[g].append((round(now, 1), dur[g]))
                    print(f"  {now:6.0f}s {g.split(';')[1]}: {dur[g]:.2f} s", flush=True)
            measured = {g: [d for t, d in evals[g] if t >= args.warmup] for g in interval}
            if missed0 is not None and all(len(measured[g]) >= need[g] for g in interval):
                break
            time.sleep(3)
        else:
            print("rule_scale: --max-wait passed before every group ran its cycles", flush=True)
        wall = time.monotonic() - all_up
        cpu = proc_stats(proc.pid)[0]
        rss, hwm = proc_stats(proc.pid)[1], peak_rss(proc.pid)
        missed = by_group(m, "prometheus_rule_group_iterations_missed_total")
        iterations = by_group(m, "prometheus_rule_group_iterations_total")
        rules = by_group(m, "prometheus_rule_group_rules")
        fails = defaultdict(float)
        for (name, lab), v in m.items():
            if name == "prometheus_rule_evaluation_failures_total":
                fails[dict(lab)["rule_group"]] += v
        groups = {}
        for g in interval:
            d = [x for t, x in evals[g] if t >= args.warmup]
            early = [x for t, x in evals[g] if t < args.warmup]
            med = statistics.median(d) if d else None
            groups[g.split(";", 1)[1]] = {
                "file": Path(g.split(";")[0]).name, "rules": int(rules.get(g, 0)), "interval_seconds": interval[g],
                "evaluations": [[t, round(x, 4)] for t, x in evals[g]], "measured": len(d),
                "median_seconds": med, "max_seconds": max(d) if d else None,
                "warmup_median_seconds": statistics.median(early) if early else None,
                "seconds_per_minute": med * 60 / interval[g] if med is not None else None,
                "iterations_total": int(iterations.get(g, 0)), "iterations_missed_total": int(missed.get(g, 0)),
                "iterations_missed_measured": int(missed.get(g, 0) - (missed0 or {}).get(g, 0)),
                "evaluation_failures": int(fails.get(g, 0))}
        recorded = {r["metric"]["__name__"]: int(float(r["value"][1]))
                    for r in query(url, 'count by (__name__) ({__name__=~".+:.+"})')}
        node0 = node_names[0]
        per_node = {r["metric"]["__name__"]: int(float(r["value"][1]))
                    for r in query(url, f'count by (__name__) ({{node="{node0}"}})')}
        scraped = query(url, 'avg(scrape_samples_scraped{job="fleetcanary"})')
        alerts = query(url, "count by (alertname, alertstate) (ALERTS)")
        return {"slowest_rules": slowest_rules(url), "prometheus_ready_seconds": ready_s,
                "all_up_seconds": all_up - t0, "groups": groups,
                "head_series": int(m.get(("prometheus_tsdb_head_series", ()), 0)),
                "scraped_series_per_node": float(scraped[0]["value"][1]) if scraped else None,
                "recorded_series": recorded, "recorded_series_total": sum(recorded.values()),
                "node0_series": sum(n for k, n in per_node.items() if ":" not in k),
                "node0_recorded_series": sum(n for k, n in per_node.items() if ":" in k),
                "node0_recorded_by_metric": {k: n for k, n in per_node.items() if ":" in k},
                "alerts": {f'{a["metric"]["alertname"]}/{a["metric"]["alertstate"]}': int(float(a["value"][1]))
                           for a in alerts},
                "prometheus_cpu_seconds_per_second": ((cpu - cpu0) / (time.monotonic() - t_cpu0)
                                                      if cpu0 is not None else None),
                "prometheus_rss_bytes": rss, "prometheus_peak_rss_bytes": hwm, "measured_seconds": wall,
                "warmup_seconds": args.warmup}
    finally:
        _terminate(proc, 120)


def _terminate(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sharded_rules(work: Path, pools: list[str]) -> list[Path]:
    """The shipped rules rendered by alerts/build.py with `pools` in peer and own-history groups of their own."""
    from dataclasses import replace

    from alerts.build import SETTINGS, render
    out = work / "rules"
    out.mkdir()
    for name, text in render(settings=replace(SETTINGS, pools=tuple(pools))).items():
        (out / name).write_text(text)
    return [out / "fleetcanary.rules.yml", out / "fleetcanary.alerts.yml"]
