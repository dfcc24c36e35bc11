"""PNG plots for `fleetcanary report --plots` (matplotlib, the `report` extra).

Each plot is drawn only when the results hold its data: collective bus bandwidth
against message size (log-log, one line per collective and side), per-GPU memory
bandwidth bars (per direction and side), and the P2P bandwidth matrix (per side).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from fleetcanary.core.record import RunRecord
from fleetcanary.offline import results


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _series(sides):
    return {side: results.series(runs)[0] for side, runs in sides.items()}


def collectives(per_side, out: Path) -> str | None:
    fig, ax = plt.subplots(figsize=(8, 5))
    drawn = False
    for (side, sr), style in zip(per_side.items(), ("-o", "--s", ":^"), strict=False):
        lines = defaultdict(list)
        for s in sr.values():
            if s.probe == "collectives" and s.name.endswith("_busbw") and "size_bytes" in s.labels:
                key = (s.labels.get("collective", s.name), s.labels.get("backend", ""), s.labels.get("ranks", ""))
                lines[key].append((int(s.labels["size_bytes"]), float(np.median(s.samples()[0]))))
        for (coll, backend, ranks), pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] / 1e9 for p in pts], style,
                    label=f"{coll} ({backend}, {ranks} ranks) {side}")
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("Collective bus bandwidth against message size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out / "collectives_busbw.png")


def gpu_bandwidth(per_side, out: Path) -> str | None:
    bars = defaultdict(dict)  # (direction, side) -> gpu -> value
    for side, sr in per_side.items():
        for s in sr.values():
            if s.probe == "gpu_bandwidth" and "gpu" in s.labels:
                bars[(s.labels.get("direction", s.name), side)][int(s.labels["gpu"])] = float(np.median(s.samples()[0]))
    if not bars:
        return None
    directions = sorted({d for d, _ in bars})
    fig, axes = plt.subplots(1, len(directions), figsize=(5 * len(directions), 4), squeeze=False)
    for ax, d in zip(axes[0], directions, strict=True):
        sides = [sd for dd, sd in bars if dd == d]
        width = 0.8 / len(sides)
        for i, sd in enumerate(sides):
            gpus = sorted(bars[(d, sd)])
            ax.bar(np.array(gpus) + i * width, [bars[(d, sd)][g] / 1e9 for g in gpus], width, label=sd)
        ax.set_title(f"GPU memory bandwidth: {d}")
        ax.set_xlabel("GPU")
        ax.set_ylabel("GB/s")
        ax.legend(fontsize=7)
    return _save(fig, out / "gpu_bandwidth.png")


def p2p_matrix(per_side, out: Path) -> str | None:
    mats = {}
    for side, sr in per_side.items():
        cells = {(int(s.labels["src_gpu"]), int(s.labels["dst_gpu"])): float(np.median(s.samples()[0]))
                 for s in sr.values() if s.probe == "gpu_p2p" and s.name == "p2p" and "src_gpu" in s.labels}
        if cells:
            n = max(max(k) for k in cells) + 1
            m = np.full((n, n), np.nan)
            for (a, b), v in cells.items():
                m[a, b] = v / 1e9
            mats[side] = m
    if not mats:
        return None
    fig, axes = plt.subplots(1, len(mats), figsize=(5 * len(mats), 4.5), squeeze=False)
    for ax, (side, m) in zip(axes[0], mats.items(), strict=True):
        im = ax.imshow(m, cmap="viridis")
        ax.set_title(f"P2P bandwidth (GB/s), {side}")
        ax.set_xlabel("destination GPU")
        ax.set_ylabel("source GPU")
        for (a, b), v in np.ndenumerate(m):
            if np.isfinite(v):
                ax.text(b, a, f"{v:.0f}", ha="center", va="center", fontsize=6, color="w")
        fig.colorbar(im, ax=ax, shrink=0.8)
    return _save(fig, out / "p2p_matrix.png")


def render(sides: dict[str, list[RunRecord]], out: Path) -> list[str]:
    per_side = _series(sides)
    return [p for p in (collectives(per_side, out), gpu_bandwidth(per_side, out), p2p_matrix(per_side, out)) if p]
