"""The fabric probe: this node and its partner of the slot run a 2-rank collective sweep.

Entry points and settings (stable; docs/fabric.md explains the design):
- ``Fabric.run(config, ctx)``: one slot's meeting. ``config`` is ``spec.Config``: the members
  (``members_from`` static ``members: [{name, address}]`` or kubernetes
  ``kubernetes_namespace``/``kubernetes_label_selector``), ``member_name`` (default the
  daemon's node name), ``port``, ``slot_seconds``, ``meet_offset_seconds``,
  ``rendezvous_wait_seconds``, ``handshake_timeout_seconds``, ``secret_file`` (or the
  FLEETCANARY_FABRIC_SECRET variable), ``backend``, the sweep (``collectives``,
  ``sizes_bytes``, ``sendrecv_bytes``, iterations) and NCCL's variables (``nccl_env``,
  ``nccl_env_allowlist``).
- ``schedule.meeting(names, me, unix_time, slot_seconds)``: who meets whom in a slot.
- ``rendezvous.host`` / ``rendezvous.guest``: the authenticated handshake.

A run: find the slot whose meeting it can still make (the current one while its window is
open, else the next within the deadline), gate the GPU, meet (the host listens on its own
member address, the guest connects from its own), open the store and process group, sweep,
check every element, exchange both ranks' timings so both sides publish the same figures.
Partner absent, busy or late: skip ``peer_unavailable`` when the meeting window closes (a
few seconds past the meeting time), never a failure. Process-group timeouts come from the
deadline: a link cut mid-sweep ends as a ``collective_timeout`` on both sides.

The daemon starts this probe on the wall-clock grid of its interval (``slot_aligned``), so
both sides of a pair start together; keep ``interval_seconds`` equal to ``slot_seconds``.
Test hook: FLEETCANARY_FABRIC_FAULT=corrupt (the guest flips one received element),
hang (the guest stops answering after the collectives, sockets open).
"""
from __future__ import annotations

import math
import os
import time
from typing import ClassVar

from fleetcanary.probes.base import (
    Figure,
    MetricSpec,
    Probe,
    ProbeContext,
    ProbeError,
    ProbeResult,
    ProbeSkipped,
    Sample,
)
from fleetcanary.probes.fabric import members as membersmod
from fleetcanary.probes.fabric import rendezvous, schedule
from fleetcanary.probes.fabric.spec import BUSBW, LAT, MEMBERS, PAIR_SLOT, PARTNER, REJECTED, SENDRECV, SLOT, Config

SETUP_MARGIN_SECONDS = 3.0   # left for the result after the last operation's timeout


class Fabric(Probe):
    name = "fabric"
    Config = Config
    exclusive = "gpu"
    coverage = "node"  # a measurement of the node's network path
    slot_aligned = True
    default_enabled = False        # needs members and a secret
    default_interval_seconds = 300.0
    default_timeout_seconds = 120.0
    failure_reasons = ("wrong_result", "rank_failed", "peer_lost", "rendezvous_failed", "members_unavailable",
                       "secret_invalid", "nvml_error", "cuda_error")
    reason_docs: ClassVar[dict[str, str]] = {
        "peer_unavailable": "skip: the slot's partner did not complete the authenticated rendezvous within the "
                            "meeting window (absent, busy, late, a bye in an odd fleet, or another secret)",
        "peer_lost": "the partner's connection closed during the sweep",
        "rendezvous_failed": "the listener did not prove the fleet secret, or the session's messages failed "
                             "authentication, or the rendezvous port could not be opened",
        "members_unavailable": "the member list could not be read (Kubernetes API error, bad address)",
        "secret_invalid": "the fleet secret is unreadable or shorter than 16 bytes",
    }
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec(BUSBW, "gauge", "Bus bandwidth of the latest pair's collective (nccl-tests busbw for 2 ranks: "
                   "all_reduce = algbw, all_gather = algbw / 2), median over iterations; the pair changes every slot.",
                   "bytes_per_second", ("collective", "size_bytes", "backend")),
        MetricSpec(LAT, "gauge", "Time per operation of the latest pair's collective on the slower rank, median; "
                   "collective=sendrecv: half the ping-pong round trip.", "seconds",
                   ("collective", "size_bytes", "backend")),
        MetricSpec(SENDRECV, "gauge", "Send/recv bandwidth of the latest pair: 2 x bytes / ping-pong round trip, "
                   "median.", "bytes_per_second", ("size_bytes", "backend")),
        MetricSpec(PARTNER, "gauge", "The latest pair's partner (value 1); one series, replaced every pair.", "info",
                   ("partner",)),
        MetricSpec(PAIR_SLOT, "gauge", "Start of the slot the latest pair's figures were measured in (unix "
                   "seconds); figures are current while time() is within one slot of it.", "seconds"),
        MetricSpec(SLOT, "gauge", "Configured length of one schedule slot.", "seconds"),
        MetricSpec(MEMBERS, "gauge", "Fabric members in the list of the latest pair's run.", "count"),
        MetricSpec(REJECTED, "counter", "Connections the rendezvous refused while hosting: unexpected_address "
                   "(not the partner), bad_handshake (garbage, a wrong MAC, or a hello not for that connection), "
                   "silent (no hello in time, or the oldest waiting when a newer connection needed room), "
                   "after_pairing (from the partner's address, once the pair had met).", "total",
                   ("reason",)),
    )

    # ------------------------------------------------------------------ run
    def run(self, config: Config, ctx: ProbeContext) -> ProbeResult:
        if config.members_from == "static" and not config.members:
            raise ProbeSkipped("not_configured", "no fabric members configured")
        secret = rendezvous.load_secret(config.secret_file)
        me = config.member_name or ctx.node_name
        endpoints = membersmod.members(config)
        by_name = {e.name: e for e in endpoints}
        if me not in by_name:
            raise ProbeSkipped("not_configured", f"{me} is not among the {len(endpoints)} fabric members")
        if len(endpoints) < 2:
            raise ProbeSkipped("not_configured", "the fabric has one member")
        meet_at, slot_start = self._meeting_time(config, ctx)
        m = schedule.meeting(list(by_name), me, slot_start, config.slot_seconds)
        if m.partner is None:
            raise ProbeSkipped("peer_unavailable", f"a bye in slot {m.slot} (odd member count)")
        backend, device, gate = self._plan(config, ctx)
        mine, peer = by_name[me], by_name[m.partner]
        my_ips = membersmod.resolve(mine.host)
        if not my_ips:
            raise ProbeError("members_unavailable", f"this member's address {mine.host} does not resolve")
        my_ip = min(my_ips)
        until = min(meet_at + config.rendezvous_wait_seconds, ctx.deadline_monotonic - SETUP_MARGIN_SECONDS)
        if m.i_host:
            peer_ips = membersmod.resolve(peer.host)
            session = rendezvous.host(my_ip, mine.port, peer_ips, m.slot, me, m.partner, secret, until,
                                      config.handshake_timeout_seconds)
        else:
            session = rendezvous.guest((peer.host, peer.port), my_ip, m.slot, me, m.partner, secret, until,
                                       config.handshake_timeout_seconds)
        del secret
        try:
            return self._measure(config, ctx, m, session, my_ip, backend, device, gate, len(endpoints))
        finally:
            session.close()

    @staticmethod
    def _meeting_time(config: Config, ctx: ProbeContext) -> tuple[float, float]:
        """(monotonic meeting time, unix start of its slot): this slot's while its window is open,
        else the next slot's if it fits the deadline, else a skip."""
        now_wall, now_mono = time.time(), time.monotonic()
        slot = math.floor(now_wall / config.slot_seconds)
        for s in (slot, slot + 1):
            start = s * config.slot_seconds
            meet_wall = start + config.meet_offset_seconds
            if now_wall <= meet_wall + config.rendezvous_wait_seconds:
                meet_mono = now_mono + (meet_wall - now_wall)
                if meet_mono + config.rendezvous_wait_seconds > ctx.deadline_monotonic - SETUP_MARGIN_SECONDS:
                    break
                return meet_mono, start
        raise ProbeSkipped("peer_unavailable", "started after this slot's meeting window and the next one ends "
                           "past the deadline (interval_seconds should equal slot_seconds)")

    @staticmethod
    def _plan(config: Config, ctx: ProbeContext):
        """(backend, device, gate) or a skip; both sides gate before meeting, so a busy side
        is simply absent and its partner skips with peer_unavailable."""
        from fleetcanary.probes.lib import gpu_probe, torch_util

        torch_util.require_torch()  # first: the ranks are torch programs, on gloo as on NCCL
        if config.backend == "gloo":
            return "gloo", "cpu", None

        def pick(handles):
            if not handles:  # auto: gloo; nccl: the gate skips no_gpu (NVML lists no GPU)
                return None if config.backend == "auto" else handles
            if config.gpu_index is None:
                return handles
            picked = [h for h in handles if h.index == config.gpu_index]
            if not picked:
                raise ProbeSkipped("no_gpu", f"no GPU {config.gpu_index}")
            return picked

        # auto without NVML or GPUs: gloo over TCP; nccl without them: no_gpu
        gpus = gpu_probe.acquire(config, ctx, nvml_missing="skip" if config.backend == "nccl" else "none",
                                 select=pick)
        if gpus.kind == "cpu":
            return "gloo", "cpu", None
        if not torch_util.import_torch().distributed.is_nccl_available():
            raise ProbeSkipped("dependency_missing", "this torch build has no NCCL")
        return "nccl", f"cuda:{gpus.cuda(gpus.indices[0])}", gpus.gate

    # ------------------------------------------------------------------ measure
    def _measure(self, config, ctx, m, session, my_ip, backend, device, gate, n_members) -> ProbeResult:
        from fleetcanary.probes.fabric import pair

        if backend == "nccl":
            _nccl_environment(config)
        role = "host" if m.i_host else "guest"
        rank = 0 if m.i_host else 1
        until = ctx.deadline_monotonic - SETUP_MARGIN_SECONDS
        op_timeout = max(1.0, min(config.collective_timeout_seconds, until - time.monotonic()))
        t0 = time.monotonic()
        try:
            torch, ops, _store = pair.connect(session, role, my_ip, backend, _device(device), until, op_timeout)
            dev = ops.device
            mine = pair.sweep(torch, ops, rank, config.collectives, sorted(config.sizes_bytes), config.sendrecv_bytes,
                              config.warmup_iterations, config.iterations, config.sendrecv_iterations, dev)
            both = pair.exchange(torch, ops, mine, dev)
        except ProbeError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified: timeout, peer lost, rank failure
            raise pair.classify(exc) from None
        finally:
            if backend == "nccl":
                _destroy()
        return self._result(config, m, session, backend, mine, both, gate, n_members, time.monotonic() - t0,
                            torch.__version__)

    @staticmethod
    def _result(config, m, session, backend, mine, both, gate, n_members, seconds, torch_version) -> ProbeResult:
        res = ProbeResult(parameters={"backend": backend, "collectives": list(config.collectives),
                                      "sizes": sorted(config.sizes_bytes), "sendrecv_bytes": config.sendrecv_bytes,
                                      "warmup": config.warmup_iterations, "iterations": config.iterations,
                                      "sendrecv_iterations": config.sendrecv_iterations,
                                      "slot_seconds": config.slot_seconds},
                          touched={"invasive": backend == "nccl", "partner": m.partner,
                                   **(gate.record() if gate else {})})
        wrong, k = [], 0
        for i, r in enumerate(mine["results"]):
            w = int(both[0]["wrong"][i] + both[1]["wrong"][i])
            if w:
                wrong.append(f"{r['collective']} size {r['size_bytes']}: {w} wrong elements")
            n = len(r["times"])
            iters = [max(both[0]["times"][k + j], both[1]["times"][k + j]) for j in range(n)]
            k += n
            labels = {"collective": r["collective"], "size_bytes": str(r["size_bytes"]), "backend": backend}
            factor = _bus_factor(r["collective"])
            lat = Figure(f"{r['collective']}_latency", "seconds", iters, labels, higher_is_better=False)
            bus = Figure(f"{r['collective']}_busbw", "bytes_per_second", [r["bytes"] / t * factor for t in iters],
                         labels)
            bus.median = bus.dispersion["median"] = r["bytes"] / lat.median * factor
            res.figures += [bus, lat]
            res.samples += [Sample(BUSBW, labels, bus.median), Sample(LAT, labels, lat.median)]
        sr = mine["sendrecv"]
        w = int(both[0]["wrong"][-1] + both[1]["wrong"][-1])
        if w:
            wrong.append(f"sendrecv {sr['bytes']} bytes: {w} wrong elements")
        rtts = both[0]["times"][k:]          # timed on the host (rank 0)
        sr_labels = {"size_bytes": str(sr["bytes"]), "backend": backend}
        bw = Figure("sendrecv_bandwidth", "bytes_per_second", [2 * sr["bytes"] / t for t in rtts], sr_labels)
        half = Figure("sendrecv_latency", "seconds", [t / 2 for t in rtts],
                      {"collective": "sendrecv", **sr_labels}, higher_is_better=False)
        bw.median = bw.dispersion["median"] = 2 * sr["bytes"] / (2 * half.median)
        res.figures += [bw, half]
        res.samples += [Sample(SENDRECV, sr_labels, bw.median), Sample(LAT, half.labels, half.median),
                        Sample(PARTNER, {"partner": m.partner}, 1.0),
                        Sample(PAIR_SLOT, {}, m.slot * config.slot_seconds),
                        Sample(SLOT, {}, config.slot_seconds), Sample(MEMBERS, {}, float(n_members))]
        res.samples += [Sample(REJECTED, {"reason": r}, float(c)) for r, c in sorted(session.rejected.items())]
        if backend == "nccl" and gate is not None:   # the GPU-time budget counts the sweep on the one GPU used
            res.gpu_seconds = {str(gate.usable[0].index): round(seconds, 3)}
        res.extra = {"partner": m.partner, "role": "host" if m.i_host else "guest", "slot": m.slot, "round": m.round,
                     "members": n_members, "partner_address": session.peer_ip,
                     "handshake_seconds": round(session.handshake_seconds, 4),
                     "rendezvous_rejected": dict(session.rejected), "sweep_seconds": round(seconds, 3),
                     "torch": torch_version,
                     "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")} if backend == "nccl"
                     else {}}
        if wrong:
            raise ProbeError("wrong_result", "; ".join(wrong[:5]))
        return res


def _bus_factor(collective: str) -> float:
    return 1.0 if collective == "all_reduce" else 0.5


def _device(device: str):
    import torch

    return torch.device(device)


def _nccl_environment(config: Config) -> None:
    """Only allow-listed NCCL_* variables reach NCCL: the daemon's own, then the configured ones."""
    allowed = set(config.nccl_env_allowlist)
    for k in [k for k in os.environ if k.startswith("NCCL_") and k not in allowed]:
        del os.environ[k]
    for k, v in config.nccl_env.items():
        if k in allowed:
            os.environ[k] = v
    # A collective that times out aborts the communicator and raises in the waiting call (2 =
    # clean up only) rather than killing the worker, so the run ends as a classified timeout.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")


def _destroy() -> None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - best effort on the way out; the worker exits next
        pass
