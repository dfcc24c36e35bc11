"""Matrix products shared by the compute probes: timed throughput and the SDC canary's
deterministic products. One code path for "cuda" and "cpu" (tests use tiny shapes).

Imported only inside a worker's ``run`` (torch is passed in, never imported here).

Throughput: an n x n x n product counts 2 n^3 floating-point operations (a multiply and an
add per term, as cuBLAS, DCGM's targeted stress and every GEMM benchmark count). One timed
repeat is ``per_repeat`` back-to-back products between two CUDA events on the current
stream, after ``warmup`` untimed repeats that also bring the clocks up from idle.

dtypes (a fixed set, also the metric's label values):
- bf16, fp16: tensor-core products with fp32 accumulation (torch.matmul).
- tf32: fp32 inputs with TF32 tensor cores (allow_tf32 on for the product only); compute
  capability 8.0 or newer.
- fp8: e4m3 inputs, bf16 output, per-tensor scale 1 (torch._scaled_mm); compute capability
  8.9 or newer and a torch with _scaled_mm.
On CPU, bf16 and fp16 run through torch's CPU kernels; tf32 and fp8 are unsupported.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any

DTYPES = ("bf16", "fp16", "tf32", "fp8")
# cuBLAS picks reduction orders that can differ from run to run unless its workspace is fixed;
# with this setting (and deterministic algorithms) a product is reproducible on one stack.
CUBLAS_WORKSPACE = ":4096:8"


def flops(n: int) -> float:
    return 2.0 * n * n * n


def supported(torch, device, dtype: str) -> tuple[bool, str]:
    """Whether ``dtype`` runs on ``device``, and why not."""
    if device.type != "cuda":
        return (True, "") if dtype in ("bf16", "fp16") else (False, f"{dtype} needs a CUDA GPU")
    major, minor = torch.cuda.get_device_capability(device)
    cc = major * 10 + minor
    if dtype == "bf16" and cc < 80:
        return False, f"bf16 tensor cores need compute capability 8.0 (this GPU: {major}.{minor})"
    if dtype == "tf32" and cc < 80:
        return False, f"tf32 needs compute capability 8.0 (this GPU: {major}.{minor})"
    if dtype == "fp8":
        if cc < 89:
            return False, f"fp8 needs compute capability 8.9 (this GPU: {major}.{minor})"
        if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
            return False, "this torch has no _scaled_mm"
    return True, ""


def operands(torch, device, dtype: str, n: int, seed: int = 0):
    """Two n x n operands with values in [-1, 1) (no overflow in fp16/fp8), and the product function."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    a = (torch.rand(n, n, generator=g) * 2 - 1)
    b = (torch.rand(n, n, generator=g) * 2 - 1)
    if dtype in ("bf16", "fp16"):
        t = torch.bfloat16 if dtype == "bf16" else torch.float16
        a, b = a.to(device=device, dtype=t), b.to(device=device, dtype=t)
        out = torch.empty(n, n, dtype=t, device=device)
        return lambda: torch.matmul(a, b, out=out)
    if dtype == "tf32":
        a, b = a.to(device), b.to(device)
        out = torch.empty(n, n, dtype=torch.float32, device=device)

        def tf32():
            prev = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                torch.matmul(a, b, out=out)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = prev
        return tf32
    if dtype == "fp8":
        a8 = a.to(device).to(torch.float8_e4m3fn)
        b8 = b.to(device).t().contiguous().t().to(torch.float8_e4m3fn)  # column-major second operand
        one = torch.ones((), dtype=torch.float32, device=device)
        return lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    raise ValueError(f"unknown dtype {dtype!r}; use one of {DTYPES}")


def timed_throughput(torch, tu, device, dtype: str, n: int, warmup: int, repeats: int,
                     per_repeat: int) -> tuple[list[float], float]:
    """FLOP/s of each timed repeat, and the GPU seconds spent (warm-up included)."""
    fn = operands(torch, device, dtype, n)

    def batch():
        for _ in range(per_repeat):
            fn()

    rates, gpu_seconds = [], 0.0
    for i in range(warmup + repeats):
        t = tu.time_op(torch, device, batch)
        gpu_seconds += t
        if i >= warmup:
            rates.append(per_repeat * flops(n) / t)
    return rates, gpu_seconds


def set_deterministic(torch) -> dict[str, Any]:
    """Deterministic algorithms and a fixed cuBLAS workspace, before any cuBLAS handle exists.
    Returns what was set, for the record."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if hasattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"):
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    return {"deterministic_algorithms": True, "cublas_workspace_config": os.environ["CUBLAS_WORKSPACE_CONFIG"],
            "allow_tf32": False, "reduced_precision_reduction": False}


def sdc_checksum(torch, device, dtype: str, n: int, products: int, seed: int) -> tuple[str, float]:
    """SHA-256 over the bytes of ``products`` deterministic n x n products (fixed seeds, inputs made on
    the CPU so every device multiplies the same bits), and the seconds it took on the device.

    dtype: bf16 (tensor cores) or fp32 (FMA units, TF32 off)."""
    h = hashlib.sha256()
    seconds = 0.0
    t = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    for k in range(products):
        g = torch.Generator(device="cpu").manual_seed(seed + k)
        a = (torch.rand(n, n, generator=g) * 2 - 1).to(dtype=t).to(device)
        b = (torch.rand(n, n, generator=g) * 2 - 1).to(dtype=t).to(device)
        out = torch.empty(n, n, dtype=t, device=device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b, out=out)
            end.record()
            end.synchronize()
            seconds += start.elapsed_time(end) / 1e3
        else:
            import time

            t0 = time.perf_counter()
            torch.matmul(a, b, out=out)
            seconds += time.perf_counter() - t0
        h.update(out.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest(), seconds


def stack_identity(torch, device) -> dict[str, str]:
    """The software stack a product's bits depend on (besides the GPU model and driver)."""
    return {"torch": torch.__version__, "cuda_runtime": str(torch.version.cuda or "none"),
            "cublas": _cublas_version(torch) if device.type == "cuda" else "none"}


def _cublas_version(torch) -> str:
    try:
        v = torch._C._cuda_getCompiledVersion()  # CUDA the wheel was built with; cuBLAS ships with it
        return str(v)
    except Exception:  # noqa: BLE001 - optional detail
        return "unknown"
