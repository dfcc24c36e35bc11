"""A real Prometheus server on 127.0.0.1 for tests: harness/prometheus.py's, its binary found the tests' way
(missing: a skip, or a failure under CI=true)."""
from __future__ import annotations

from harness import prometheus

from .helpers import require_binary


class Prometheus(prometheus.Prometheus):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, binary_path=require_binary("prometheus"), **kwargs)
