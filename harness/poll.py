"""Polling with a deadline: the one way tests and benchmarks wait for a state (never a bare sleep)."""
from __future__ import annotations

import time
import urllib.request


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


def wait_http(url: str, timeout: float = 60.0) -> None:
    """Poll ``url`` until it answers 200; past the deadline a benchmark stops (SystemExit naming the URL)."""
    def ok() -> bool:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200

    try:
        wait_for(ok, timeout=timeout, interval=0.1, what=url)
    except AssertionError:
        raise SystemExit(f"benchmark: {url} did not come up within {timeout}s") from None
