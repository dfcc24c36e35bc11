"""The JSON lists the daemon keeps in its state directory across restarts: the GPU budget's charges of the last
day (gpu-budget.json, daemon/scheduler.py's GpuBudget) and when each GPU was last measured (coverage.json,
daemon/coverage.py). Read and written through core/statefile.py: reading never raises (a file absent or set
aside is [], counted in fleetcanary_state_errors_total with one line), a write that fails is one line and the
daemon goes on with what it holds in memory.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable

from fleetcanary.core import statefile

BUDGET_FILE = "gpu-budget.json"  # the GPU-time charges of the last day, kept across restarts
COVERAGE_FILE = "coverage.json"   # when each GPU was last measured by each invasive probe
log = logging.getLogger("fleetcanary.daemon")


class StateFiles:
    def __init__(self, state_dir: str) -> None:
        self.dir = state_dir  # the daemon's settings.state_dir (a reload that names another moves the writes)

    def read(self, name: str, what: str, lost: str) -> list:
        """A JSON list the daemon keeps in its state directory; [] when absent or set aside (core/statefile:
        counted in fleetcanary_state_errors_total, one line). Never raises."""
        data = statefile.read_json(os.path.join(self.dir, name), name, f"{what}: {lost}", expect=list)
        return data if data is not None else []

    @staticmethod
    def dropper(name: str, what: str) -> Callable[[str, str], None]:
        """drop(kind, detail) for a restore: each entry refused is counted; one line for the file."""
        seen = [0]

        def drop(kind: str, detail: str) -> None:
            statefile.ERRORS.count(name, kind)
            seen[0] += 1
            if seen[0] == 1:
                log.warning("state %s: %s set aside (%s: %s; more are counted, not logged); %s",
                            name, what, kind, detail, "the rest is restored")
        return drop

    def keep(self, name: str, what: str, data: list) -> None:
        path = os.path.join(self.dir, name)
        try:
            statefile.write_atomic(path, json.dumps(data, allow_nan=False))
        except (OSError, ValueError) as e:
            log.warning("%s: cannot keep it in %s: %s", what, path, getattr(e, "strerror", None) or e)

    # --- the two files --------------------------------------------------------------------------------------
    def restore_budget(self, budget) -> None:
        """The GPU budget's (daemon/scheduler.py, GpuBudget) charges of the last day."""
        charges = self.read(BUDGET_FILE, "GPU budget", "starting from nothing spent")
        kept = budget.restore(charges, time.time(), drop=self.dropper(BUDGET_FILE, "a GPU budget charge"))
        log.info("GPU budget: %d charges of the last day restored", kept)

    def save_budget(self, budget) -> None:
        self.keep(BUDGET_FILE, "GPU budget", budget.dump(time.time()))

    def restore_coverage(self, store) -> None:
        """The coverage of the store (daemon/state.py, ResultStore.restore_coverage)."""
        entries = self.read(COVERAGE_FILE, "coverage", "every GPU counts as unmeasured until its next run")
        store.restore_coverage(entries, drop=self.dropper(COVERAGE_FILE, "a coverage entry"))

    def save_coverage(self, store) -> None:
        self.keep(COVERAGE_FILE, "coverage", store.dump_coverage())
