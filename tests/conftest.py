import sys
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, stop_all

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def state_dir(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
def start_daemon(tmp_path):
    """start(config, env=None) -> a ready `fleetcanary run` on 127.0.0.1 (tests/support/daemon.py), its files
    in tmp_path/daemon (daemon-2, ... for more); stopped after the test."""
    started: list[Daemon] = []

    def start(config: dict, env: dict | None = None) -> Daemon:
        n = len(started) + 1
        started.append(Daemon(tmp_path / ("daemon" if n == 1 else f"daemon-{n}"), config, env=env))
        return started[-1]

    yield start
    for d in started:  # before the fixtures the test asked for after this one (an API server) go away
        d.stop()


@pytest.fixture(autouse=True)
def _stop_daemons():
    """A test that fails (or forgets) before its daemon's stop() leaves no daemon running."""
    yield
    stop_all()


@pytest.fixture(autouse=True)
def _state_errors_start_at_zero():
    """core/statefile's and the claim inbox's counts are the process's (a daemon's life); in the test process,
    each test's own (an in-process daemon after a claim test on the same xdist worker showed its refusals)."""
    from fleetcanary.core import statefile
    from fleetcanary.daemon import claim_inbox
    statefile.ERRORS.clear()
    claim_inbox.REJECTED.clear()


SMALL_HOST_BW = {"params": {"array_bytes": 8 << 20, "repeats": 3}, "interval_seconds": 30, "timeout_seconds": 20}


@pytest.fixture(autouse=True)
def _test_process_stays_unpatched():
    """Locust imports gevent, which monkey-patches threading for the whole process: every later test's
    threads would become greenlets, and a worker's output drain would block the test run. Locust runs
    in subprocesses only."""
    yield
    assert "gevent" not in sys.modules, "this test imported gevent (locust) into the test process"


# Modules whose tests share no expensive fixture: under xdist each of their tests may go to any worker.
SPREAD = {"tests/test_alerts.py"}  # one promtool process per rule-test file, up to 1.5 min each


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs `-n 6 --dist loadscope`; with loadscope, a module's tests stay on one worker (many share a
    module-scoped fixture: a fleet of daemons, a Prometheus, real result sets, which each worker would otherwise
    build again), except the SPREAD modules', which go one by one. Other --dist modes are xdist's own."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # xdist (3.x) hands out a loadscope run's modules most tests first, which undid the long-first order below: the
    # fabric fleet (5 tests, 4 minutes of real time, mostly waiting on its slot grid) started after 5.5 minutes and
    # ended the run. In collection order, the long modules start at once.
    config.option.loadscopereorder = False

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return nodeid if module in SPREAD else module

    return ModuleScheduling(config, log)


# The modules that take longest on one worker (2-core VM, `make test`): the fabric fleet's slot grid (about 4
# minutes, mostly waiting), the image (2.5 minutes with the layer cache warm), the wheel and sdist (2 minutes).
LONGEST = ("tests/probes/test_fabric_netns.py", "tests/test_image.py", "tests/packaging/test_wheel.py")


# Modules that mostly wait (a trickled request, a timeout, Alertmanager's group_wait, a daemon's next interval,
# Hypothesis over sockets): under a third of their real time on a CPU with 6 workers. In file order the reliability and
# Alertmanager ones came last together and for 30-45 s every worker waited at once; run together right after the
# long modules, they did the same there. Spread evenly through the others, their waits overlap with work.
WAITING = ("tests/reliability/test_hostile_http.py", "tests/test_alertmanager.py", "tests/daemon/test_xid_watch.py",
           "tests/remediate/test_with_alertmanager.py", "tests/reliability/test_claim_inbox.py",
           "tests/probes/test_fabric_rendezvous_properties.py", "tests/test_coverage_live.py",
           "tests/reliability/test_rendezvous_hostile.py", "tests/reliability/test_secrets.py",
           "tests/runner/test_isolation.py", "tests/daemon/test_hard_faults.py", "tests/reliability/test_faults.py",
           "tests/offline/test_loadtest.py", "tests/reliability/test_security.py", "tests/test_netns_harness.py",
           "tests/daemon/test_claim.py", "tests/daemon/test_prometheus.py", "tests/test_rules_cli.py",
           "tests/offline/test_compare.py", "tests/probes/test_inference_targets.py")


def pytest_collection_modifyitems(config, items):
    """Tests marked `long` (a minute or more of real time) are collected first, the LONGEST modules' before the
    others, so under xdist they start at once on separate workers and the short ones fill the gaps, instead of one
    long test starting last; the rest in file order, with the WAITING modules spread evenly among them."""
    def module(item) -> str:
        return item.nodeid.split("::", 1)[0]

    def is_long(item) -> bool:
        return item.get_closest_marker("long") is not None

    rest = [m for m in dict.fromkeys(module(i) for i in items if not is_long(i)) if m not in WAITING]
    waiting = [m for m in dict.fromkeys(module(i) for i in items) if m in WAITING]
    slot = {m: (k + 1) * (len(rest) + 1) / (len(waiting) + 1) for k, m in enumerate(waiting)}
    slot.update({m: k + 0.5 for k, m in enumerate(rest)})

    def order(item) -> tuple[bool, int, float]:
        if is_long(item):
            return False, LONGEST.index(module(item)) if module(item) in LONGEST else len(LONGEST), 0.0
        return True, 0, slot[module(item)]

    items.sort(key=order)  # stable: otherwise in file order
