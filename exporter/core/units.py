"""Human formatting of figures by unit, and the plain-text tables they go into."""
from __future__ import annotations

import math


def human(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if unit == "bytes_per_second":
        for div, suffix in ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
            if abs(value) >= div:
                return f"{value / div:.2f} {suffix}"
        return f"{value:.0f} B/s"
    if unit == "seconds":
        for mult, suffix in ((1.0, "s"), (1e3, "ms"), (1e6, "us")):
            if abs(value) * mult >= 1:
                return f"{value * mult:.3g} {suffix}"
        return f"{value * 1e9:.3g} ns"
    if unit == "bytes":
        for div, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if abs(value) >= div:
                return f"{value / div:.2f} {suffix}"
        return f"{value:.0f} B"
    if unit == "flops_per_second":
        for div, suffix in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
            if abs(value) >= div:
                return f"{value / div:.2f} {suffix}"
        return f"{value:.0f} FLOP/s"
    if unit == "tokens_per_second":
        return f"{value:.4g} tokens/s"
    if unit == "ratio":
        return f"{value * 100:.1f}%"
    return f"{value:.4g} {unit}".strip()


def text_table(header, rows) -> str:
    """Left-aligned columns as wide as their widest cell, a rule under the header."""
    lines = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*row).rstrip() for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)
