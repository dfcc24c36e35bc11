"""Fakes at the hardware boundary, built from recorded device facts (NVML)."""
