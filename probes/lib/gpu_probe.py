"""The base of the invasive GPU probes (``exclusive = "gpu"``): their shared settings and
the prologue every run starts with.

Settings: ``GpuProbeConfig`` holds ``busy_policy`` and ``expected_gpu_seconds``;
``GpuDeviceConfig`` adds ``device`` for the probes that run torch in the worker itself
(the collective probes choose a ``backend`` instead). The field types carry their bound
and description (``BusyPolicy``, ``GpuSeconds``, ``Device``), so a probe that needs its own
default or wording re-declares only that, e.g. ``expected_gpu_seconds: GpuSeconds = 2.0``
or ``= Field(22.0, description=...)``; the bound stays. tests/probes/test_contract.py fails
for a GPU probe whose Config does not derive from ``GpuProbeConfig``.

Prologue: ``acquire(config, ctx, ...)`` opens NVML, picks the handles, gates them
(probes/lib/gpu_gate.py: busy, allocated, budget, lost), reads what the probe needs from
NVML while the session is open, and resolves the torch device; every skip has the reason
the probes gave when each carried its own copy.

CUDA is told which GPUs by UUID, never by NVML index: before torch starts CUDA in the worker, the prologue
sets CUDA_VISIBLE_DEVICES to the UUIDs of the GPUs the gate left, in NVML order, so CUDA device ``i`` is
``handles[i]`` (``GpuAccess.cuda(index)`` gives it for an NVML index) whatever CUDA_DEVICE_ORDER says and
whatever CUDA_DEVICE_ORDER says (an NVML index is not a CUDA ordinal under a restricted
CUDA_VISIBLE_DEVICES, nor under MIG). A CUDA_VISIBLE_DEVICES the worker found set is a restriction that stays:
only the GPUs it names (by UUID or unique UUID prefix, or by number, taken as the NVML index, i.e. PCI bus
order) are gated, the rest are not touched. Rank programs started after it (collectives) inherit it. Where CUDA has
started in this process already, the ordinals are matched by the UUIDs torch reports. A probe that supports
MIG (``mig=True``) also gets the gate's free MIG devices (``GpuAccess.mig``), each measured in its own
process pointed at its MIG UUID (``on_mig``): CUDA enumerates one MIG device per process.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field

from fleetcanary.probes.base import ProbeConfig, ProbeContext, ProbeSkipped
from fleetcanary.probes.lib import gpu_gate, nvml

BusyPolicy = Annotated[Literal["node", "gpu"], Field(
    description="node: any busy GPU skips the run; gpu: measure the idle GPUs only.")]
GpuSeconds = Annotated[float, Field(
    gt=0, description="GPU seconds one run is assumed to cost on each GPU it uses, for the budget check before "
    "it runs.")]
Device = Annotated[Literal["auto", "cpu"], Field(
    description="auto: CUDA GPUs (skip with no_gpu without one); cpu: the same code on the CPU, for tests.")]


class GpuProbeConfig(ProbeConfig):
    """Settings every invasive GPU probe has. Each probe sets its own ``expected_gpu_seconds``."""

    busy_policy: BusyPolicy = "node"
    expected_gpu_seconds: GpuSeconds = 1.0


class GpuDeviceConfig(GpuProbeConfig):
    """A GPU probe that runs torch in its worker: ``device`` auto (CUDA) or cpu (tests)."""

    device: Device = "auto"


# What acquire does where NVML cannot be used:
#   "fail": no driver -> skip no_gpu; a driver whose NVML fails -> failure nvml_error
#   "skip": skip no_gpu whatever the cause (a GPU backend was asked for)
#   "none": go on without GPUs (kind "cpu", no session): the probe falls back to the CPU
NvmlMissing = Literal["fail", "skip", "none"]
Select = Callable[[list[nvml.GpuHandle]], "list[nvml.GpuHandle] | None"]


@dataclass
class GpuAccess:
    """What the prologue found. ``kind``: "cuda" (gated GPUs) or "cpu" (device cpu, or no
    NVML where that is allowed). ``handles``: the GPUs the run may use (gated), or on the CPU
    the NVML handles it may read. ``facts``: what ``inspect`` returned. ``session`` stays
    open only with ``keep_session``; ``close()`` or a ``with`` block ends it."""

    kind: str
    session: nvml.Session | None = None
    handles: list[nvml.GpuHandle] = field(default_factory=list)
    gate: gpu_gate.Gate | None = None
    facts: Any = None
    ordinals: dict[int, int] = field(default_factory=dict)  # NVML index -> CUDA ordinal
    driver: tuple[str, str] | None = None  # NVML's driver version and the CUDA version it runs ("12.4")

    @property
    def indices(self) -> list[int]:
        return [h.index for h in self.handles]

    @property
    def mig(self) -> dict[int, list[str]]:
        """Free MIG devices the gate left (parent GPU index -> MIG UUIDs), for a probe acquired with mig=True."""
        return dict(self.gate.mig) if self.gate else {}

    def cuda(self, index: int) -> int:
        """The CUDA ordinal of the GPU with this NVML index (see the module docstring)."""
        return self.ordinals.get(index, index)

    def record(self) -> dict[str, Any]:
        """The gate's record fields (measured and skipped GPUs) for ``touched``; {} ungated."""
        return self.gate.record() if self.gate else {}

    def close(self) -> None:
        if self.session is not None:
            self.session.__exit__(None, None, None)

    def __enter__(self) -> GpuAccess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def acquire(config: GpuProbeConfig, ctx: ProbeContext, *, nvml_missing: NvmlMissing = "fail",
            nvml_on_cpu: bool = False, select: Select | None = None, min_gpus: int = 0,
            too_few: str = "single_gpu", inspect: Callable[[nvml.Session, list[nvml.GpuHandle]], Any] | None = None,
            keep_session: bool = False, mig: bool = False) -> GpuAccess:
    """The gate prologue of a GPU probe's run. Raises ProbeSkipped (or ProbeError nvml_error).

    ``config.device`` (where the Config has one) "cpu": no gate; NVML is read only with
    ``nvml_on_cpu`` (topology, load traces), and its absence is no skip. Otherwise the run
    is gated: NVML per ``nvml_missing``; ``select(handles)`` picks the GPUs (it may raise a
    skip, or return None: no GPU to use, the run goes on without, kind "cpu");
    fewer than ``min_gpus`` GPUs on the node skips single_gpu, fewer usable after the gate
    skips ``too_few``; then torch must see CUDA (skip dependency_missing, driver_too_old or unsupported:
    torch_util.why_no_cuda).
    ``inspect(session, handles)`` runs while the session is open, on the GPUs the run uses.
    """
    on_cpu = getattr(config, "device", "auto") == "cpu"
    if on_cpu and not nvml_on_cpu:
        return _with_torch(GpuAccess("cpu"))
    session = _open(nvml_missing="none" if on_cpu else nvml_missing)
    if session is None:  # device cpu, or "none": a probe that runs its torch elsewhere (gloo ranks) goes on
        return _with_torch(GpuAccess("cpu")) if on_cpu else GpuAccess("cpu")
    access = GpuAccess("cpu" if on_cpu else "cuda", session)
    try:
        if not on_cpu:  # for a torch that cannot use the GPUs: is the driver too old for its CUDA?
            access.driver = (session.driver_version(), session.cuda_driver_version())
        handles = session.handles()
        if not on_cpu and not os.environ.get(nvml.FAKE_ENV):  # recorded facts name no device of this machine
            handles = visible(session, handles)
        if select is not None:
            handles = select(handles)
            if handles is None:  # no GPU to use here: the run goes on without (the fabric probe's gloo)
                access.close()
                return GpuAccess("cpu")
        if len(handles) < min_gpus:
            raise ProbeSkipped("single_gpu", f"{len(handles)} GPU(s) on this node; this probe needs {min_gpus}")
        if on_cpu:
            access.handles = [h for h in handles if not h.lost]
        else:
            access.gate = gpu_gate.gate(session, handles, ctx.gpu, ctx.kube, config.expected_gpu_seconds,
                                        config.busy_policy, mig=mig)
            access.handles = list(access.gate.usable)
            if not os.environ.get(nvml.FAKE_ENV):  # recorded facts' UUIDs name no device of this machine
                access.ordinals = pin_cuda([access.gate.uuids.get(h.index, "") for h in access.handles],
                                           access.indices)
        if len(access.handles) < min_gpus:
            reason = "single_gpu" if on_cpu else too_few
            raise ProbeSkipped(reason, f"only {len(access.handles)} usable GPU(s) of the {min_gpus} this probe needs"
                               + (f": {access.gate.skipped}" if access.gate else ""))
        if inspect is not None:
            access.facts = inspect(session, access.handles)
    except BaseException:
        access.close()
        raise
    if not keep_session:
        access.close()
        access.session = None
    try:
        return _with_torch(access)
    except BaseException:
        access.close()
        raise


def visible(session: nvml.Session, handles: list[nvml.GpuHandle], environ=os.environ) -> list[nvml.GpuHandle]:
    """The GPUs a preset CUDA_VISIBLE_DEVICES lets CUDA see (all without one). As CUDA reads it: entries up to
    the first that names nothing; a UUID entry may be a unique prefix; a MIG UUID names its parent GPU here.
    None left: ProbeSkipped("no_gpu")."""
    preset = environ.get("CUDA_VISIBLE_DEVICES")
    if preset is None:
        return handles
    live = [h for h in handles if not h.lost]
    uuids = {h.index: session.uuid(h) for h in live}
    migs = {h.index: {session.uuid(m) for m in session.mig_devices(h) or []} for h in live
            if session.mig_mode(h) == "enabled"} if "MIG-" in preset else {}
    keep: list[int] = []
    for entry in (e.strip() for e in preset.split(",")):
        if entry.isdigit():
            named = [h.index for h in handles if h.index == int(entry)]
        else:
            named = [i for i, u in uuids.items() if entry and u.startswith(entry)] or \
                [i for i, ms in migs.items() if entry in ms]
        if len(named) != 1:
            break
        keep += [i for i in named if i not in keep]
    out = [h for h in handles if h.index in keep]
    if not out:
        raise ProbeSkipped("no_gpu", f"CUDA_VISIBLE_DEVICES={preset[:200]!r} names none of the GPUs NVML lists")
    return out


def pin_cuda(uuids: list[str], indices: list[int], environ=os.environ) -> dict[int, int]:
    """Point CUDA at these GPUs by UUID, in this order, and return NVML index -> CUDA ordinal. Where CUDA has
    started in this process already (the variable is read once), the ordinals come from torch's device UUIDs;
    where a UUID is unknown, the NVML index stands (no GPU, or NVML without UUIDs)."""
    import sys

    if not uuids or not all(u.startswith(("GPU-", "MIG-")) for u in uuids):
        return {}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        seen = {}
        for i in range(torch.cuda.device_count()):
            u = str(getattr(torch.cuda.get_device_properties(i), "uuid", ""))
            seen["GPU-" + u if u and not u.startswith(("GPU-", "MIG-")) else u] = i
        return {idx: seen[u] for idx, u in zip(indices, uuids, strict=True) if u in seen}
    environ["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    return {idx: i for i, idx in enumerate(indices)}


def on_mig(uuid: str, fn: Callable[[dict], dict], config: dict, timeout_seconds: float = 600.0) -> dict:
    """``fn(config)`` in a fresh Python process whose CUDA sees only the MIG device ``uuid`` (as CUDA device 0).
    ``fn`` is a module-level function; config and result are JSON. A plain subprocess, not multiprocessing: the
    child never re-imports this process's ``__main__``, and one that dies or overruns is an error here, never a
    pool that restarts it forever. Raises ProbeError("cuda_error") with the child's last line."""
    import json
    import subprocess
    import sys

    from fleetcanary.probes.base import ProbeError

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid}
    job = json.dumps({"module": fn.__module__, "function": fn.__qualname__, "config": config})
    try:
        p = subprocess.run([sys.executable, "-m", "fleetcanary.probes.lib.mig_child"], input=job, env=env,
                           capture_output=True, text=True, timeout=max(1.0, timeout_seconds))
    except subprocess.TimeoutExpired:
        raise ProbeError("cuda_error", f"MIG device {uuid}: no answer within {timeout_seconds:.0f} s") from None
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise ProbeError("cuda_error", f"MIG device {uuid}: exit {p.returncode}: {last}")
    return json.loads(lines[-1])


def measure_mig(mig: dict[int, list[str]], fn: Callable[[dict], dict], config: dict, res,
                deadline_monotonic: float | None = None) -> dict[str, dict]:
    """``fn(config)`` on each free MIG device (on_mig), its GPU seconds charged to the parent GPU in ``res``;
    the per-device results by MIG UUID, each with its parent GPU's index. Each child gets what is left of the
    run's deadline."""
    import time

    out = {}
    for parent, uuids in sorted(mig.items()):
        for uuid in uuids:
            left = 600.0 if deadline_monotonic is None else deadline_monotonic - time.monotonic() - 1.0
            got = on_mig(uuid, fn, config, timeout_seconds=left)
            out[uuid] = {"gpu": str(parent), **got}
            res.gpu_seconds[str(parent)] = res.gpu_seconds.get(str(parent), 0.0) + float(got.get("gpu_seconds", 0))
    return out


def _open(nvml_missing: NvmlMissing) -> nvml.Session | None:
    if nvml_missing == "fail":
        return gpu_gate.open_session()
    try:
        return nvml.open_session()
    except nvml.NvmlUnavailable as exc:
        if nvml_missing == "skip":
            raise ProbeSkipped("no_gpu", str(exc)) from None
        return None


def _with_torch(access: GpuAccess) -> GpuAccess:
    """Skip dependency_missing without torch; where NVML sees GPUs and torch cannot use them, dependency_missing
    (a CPU build of torch), driver_too_old (the driver is older than torch's CUDA needs) or unsupported
    (torch_util.why_no_cuda)."""
    from fleetcanary.probes.lib import torch_util

    try:
        torch_util.resolve_device_kind("cpu" if access.kind == "cpu" else "auto")
    except ProbeSkipped as e:
        if access.gate is not None:  # which GPUs the run would have measured: NVML sees GPUs, torch no CUDA
            reason, detail = (e.reason, e.detail) if e.reason != "no_gpu" else \
                torch_util.why_no_cuda(torch_util.import_torch(), access.driver)
            gate = access.gate.record()
            mig = f", MIG devices {gate['measured_mig_devices']}" if gate.get("measured_mig_devices") else ""
            raise ProbeSkipped(reason, f"{detail}; the gate left GPUs {gate['measured_gpus']}{mig}"
                               f" (skipped: {gate['skipped_gpus']})") from None
        raise
    return access
