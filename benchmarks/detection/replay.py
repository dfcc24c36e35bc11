"""Backfill what a fleet's exporters published into a real Prometheus, and replay the shipped rules
on it as a live Prometheus would evaluate them, evaluation by evaluation.

* Raw series: one OpenMetrics file per 2-hour block -> `promtool tsdb create-blocks-from openmetrics`
  (the next block is generated while promtool reads the last). The series are the exporter's judge
  statistics at each scrape (judge.py drives the exporter's own FigureStore and exposition) and the
  raw series the hard-failure alerts read.
* Groups: the shipped `fleetcanary-peers*` group (its recording rules, then its alerts),
  `fleetcanary-own-history*`, `fleetcanary-hard-failures` and `fleetcanary-probe-health`, each at its
  `interval:` and at its own fixed offset within it (Prometheus derives a group's offset from a hash
  of its name and file; here from its name), so each group evaluates at the times a live server would.
* No rule output is backfilled. A live group evaluates its rules in order at one timestamp, so an
  alert of the peers group reads the recording rules' samples of that same evaluation: the replay
  substitutes each recorded series by its rule's expression (the selector's matchers pushed into
  it) and evaluates the alert with query_range at exactly the group's evaluation times. An alert of
  another group reads the recorded series written at that group's latest evaluation: the substituted
  expression is shifted back by the offset between the two groups (`offset`). Every evaluation is
  replayed; `promtool tsdb create-blocks-from rules` (used before) writes no evaluation in the last
  second before each 2-hour block boundary, which the 5-minute lookback hid (`promtool_gap` checks).
* Alerts: the condition at every evaluation of its group, through Prometheus's alert state machine
  (pending when true, firing once true for `for`, resolved at the first false evaluation: the
  shipped rules have no keep_firing_for). An alert with a hold (`FIRE # hold: ... or HOLD`, HOLD reading
  its statistics `and on(...) ALERTS{alertname=..., alertstate="firing"}`: alerts/common.py `hold`) is two
  conditions: FIRE drives it as above, and once it fires, HOLD keeps it firing at each next evaluation (the
  ALERTS sample its previous evaluation wrote), as Prometheus evaluates the expression.
"""
from __future__ import annotations

import bisect
import hashlib
import itertools
import multiprocessing
import re
import shutil
import signal
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fleetcanary.core.rulesettings import RuleSettings
from fleetcanary.probes.lib import yamltext
from fleetcanary.rules.common import HOLD_MARK, firing
from harness.backfill import PROMTOOL_BLOCK_S, BackfilledPrometheus, binary

ROOT = Path(__file__).resolve().parents[2]

RULES = ROOT / "alerts/fleetcanary.rules.yml"
ALERTS = ROOT / "alerts/fleetcanary.alerts.yml"
GROUPS = ("fleetcanary-peer-spread", "fleetcanary-peers", "fleetcanary-own-history", "fleetcanary-hard-failures",
          "fleetcanary-probe-health")  # and their pool shards
# A hold's read: `(last_over_time(node:fleetcanary_judge_<stat>:held_<group>{m}[6h]) and on(...) ALERTS{...})`. The
# held record is the statistic at the evaluations where the alert fired or was pending (recorded before the group's
# alerts, from ALERTS, which the replay does not write); while the alert fires, it is the statistic's newest sample
# of the window, so the replay reads it as `last_over_time(stat{m}[6h])`.
HELD = re.compile(r"\bnode:(fleetcanary_judge_[a-z_]+):held_[a-z_]+\b")
RECORD_NAME = re.compile(r"\b[a-z_]+:[a-zA-Z0-9_]+:[a-zA-Z0-9_]+\b")
SELECTOR = re.compile(r"\b([a-z_]+:[a-zA-Z0-9_]+:[a-zA-Z0-9_]+|fleetcanary_[a-z0-9_]+|up)\b(\{[^}]*\})?"
                      r"(?!\s*\()")
# A record read through a window (the peer-spread group's MADs and node counts, which run slower than their readers).
NEWEST = re.compile(r"last_over_time\(\s*([a-z_]+:[a-zA-Z0-9_]+:[a-zA-Z0-9_]+)(\{[^}]*\})?\[(\w+)\]\s*\)")
READ = re.compile(NEWEST.pattern + "|" + SELECTOR.pattern)
METRIC_NAME = re.compile(r"\b(fleetcanary_[a-z0-9_]+|up)\b(?!\s*\()")
EVAL_S = 60  # a group without an interval: Prometheus's global default here


def seconds(d) -> int:
    if d is None:
        return 0
    if isinstance(d, (int, float)):
        return int(d)
    total = 0
    for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", str(d)):
        total += int(n) * {"ms": 0, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}[u]
    return total


def clean(expr: str) -> str:
    """One line: PromQL comments (to the end of their line) dropped, whitespace collapsed."""
    return " ".join(re.sub(r"#[^\n]*", " ", expr).split())


# Where a deployment loads the rule files (deploy/prometheus-scrape.example.yml): Prometheus places each group's
# evaluations at an offset hashed from the group's name and this path.
RULE_PATHS = {"fleetcanary.rules.yml": "/etc/prometheus/rules/fleetcanary.rules.yml",
              "fleetcanary.alerts.yml": "/etc/prometheus/rules/fleetcanary.alerts.yml"}
_M64 = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
                           0x27D4EB2F165667C5)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M64, 31) * _P1) & _M64


def xxh64(b: bytes) -> int:
    """XXH64 with seed 0 (what Prometheus's labels.Hash uses), for group offsets."""
    n, i = len(b), 0
    if n >= 32:
        v = [(_P1 + _P2) & _M64, _P2, 0, (-_P1) & _M64]
        while i + 32 <= n:
            v = [_round(v[k], int.from_bytes(b[i + 8 * k:i + 8 * k + 8], "little")) for k in range(4)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M64
        for x in v:
            h = (((h ^ _round(0, x)) * _P1) + _P4) & _M64
    else:
        h = _P5
    h = (h + n) & _M64
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, int.from_bytes(b[i:i + 8], "little")), 27) * _P1 + _P4) & _M64
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ ((int.from_bytes(b[i:i + 4], "little") * _P1) & _M64), 23) * _P2 + _P3) & _M64
        i += 4
    for c in b[i:]:
        h = (_rotl(h ^ ((c * _P5) & _M64), 11) * _P1) & _M64
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    return h ^ (h >> 32)


def prometheus_offset(name: str, file: str, interval: int) -> float:
    """Seconds into each interval at which Prometheus evaluates a group (rules/group.go EvalTimestamp: the
    xxhash of the labels {file, name}, modulo the interval in nanoseconds)."""
    return (xxh64(b"file\xff" + file.encode() + b"\xffname\xff" + name.encode() + b"\xff") % (interval * 10**9)) / 1e9


def group_offset(name: str, file: str, interval: int) -> int:
    """The group's offset as a live server loading `file` from its deployed path has it, in whole seconds
    (query_range steps are whole seconds; the fraction cannot change which samples an evaluation sees at a
    240-second scrape)."""
    return int(prometheus_offset(name, RULE_PATHS.get(file, file), interval))


def promtool_loses(name: str, file: str, interval: int, block: int = PROMTOOL_BLOCK_S) -> bool:
    """Whether `promtool tsdb create-blocks-from rules` drops one evaluation of this group before every block
    boundary: it queries each 2-hour block up to the last whole second before its end and starts the next
    block's at its first slot at or after the boundary, so a slot in that last second (a group offset in the
    last second of an interval that divides 2 hours) is never evaluated. The file as promtool is given it."""
    return block % interval == 0 and prometheus_offset(name, file, interval) % interval > interval - 1


# --------------------------------------------------------------------------- the shipped rules
@dataclass
class Record:
    name: str
    expr: str
    group: str
    interval: int
    offset: int


@dataclass
class Alert:
    name: str             # the alert name
    expr: str             # as shipped, one line
    for_s: int
    labels: dict
    group: str
    interval: int
    offset: int
    cond: str = ""        # what is evaluated: the expression with recorded series substituted
    kind: str = ""        # peer, fast, history, driver, drift, hard, other
    family: str = ""      # the figure, or what a hard alert watches
    needs: set = field(default_factory=set)   # raw metric names
    records: set = field(default_factory=set)
    keep_s: int = 0       # the shipped rules have none; kept for the JSON's shape
    hold: str = ""        # the hold branch without its ALERTS clause, substituted ("": none)
    hold_join: tuple = ()  # the labels its ALERTS clause joins on: a firing series holds its siblings on them too
    hold_s: int = 0
    parts: bool = False

    @property
    def path(self) -> str:
        return self.labels.get("path", "")

    @property
    def display(self) -> str:
        """The rule: the alert name, and its path where one name has several rules."""
        return f"{self.name} ({self.path})" if self.path in ("change", "level") else self.name


def classify(name: str, labels: dict) -> str:
    if "figure" not in labels:
        return "hard"
    path = labels.get("path", "")
    if path == "driver_change" or "DriverChange" in name:
        return "driver"
    if path == "drift":
        return "drift"
    if path == "regression":
        return "history"
    if path in ("fast", "own_fast"):
        return "fast"
    if path in ("change", "level"):
        return "peer"
    return "other"


def shipped_groups() -> list[dict]:
    out = []
    for f in (RULES, ALERTS):
        for g in yamltext.load(f.read_text())["groups"]:
            iv = seconds(g.get("interval")) or EVAL_S
            out.append(g | {"_interval": iv, "_offset": group_offset(g["name"], f.name, iv), "_file": f.name})
    return out


def recording_rules() -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = defaultdict(list)
    for g in shipped_groups():
        for r in g["rules"]:
            if "record" in r:
                expr = re.sub(r"\b(group_left|group_right)\b(?!\s*\()", r"\1()", clean(r["expr"]))
                out[r["record"]].append(Record(r["record"], expr, g["name"], g["_interval"], g["_offset"]))
    return out


def _matchers(braces: str | None) -> list[str]:
    inner = (braces or "{}")[1:-1].strip()
    return [m.strip() for m in re.findall(r'[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"[^"]*"', inner)]


def _add_matchers(braces: str | None, extra: list[str]) -> str:
    ms = _matchers(braces) + [m for m in extra if m not in _matchers(braces)]
    return "{" + ", ".join(ms) + "}"


def substitute(expr: str, recs: dict[str, list[Record]], group: str, interval: int, offset: int,
               shift: int = 0, used: set | None = None, within: frozenset = frozenset()) -> str:
    """expr with every recorded series replaced by its rule's expression, evaluated as a live server's
    rule in `group` (its interval and offset) would read it: the same evaluation when the rule is in the
    same group, else the recording group's latest evaluation (an `offset` on its selectors). `shift`:
    an offset already applied to this expression's selectors (nested substitutions). A rule that reads its own
    past (node:fleetcanary_nvlink_domain:info keeps a node's domain for a day) is left reading the recorded
    name, which the replay never writes: the rule as a server runs it where the series never had a value."""
    def rule(name: str, braces: str | None) -> tuple[Record, str]:
        """The one rule recording `name`, and its expression with the reader's matchers pushed into it."""
        rules = recs[name]
        if len(rules) != 1:
            raise SystemExit(f"detection: {name} is recorded by {len(rules)} rules; the replay substitutes one")
        r = rules[0]
        if used is not None:
            used.add(name)
        extra = _matchers(braces)
        grouping = set()
        for g in re.findall(r"\bby\s*\(([^)]*)\)", r.expr):
            grouping |= {x.strip() for x in g.split(",")}
        for mt in extra:
            label = re.match(r"[a-zA-Z_][a-zA-Z0-9_]*", mt).group(0)
            if label not in grouping:
                raise SystemExit(f"detection: {name}{braces} filters on {label}, which its rule does not keep")
        return r, SELECTOR.sub(lambda mm: f"{mm.group(1)}{_add_matchers(mm.group(2), extra)}", r.expr)

    def one(name: str, braces: str | None, whole: str) -> str:
        if name in within:
            return whole
        if name not in recs:
            if shift:
                return f"{name}{braces or ''} offset {shift}s"
            return whole
        r, inner = rule(name, braces)
        if r.group == group:
            d = shift
        else:
            if interval % r.interval:
                raise SystemExit(f"detection: {group} ({interval}s) reads {name} of {r.group} ({r.interval}s) "
                                 "without last_over_time; a plain read of a slower group's record goes stale")
            d = shift + (offset - r.offset) % r.interval
        return "(" + substitute(inner, recs, r.group, r.interval, r.offset, d, used, within | {name}) + ")"

    def newest(m: re.Match) -> str:
        """`last_over_time(record[W])`: the record's value at the newest evaluation of its group within W before
        this reader's time τ (t - shift), the groups' evaluations being k * interval + offset. A subquery at the
        recorder's interval steps through k * interval (Prometheus aligns a subquery's steps to multiples of
        its step), so its `offset` is shift + the recorder's offset and the rule inside reads its data that
        offset later (a negative offset): at k * interval + offset, where the live group evaluated."""
        name, braces, window = m.group(1), m.group(2), m.group(3)
        if name in within:
            return m.group(0)
        if name not in recs:
            raise SystemExit(f"detection: last_over_time({name}[{window}]) reads no record the replay substitutes")
        r, inner = rule(name, braces)
        body = substitute(inner, recs, r.group, r.interval, r.offset, -r.offset, used, within | {name})
        at = shift + r.offset
        return f"last_over_time(({body})[{window}:{r.interval}s]{f' offset {at}s' if at else ''})"

    # one pass: what a substitution writes is not read again
    return READ.sub(lambda m: newest(m) if m.group(1) else one(m.group(4), m.group(5), m.group(0)), expr)


def load_alerts(emitted: set[str], families: set[str]) -> tuple[list[Alert], list[dict]]:
    """The shipped alerts of the replayed groups that this fleet can exercise, and those it cannot (why)."""
    recs = recording_rules()
    chosen, skipped = [], []
    for g in shipped_groups():
        if not g["name"].startswith(GROUPS):
            continue
        for r in g["rules"]:
            if "alert" not in r:
                continue
            if "keep_firing_for" in r:
                raise SystemExit(f"detection: {r['alert']} has keep_firing_for; the replay's state machine has none")
            # `group_left X` with X substituted by a parenthesised expression would read as a label list
            fire, mark, hold = r["expr"].partition(HOLD_MARK)
            expr, held = (re.sub(r"\b(group_left|group_right)\b(?!\s*\()", r"\1()", clean(x))
                          for x in (fire, mark + hold))
            if mark:
                own = " and " + firing(RuleSettings(), r["alert"])   # the shipped rules' settings
                held = held.removeprefix("or ")
                if own not in held or "ALERTS" in held.replace(own, ""):
                    raise SystemExit(f"detection: {r['alert']} holds through another alert's ALERTS")
                held = held.replace(own, "")
                hold_join = tuple(x.strip() for x in re.search(r"on\(([^)]*)\) ALERTS", own).group(1).split(","))
            a = Alert(r["alert"], expr, seconds(r.get("for")), r.get("labels", {}), g["name"],
                      g["_interval"], g["_offset"])
            a.kind = classify(a.name, a.labels)
            a.family = a.labels.get("figure", "")
            used: set[str] = set()
            a.cond = substitute(a.expr, recs, a.group, a.interval, a.offset, used=used)
            if mark:
                a.hold = substitute(HELD.sub(r"\1", held), recs, a.group, a.interval, a.offset, used=used)
                a.hold_join = hold_join
            a.records = used
            a.needs = set(METRIC_NAME.findall(re.sub(r'"[^"]*"', '""', a.cond)))
            if a.kind != "hard":
                ok = a.family in families
                why = f"figure {a.family} is not in the synthetic fleet"
            else:
                missing = sorted(a.needs - emitted)
                ok = not missing and bool(a.needs)
                why = f"needs {', '.join(missing)}, which the fleet does not emit"
                a.family = hard_family(a.needs)
            if ok:
                chosen.append(a)
            else:
                skipped.append({"alert": a.display, "group": a.group, "why": why})
    return chosen, skipped


def peer_records() -> list[Record]:
    """The recording rules of the replayed groups (evaluated for the evaluation count)."""
    return [r for rs in recording_rules().values() for r in rs if r.group.startswith(GROUPS)]


def hard_family(needs: set[str]) -> str:
    if "fleetcanary_gpu_lost" in needs or "fleetcanary_gpus_healthy" in needs:
        return "gpu_lost"
    if "fleetcanary_gpu_pcie_link_width" in needs:
        return "pcie"
    if needs == {"up"}:
        return "exporter"
    return "probe"


def grid(start: int, interval: int, offset: int) -> int:
    """The group's first evaluation at or after start."""
    return start + (offset - start) % interval


# --------------------------------------------------------------------------- backfill
_FLEET = None  # the fleet, inherited by the forked workers


def _pool(jobs: int):
    """A pool of forked workers (they inherit the fleet through _FLEET) that end on SIGTERM as a process does: the
    run's handler (run.py: sys.exit, so its finally blocks stop Prometheus) would raise SystemExit inside the pool's
    own locks when the pool terminates its workers at the end of a `with`, and a worker left waiting on one of them
    held the run (seen once in the backfill)."""
    return multiprocessing.get_context("fork").Pool(
        jobs, initializer=signal.signal, initargs=(signal.SIGTERM, signal.SIG_DFL))


def _judge(i: int):
    from benchmarks.detection.judge import judge_node
    n = _FLEET.nodes[i]
    _, t, up, *_ = _FLEET._per_node[i]
    return n.name, judge_node(_FLEET, n, t, up, Path(_FLEET._state_root) / n.name)


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


def judge_fleet(fleet, work: Path, progress, jobs: int = 2) -> dict:
    """Drive every node's exporter judge (judge.py) over the fleet's runs and scrapes; the checks summed."""
    global _FLEET  # noqa: PLW0603 - the forked pool's workers inherit the fleet through it, unpickled
    fleet.prepare_scrapes()
    fleet._state_root = str(work / "state")
    _FLEET = fleet
    fleet.judged = {}
    t = time.monotonic()
    with _pool(jobs) as pool:
        for k, (name, nj) in enumerate(pool.imap_unordered(_judge, range(len(fleet.nodes)), chunksize=4), 1):
            fleet.judged[name] = nj
            if k % 40 == 0:
                progress(f"judge: {k}/{len(fleet.nodes)} nodes ({time.monotonic() - t:.0f}s)")
    shutil.rmtree(work / "state", ignore_errors=True)
    from benchmarks.detection.fleet import DRIVER_OLD

    checks: dict = {"series_published": 0, "samples": 0, "nodes_never_upgraded_with_another_driver_label": 0}
    for name, nj in fleet.judged.items():
        if fleet.by_name[name].upgrade_at is None and nj.checks["driver_labels"] != [DRIVER_OLD]:
            checks["nodes_never_upgraded_with_another_driver_label"] += 1
        checks["series_published"] += len(nj.cols)
        checks["samples"] += sum(len(x) for x in nj.idx)
        for k, v in nj.checks.items():
            if isinstance(v, (int, float)):
                checks[k] = checks.get(k, 0) + v
    return checks


def backfill_raw(fleet, data: Path, work: Path, progress, jobs: int = 2) -> int:
    """Generate the scrapes block by block and backfill each (`jobs` blocks at a time)."""
    global _FLEET  # noqa: PLW0603
    data.mkdir(parents=True, exist_ok=True)
    _FLEET = fleet
    args = [(i, b0, b1, str(work), str(data)) for i, (b0, b1) in enumerate(fleet.blocks())]
    size = 0
    with _pool(jobs) as pool:
        for k, s in enumerate(pool.imap_unordered(_raw_block, args), 1):
            size += s
            if k % 12 == 0:
                progress(f"raw backfill: {k}/{len(args)} blocks, {size / 2**20:.0f} MiB of OpenMetrics so far")
    return size


# --------------------------------------------------------------------------- replay
def query_series(prom: BackfilledPrometheus, expr: str, start: int, end: int, step: int,
                 chunk: int = 86400) -> tuple[dict[frozenset, list[int]], list[int]]:
    """Evaluation times (start + k * step) at which each output series of expr exists, and every
    evaluation time query_range answered (a check that none was lost)."""
    out: dict[frozenset, list[int]] = defaultdict(list)
    steps: set[int] = set()
    chunk = chunk // step * step
    t = start
    while t <= end:
        e = min(end, t + chunk - step)
        for s in prom.query_range(expr, t, e, step):
            key = frozenset((k, v) for k, v in s["metric"].items() if k != "__name__")
            ts = [int(float(x)) for x, _ in s["values"]]
            out[key].extend(ts)
            steps.update(ts)
        t = e + step
    return out, sorted(steps)


def replay(cond: dict[frozenset, list[int]], a: Alert, end: int,
           hold: dict[frozenset, list[int]] | None = None) -> list[dict]:
    """Prometheus's alert state machine over the group's evaluations, per output series: active at the
    first true evaluation, firing once it has been true for `for`, resolved (or dropped, if pending) at
    the first false one. With `hold` (the hold branch's true evaluations), a firing alert stays firing at
    an evaluation where the hold is true (the ALERTS sample of the previous evaluation is firing).

    The hold branch joins its own ALERTS on `a.hold_join` (node, gpu, series, baseline), not on every label, so on
    a live server it is true for a series whose *sibling* on those labels fired at the previous evaluation, too: the
    same GPU's series under a new driver (its driver_version differs) while the old one's page holds. Such a series
    is active there like any other, and fires after `for`. That is carried here until nothing changes."""
    fire = {key: set(ts) for key, ts in cond.items()}
    held = {key: set(ts) for key, ts in (hold or {}).items()}
    while True:
        episodes = [ep for key in fire for ep in _episodes(key, fire[key], held.get(key, set()), a, end)]
        if not held or not a.hold_join:
            return episodes
        firing: dict[tuple, list[tuple[frozenset, int, int]]] = defaultdict(list)
        for ep in episodes:
            key = frozenset(ep["labels"].items())
            firing[tuple(ep["labels"].get(x, "") for x in a.hold_join)].append((key, ep["start"], ep["end"]))
        grown = False
        for key, ts in held.items():
            labels = dict(key)
            sibs = [(s, e) for k, s, e in firing.get(tuple(labels.get(x, "") for x in a.hold_join), ()) if k != key]
            if not sibs:
                continue
            extra = {t for t in ts - fire.get(key, set()) if any(s <= t - a.interval < e for s, e in sibs)}
            if extra:
                fire.setdefault(key, set()).update(extra)
                grown = True
        if not grown:
            return episodes


def _episodes(key: frozenset, fire: set[int], held: set[int], a: Alert, end: int) -> list[dict]:
    """One series' episodes: `fire` its true evaluations, `held` those where its hold is true."""
    out = []
    step = a.interval
    labels = dict(key)
    order = sorted(fire)
    k = 0
    while k < len(order):
        active_at = t = order[k]
        while t - active_at < a.for_s and t + step in fire:   # pending
            t += step
        if t - active_at >= a.for_s:
            fired_at = t
            while t + step in fire or t + step in held:          # firing
                t += step
            out.append({"labels": labels, "start": fired_at, "end": min(t + step, end)})
        k = bisect.bisect_right(order, t)
    return out


def replay_alert(prom: BackfilledPrometheus, a: Alert, start: int, end: int) -> tuple[list[dict], dict]:
    t = time.monotonic()
    first = grid(start, a.interval, a.offset)
    cond, steps = query_series(prom, a.cond, first, end, a.interval)
    hold = query_series(prom, a.hold, first, end, a.interval)[0] if a.hold else None
    eps = replay(cond, a, end, hold)
    expected = (end - first) // a.interval + 1
    bad = [x for x in steps if (x - first) % a.interval]
    return eps, {"query_s": round(time.monotonic() - t, 1), "cond_series": len(cond), "evaluations": expected,
                 "off_grid_points": len(bad)}


def count_evaluations(prom: BackfilledPrometheus, r: Record, start: int, end: int) -> dict:
    """A recording rule of a replayed group at each of its group's evaluations: how many series it
    records there (the rule substituted exactly as the alerts read it). Every evaluation is answered by
    query_range; one without output is listed (none should lack it while the fleet publishes)."""
    expr = substitute(r.name, recording_rules(), r.group, r.interval, r.offset)
    first = grid(start, r.interval, r.offset)
    _, steps = query_series(prom, f"count({expr})", first, end, r.interval)
    expected = list(range(first, end + 1, r.interval))
    have = set(steps)
    missing = [t for t in expected if t not in have]
    return {"rule": r.name, "group": r.group, "interval_s": r.interval, "offset_s": r.offset,
            "evaluations": len(expected), "with_output": len(expected) - len(missing), "without_output": missing[:20],
            "off_grid": sum(1 for t in steps if (t - first) % r.interval)}


def promtool_gap(prom_data: Path, work: Path, r: Record, start: int, end: int, selector: str, progress,
                 filename: str = "fleetcanary.rules.yml") -> dict:
    """What `promtool tsdb create-blocks-from rules` writes for one recording rule of the peers group over
    [start, end]: the timestamps of one recorded series (`selector`, a peer group present all along),
    read back raw, and every evaluation missing between them (a step longer than the group's
    interval), with its distance to the next 2-hour block boundary. promtool places the group's evaluations
    at the offset Prometheus would (a hash of the group's name and the file's path as given): the old
    replay's file name by default."""
    d = work / "promtool-gap"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    # its own name (no replayed rule reads it), one per group and file: each check writes its own series
    tag = hashlib.sha256(f"{r.group}/{filename}".encode()).hexdigest()[:8]
    name = f"fleetcanary_detection_gap_{tag}:" + r.name.split(":", 1)[1]
    body = {"groups": [{"name": r.group, "interval": f"{r.interval}s", "rules": [{"record": name, "expr": r.expr}]}]}
    (d / filename).write_text(yaml.safe_dump(body, sort_keys=False))
    t0 = time.monotonic()
    prom = BackfilledPrometheus(prom_data, work / "prometheus.log", "5m")
    try:
        proc = subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "rules", "--start", str(start),
                               "--end", str(end), "--url", prom.url, "--eval-interval", f"{r.interval}s",
                               "--output-dir", "out", filename], cwd=d, capture_output=True)
        if proc.returncode != 0:
            raise RuntimeError(f"promtool rules backfill failed: {proc.stderr.decode()[-2000:]}")
    finally:
        prom.stop()
    for blk in (d / "out").iterdir():
        if blk.is_dir():
            shutil.move(str(blk), prom_data / blk.name)
    shutil.rmtree(d, ignore_errors=True)
    prom = BackfilledPrometheus(prom_data, work / "prometheus.log", "5m")
    try:
        res = prom.query(f"{name}{selector}[{end - start + 600}s]", end + 1)
    finally:
        prom.stop()
    if len(res) != 1:
        raise RuntimeError(f"promtool gap check: {name}{selector} gave {len(res)} series")
    ts = [float(t) for t, _ in res[0]["values"]]
    gaps = [(a, b) for a, b in itertools.pairwise(ts) if b - a > 1.5 * r.interval]
    lost = [a + r.interval * k for a, b in gaps for k in range(1, round((b - a) / r.interval))]
    before = sorted({round(((x // PROMTOOL_BLOCK_S) + 1) * PROMTOOL_BLOCK_S - x, 3) for x in lost})
    span_h = (ts[-1] - ts[0]) / 3600 if ts else 0
    progress(f"promtool gap check ({time.monotonic() - t0:.0f}s): {len(ts)} evaluations written over {span_h:.1f} h, "
             f"{len(lost)} missing")
    return {"rule": r.name, "group": r.group, "file": filename, "series": selector, "start": start, "end": end,
            "interval_s": r.interval,
            "written": len(ts), "first": ts[0] if ts else None, "last": ts[-1] if ts else None,
            "missing": len(lost), "block_boundaries_crossed": int(span_h // 2),
            "missing_seconds_before_block_boundary": before[:20], "missing_examples": lost[:10],
            # a lone missing evaluation leaves the one before it exactly one interval old: inside a 5-minute
            # lookback (Prometheus 2.x includes its left end), so an instant query there still sees a value
            "lookback_hides_them": all(b - a <= 2 * r.interval for a, b in gaps)}


# --------------------------------------------------------------------------- why an alert did not fire
CONDITION = re.compile(r"^(?P<value>.*?) > (?P<floor>[0-9.]+)"
                       r"(?: > on\((?P<g>[^)]*)\) group_left\(\) \((?P<gate>.*?)\))?"
                       r"(?: and on\((?P<g3>[^)]*)\) (?P<confirm>.*) > (?P<cfloor>[0-9.]+))?"
                       r"(?: (?P<op>and|unless) on\((?P<g2>[^)]*)\) \((?P<nodes>.*) >= (?P<min>\d+)\))?$")
# The same parts where the gap is written once (issue 42): VALUE > on(G) group_left() clamp_min(K * MAD, FLOOR).
CONDITION_ONCE = re.compile(r"^(?P<value>.*?) > on\((?P<g>[^)]*)\) group_left\(\) clamp_min\((?P<gate>.*?), "
                            r"(?P<floor>[0-9.]+)\)"
                            r"(?: and on\((?P<g3>[^)]*)\) (?P<confirm>.*) > (?P<cfloor>[0-9.]+))?"
                            r"(?: (?P<op>and|unless) on\((?P<g2>[^)]*)\) \((?P<nodes>.*) >= (?P<min>\d+)\))?$")
RAW_JUDGE = re.compile(r"(?<![:\w])(fleetcanary_judge_[a-z]+)(?![:\w])(\{[^}]*\})?")


def condition_parts(a: Alert) -> dict | None:
    """A peer or own-history alert's condition in its parts, as the shipped rules write it:
    VALUE > FLOOR [> on(G) group_left() (K * MAD)] [and on(N) CONFIRMED > FLOOR] [and|unless on(G) (NODES >= MIN)],
    or with the gap written once, VALUE > on(G) group_left() clamp_min(K * MAD, FLOOR) [...]."""
    m = CONDITION_ONCE.match(a.expr) or CONDITION.match(a.expr)
    if not m or a.kind == "hard":
        return None
    return m.groupdict()


def query_values(prom: BackfilledPrometheus, expr: str, start: int, end: int, step: int,
                 chunk: int = 86400) -> dict[frozenset, dict[int, float]]:
    """Each output series of expr (its labels but the name) -> {evaluation time: value}."""
    out: dict[frozenset, dict[int, float]] = defaultdict(dict)
    chunk = chunk // step * step
    t = start
    while t <= end:
        e = min(end, t + chunk - step)
        for s in prom.query_range(expr, t, e, step):
            key = frozenset((k, v) for k, v in s["metric"].items() if k != "__name__")
            out[key].update((int(float(x)), float(v)) for x, v in s["values"])
        t = e + step
    return out


def diagnose(prom: BackfilledPrometheus, a: Alert, nodes: list[str], start: int, end: int,
             batch: int = 24) -> dict[tuple, dict[int, tuple]]:
    """For the series of `nodes`, at each evaluation of the alert's group: the condition's value, its MAD
    gate and its peer group's node count ((node, gpu, baseline) -> {t: (value, gate, nodes)}; None where a
    part is absent), each part substituted as the alert reads it."""
    parts = condition_parts(a)
    if parts is None or not nodes:
        return {}
    recs = recording_rules()
    first = grid(start, a.interval, a.offset)

    def sub(e: str) -> str:
        return substitute(e, recs, a.group, a.interval, a.offset)

    def by_group(expr: str | None, labels: str | None) -> tuple[list[str], dict]:
        if not expr:
            return [], {}
        names = [x.strip() for x in labels.split(",")]
        got = query_values(prom, sub(expr), first, end, a.interval)
        return names, {tuple(dict(k).get(n, "") for n in names): v for k, v in got.items()}

    gate_names, gates = by_group(parts["gate"], parts["g"])
    node_names, peers = by_group(parts["nodes"], parts["g2"])
    out: dict[tuple, dict[int, tuple]] = defaultdict(dict)
    for i in range(0, len(nodes), batch):
        sel = ['node=~"' + "|".join(sorted(nodes[i:i + batch])) + '"']
        # where the series has a median, an absent change means no baseline (not a stale or warming series)
        med = f'count by (node, gpu) (fleetcanary_judge_median{{figure="{a.family}", {sel[0]}}})'
        for key, vals in query_values(prom, med, first, end, a.interval).items():
            d = dict(key)
            out[("median", d.get("node"), d.get("gpu", ""))].update(dict.fromkeys(vals, ()))
        value = RAW_JUDGE.sub(lambda m, sel=sel: f"{m.group(1)}{_add_matchers(m.group(2), sel)}", parts["value"])
        for key, vals in query_values(prom, sub(value), first, end, a.interval).items():
            d = dict(key)
            ent = (d.get("node"), d.get("gpu", ""), d.get("baseline", ""))
            gate = gates.get(tuple(d.get(n, "") for n in gate_names), {})
            npeers = peers.get(tuple(d.get(n, "") for n in node_names), {})
            for t, v in vals.items():
                g = gate.get(t)
                out[ent][t] = (v, None if g is None else g, npeers.get(t))
    return out
