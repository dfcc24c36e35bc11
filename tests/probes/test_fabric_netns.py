"""The fabric probe across a small fleet: four network namespaces on one bridge
(tests/support/netns.py), each running a real `fleetcanary run` with the fabric probe on gloo
over TCP and a static member list, and a real Prometheus in the root namespace scraping all four
with the shipped rules (a copy evaluated every 2 s, `for` scaled to seconds).

One fleet serves the module (starting it costs a torch import per node per slot); the tests
run in file order and each leaves the fleet as it found it:

1. over the first tournament every pair meets, with node-3's link rate-limited (tc tbf, both
   directions) from the start;
2. the shipped FleetCanaryFabricNodeSlow fires for node-3 and for no other node;
3. strays on a host's rendezvous port (one from outside the pair, one silent from the partner's
   own address) do not break that slot's pair;
4. a link cut mid-collective ends as a timeout on both sides, within the deadline;
5. a partner whose daemon is down is a `peer_unavailable` skip on the other side.

Nothing here asserts on speed: the machine is shared. The limit is far below what a free link
moves on any machine this runs on, and the rules compare nodes with each other. The daemons meet
in real time on a wall-clock slot grid, so the slot is sized from what this machine measures when
the fleet starts (tests/support/realtime.py: a worker's imports and a torch import under the load
of the moment), and no wait is a count of slots: a wait ends when what it waits for is there, or
when the daemons' own records show it will not come (a pair scheduled ATTEMPTS times, both sides
running, never met; the daemons no longer recording runs). Wall-clock timeouts only bound a hang.
"""
from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
from itertools import combinations
from pathlib import Path

import pytest
import yaml

from fleetcanary.probes import PROBES
from fleetcanary.probes.lib import yamltext
from tests.support.helpers import StopWaiting, metric_value, require_binary, unavailable, wait_for
from tests.support.netns import NamespaceNet
from tests.support.prometheus import Prometheus
from tests.support.realtime import Meetings, SlotPlan

if importlib.util.find_spec("torch") is None:  # gloo ranks need it; `make test` installs it
    unavailable("torch is not installed")
pytestmark = [pytest.mark.multinode, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"
N = 4
NAMES = [f"node-{i}" for i in range(N)]
PAIRS = list(combinations(NAMES, 2))
SLOW = "node-3"             # the node whose link is rate-limited
RATE_BITS = 40_000_000      # tbf on SLOW's link: far below any free veth link
PORT = 29400
# A slot holds the workers' start (the meeting window), a torch import in each of the four workers at
# once, and the sweep: 5 ping-pongs of 1 MiB and small collectives, about 1 s at RATE_BITS, plus the
# process group and the result. SlotPlan scales the measured start and import times by the workers per
# core and a safety factor; this is the sweep's share.
SWEEP_SECONDS = 6.0
# A pair the schedule gave this many slots in which both sides ran, that never met, will not meet: the
# verdict. (A busy machine can lose a slot: a worker too late for the meeting window.)
ATTEMPTS = 3
HANG_SLOTS = 30             # only a hang reaches a wait this long; evidence ends a failing wait sooner
CLOCK_SLACK_S = 1.0         # a record's start (wall clock) and duration (monotonic) are read one after the other
SECRET = "netns-fleet-secret-5b1e0c7d2a94"
# The rules' copy: evaluated every 2 s, `for` a few evaluations. The windows stay the shipped 1h, longer
# than this module runs: a tournament that a busy machine stretched over more slots stays in the window.
RULE_INTERVAL = "2s"
FOR = "6s"


def fabric_params(net: NamespaceNet, secret_file: Path, plan: SlotPlan) -> dict:
    return {"members": [{"name": n.name, "address": f"{n.ip}:{PORT}"} for n in net.nodes],
            "backend": "gloo", "slot_seconds": plan.slot, "meet_offset_seconds": plan.meet_offset,
            "rendezvous_wait_seconds": plan.wait, "handshake_timeout_seconds": 2.0,
            "sizes_bytes": [8, 65536], "sendrecv_bytes": 1 << 20, "warmup_iterations": 1, "iterations": 3,
            "sendrecv_iterations": 3, "collective_timeout_seconds": plan.timeout, "secret_file": str(secret_file)}


def daemon_config(net: NamespaceNet, secret_file: Path, plan: SlotPlan) -> dict:
    probes = {name: {"enabled": False} for name in PROBES if name != "fabric"}
    probes["fabric"] = {"enabled": True, "interval_seconds": plan.slot, "timeout_seconds": plan.timeout,
                        "jitter_seconds": 0, "params": fabric_params(net, secret_file, plan)}
    return {"worker_kill_grace_seconds": plan.kill_grace, "probes": probes}


def scaled_rules(workdir: Path) -> list[str]:
    """The shipped rule files with every group evaluated every RULE_INTERVAL and the fabric alerts'
    `for` scaled to seconds. alerts/build.py has no scale option on this branch, so the copy is
    rewritten here; the expressions are the shipped ones, 1h windows included."""
    out, scaled = [], set()
    for name in ("fleetcanary.rules.yml", "fleetcanary.alerts.yml"):
        doc = yamltext.load((ALERTS / name).read_text())
        for group in doc["groups"]:
            group["interval"] = RULE_INTERVAL
            if not group["name"].startswith("fleetcanary-fabric"):
                continue
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = FOR
                scaled.add(rule.get("alert") or rule["record"])
        p = workdir / name
        p.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(str(p))
    assert {"FleetCanaryFabricNodeSlow", "node:fleetcanary_fabric_partners_measured:count1h"} <= scaled, scaled
    return out


# A stray on the partner's own address (another process on that node): one garbage line, one
# silent connection held open until `until`.
STRAY = """
import json, socket, sys, time
src, host, port, until = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
held, sent = [], 0
while time.time() < until and len(held) < 2:
    try:
        s = socket.create_connection((host, port), timeout=0.5, source_address=(src, 0))
    except OSError:
        time.sleep(0.02)
        continue
    if not held:
        s.sendall(b"not a hello\\n")
        sent += 1
    held.append(s)
while time.time() < until:
    time.sleep(0.1)
print(json.dumps({"connected": len(held), "garbage": sent}))
"""


class Fleet:
    """Four daemons, Prometheus, and a driver thread that puts the faults into chosen slots while
    the tests read the outcomes (so the scenarios share slots instead of queueing for them)."""

    def __init__(self, workdir: Path, plan: SlotPlan) -> None:
        self.workdir = workdir
        self.plan = plan
        self.hang = HANG_SLOTS * plan.slot
        self.net = NamespaceNet(N, names=NAMES)
        self.secret = workdir / "fabric.secret"
        self.secret.write_text(SECRET)
        self.secret.chmod(0o600)
        self.config = daemon_config(self.net, self.secret, plan)
        self.daemons: dict = {}
        self.m = Meetings(self.daemons, NAMES, plan)
        self.prom: Prometheus | None = None
        self.started = time.time()
        self.stop = threading.Event()
        self.done = {k: threading.Event() for k in ("stray", "faults")}
        self.stray: list[dict] = []      # per attempt: slot, host, guest, what the strays achieved
        self.faults: list[dict] = []     # per attempt: slot, cut pair, down pair, when
        self.errors: list[str] = []
        self.cut_reasons: dict[str, str] = {}
        self._thread = threading.Thread(target=self._drive, name="fleet-driver", daemon=True)

    # ------------------------------------------------------------------ set-up
    def start(self) -> None:
        self.net.limit(SLOW, RATE_BITS)
        for n in self.net.nodes:
            self.start_daemon(n.name)
        self.m.created = time.time()      # runs are due from here on (Meetings.stalled)
        targets = [f"{n.ip}:9835" for n in self.net.nodes]
        labels = {t: {"node": n.name} for t, n in zip(targets, self.net.nodes, strict=True)}
        self.prom = Prometheus(self.workdir / "prom", targets, rule_files=scaled_rules(self.workdir),
                               target_labels=labels)
        self._thread.start()

    def start_daemon(self, name: str):
        self.daemons[name] = self.net.start_daemon(name, self.config, self.workdir / name)
        return self.daemons[name]

    # ------------------------------------------------------------------ reading
    def slot_now(self) -> int:
        return int(time.time() // self.plan.slot)

    def runs(self, name: str, slot: int | None = None) -> list[dict]:
        return self.m.runs(name, slot)

    def run_in(self, name: str, slot: int) -> dict:
        """The node's run of that slot, once recorded (it ends by the slot's deadline and kill grace)."""
        return wait_for(lambda: (self.runs(name, slot) or [None])[0], timeout=3 * self.plan.slot, interval=0.5,
                        what=f"{name}'s fabric run of slot {slot}")

    def wait_tournament(self) -> dict:
        """Every pair met on both sides; fails once a pair's own scheduled slots say it will not."""
        return wait_for(lambda: self.m.all_pairs_met(PAIRS, ATTEMPTS), timeout=self.hang, interval=1.0,
                        what=f"every pair measured on both sides ({self.plan})")

    def share(self) -> dict[str, float]:
        """The slow share of each node whenever it had the minimum of partners (before that, no verdict)."""
        since = f"{int(time.time() - self.started) + 60}s"
        return {r["metric"]["node"]: float(r["value"][1]) for r in self.prom.query(
            f"max by (node) (max_over_time((node:fleetcanary_fabric_partners_slow:ratio1h and on(node) "
            f"node:fleetcanary_fabric_partners_measured:count1h >= 3)[{since}:{RULE_INTERVAL}]))")}

    def wait_judged(self) -> dict[str, float]:
        """Every node judged: Prometheus saw three of its partners' figures while current. A run that ended
        late in its slot may be missed; the next meeting of that pair makes up for it."""
        return self.wait_with_meetings(lambda: (s := self.share()) and set(s) == set(NAMES) and s, PAIRS,
                                       what="every node judged with 3 partners measured")

    def wait_with_meetings(self, check, pairs, what: str, times: int = 2):
        """Poll ``check`` (Prometheus's view of what the daemons measured) until it holds; give up once each
        of ``pairs`` met ``times`` more times meanwhile (Prometheus had those runs to see), or the runs stop."""
        since = time.time()

        def poll():
            value = check()
            if value:
                return value
            if self.m.met_again(pairs, since, times):
                raise StopWaiting(f"each of {pairs} met {times} more times since the wait began and still not: "
                                  f"{what}")
            why = self.m.stalled()
            if why:
                raise StopWaiting(why)
            return None
        return wait_for(poll, timeout=self.hang, interval=2.0, what=what)

    def close(self) -> None:
        self.stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=60)
        try:
            if self.prom is not None:
                self.prom.stop()
        finally:
            self.net.close()

    # ------------------------------------------------------------------ the driver
    def _until(self, t: float) -> None:
        """Wait for a wall-clock time (the slot grid), not for a state."""
        self.stop.wait(max(0.0, t - time.time()))
        if self.stop.is_set():
            raise RuntimeError("fleet closed")

    def _drive(self) -> None:
        try:
            self._strays()
            self.done["stray"].set()
            self.wait_tournament()
            # The faults lose figures (a stopped daemon is no longer scraped): first every node is judged.
            self.wait_judged()
            self._faults()
        except Exception as exc:  # noqa: BLE001 - reported by the tests that wait on it
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            for e in self.done.values():
                e.set()

    def _strays(self) -> None:
        """Strays on node-0's rendezvous port (node-0 hosts every pair it is in): from the root namespace
        (not the partner's address: closed at accept) and from the partner's own namespace (garbage, then
        silence). The host listens only until its partner's hello: when the root stray never found the port
        open (the partner was there first), again in a later slot."""
        host = self.net.node("node-0")
        for _ in range(ATTEMPTS):
            slot = self.slot_now() + 1
            guest = self.net.node(self.m.partner_in("node-0", slot))
            until = self.plan.window_end(slot)
            self._until(slot * self.plan.slot - 1.0)
            ns = self.net.popen(guest, [sys.executable, "-I", "-c", STRAY, guest.ip, host.ip, str(PORT), str(until)],
                                stdout=subprocess.PIPE, text=True)
            root_connected = 0
            while time.time() < until and not root_connected:
                try:
                    socket.create_connection((host.ip, PORT), timeout=0.5).close()
                    root_connected += 1
                except OSError:
                    time.sleep(0.01)
            out, _ = ns.communicate(timeout=self.hang)
            self.stray.append({"slot": slot, "host": host.name, "guest": guest.name, "root_connected": root_connected,
                               "partner_ns": out.strip()})
            if root_connected:
                return

    def _faults(self) -> None:
        """One slot F: SLOW's link cut once its pair's process group is up (mid-collective), and in the
        other pair the guest's daemon stopped before F starts. A cut that came after the sweep ended
        (the pair succeeded), or a pair that never got its process group up, is tried again in a later
        slot with the stopped daemon back."""
        down_done = False
        plan = self.plan
        for _ in range(ATTEMPTS + 1):
            slot = self.slot_now() + 1
            partner = self.m.partner_in(SLOW, slot)
            others = sorted(set(NAMES) - {SLOW, partner})
            attempt = {"slot": slot, "cut": (SLOW, partner), "down": None}
            if not down_done:
                down = others[1]                     # the guest of the other pair; others[0] hosts
                # Stop it between its previous run's end and this slot's start.
                wait_for(lambda down=down, slot=slot: self.runs(down, slot - 1) or
                         time.time() > (slot - 1) * plan.slot + plan.timeout + plan.kill_grace,
                         timeout=2 * plan.slot, interval=0.2, what=f"{down}'s run of slot {slot - 1} to end")
                if time.time() > slot * plan.slot - 0.5:
                    continue
                self.daemons[down].stop()
                attempt["down"] = (others[0], down)
            attempt["cut_at"] = self._cut_mid_collective(slot, partner)
            self.faults.append(attempt)
            for name in (SLOW, partner):
                self.run_in(name, slot)
            if attempt["cut_at"] is not None:
                self.net.restore(SLOW)
            if attempt["down"] and not down_done:
                self.run_in(attempt["down"][0], slot)
                self.start_daemon(attempt["down"][1])
                down_done = True
            outcomes = {r["outcome"] for n in (SLOW, partner) for r in self.runs(n, slot)}
            if attempt["cut_at"] is not None and outcomes != {"success"}:
                return

    def _cut_mid_collective(self, slot: int, partner: str) -> float | None:
        """Cut SLOW's link as soon as its process group with the partner is up: besides the rendezvous
        session (port PORT) the store and gloo connections are established. None: never seen."""
        peer = self.net.node(partner).ip
        end = slot * self.plan.slot + self.plan.timeout
        self._until(slot * self.plan.slot)
        while time.time() < end:
            r = self.net.run(SLOW, ["ss", "-tnH", "state", "established"], check=False)
            conns = [[_addr(x) for x in line.split()[2:4]] for line in r.stdout.splitlines()]
            pg = [c for c in conns if len(c) == 2 and c[1][0] == peer and PORT not in (c[0][1], c[1][1])]
            if len(pg) >= 2:
                self.net.cut(SLOW)
                return time.time()
            time.sleep(0.05)
        return None


def _addr(text: str) -> tuple[str, int]:
    """(ip, port) from ss's 1.2.3.4:5 or [::ffff:1.2.3.4]:5 (gloo's sockets are IPv6, v4-mapped)."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    return host.removeprefix("::ffff:"), int(port)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    require_binary("ss")          # iproute2, like ip and tc: finds the pair's process group to cut it
    plan = SlotPlan.measure(workers=N, sweep_seconds=SWEEP_SECONDS)
    print(f"fabric fleet slot plan: {plan}")
    f = Fleet(tmp_path_factory.mktemp("fabric-fleet"), plan)
    try:
        f.start()
        yield f
    finally:
        f.close()


def test_every_pair_meets_over_a_tournament_and_both_sides_agree(fleet):
    """With node-3 rate-limited from the start, every pair of the 4 meets (one tournament is 3 slots;
    a slot a busy machine loses is made up in the next tournament); both sides of a meeting name each
    other and the slot the schedule gives."""
    pairs = fleet.wait_tournament()
    for pair, slots in pairs.items():
        a, b = sorted(pair)
        for s in slots:
            assert fleet.m.partner_in(a, s) == b and fleet.m.partner_in(b, s) == a   # the schedule each computed alone
    for name in NAMES:
        for r in fleet.runs(name):
            if r["outcome"] == "success":
                extra = r["result"]["extra"]
                assert extra["partner"] == fleet.m.partner_in(name, extra["slot"])
                assert extra["role"] == ("host" if name < extra["partner"] else "guest")
                assert extra["members"] == N and extra["partner_address"] == fleet.net.node(extra["partner"]).ip
    # Prometheus holds the latest partner as one bounded info series per node.
    info = wait_for(lambda: {r["metric"]["node"]: r["metric"]["partner"]
                             for r in fleet.prom.query("fleetcanary_fabric_last_partner_info")},
                    timeout=fleet.hang, interval=1.0, what="partner info series")
    assert set(info) <= set(NAMES) and all(p in NAMES and p != n for n, p in info.items())


def test_the_shipped_rules_fire_fabric_node_slow_for_the_limited_node_and_no_other(fleet):
    """Every pair involving node-3 is slow; each other node is slow with one partner of three. The
    shipped FleetCanaryFabricNodeSlow (`for` scaled) fires for node-3 only, while every node had the
    minimum of distinct partners measured (so the others were judged, not unseen)."""
    fleet.wait_tournament()
    fleet.wait_judged()
    alert = 'ALERTS{alertname="FleetCanaryFabricNodeSlow", alertstate="firing"}'
    firing = fleet.wait_with_meetings(lambda: fleet.prom.query(alert), [p for p in PAIRS if SLOW in p],
                                      what="FleetCanaryFabricNodeSlow firing")
    assert {r["metric"]["node"] for r in firing} == {SLOW}
    judged = fleet.share()
    assert set(judged) == set(NAMES), judged
    since = f"{int(time.time() - fleet.started) + 60}s"
    ever = fleet.prom.query(f'max by (node) (max_over_time(ALERTS{{alertname="FleetCanaryFabricNodeSlow"}}[{since}]))')
    assert {r["metric"]["node"] for r in ever} == {SLOW}, ever            # not even pending elsewhere
    assert judged[SLOW] > 0.5 and all(judged[n] <= 0.5 for n in NAMES if n != SLOW), judged
    # The slow verdicts name node-3's pairs only: (node-3, any) and (any, node-3).
    slow_pairs = {(r["metric"]["node"], r["metric"]["partner"]) for r in fleet.prom.query(
        f"max_over_time(node_partner:fleetcanary_fabric_pair_slow:bool[{since}]) == 1")}
    assert slow_pairs and all(SLOW in p for p in slow_pairs), slow_pairs


def test_strays_on_the_rendezvous_port_do_not_break_the_pair(fleet):
    assert fleet.done["stray"].wait(timeout=fleet.hang) and not fleet.errors, fleet.errors
    hit = [a for a in fleet.stray if a["root_connected"]]
    assert hit, f"the root-namespace stray never found the rendezvous port open: {fleet.stray}"
    a = hit[-1]
    host = fleet.run_in(a["host"], a["slot"])
    guest = fleet.run_in(a["guest"], a["slot"])
    assert (host["outcome"], guest["outcome"]) == ("success", "success"), (host["detail"], guest["detail"], a)
    assert host["result"]["extra"]["partner"] == a["guest"] and guest["result"]["extra"]["partner"] == a["host"]
    rejected = host["result"]["extra"]["rendezvous_rejected"]
    assert rejected.get("unexpected_address", 0) >= 1, (rejected, a)    # the root namespace's connection
    assert SECRET not in json.dumps(host) + json.dumps(guest)


def test_a_link_cut_mid_collective_is_a_timeout_on_both_sides_within_the_deadline(fleet):
    assert fleet.done["faults"].wait(timeout=fleet.hang) and not fleet.errors, fleet.errors
    cut = [a for a in fleet.faults if a["cut_at"] is not None]
    assert cut, f"the process group was never seen up before the deadline: {fleet.faults}"
    a = cut[-1]
    timeout = fleet.plan.timeout
    for name in a["cut"]:
        r = fleet.run_in(name, a["slot"])
        assert r["outcome"] == "timeout", (name, r["outcome"], r["reason"], r["detail"], a)
        assert r["started_at"] <= a["cut_at"] <= r["started_at"] + r["wall_seconds"]     # cut during the run
        # Within the deadline either way, by the runner's own account (no figure about speed):
        # collective_timeout: the probe's bounded wait ran out (its process group's timeout ends
        # SETUP_MARGIN_SECONDS before the deadline) and it answered in time, or the runner would have
        # killed it; deadline: the worker was still tearing down (torch's interpreter exit takes seconds
        # on a loaded machine) and the runner killed it at the deadline, not before.
        assert r["reason"] in ("collective_timeout", "deadline"), (name, r["reason"], r["detail"])
        if r["reason"] == "collective_timeout":
            assert r["probe_seconds"] < timeout, (name, r["probe_seconds"])
        else:
            assert r["wall_seconds"] >= timeout and f"no result within {timeout:g}s" in r["detail"], (name, r)
        fleet.cut_reasons[name] = r["reason"]
    # The link is back and the pair's nodes meet again afterwards.
    assert fleet.net.link_up(SLOW)


def test_a_partner_that_is_down_is_a_peer_unavailable_skip_on_the_other_side(fleet):
    assert fleet.done["faults"].wait(timeout=fleet.hang) and not fleet.errors, fleet.errors
    down = [a for a in fleet.faults if a["down"]]
    assert down, f"no slot left room to stop a daemon: {fleet.faults}"
    a = down[0]
    alive, stopped = a["down"]
    r = fleet.run_in(alive, a["slot"])
    assert (r["outcome"], r["reason"]) == ("skipped", "peer_unavailable"), (r["outcome"], r["reason"], r["detail"])
    assert stopped in r["detail"]
    # The skip came from the meeting window, not from the deadline (a deadline kill is outcome "timeout"):
    # the host listened until the window closed, then answered.
    assert r["started_at"] + r["wall_seconds"] >= fleet.plan.window_end(a["slot"]) - CLOCK_SLACK_S, r
    assert not fleet.runs(stopped, a["slot"])                               # it really was down
    # Counted as a skip with its reason on the side that waited, never as a failure.
    text = fleet.daemons[alive].metrics()
    assert metric_value(text, "fleetcanary_probe_skips_total", probe="fabric", reason="peer_unavailable") >= 1
    assert not metric_value(text, "fleetcanary_probe_runs_total", probe="fabric", outcome="failure")
