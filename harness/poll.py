"""Polling with a deadline: the one way tests and benchmarks wait for a state (never a bare sleep)."""
from __future__ import annotations

import time


class StopWaiting(AssertionError):
    """Raised by a wait_for predicate that knows the condition can no longer come (the process it waits
    on exited): wait_for fails at once with it instead of polling to the deadline."""


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value (returned) or the deadline passes (AssertionError
    naming ``what`` and the predicate's last exception, if any)."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except StopWaiting:
            raise
        except Exception as exc:  # noqa: BLE001 - keep polling; report the last error
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                         + (f" (last error: {last_exc})" if last_exc else ""))
