"""The host services an NVLink fabric depends on, as far as a pod can read them.

- nvidia-fabricmanager (process ``nv-fabricmanager``): HGX and DGX NVSwitch systems (A100, H100, H200, B200); without
  it their GPUs never complete fabric registration. GB200 NVL72 compute trays do not run it: the rack's NVLink
  switch trays run NVLink management (NMX), which no compute tray can read.
- nvidia-imex (process ``nvidia-imex``): the IMEX daemon that shares GPU memory across the nodes of a multi-node
  NVLink domain, run as a systemd unit or, with NVIDIA's DRA driver, in a ComputeDomain daemon pod while a
  ComputeDomain exists. Its node list (``/etc/nvidia-imex/nodes_config.cfg``, one IP a line) is the IMEX domain.

What is readable from a pod, and so what this module reads:
- processes, by their ``comm`` under the host's /proc: the host's processes are visible with ``hostPID: true``
  or with the host's /proc mounted read-only at ``proc_root`` (gpu_health's ``host_proc_path``; the shipped
  DaemonSet does neither, so there the states read "unknown" and say so). Whether the /proc read is the host's
  is told by its PID 1: systemd or init is a host, anything else a container's own PID namespace, where a
  missing process proves nothing ("unknown").
- the IMEX node config, where the host's /etc/nvidia-imex is mounted (``imex_config``).
Not read: systemd unit state (D-Bus to the host's systemd is more privilege than an exporter should have, and
/run/systemd/units is systemd's internal, not an API), `nvidia-imex-ctl -N` (a binary and a socket of the host).

Written by hand: psutil would read the same /proc but only the one mounted at /proc, not a host's at another root.
"""
from __future__ import annotations

import os
from pathlib import Path

PROCESSES = {"fabricmanager": "nv-fabricmanager", "imex": "nvidia-imex"}
HOST_INIT = ("systemd", "init")
MAX_READ = 256
MAX_PIDS = 65536           # a bound on the walk of a hostile or huge /proc
MAX_IMEX_NODES = 4096


def _comm(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_READ).decode("utf-8", "replace").strip()
    except OSError:
        return None


def service_states(proc_root: str = "/proc") -> dict[str, str]:
    """service -> running | not_running | unknown (the /proc read is not the host's, or cannot be read)."""
    root = Path(proc_root)
    host = _comm(root / "1" / "comm") in HOST_INIT
    seen: set[str] = set()
    try:
        with os.scandir(root) as it:
            for n, entry in enumerate(it):
                if n >= MAX_PIDS:
                    break
                if entry.name.isdigit():
                    comm = _comm(Path(entry.path) / "comm")
                    if comm in PROCESSES.values():
                        seen.add(comm)
    except OSError:
        return dict.fromkeys(PROCESSES, "unknown")
    return {s: "running" if p in seen else "not_running" if host else "unknown" for s, p in PROCESSES.items()}


def imex_nodes(config: str = "/etc/nvidia-imex/nodes_config.cfg") -> int | None:
    """How many nodes the IMEX node config lists (lines that are not empty or comments); None where unreadable."""
    try:
        with open(config, "rb") as f:
            text = f.read(MAX_IMEX_NODES * 64).decode("utf-8", "replace")
    except OSError:
        return None
    return sum(1 for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))
