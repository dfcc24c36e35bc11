"""PromQL label matchers (fleetcanary.core.matchers): kept under this name for `fleetcanary.rules.matchers`."""
from fleetcanary.core.matchers import NAME, OPS, parse

__all__ = ["NAME", "OPS", "parse"]
