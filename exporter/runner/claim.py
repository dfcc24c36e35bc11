"""`fleetcanary claim`: the process of a claim pod (deploy/overlays/scheduled-runs).

The node's exporter asked the scheduler for GPU time with a lowest-priority pod bound to its node that requests
the GPUs (fleetcanary.daemon.claim); once the scheduler places it, this runs the jobs the exporter handed it
(--spec: the probes' jobs, built as the daemon builds its own) one after another in isolated workers, and leaves
each run record, samples included, in the inbox the exporter reads (a hostPath both mount), one file per run,
written whole and renamed into place: the exporter never sees half a record.

Preemption (the kubelet's SIGTERM when a tenant's pod needs the GPUs, or the pod's activeDeadlineSeconds): the
worker in flight is stopped (SIGTERM, SIGKILL after the grace) and its run is recorded as skipped, reason
preempted, and nothing of it is kept; the runs not started are not recorded; the process exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from fleetcanary.core.record import RunRecord
from fleetcanary.core.textfile import write_atomic
from fleetcanary.runner import isolation

EXIT_BAD_SPEC = 2


def grace(spec: dict) -> float:
    """Seconds a stopped worker gets between SIGTERM and SIGKILL (the exporter's worker_kill_grace_seconds)."""
    return float(spec.get("kill_grace_seconds", 2.0))


def record_path(inbox: Path, out: RunRecord) -> Path:
    return inbox / f"{int(out.started_at * 1000)}-{os.getpid()}-{out.probe}.json"


def run(inbox: Path, spec: dict, stop: threading.Event | None = None) -> list[RunRecord]:
    """Run the spec's jobs; each record lands in `inbox` as it finishes. `stop` set: preempted."""
    stop = stop or threading.Event()
    done = []
    for item in spec["jobs"]:
        if stop.is_set():
            break
        job, timeout = item["job"], float(item["timeout_seconds"])
        out = isolation.run_isolated(job, timeout, grace(spec))
        if stop.is_set():
            out = RunRecord(job["name"], "skipped", "preempted",
                            "the claim pod was stopped (preempted or past its deadline) mid-run; nothing of the run "
                            "is kept", node=out.node, started_at=out.started_at, wall_seconds=out.wall_seconds)
        out.trigger = "claim"
        write_atomic(record_path(inbox, out), json.dumps(out.to_json(with_samples=True)))
        done.append(out)
    return done


def load_spec(text: str) -> dict:
    """The spec or ValueError with one line."""
    spec = json.loads(text)
    if not isinstance(spec, dict) or not isinstance(spec.get("jobs"), list):
        raise ValueError("the spec is not an object with a list of jobs")
    for item in spec["jobs"]:
        if not isinstance(item, dict) or not isinstance(item.get("job"), dict) or "timeout_seconds" not in item:
            raise ValueError("a job entry lacks its job or timeout_seconds")
        float(item["timeout_seconds"])
    return spec


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--inbox", required=True, help="the directory the node's exporter reads records from")
    ap.add_argument("--spec", required=True, help="the jobs (JSON), as the exporter wrote them into the pod")


def main(args: argparse.Namespace | list[str] | None = None) -> int:
    if not isinstance(args, argparse.Namespace):
        ap = argparse.ArgumentParser(prog="fleetcanary claim", description=__doc__.splitlines()[0])
        add_arguments(ap)
        args = ap.parse_args(args)
    try:
        spec = load_spec(args.spec)
    except (ValueError, TypeError) as exc:
        print(f"fleetcanary claim: bad --spec: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
        return EXIT_BAD_SPEC
    inbox = Path(args.inbox)
    if not inbox.is_dir() or not os.access(inbox, os.W_OK):
        print(f"fleetcanary claim: {inbox} is not a writable directory", file=sys.stderr)
        return EXIT_BAD_SPEC
    stop = threading.Event()

    def on_term(signum, frame) -> None:
        stop.set()  # the worker in flight is stopped from a thread: no lock is taken in the handler
        threading.Thread(target=isolation.kill_all_workers, args=(grace(spec),),
                         daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    t0 = time.monotonic()
    done = run(inbox, spec, stop)
    print(f"fleetcanary claim: {len(done)} runs in {time.monotonic() - t0:.0f} s"
          + (" (preempted)" if stop.is_set() else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
