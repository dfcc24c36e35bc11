"""The metrics reference covers every probe metric (its freshness: tests/test_generated.py)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_probe_metric_is_documented():
    text = (ROOT / "docs/metrics.md").read_text()
    from fleetcanary.probes import PROBES

    for cls in PROBES.values():
        for spec in cls.metrics:
            assert f"`{spec.name}`" in text
