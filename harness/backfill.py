"""Backfill synthetic series and the shipped recording rules into a real Prometheus.

Used by the detection benchmark and the dashboard tests: OpenMetrics text becomes TSDB
blocks (`promtool tsdb create-blocks-from openmetrics`); the recording rules a query
needs are then backfilled with `promtool tsdb create-blocks-from rules`, in dependency
order, since a rule backfill cannot read rules backfilled beside it.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path

import yaml

from fleetcanary.probes.lib import yamltext
from harness.ports import free_port
from harness.processes import stop_process
from harness.prometheus import binary

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "alerts/fleetcanary.rules.yml"
RECORD_NAME = re.compile(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+")


PROMTOOL_BLOCK_S = 7200  # promtool's block duration for `create-blocks-from rules`


class BackfilledPrometheus:
    """A Prometheus on 127.0.0.1 over an existing TSDB directory (no scraping)."""

    def __init__(self, data: Path, log: Path, lookback: str = "5m") -> None:
        self._log = open(log, "ab")  # noqa: SIM115 - Prometheus's output for its lifetime; closed in stop()
        # A free port can be taken by another process before Prometheus binds it (tests run side by
        # side): a ready answer counts only if it comes from this server over this data, else retry.
        for _ in range(5):
            self.port = free_port()
            if self._start(data, lookback):
                return
            self._halt()
        self._log.close()
        raise RuntimeError(f"prometheus over {data} did not become ready; see {log}")

    def _start(self, data: Path, lookback: str) -> bool:
        cfg = data.parent / "backfill-prometheus.yml"
        cfg.write_text("global: {scrape_interval: 1h}\n")
        self.proc = subprocess.Popen(
            [binary("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=60d",
             "--query.max-samples=500000000", "--query.timeout=10m", "--log.level=warn",
             f"--query.lookback-delta={lookback}",
             # the detection replay reads a slower group's records as a subquery whose rule reads its data a
             # group offset later (benchmarks/detection/replay.py substitute)
             "--enable-feature=promql-negative-offset"],
            stdout=self._log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(self.url + "/api/v1/status/flags", timeout=2) as r:
                    flags = json.loads(r.read()).get("data", {})
                if flags.get("storage.tsdb.path") != str(data):
                    return False  # another server holds the port
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self.proc.poll() is None
            except (OSError, ValueError):
                time.sleep(0.2)
        return False

    def _halt(self) -> None:
        stop_process(self.proc, timeout=60)

    def _get(self, path: str, params: dict, timeout: float = 900) -> list[dict]:
        q = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=timeout) as r:
                data = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            data = json.loads(exc.read() or b"{}")
        if data.get("status") != "success":
            raise RuntimeError(f"query {params.get('query')!r} failed: {data.get('error', data)}")
        return data["data"]["result"]

    def query(self, expr: str, at: float) -> list[dict]:
        return self._get("/api/v1/query", {"query": expr, "time": at})

    def query_range(self, expr: str, start: int, end: int, step: int) -> list[dict]:
        return self._get("/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step})

    def stop(self) -> None:
        stop_process(self.proc, timeout=120)
        self._log.close()


def create_blocks(openmetrics: Path, data: Path) -> None:
    subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(data)],
                   check=True, stdout=subprocess.DEVNULL)


def rule_stages(wanted, rules_path: Path = RULES) -> list[list[dict]]:
    """The recording rules `wanted` needs, transitively, split into dependency levels."""
    rules = {r["record"]: r for g in yamltext.load(rules_path.read_text())["groups"] for r in g["rules"]}
    needed: dict[str, dict] = {}

    def add(name):
        if name in needed or name not in rules:
            return
        needed[name] = rules[name]
        for dep in RECORD_NAME.findall(rules[name]["expr"]):
            add(dep)

    for w in wanted:
        add(w)
    level: dict[str, int] = {}

    def lvl(name):
        if name not in level:
            deps = [d for d in RECORD_NAME.findall(needed[name]["expr"]) if d in needed]
            level[name] = 1 + max((lvl(d) for d in deps), default=-1)
        return level[name]

    stages: dict[int, list[dict]] = defaultdict(list)
    for name, rule in needed.items():
        stages[lvl(name)].append(rule)
    return [stages[i] for i in sorted(stages)]


def backfill_rules(data: Path, wanted, start: int, end: int, eval_seconds: int, work: Path,
                   lookback: str = "5m", progress=None) -> list[list[str]]:
    """Backfill the recording rules `wanted` needs over [start, end]; returns the stages' rule names."""
    done = []
    ev = f"{eval_seconds // 60}m" if eval_seconds % 60 == 0 else f"{eval_seconds}s"
    # promtool (2.42) imports a rule block by block (2 h) and stops at the first block whose first aligned
    # evaluation falls after the block's end: a start late in its 2-hour block, with the group's hashed
    # offset, silently imported nothing at all. Start on a block boundary, where every block has one.
    if eval_seconds > PROMTOOL_BLOCK_S:
        raise ValueError(f"rule backfill: an evaluation interval over {PROMTOOL_BLOCK_S} s is not supported")
    start = -(-start // PROMTOOL_BLOCK_S) * PROMTOOL_BLOCK_S
    for i, stage in enumerate(rule_stages(wanted)):
        prom = BackfilledPrometheus(data, work / "backfill-prometheus.log", lookback)
        try:
            # One file path and group name for every stage: Prometheus offsets a group's evaluations by a
            # hash of its name and file, so all stages then evaluate at the same instants, as the rules of
            # one live group do, instead of stacking up to one interval of lag per stage.
            rf = work / "rules.yml"
            rf.write_text(yaml.safe_dump({"groups": [{"name": "fleetcanary-peers", "interval": ev, "rules": stage}]}))
            out = work / f"rules{i}"
            r = subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "rules", "--start", str(start),
                                "--end", str(end + 1), "--url", prom.url, "--eval-interval", ev,
                                "--output-dir", str(out), str(rf)], capture_output=True, text=True)
        finally:
            prom.stop()
        if r.returncode != 0 or not out.is_dir():
            raise RuntimeError(f"promtool rule backfill of stage {i} wrote no blocks (exit {r.returncode}): "
                               f"{(r.stdout + r.stderr)[-3000:]}")
        for blk in out.iterdir():
            if blk.is_dir():
                shutil.move(str(blk), data / blk.name)
        names = [r["record"] for r in stage]
        done.append(names)
        if progress:
            progress(f"rules backfilled, stage {i}: {', '.join(names)}")
    return done
