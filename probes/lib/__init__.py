"""Code the probes share: NVML, GPU gating, torch helpers, the LLM client and SSE parser,
statistics, subprocess start. Never imports a probe module."""
