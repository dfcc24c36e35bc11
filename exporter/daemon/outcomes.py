"""Outcome counting: what each probe's runs came to (fleetcanary_probe_runs_total, _skips_total, _failures_total,
_crashes_total, _success, _duration_seconds, _last_success_timestamp_seconds, _confirmation_runs_total), as
plain data per probe. The store (daemon/state.py) holds its lock around ``count``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fleetcanary.core.record import OUTCOMES, RunRecord
from fleetcanary.daemon.intake import LabelKey

# Skip reasons that mean a tenant holds the GPUs: what opportunistic runs and claims answer.
TENANT_REASONS = ("gpu_allocated", "gpu_busy", "gpu_mps")


@dataclass
class ProbeState:
    last: RunRecord | None = None
    verdict: RunRecord | None = None  # the last run that was not skipped: what probe_success says
    runs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    skips: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    crashes: dict[str, int] = field(default_factory=dict)
    last_run_ts: float | None = None
    last_success_ts: float | None = None
    gauges: dict[str, dict[LabelKey, float]] = field(default_factory=dict)
    gauges_at: float | None = None  # finished_at of the run that produced `gauges`
    invalid_samples: int = 0
    confirmations: int = 0  # runs the daemon added to confirm a jump (daemon/confirm.py)

    @property
    def skipped_for_tenant(self) -> bool:
        """The last run skipped because a tenant holds the GPUs."""
        return self.last is not None and self.last.outcome == "skipped" and self.last.reason in TENANT_REASONS


def count(st: ProbeState, out: RunRecord) -> None:
    """A finished run into its probe's outcome counts, verdict and run times."""
    st.last = out
    if out.outcome != "skipped":
        st.verdict = out
    st.runs[out.outcome] = st.runs.get(out.outcome, 0) + 1
    st.last_run_ts = out.finished_at
    if out.trigger == "confirmation":
        st.confirmations += 1
    if out.outcome == "skipped":
        st.skips[out.reason] = st.skips.get(out.reason, 0) + 1
    elif out.outcome == "failure":
        st.failures[out.reason] = st.failures.get(out.reason, 0) + 1
    elif out.outcome == "crash":
        st.crashes[out.reason] = st.crashes.get(out.reason, 0) + 1
    if out.outcome == "success":
        st.last_success_ts = st.last_run_ts
