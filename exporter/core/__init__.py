"""Core: config, the run record and its outcome vocabulary, environment, units, statistics,
version and the shipped data files. Imports probes (for their configs and specs) and nothing
else of fleetcanary."""
