"""A run needs no low descriptor numbers and no spare descriptors to end classified: with every descriptor
below 1024 taken (the attack's 1,100 idle HTTP connections) a run still succeeds (select.select raised
`filedescriptor out of range` and the run vanished), and with none left it is a spawn_failed crash (os.pipe's
EMFILE escaped run_isolated)."""
import os
import resource

import pytest

from fleetcanary.probes.host_memory_bandwidth import HostMemoryBandwidth
from tests.support.helpers import run_job, unavailable

PARAMS = {"array_bytes": 1 << 20, "repeats": 1}


@pytest.fixture
def fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    opened: list[int] = []
    yield soft, hard, opened
    for fd in opened:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_run_succeeds_when_every_descriptor_below_1024_is_taken(tmp_path, fd_limit):
    soft, hard, opened = fd_limit
    if hard < 1200:
        unavailable(f"the hard descriptor limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    while True:  # fill every free descriptor number up to 1023: what the run opens next is numbered 1024 or more
        fd = os.open(os.devnull, os.O_RDONLY)
        opened.append(fd)
        if fd >= 1023:
            break
    out = run_job(HostMemoryBandwidth, PARAMS, tmp_path, timeout_seconds=60)
    assert out.outcome == "success", (out.outcome, out.reason, out.detail)


def test_no_descriptor_left_is_a_spawn_failed_crash(tmp_path, fd_limit):
    _, hard, opened = fd_limit
    fd = os.open(os.devnull, os.O_RDONLY)
    opened.append(fd)
    used = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 1, hard))
    while True:  # take what is left under the limit
        try:
            opened.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    out = run_job(HostMemoryBandwidth, PARAMS, tmp_path, timeout_seconds=60)
    assert (out.outcome, out.reason) == ("crash", "spawn_failed"), (out.outcome, out.reason, out.detail)
    assert "Too many open files" in out.detail
