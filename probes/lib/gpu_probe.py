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
"""
from __future__ import annotations

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
    driver: tuple[str, str] | None = None  # NVML's driver version and the CUDA version it runs ("12.4")

    @property
    def indices(self) -> list[int]:
        return [h.index for h in self.handles]

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
            keep_session: bool = False) -> GpuAccess:
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
                                        config.busy_policy)
            access.handles = list(access.gate.usable)
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
            raise ProbeSkipped(reason, f"{detail}; the gate left GPUs {gate['measured_gpus']}"
                               f" (skipped: {gate['skipped_gpus']})") from None
        raise
    return access
