"""Run an image of the OCI layout scripts/build-image writes as a real container: `umoci raw unpack` into an OCI
runtime bundle, `crun run`. tests/test_image.py and benchmarks/image.py share it.

The container shares the host's network namespace (its exporter listens on a loopback port of the caller's
choosing) and otherwise runs as the DaemonSet runs it: the image's user (65532), a read-only root, tmpfs at
/tmp and at the state directory (the pod's emptyDirs). crun keeps its state under a directory of the caller's
(`--root`), so parallel callers never see each other's containers, and runs without cgroups of its own
(`--cgroup-manager=disabled`): nothing to clean up but the container itself.

crun 1.8 refuses a "hybrid" host (cgroup v1 controllers plus a cgroup2 /sys/fs/cgroup/unified with a controller
in it: "cgroups in hybrid mode not supported"). There every crun command runs in a private mount namespace
with an empty tmpfs over /sys/fs/cgroup/unified, so crun sees plain cgroup v1; the host is not changed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

UNIFIED = "/sys/fs/cgroup/unified"
HIDE_UNIFIED = f'mount -t tmpfs -o ro,size=4k fleetcanary-hide-cgroup2 {UNIFIED} && exec "$@"'


def hybrid_cgroups() -> bool:
    """A cgroup2 hierarchy mounted at /sys/fs/cgroup/unified beside the v1 ones."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    return any(ln.split()[4] == UNIFIED and " - cgroup2 " in ln for ln in mounts)


class Container:
    """One container from an image of an OCI layout, in `workdir` (bundle, crun state, log)."""

    def __init__(self, layout: Path, tag: str, workdir: Path, name: str, crun: str = "crun", umoci: str = "umoci"):
        self.layout, self.tag, self.workdir, self.name = Path(layout), tag, Path(workdir), name
        self.crun, self.umoci = crun, umoci
        self.bundle = self.workdir / "bundle"
        self.state_root = self.workdir / "crun-state"
        self.log = self.workdir / "container.log"
        self.started = False

    # --- crun ------------------------------------------------------------------------------------------
    def crun_argv(self, *args: str) -> list[str]:
        argv = [self.crun, "--root", str(self.state_root), "--cgroup-manager=disabled", *args]
        if hybrid_cgroups():
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", HIDE_UNIFIED, "crun", *argv]
        return argv

    def crun_run(self, *args: str, timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
        r = subprocess.run(self.crun_argv(*args), capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, **kw)
        if check and r.returncode != 0:
            raise RuntimeError(f"crun {' '.join(args[:2])}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
        return r

    # --- the bundle ------------------------------------------------------------------------------------
    def unpack(self) -> dict:
        """The tag's layers into the bundle's rootfs and the runtime config umoci derives from the image into its
        config.json; -> that config. `umoci raw unpack`, not `umoci unpack`: the bundle is run, never repacked,
        so the mtree of every file's digest that `unpack` writes for a repack is not made (for the CPU image,
        1.3 GiB, that was 7 of its 19 CPU seconds; the config is the same byte for byte)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.bundle, ignore_errors=True)
        self.bundle.mkdir()
        image = f"{self.layout}:{self.tag}"
        rootfs = self.bundle / "rootfs"
        for what, argv in (("raw unpack", ["raw", "unpack", "--image", image, str(rootfs)]),
                           ("raw runtime-config", ["raw", "runtime-config", "--image", image, "--rootfs", str(rootfs),
                                                   str(self.bundle / "config.json")])):
            r = subprocess.run([self.umoci, *argv], capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"umoci {what}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
        return json.loads((self.bundle / "config.json").read_text())

    def configure(self, args: list[str], state_dir: str = "/var/lib/fleetcanary",
                  files: dict[str, Path] | None = None) -> dict:
        """The bundle's config as the pod runs it, on the host network, running `args` (e.g. ["fleetcanary",
        "run", "--listen-address", "127.0.0.1:PORT"]); `files`: container path -> host file, mounted read-only
        (as a ConfigMap is)."""
        path = self.bundle / "config.json"
        cfg = json.loads(path.read_text())
        proc = cfg["process"]
        user = proc["user"]
        proc["args"] = args
        proc["terminal"] = False
        proc["noNewPrivileges"] = True
        cfg["root"]["readonly"] = True
        cfg["linux"]["namespaces"] = [n for n in cfg["linux"]["namespaces"] if n["type"] != "network"]
        owner = [f"uid={user['uid']}", f"gid={user['gid']}"]
        for dest, opts in (("/tmp", ["mode=1777"]), (state_dir, ["mode=0755", *owner])):
            cfg["mounts"] = [m for m in cfg["mounts"] if m["destination"] != dest]
            cfg["mounts"].append({"destination": dest, "type": "tmpfs", "source": "tmpfs",
                                  "options": ["nosuid", "nodev", "size=256m", *opts]})
        # the host's resolver and name, read-only, as a runtime provides them
        binds = {f: f for f in ("/etc/resolv.conf", "/etc/hosts") if Path(f).exists()}
        binds.update({dest: str(src) for dest, src in (files or {}).items()})
        for dest, src in binds.items():
            cfg["mounts"] = [m for m in cfg["mounts"] if m["destination"] != dest]
            cfg["mounts"].append({"destination": dest, "type": "bind", "source": src, "options": ["rbind", "ro"]})
        path.write_text(json.dumps(cfg, indent=2))
        return cfg

    # --- the container ---------------------------------------------------------------------------------
    def start(self) -> float:
        """`crun run --detach`; -> time.monotonic() just before it ran."""
        self.state_root.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log, "wb") as log:
            r = subprocess.run(self.crun_argv("run", "--detach", "--bundle", str(self.bundle), self.name),
                               stdout=log, stderr=log, stdin=subprocess.DEVNULL, timeout=120)
        self.started = True
        if r.returncode != 0:
            raise RuntimeError(f"crun run: exit {r.returncode}: {self.output()[-500:]}")
        return t0

    def state(self) -> dict:
        return json.loads(self.crun_run("state", self.name).stdout)

    def running(self) -> bool:
        r = self.crun_run("state", self.name, check=False)
        return r.returncode == 0 and json.loads(r.stdout).get("status") == "running"

    def exec(self, *argv: str, user: str = "65532:65532", timeout: float = 120) -> subprocess.CompletedProcess:
        return self.crun_run("exec", "--user", user, self.name, *argv, timeout=timeout, check=False)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Kill and delete the container (idempotent); the bundle and the crun state go with the workdir."""
        if not self.started:
            return
        self.crun_run("kill", self.name, "KILL", check=False)
        self.crun_run("delete", "--force", self.name, check=False)
        self.started = False

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.bundle, ignore_errors=True)
        shutil.rmtree(self.state_root, ignore_errors=True)


def uid_of(pid: int) -> tuple[int, ...]:
    """/proc/<pid>/status's Uid line: real, effective, saved, filesystem."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return tuple(int(x) for x in line.split()[1:])
    raise RuntimeError(f"no Uid line in /proc/{pid}/status")


def is_root() -> bool:
    return os.geteuid() == 0
