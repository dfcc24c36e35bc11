"""Backfill a fleet's scrapes and the shipped recording rules into a real Prometheus, and replay the
shipped alerts on it as a live Prometheus evaluating every minute would.

* Raw series: one OpenMetrics file per 2-hour block -> `promtool tsdb create-blocks-from openmetrics`
  (the next block is generated while promtool reads the last).
* Recording rules: only those the replayed alerts need, transitively, read from the SHIPPED rule
  file, in dependency order (a rule backfill cannot read rules backfilled beside it). Every rule
  stays in its shipped group, with that group's `interval:` (promtool honours a group's interval;
  `--eval-interval` is only the default for groups without one) and the group's name, so each
  group evaluates at its own offset, as on a live server. Prometheus runs with its default
  5-minute lookback.
* Alerts: the condition is evaluated with query_range at the alert evaluation interval (1 min) and
  replayed through Prometheus's alert state machine (pending, `for`, `keep_firing_for`). When
  alerts/build.py exposes `alert_parts()`, an alert's hold while its window is sparse (the
  rule's own `ALERTS` reference, which query_range on backfilled data cannot evaluate) is replayed
  from its parts: cond, runs_ok, entity, for_s, keep_s, hold_s.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repo root, for the imports below
from alerts.backfill import BackfilledPrometheus, binary

ROOT = Path(__file__).resolve().parents[2]

RULES = ROOT / "alerts/fleetcanary.rules.yml"
ALERTS = ROOT / "alerts/fleetcanary.alerts.yml"
RECORD_NAME = re.compile(r"\b[a-z_]+:[a-zA-Z0-9_]+:[a-zA-Z0-9_]+\b")
METRIC_NAME = re.compile(r"\b(fleetcanary_[a-z0-9_]+|up)\b(?!\s*\()")
EVAL_S = 60  # the alert groups' evaluation interval (global default: no interval set on them)


def seconds(d) -> int:
    if d is None:
        return 0
    if isinstance(d, (int, float)):
        return int(d)
    total = 0
    for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", str(d)):
        total += int(n) * {"ms": 0, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}[u]
    return total


# --------------------------------------------------------------------------- the shipped rules
@dataclass
class Alert:
    name: str
    expr: str
    for_s: int
    keep_s: int
    labels: dict
    group: str
    cond: str = ""
    runs_ok: str | None = None
    entity: tuple = ()
    hold_s: int = 0
    parts: bool = False
    kind: str = ""        # peer, fast, history, driver, drift, hard, other
    family: str = ""      # the family label, or what a hard alert watches
    needs: set = field(default_factory=set)   # raw metric names
    records: set = field(default_factory=set)


def load_build():
    """alerts/build.py as a module (as tests/test_alerts.py loads it), or None."""
    path = ROOT / "alerts/build.py"
    sys.path.insert(0, str(path.parent))
    name = "fleetcanary_alerts_build_detection"
    spec = importlib.util.spec_from_file_location(name, str(path),
                                                  loader=importlib.machinery.SourceFileLoader(name, str(path)))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:  # noqa: BLE001 - the benchmark still runs on the shipped files alone
        print(f"detection: alerts/build.py did not load ({exc}); replaying the alert expressions whole")
        return None
    return mod


def classify(name: str, labels: dict) -> str:
    if "family" not in labels:
        return "hard"
    if "DriverChange" in name:
        return "driver"
    if "Drift" in name:
        return "drift"
    if "Regression" in name:
        return "history"
    if re.search(r"Fast|Large|Sharp|Sudden|Steep|Far|Big", name):
        return "fast"
    if "Peers" in name:
        return "peer"
    return "other"


def recording_rules(path: Path | None = None) -> dict[str, list[tuple[str, int, dict]]]:
    """record name -> [(group name, group interval in s, rule)]: one name can have several rules (one per
    probe, say), and a query of the name sees them all."""
    out: dict[str, list] = defaultdict(list)
    for g in yaml.safe_load((path or RULES).read_text())["groups"]:
        for r in g["rules"]:
            if "record" in r:
                out[r["record"]].append((g["name"], seconds(g.get("interval")) or EVAL_S, r))
    return out


def closure(exprs, recs) -> tuple[set, set]:
    """The recording rules and raw metrics a set of expressions needs, transitively."""
    records, raw = set(), set()
    pending = list(exprs)
    while pending:
        e = pending.pop()
        if not e:
            continue
        for r in RECORD_NAME.findall(e):
            if r in recs and r not in records:
                records.add(r)
                pending.extend(x[2]["expr"] for x in recs[r])
        stripped = RECORD_NAME.sub(" ", e)
        stripped = re.sub(r'"[^"]*"', '""', stripped)
        raw |= set(METRIC_NAME.findall(stripped))
    return records, raw


def load_alerts(emitted: set[str], families: set[str]) -> tuple[list[Alert], list[dict]]:
    """The shipped alerts this fleet can exercise, and those it cannot (with the reason)."""
    recs = recording_rules()
    build = load_build()
    parts = build.alert_parts() if build is not None and hasattr(build, "alert_parts") else {}
    chosen, skipped = [], []
    for g in yaml.safe_load(ALERTS.read_text())["groups"]:
        for r in g["rules"]:
            if "alert" not in r:
                continue
            a = Alert(r["alert"], " ".join(r["expr"].split()), seconds(r.get("for")), seconds(r.get("keep_firing_for")),
                      r.get("labels", {}), g["name"])
            a.kind = classify(a.name, a.labels)
            a.family = a.labels.get("family", "")
            p = parts.get(a.name)
            if p:
                a.parts = True
                a.cond = " ".join(p["cond"].split())
                a.runs_ok = " ".join(p["runs_ok"].split()) if p.get("runs_ok") else None
                a.entity = tuple(p.get("entity") or ())
                a.for_s = int(p.get("for_s", a.for_s))
                a.keep_s = int(p.get("keep_s", a.keep_s))
                a.hold_s = int(p.get("hold_s") or 0)
            else:
                a.cond = a.expr
            if "ALERTS" in a.cond and not a.parts:
                skipped.append({"alert": a.name,
                                "why": "its expression reads ALERTS and build.py gives no alert_parts"})
                continue
            a.records, a.needs = closure([a.cond, a.runs_ok], recs)
            a.needs.discard("ALERTS")
            if a.kind != "hard":
                ok = a.family in families
                why = f"family {a.family} is not in the synthetic fleet"
            else:
                missing = sorted(a.needs - emitted)
                ok = not missing and bool(a.needs)
                why = f"needs {', '.join(missing)}, which the fleet does not emit"
                a.family = hard_family(a.needs)
            if ok:
                chosen.append(a)
            else:
                skipped.append({"alert": a.name, "why": why})
    return chosen, skipped


def hard_family(needs: set[str]) -> str:
    if "fleetcanary_gpu_lost" in needs or "fleetcanary_gpus_healthy" in needs:
        return "gpu_lost"
    if "fleetcanary_gpu_pcie_link_width" in needs:
        return "pcie"
    if needs == {"up"}:
        return "exporter"
    return "probe"


# --------------------------------------------------------------------------- backfill
_FLEET = None  # the fleet, inherited by the forked block writers


def _raw_block(arg) -> int:
    i, b0, b1, work, data = arg
    path = Path(work) / f"block{i:03d}.om"
    _FLEET.write_block(path, b0, b1)
    size = path.stat().st_size
    r = subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(path), str(data)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    path.unlink()
    if r.returncode != 0:
        raise RuntimeError(f"promtool openmetrics backfill of block {i} failed: {r.stderr.decode()[-2000:]}")
    return size


def backfill_raw(fleet, data: Path, work: Path, progress, jobs: int = 2) -> int:
    """Generate the scrapes block by block and backfill each (`jobs` blocks at a time)."""
    import multiprocessing

    global _FLEET  # noqa: PLW0603 - the forked pool's workers inherit the fleet through it, unpickled
    data.mkdir(parents=True, exist_ok=True)
    fleet.prepare_scrapes()
    _FLEET = fleet
    args = [(i, b0, b1, str(work), str(data)) for i, (b0, b1) in enumerate(fleet.blocks())]
    size = 0
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for k, s in enumerate(pool.imap_unordered(_raw_block, args), 1):
            size += s
            if k % 12 == 0:
                progress(f"raw backfill: {k}/{len(args)} blocks, {size / 2**20:.0f} MiB of OpenMetrics so far")
    return size


def stages(records: set[str], recs) -> list[list[str]]:
    level: dict[str, int] = {}

    def lvl(name):
        if name not in level:
            deps = {d for x in recs[name] for d in RECORD_NAME.findall(x[2]["expr"]) if d in records and d != name}
            level[name] = 1 + max((lvl(d) for d in deps), default=-1)
        return level[name]

    out: dict[int, list[str]] = defaultdict(list)
    for r in sorted(records):
        out[lvl(r)].append(r)
    return [out[i] for i in sorted(out)]


RANGE_READ = re.compile(r"\b([a-z_]+:[a-zA-Z0-9_]+:[a-zA-Z0-9_]+)(\{[^}]*\})?\s*(\[|offset\b)")


def read_back(records: set[str], recs, exprs=()) -> set[str]:
    """The recorded series some expression reads over a range or at an offset (a baseline over days
    of daily medians, say), with everything they need: those must exist before the evaluated span."""
    texts = list(exprs) + [x[2]["expr"] for n in records for x in recs[n]]
    seeds = {m.group(1) for e in texts if e for m in RANGE_READ.finditer(e)} & records
    out, pending = set(), list(seeds)
    while pending:
        n = pending.pop()
        if n in out:
            continue
        out.add(n)
        pending.extend(d for x in recs[n] for d in RECORD_NAME.findall(x[2]["expr"]) if d in records)
    return out


def backfill_rules(records: set[str], data: Path, work: Path, start: int, end: int, progress, jobs: int = 2,
                   early: set[str] = frozenset(), early_start: int | None = None) -> list:
    """Backfill `records` stage by stage; each rule in its shipped group at the group's interval, from
    `start`, or from `early_start` for the rules in `early` (read back over a range by others)."""
    recs = recording_rules()
    interval = {g: iv for rs in recs.values() for g, iv, _ in rs}
    done = []
    for i, stage in enumerate(stages(records, recs)):
        t = time.monotonic()
        rules = sorted(((g, name, r) for name in stage for g, _, r in recs[name]), key=lambda x: (x[0], x[1]))
        # split the stage into `jobs` promtool processes per start; a group's rules can be split too: each
        # process reads a file of the same relative name, so a group keeps its evaluation offset
        chunks = []
        for s0 in sorted({early_start if (early_start and n in early) else start for _, n, _ in rules}):
            mine = [x for x in rules if (early_start if (early_start and x[1] in early) else start) == s0]
            part = [[] for _ in range(max(1, min(jobs, len(mine))))]
            for k, x in enumerate(mine):
                part[k % len(part)].append(x)
            chunks += [(s0, c) for c in part]
        prom = BackfilledPrometheus(data, work / "prometheus.log", "5m")
        procs = []
        try:
            for c, (s0, part) in enumerate(chunks):
                d = work / f"stage{i}-{c}"
                d.mkdir(parents=True, exist_ok=True)
                groups = defaultdict(list)
                for g, _, r in part:
                    groups[g].append(r)
                body = {"groups": [{"name": g, "interval": f"{interval[g]}s", "rules": rs} for g, rs in groups.items()]}
                (d / "fleetcanary.rules.yml").write_text(yaml.safe_dump(body, sort_keys=False))
                procs.append((subprocess.Popen(
                    [binary("promtool"), "tsdb", "create-blocks-from", "rules", "--start", str(s0), "--end",
                     str(end), "--url", prom.url, "--eval-interval", f"{EVAL_S}s", "--output-dir", "out",
                     "fleetcanary.rules.yml"], cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), d))
            for proc, d in procs:
                _, err = proc.communicate()
                if proc.returncode != 0:
                    raise RuntimeError(f"promtool rules backfill failed in {d}: {err.decode()[-3000:]}")
        finally:
            prom.stop()
        for _, d in procs:
            out = d / "out"
            if out.exists():
                for blk in out.iterdir():
                    if blk.is_dir():
                        shutil.move(str(blk), data / f"{blk.name}")
            shutil.rmtree(d, ignore_errors=True)
        groups = sorted({g for g, _, _ in rules})
        done.append({"rules": stage, "groups": groups, "intervals_s": sorted({interval[g] for g in groups}),
                     "seconds": round(time.monotonic() - t, 1)})
        done[-1]["from_start"] = sorted(r for r in stage if early_start and r in early)
        progress(f"rules stage {i} ({time.monotonic() - t:.0f}s): " + ", ".join(
            f"{r} [{', '.join(sorted({f'{g} @{iv}s' for g, iv, _ in recs[r]}))}]"
            + (" (from day 0)" if early_start and r in early else "") for r in stage))
    return done


# --------------------------------------------------------------------------- replay
def query_series(prom: BackfilledPrometheus, expr: str, start: int, end: int, step: int = EVAL_S,
                 chunk: int = 86400) -> dict[frozenset, list[int]]:
    """Timestamps (on the step grid from start) at which each output series of expr exists."""
    out: dict[frozenset, list[int]] = defaultdict(list)
    t = start
    while t <= end:
        e = min(end, t + chunk - step)
        for s in prom.query_range(expr, t, e, step):
            key = frozenset((k, v) for k, v in s["metric"].items() if k != "__name__")
            out[key].extend(int(float(ts)) for ts, _ in s["values"])
        t = e + step
    return out


def replay(cond: dict[frozenset, list[int]], a: Alert, end: int, runs_ok=None) -> list[dict]:
    """Prometheus's alert state machine over the evaluation grid, per output series. runs_ok:
    entity key -> set of timestamps at which the entity's window has enough runs (None: no hold)."""
    episodes = []
    for key, ts in cond.items():
        labels = dict(key)
        ent = tuple(labels.get(x) for x in a.entity) if a.entity else None
        true = set(ts)
        ok_at = runs_ok.get(ent, set()) if runs_ok is not None else None
        order = sorted(true)
        i = 0
        t = order[0] if order else None
        while t is not None and t <= end:
            # inactive: jump to the next true evaluation
            active_at, fired_at, keep_since, hold_since, held = t, None, None, None, 0
            while t <= end:
                is_true = t in true
                if not is_true and fired_at is not None and ok_at is not None and a.hold_s > 0 and t not in ok_at:
                    hold_since = t if hold_since is None else hold_since
                    if t - hold_since <= a.hold_s:
                        is_true = True   # held: the window is sparse, the alert keeps its state
                        held += 1
                elif is_true or (ok_at is not None and t in ok_at):
                    hold_since = None
                if is_true:
                    keep_since = None
                    if fired_at is None and t - active_at >= a.for_s:
                        fired_at = t
                else:
                    if fired_at is None:
                        break  # pending -> inactive
                    keep_since = t if keep_since is None else keep_since
                    if t - keep_since >= a.keep_s:
                        break  # resolved
                t += EVAL_S
            if fired_at is not None:
                episodes.append({"labels": labels, "start": fired_at, "end": min(t, end), "held_evals": held})
            while i < len(order) and order[i] <= t:
                i += 1
            t = order[i] if i < len(order) else None
    return episodes


def node_filter(nodes: set[str]) -> str:
    return '|'.join(sorted(nodes))


def replay_alert(prom: BackfilledPrometheus, a: Alert, start: int, end: int) -> tuple[list[dict], dict]:
    t = time.monotonic()
    cond = query_series(prom, a.cond, start, end)
    runs_ok = None
    if a.parts and a.runs_ok and a.entity and cond:
        nodes = {dict(k).get("node") for k in cond} - {None}
        ent = ", ".join(a.entity)
        # only the nodes the condition ever held on: the entities whose hold matters
        q = (f"group by ({ent}) ({a.runs_ok}) and on(node) "
             f'group by (node) (up{{job="fleetcanary", node=~"{node_filter(nodes)}"}})')
        runs_ok = {}
        for key, ts in query_series(prom, q, start, end).items():
            d = dict(key)
            runs_ok[tuple(d.get(x) for x in a.entity)] = set(ts)
    eps = replay(cond, a, end, runs_ok)
    return eps, {"query_s": round(time.monotonic() - t, 1), "cond_series": len(cond)}
