"""Generated docs match the code."""
from pathlib import Path

from exporter import docgen

ROOT = Path(__file__).resolve().parent.parent


def test_generated_docs_are_up_to_date():
    for rel, fn in docgen.TARGETS.items():
        assert (ROOT / rel).read_text() == fn(), f"{rel} is stale: run `python -m exporter.docgen`"


def test_every_probe_metric_is_documented():
    text = (ROOT / "docs/metrics.md").read_text()
    from probes import PROBES

    for cls in PROBES.values():
        for spec in cls.metrics:
            assert f"`{spec.name}`" in text
