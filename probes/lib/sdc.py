"""Silent-data-corruption verdicts: a checksum per GPU against a golden built by consensus.

Pure Python (no torch): the probe computes checksums, this module judges them.

The golden for one key (GPU model, driver, software stack and the canary's parameters) is
the checksum that a strict majority of the GPUs measured together agreed on, with at least
``min_consensus`` GPUs voting. It is stored in the state directory (``sdc_golden.json``),
so later runs, and a node whose other GPUs are busy, judge against it. A golden can also be
shipped (``golden_file``: the same format, e.g. collected from a fleet), and wins over the
state file. The GPU under test never makes its own golden alone.

Verdicts per GPU (``fleetcanary_gpu_sdc_status`` label values):
- match: equals the golden;
- mismatch: differs from the golden (the probe fails with ``wrong_result`` naming it);
- no_consensus: no golden and no strict majority among the GPUs, or every GPU agrees on a
  value that is not the golden (a changed stack the key misses, or a node-wide fault):
  reported, never guessed;
- unjudged: no golden and too few GPUs to vote (a one-GPU node without a shipped golden).
"""
from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetcanary.probes.lib import safefile

STATUSES = ("match", "mismatch", "no_consensus", "unjudged")
GOLDEN_FILE = "sdc_golden.json"
MAX_GOLDEN_BYTES = 16 << 20  # goldens are a few hundred bytes each; a larger file is not one


def golden_key(identity: dict[str, Any]) -> str:
    """A stable key from what the result's bits may depend on (sorted JSON, hashed for a short name)."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Verdict:
    status: dict[str, str]                 # gpu -> one of STATUSES
    golden: str | None                     # the checksum judged against (None: none)
    golden_source: str                     # "shipped", "state", "consensus" (made now) or "none"
    established: bool = False              # a new golden was written this run
    groups: dict[str, list[str]] = field(default_factory=dict)  # checksum -> gpus that produced it
    detail: str = ""

    @property
    def wrong(self) -> list[str]:
        return sorted((g for g, s in self.status.items() if s == "mismatch"), key=_num)

    @property
    def no_consensus(self) -> bool:
        return any(s == "no_consensus" for s in self.status.values())

    def record(self) -> dict[str, Any]:
        return {"status": self.status, "golden": self.golden, "golden_source": self.golden_source,
                "established": self.established, "groups": self.groups, "detail": self.detail}


def _num(g: str) -> tuple:
    return (0, int(g)) if g.isdigit() else (1, g)


def judge(checksums: dict[str, str], golden: str | None, golden_source: str, min_consensus: int) -> Verdict:
    """The verdict for the GPUs measured together. ``golden``: the stored or shipped value, if any."""
    groups: dict[str, list[str]] = {}
    for gpu, c in sorted(checksums.items(), key=lambda kv: _num(kv[0])):
        groups.setdefault(c, []).append(gpu)
    if golden is not None:
        agree = groups.get(golden, [])
        others = [g for c, gs in groups.items() if c != golden for g in gs]
        if not agree and len(checksums) >= max(min_consensus, 2) and len(groups) == 1:
            return Verdict(dict.fromkeys(checksums, "no_consensus"), golden, golden_source, groups=groups,
                           detail=f"all {len(checksums)} GPUs agree on a checksum that is not the {golden_source} "
                                  "golden: a changed software stack the key misses, or a node-wide fault")
        status = dict.fromkeys(agree, "match") | dict.fromkeys(others, "mismatch")
        return Verdict(status, golden, golden_source, groups=groups)
    n = len(checksums)
    if n < max(min_consensus, 2):
        return Verdict(dict.fromkeys(checksums, "unjudged"), None, "none", groups=groups,
                       detail=f"no golden and {n} GPU(s) measured; {max(min_consensus, 2)} needed to vote")
    top, votes = Counter(checksums.values()).most_common(1)[0]
    if votes * 2 <= n:
        return Verdict(dict.fromkeys(checksums, "no_consensus"), None, "none", groups=groups,
                       detail=f"no strict majority among {n} GPUs: {sorted(len(v) for v in groups.values())}")
    status = {g: ("match" if c == top else "mismatch") for g, c in checksums.items()}
    return Verdict(status, top, "consensus", established=True, groups=groups,
                   detail=f"golden established by {votes} of {n} GPUs")


class GoldenStore:
    """Goldens by key: a shipped file (read-only, wins) over the state directory's file."""

    def __init__(self, state_dir: str, shipped: str | None = None) -> None:
        self.path = Path(state_dir) / GOLDEN_FILE
        self.shipped = Path(shipped) if shipped else None

    def _read(self, path: Path) -> dict[str, Any]:
        # the state directory's file never through a link (probes/lib/safefile); the shipped one is the
        # operator's path (a ConfigMap's file is a link)
        raw, kind, detail = safefile.read_raw(path, MAX_GOLDEN_BYTES, follow_links=path == self.shipped)
        if raw is None:
            if not kind or kind == "symlink":
                return {}  # absent, or a link planted in the state directory: not read, replaced by the next put
            raise GoldenFileError(f"{path}: {detail}")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise GoldenFileError(f"{path}: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("goldens", {}), dict):
            raise GoldenFileError(f"{path}: not a golden file (want an object with 'goldens')")
        return data.get("goldens", {})

    def get(self, key: str) -> tuple[str | None, str]:
        if self.shipped is not None:
            if not self.shipped.exists():
                raise GoldenFileError(f"{self.shipped}: no such golden file")
            g = self._read(self.shipped).get(key)
            if g:
                return g["checksum"], "shipped"
        g = self._read(self.path).get(key)
        return (g["checksum"], "state") if g else (None, "none")

    def put(self, key: str, checksum: str, identity: dict[str, Any], voters: list[str], agreeing: list[str]) -> None:
        goldens = self._read(self.path)
        goldens[key] = {"checksum": checksum, "identity": identity, "voters": voters, "agreeing": agreeing,
                        "established_unix": time.time()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        safefile.write_atomic(self.path, json.dumps({"goldens": goldens}, indent=1, sort_keys=True))


class GoldenFileError(Exception):
    pass
