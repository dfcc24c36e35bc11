"""Statistics for the exporter's tools: the same dispersion and percentile the probes reduce
their figures with (defined once, in fleetcanary.probes.lib.stats, which imports nothing)."""
from fleetcanary.probes.lib.stats import dispersion, percentile

__all__ = ["dispersion", "percentile"]
