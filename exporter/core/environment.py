"""The environment record: the guide's variables to freeze, as far as this host can tell.

Fields the host cannot tell are recorded as "unknown", never omitted. The host part
is cheap, stdlib-only reads of /proc, /sys and the cgroup filesystem. The GPU part
calls NVML and so runs only in a worker process (``collect(with_gpu=True)``).
"""
from __future__ import annotations

import os
import platform
import re
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from fleetcanary.core.version import git_commit, version

UNKNOWN = "unknown"

# Fields of the record that identify a node's hardware and software stack: they
# change only on an upgrade, so they are safe, bounded labels for fleetcanary_node_info.
STABLE_FIELDS = (
    "os", "kernel", "cpu_model", "cpu_cores", "numa_nodes", "memory_bytes", "python_version",
    "fleetcanary_version", "gpu_model", "gpu_count", "driver_version", "cuda_driver_version",
)

PACKAGES = ("numpy", "torch", "nvidia-ml-py", "prometheus-client", "pydantic", "apscheduler", "requests")
IMAGE_ENV = ("FLEETCANARY_IMAGE", "IMAGE_DIGEST", "CONTAINER_IMAGE")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def os_name() -> str:
    text = _read("/etc/os-release") or ""
    m = re.search(r'^PRETTY_NAME="?([^"\n]+)"?', text, re.MULTILINE)
    return m.group(1) if m else platform.system() or UNKNOWN


def cpu_model() -> str:
    text = _read("/proc/cpuinfo") or ""
    m = re.search(r"^(model name|Model|cpu model)\s*:\s*(.+)$", text, re.MULTILINE)
    return m.group(2).strip() if m else (platform.processor() or UNKNOWN)


def numa_nodes() -> int | str:
    root = Path("/sys/devices/system/node")
    nodes = list(root.glob("node[0-9]*")) if root.exists() else []
    return len(nodes) if nodes else UNKNOWN


def memory_bytes() -> int | str:
    text = _read("/proc/meminfo") or ""
    m = re.search(r"^MemTotal:\s+(\d+) kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else UNKNOWN


def _cgroup_dir() -> Path | None:
    """This process's cgroup v2 directory, or None on cgroup v1 / unknown."""
    text = _read("/proc/self/cgroup") or ""
    for line in text.splitlines():
        if line.startswith("0::"):
            p = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            if p.exists():
                return p
    return None


def cgroup_limits() -> dict[str, Any]:
    cg = _cgroup_dir()
    out: dict[str, Any] = {"cgroup_cpu_limit_cores": UNKNOWN, "cgroup_memory_limit_bytes": UNKNOWN}
    if cg is None:
        v1q = _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
        v1p = _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
        if v1q and v1p and v1q.lstrip("-").isdigit():
            out["cgroup_cpu_limit_cores"] = "max" if int(v1q) < 0 else int(v1q) / int(v1p)
        v1m = _read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        if v1m and v1m.isdigit():
            out["cgroup_memory_limit_bytes"] = int(v1m)
        return out
    cpu_max = _read(str(cg / "cpu.max"))
    if cpu_max:
        quota, _, period = cpu_max.partition(" ")
        out["cgroup_cpu_limit_cores"] = "max" if quota == "max" else int(quota) / int(period or 100000)
    mem_max = _read(str(cg / "memory.max"))
    if mem_max:
        out["cgroup_memory_limit_bytes"] = "max" if mem_max == "max" else int(mem_max)
    return out


def cpu_throttling() -> dict[str, int] | None:
    """Cumulative CFS throttling of this cgroup (periods throttled, microseconds), or None."""
    cg = _cgroup_dir()
    text = _read(str(cg / "cpu.stat")) if cg else _read("/sys/fs/cgroup/cpu/cpu.stat")
    if not text:
        return None
    vals = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
    if "nr_throttled" not in vals:
        return None
    usec = int(vals.get("throttled_usec", int(vals.get("throttled_time", 0)) // 1000))
    return {"nr_periods": int(vals.get("nr_periods", 0)), "nr_throttled": int(vals["nr_throttled"]),
            "throttled_usec": usec}


def throttling_delta(before: dict | None, after: dict | None) -> dict[str, Any]:
    if not before or not after:
        return {"throttled_periods": UNKNOWN, "throttled_seconds": UNKNOWN}
    return {"throttled_periods": after["nr_throttled"] - before["nr_throttled"],
            "throttled_seconds": (after["throttled_usec"] - before["throttled_usec"]) / 1e6}


SYSFS_ENV = "FLEETCANARY_SYSFS_ROOT"   # where sysfs is (tests: a recorded tree), default /sys


def hca_firmware(sysfs_root: str | None = None) -> dict[str, str]:
    """Each RDMA device's firmware version (<sysfs>/class/infiniband/<dev>/fw_ver, e.g. mlx5_0: 28.39.1002); {}
    on a node without one. The guide freezes it with the NIC: a firmware update changes NCCL's and RDMA's figures."""
    root = Path(sysfs_root or os.environ.get(SYSFS_ENV) or "/sys") / "class" / "infiniband"
    out = {}
    try:
        devices = sorted(p for p in root.iterdir())[:64]
    except OSError:
        return out
    for dev in devices:
        fw = _read(str(dev / "fw_ver"))
        if fw:
            out[dev.name] = fw[:64]
    return out


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def host_facts() -> dict[str, Any]:
    image = next((os.environ[v] for v in IMAGE_ENV if os.environ.get(v)), UNKNOWN)
    facts: dict[str, Any] = {
        "hostname": socket.gethostname() or UNKNOWN,
        "os": os_name(),
        "kernel": platform.release() or UNKNOWN,
        "arch": platform.machine() or UNKNOWN,
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count() or UNKNOWN,
        "cpu_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else UNKNOWN,
        "numa_nodes": numa_nodes(),
        "memory_bytes": memory_bytes(),
        "python_version": platform.python_version(),
        "python_executable": sys.executable,
        "packages": package_versions(),
        "fleetcanary_version": version(),
        "git_commit": git_commit(),
        "image": image,
        "in_kubernetes": bool(os.environ.get("KUBERNETES_SERVICE_HOST")),
        "hca_firmware": hca_firmware(),
    }
    facts.update(cgroup_limits())
    return facts


GPU_UNKNOWN = {
    "gpu_model": UNKNOWN, "gpu_count": UNKNOWN, "driver_version": UNKNOWN, "cuda_driver_version": UNKNOWN,
    "gpus": [],
}


def gpu_facts() -> dict[str, Any]:
    """GPU facts from NVML. Worker-only: it loads the NVML library."""
    from fleetcanary.probes.lib import nvml

    try:
        session = nvml.open_session()
    except nvml.NvmlUnavailable as exc:
        return {**GPU_UNKNOWN, "gpu_count": 0 if exc.no_driver else UNKNOWN, "nvml": str(exc)}
    with session:
        return session.environment_facts()


def collect(with_gpu: bool) -> dict[str, Any]:
    rec = host_facts()
    rec.update(gpu_facts() if with_gpu else GPU_UNKNOWN)
    return rec


def stable_labels(record: dict[str, Any]) -> dict[str, str]:
    return {k: str(record.get(k, UNKNOWN)) for k in STABLE_FIELDS}
