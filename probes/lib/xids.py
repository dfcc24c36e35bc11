"""XIDs that mean a GPU needs attention (DCGM's and NVIDIA's XID catalogue, abridged): 13 graphics engine
exception, 31 MMU fault, 43 reset channel, 45 preemptive cleanup, 48 DBE, 61/62 internal micro-controller,
63/64 row remapping, 74 NVLink error, 79 fell off the bus, 92 high SBE rate, 94/95 contained/uncontained ECC,
119/120 GSP errors. Shared by gpu_health's NVML event wait and the daemon's kernel-log watch (which never
imports NVML)."""
CRITICAL_XIDS = frozenset({13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})
