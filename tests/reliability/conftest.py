import pytest

from tests.support.reliability import RUNNING


@pytest.fixture(autouse=True)
def _stop_fault_daemons():
    yield
    for d in list(RUNNING):
        d.stop(timeout=10)
