"""Shared bits for the GPU probe tests."""
import time
from pathlib import Path

from fleetcanary.probes.base import ProbeContext
from fleetcanary.probes.testing.nvml_fake import FACTS_DIR

FIXTURES = FACTS_DIR


def fake(monkeypatch, name: str) -> Path:
    path = FIXTURES / f"{name}.json"
    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(path))
    return path


def ctx(tmp_path, gpu=None, kube=None, seconds=60.0):
    return ProbeContext(node_name="t", state_dir=str(tmp_path), deadline_monotonic=time.monotonic() + seconds,
                        gpu=gpu or {}, kube=kube or {})


def samples(result):
    return {(s.metric, tuple(sorted(s.labels.items()))): s.value for s in result.samples}


def value(result, metric, **labels):
    key = (metric, tuple(sorted(labels.items())))
    return samples(result).get(key)
