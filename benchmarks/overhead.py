#!/usr/bin/env python3
"""What fleetcanary costs a node: the daemon idle and busy, each probe's wall/CPU/GPU time, and
the duty cycle at the default schedule.

1. Daemon: `fleetcanary run` with the default probe set (no GPU here: GPU probes skip) -
   RSS and CPU over an idle window (no probe due, no scrapes), then over a busy window
   (every CPU probe due every few seconds and a scrape every second). The daemon's own
   process only: probe work happens in worker processes, counted per probe below.
2. Per probe: N isolated runs (the daemon's own worker path) with default parameters -
   wall time, CPU time of the worker and everything it started (RUSAGE_CHILDREN), GPU
   seconds from the record.
   Memory of each run: the worker's whole process tree (the worker and everything it starts,
   gloo ranks included, all in the container's cgroup at once), sampled from /proc every 50 ms
   (the sum of RSS, of anonymous RSS, and the sum of each process's VmHWM as an upper bound), and
   where this machine lets us make one, a transient memory cgroup around the run (cgroup v2
   memory.peak or v1 memory.max_usage_in_bytes): what a container memory limit sees, anonymous
   memory plus page cache first charged by the run. (max_rss_bytes, RUSAGE_CHILDREN ru_maxrss, is
   the largest single process since the benchmark began, not a sum; kept for comparison.)
3. Duty cycle: per-run cost x runs per hour at each probe's default interval.
   Container memory: the daemon's peak RSS in the busy window plus the largest concurrent worker
   set the scheduler allows (one exclusive "gpu" probe at a time, the other probes free to overlap):
   the largest exclusive probe's tree peak plus every non-exclusive probe's. The daemon windows also
   run the daemon in a memory cgroup of its own from its start (where one can be made) and report its
   peak: a measured, not composed, container figure. GPU nodes add a CUDA context per process that
   creates one; that part is an estimate (--cuda-context-mib, --gpus), never measured here.
4. GPU budget: GPU seconds per hour per GPU of every invasive GPU probe at its default
   schedule, from each probe's configured ``expected_gpu_seconds`` (what the scheduler's
   budget check charges), summed and compared with the default budget (gpu.budget_ratio
   x 3600 s). A daily probe counts as its amortized share (22 s a day = 0.92 s an hour), as
   the daemon's budget does (daemon/scheduler.py GpuBudget: each probe is held to the ratio
   over a window as long as its interval, one hour to one day; at steady state every probe
   finds its charge in its window exactly when these shares sum to the hourly budget). Each
   probe's single run must also fit its own window (a 22 s burn cannot fit an 18 s hour).
   Exits 1 when either fails. `--gpu-budget-only` prints just this (no daemon, no runs).

Loopback only (the inference canary probes the built-in reference server, storage a temp
directory). Prints tables and writes benchmarks/results/overhead.json.

    python -m benchmarks.overhead [--runs 3] [--idle 30] [--busy 30] [--gpu-budget-only]
                                  [--cuda-context-mib 600] [--gpus 8] [--no-cgroup]
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import get, proc_stats, write_result
from fleetcanary.core import config as configmod
from fleetcanary.daemon.scheduler import budget_window
from fleetcanary.offline.simulate_llm import SimSettings, start_in_thread
from fleetcanary.probes import PROBES
from fleetcanary.runner import job
from fleetcanary.runner.isolation import become_subreaper, run_isolated
from harness.ports import free_port

ROOT = Path(__file__).resolve().parent.parent

# The probes this benchmark gives a loopback target or a CPU path (probe_config below): they run in the busy window.
CPU_PROBES = ("host_memory_bandwidth", "storage", "collectives", "inference")
# The other probes the map (fleetcanary.probes.PROBES) enables by default: they run here too (skipping where their
# hardware or targets are missing), and count in the duty cycle and the concurrent worker set. Read from the map,
# so a new probe is measured without a line here.
OTHER_PROBES = tuple(n for n, cls in PROBES.items() if cls.default_enabled and n not in CPU_PROBES)
SAMPLE_SECONDS = 0.05
MiB = 2**20
# GPU probes that create a CUDA context on a GPU node, and in how many processes, from their config models: a
# `device` (cuda or cpu) is one process with a context; `cpu_ranks` (a rank program) is one rank per GPU (None).
CUDA_CONTEXTS = {n: None if "cpu_ranks" in cls.Config.model_fields else 1 for n, cls in PROBES.items()
                 if {"device", "cpu_ranks"} & set(cls.Config.model_fields)}


# ---------------------------------------------------------------------- memory of a process tree
def _children(pid: int) -> list[int]:
    """The children of one process, from every thread's /proc children list (workers are started
    from the daemon's scheduler threads)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def _memory(pid: int) -> tuple[int, int, int] | None:
    """(RSS, anonymous RSS, VmHWM) of one process in bytes; None when gone (a zombie reads 0)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    got = {"VmRSS:": 0, "RssAnon:": 0, "VmHWM:": 0}
    for line in text.splitlines():
        key = line.split(None, 1)[0] if line else ""
        if key in got:
            got[key] = int(line.split()[1]) * 1024
    return got["VmRSS:"], got["RssAnon:"], got["VmHWM:"]


class TreeSampler(threading.Thread):
    """Samples a process tree's memory every SAMPLE_SECONDS until stop(): the peak of the summed RSS
    (pessimistic: a shared library's pages count once per process) and of the summed anonymous RSS
    (never shared between the spawned processes), the most processes at once, the root's own peak, and
    the sum over every process seen of its VmHWM (an upper bound that a spike between samples cannot
    escape). ``include_root``: count the root itself (the daemon), or only its descendants (the
    benchmark's own process, whose children are the workers)."""

    def __init__(self, root: int, include_root: bool) -> None:
        super().__init__(daemon=True)
        self.root, self.include_root = root, include_root
        self._halt = threading.Event()
        self.peak_rss = self.peak_anon = self.peak_procs = self.root_peak_rss = self.samples = 0
        self._hwm: dict[int, int] = {}

    def sample(self) -> None:
        pending, rss, anon, procs = [self.root], 0, 0, 0
        seen = set()
        while pending:
            pid = pending.pop()
            if pid in seen:
                continue
            seen.add(pid)
            pending += _children(pid)
            if pid == self.root and not self.include_root:
                continue
            m = _memory(pid)
            if m is None:
                continue
            rss, anon, procs = rss + m[0], anon + m[1], procs + (m[0] > 0)
            self._hwm[pid] = max(self._hwm.get(pid, 0), m[2])
            if pid == self.root:
                self.root_peak_rss = max(self.root_peak_rss, m[0])
        self.peak_rss, self.peak_anon = max(self.peak_rss, rss), max(self.peak_anon, anon)
        self.peak_procs = max(self.peak_procs, procs)
        self.samples += 1

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(SAMPLE_SECONDS)

    def stop(self) -> dict:
        self._halt.set()
        self.join()
        self.sample()
        return {"peak_tree_rss_bytes": self.peak_rss, "peak_tree_anon_bytes": self.peak_anon,
                "tree_hwm_sum_bytes": sum(self._hwm.values()), "peak_processes": self.peak_procs,
                "samples": self.samples}


# ---------------------------------------------------------------------- a transient memory cgroup
def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, options) of every cgroup mount."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        f = line.split()
        if len(f) >= 4 and f[2] in ("cgroup", "cgroup2"):
            out.append((f[1], f[2], f[3]))
    return out


class MemCgroup:
    """A memory cgroup made for one measurement: cgroup v2 (memory.peak) where the memory controller can
    be enabled for a child of the hierarchy's root, else cgroup v1 (memory.max_usage_in_bytes). Its
    peak is what a container's memory limit sees: anonymous memory and page cache charged by its
    processes (charges made before a process moved in stay where they were). None from create() where
    neither works (no root, a delegated v2 hierarchy that is not ours, no memory controller)."""

    disabled = False
    why_not = ""

    def __init__(self, path: Path, version: int, home: Path) -> None:
        self.path, self.version, self.home = path, version, home

    @classmethod
    def create(cls, tag: str) -> MemCgroup | None:
        if cls.disabled:
            return None
        name = f"fleetcanary-overhead-{os.getpid()}-{tag}"
        errors = []
        own = {}  # controller ("" for v2) -> this process's cgroup path
        for ln in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, where = ln.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                own[c] = where
        mounts = _mounts()
        for mount, fstype, opts in sorted(mounts, key=lambda m: m[1] != "cgroup2"):  # v2 first
            try:
                if fstype == "cgroup2":
                    root = Path(mount)
                    if "memory" not in (root / "cgroup.controllers").read_text().split():
                        continue
                    if "memory" not in (root / "cgroup.subtree_control").read_text().split():
                        (root / "cgroup.subtree_control").write_text("+memory")
                    home = root / own.get("", "/").lstrip("/")
                    version = 2
                elif "memory" in opts.split(","):
                    root = Path(mount)
                    home = root / own.get("memory", "/").lstrip("/")
                    version = 1
                else:
                    continue
                path = root / name
                path.mkdir()
                return cls(path, version, home)
            except OSError as exc:
                errors.append(f"{mount}: {exc}")
        cls.why_not = "; ".join(errors) or "no cgroup memory controller mounted"
        return None

    def _read(self, name: str) -> int:
        return int((self.path / name).read_text().split()[0])

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def peak(self) -> int:
        return self._read("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")

    def reset_peak(self) -> bool:
        """Start the peak afresh from the current usage (v1 only; v2's reset is per open file)."""
        if self.version != 1:
            return False
        (self.path / "memory.max_usage_in_bytes").write_text("0")
        return True

    def stat(self) -> dict[str, int]:
        """Anonymous and page-cache bytes charged now."""
        rows = dict(ln.split() for ln in (self.path / "memory.stat").read_text().splitlines() if ln.count(" ") == 1)
        if self.version == 2:
            return {"anon_bytes": int(rows.get("anon", 0)), "file_bytes": int(rows.get("file", 0))}
        return {"anon_bytes": int(rows.get("total_rss", 0)), "file_bytes": int(rows.get("total_cache", 0))}

    def enter(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def leave(self, pid: int) -> None:
        (self.home / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        for _ in range(50):  # a process just killed may still be listed for a moment
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def probe_config(work: Path, llm_url: str, fast: bool) -> dict:
    scratch = work / "scratch"
    scratch.mkdir(exist_ok=True)
    every = (lambda s: {"interval_seconds": s, "timeout_seconds": s - 1, "jitter_seconds": 0}) if fast else \
        (lambda s: {})
    return {
        "state_dir": str(work / "state"),
        "probes": {
            "host_memory_bandwidth": every(8),
            "storage": {**every(12), "params": {"targets": [{"name": "scratch", "path": str(scratch),
                                                             "min_free_bytes": 0}]}},
            "collectives": {**every(12), "params": {"backend": "gloo"}},
            "inference": {**every(6), "params": {"targets": [{"name": "reference", "base_url": llm_url,
                                                              "model": "fleetcanary-reference"}]}},
        },
    }


def daemon_windows(work: Path, llm_url: str, idle: float, busy: float) -> dict:
    import yaml

    out = {}
    for mode, seconds in (("idle", idle), ("busy", busy)):
        port = free_port()
        cfg = probe_config(work, llm_url, fast=(mode == "busy"))
        cfg["server"] = {"listen_address": f"127.0.0.1:{port}"}
        path = work / f"daemon-{mode}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        cmd = [sys.executable, "-m", "fleetcanary", "run", "--config", str(path)]
        cg = MemCgroup.create(f"daemon-{mode}")
        if cg is not None:  # in the cgroup from its first instruction, as in a container
            cmd = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', cg.procs_file, *cmd]
        with open(work / f"daemon-{mode}.log", "wb") as log:  # the daemon keeps its own descriptor
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        life = TreeSampler(proc.pid, include_root=True)
        life.start()
        # Idle: the probes scheduled within 10 s of the start. The invasive GPU-class probes (collectives)
        # start at the node's slot of their interval (daemon/phase.py), up to 30 min away at the defaults;
        # in the busy window's 12 s interval they come within 12 s.
        wait_for = CPU_PROBES if mode == "busy" else tuple(p for p in CPU_PROBES if not PROBES[p].exclusive)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            deadline = time.monotonic() + 180
            # the first runs of every probe are done (each started within 10 s of start)
            while time.monotonic() < deadline:
                try:
                    text = get(url).decode()
                    if all(f'fleetcanary_probe_duration_seconds{{probe="{p}"}}' in text for p in wait_for):
                        break
                except OSError:
                    pass
                time.sleep(0.5)
            else:
                raise SystemExit(f"overhead: the {mode} daemon's first runs did not finish")
            time.sleep(2)
            cg_startup_peak = cg.peak() if cg else None
            reset = cg.reset_peak() if cg else False
            window = TreeSampler(proc.pid, include_root=True)
            window.start()
            c0, _ = proc_stats(proc.pid)
            t0 = time.monotonic()
            scrapes = 0
            while time.monotonic() - t0 < seconds:
                if mode == "busy":
                    get(url)
                    scrapes += 1
                time.sleep(1.0)
            c1, rss = proc_stats(proc.pid)
            win = window.stop()
            out[mode] = {"seconds": time.monotonic() - t0, "cpu_ratio": (c1 - c0) / (time.monotonic() - t0),
                         "rss_bytes": rss, "scrapes": scrapes,
                         # the daemon's own process: sampled peak in the window, and its lifetime VmHWM
                         "rss_peak_bytes": window.root_peak_rss, "vm_hwm_bytes": (_memory(proc.pid) or (0, 0, 0))[2],
                         # the daemon and its workers together, sampled
                         "tree_window": win, "workers_seen_in_window": win["peak_processes"] > 1,
                         "cgroup": None if cg is None else {
                             "version": cg.version, "startup_peak_bytes": cg_startup_peak,
                             "window_peak_bytes": cg.peak() if reset else None,
                             "lifetime_peak_bytes": max(cg_startup_peak, cg.peak()),
                             "end": cg.stat()}}
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            tree_life = life.stop()
            if cg is not None:
                cg.remove()
        if mode in out:
            out[mode]["tree_lifetime"] = tree_life
    return out


def _med(rows: list[dict], key: str) -> float:
    """The median (upper, for an even count) of one field over the runs."""
    return sorted(r[key] for r in rows)[len(rows) // 2]


def per_probe(work: Path, llm_url: str, runs: int, cpu_paths: bool = False) -> dict:
    """Each probe's runs. cpu_paths: instead, the GPU probes that take ``device: cpu``, forced onto their CPU
    path (torch on the CPU: the import and host-side cost a GPU node pays too, without the CUDA context)."""
    become_subreaper(reap_everything=True)
    path = work / "probes.yaml"
    import yaml

    path.write_text(yaml.safe_dump(probe_config(work, llm_url, fast=False)))
    settings = configmod.load(path)
    out = {}
    for name in CPU_PROBES + OTHER_PROBES:
        entry = settings.probe_entries()[name]
        params = entry.params.model_dump(mode="json")
        if cpu_paths:
            if not PROBES[name].exclusive or "device" not in params:
                continue
            params["device"] = "cpu"
        rows = []
        for i in range(runs):
            cg = MemCgroup.create(f"{name}-{i}")
            tree = TreeSampler(os.getpid(), include_root=False)  # our children: the worker and its own
            tree.start()
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if cg is not None:  # the worker is forked inside it; our own earlier charges stay outside
                cg.enter(os.getpid())
            try:
                o = run_isolated(job.build(name, PROBES[name], params, job.probe_context(settings)),
                                 entry.timeout_seconds)
            finally:
                if cg is not None:
                    cg.leave(os.getpid())
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            mem = tree.stop()
            if cg is not None:
                mem.update(cgroup_peak_bytes=cg.peak(), cgroup_end=cg.stat())
                cg.remove()
            rows.append({"outcome": o.outcome, "reason": o.reason, "wall_seconds": o.wall_seconds,
                         "cpu_seconds": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
                         "gpu_seconds": sum(o.gpu_seconds.values()),
                         "max_rss_bytes": r1.ru_maxrss * 1024, **mem})
        # memory: the largest of the runs (a limit must hold every run), the rest the median
        peaks = {k: max(r[k] for r in rows) for k in ("peak_tree_rss_bytes", "peak_tree_anon_bytes",
                                                      "tree_hwm_sum_bytes", "peak_processes")}
        cg_peaks = [r["cgroup_peak_bytes"] for r in rows if "cgroup_peak_bytes" in r]
        out[name] = {"runs": rows, "outcome": rows[-1]["outcome"], "reason": rows[-1]["reason"],
                     "wall_seconds": _med(rows, "wall_seconds"), "cpu_seconds": _med(rows, "cpu_seconds"),
                     "gpu_seconds": _med(rows, "gpu_seconds"), "interval_seconds": entry.interval_seconds,
                     "exclusive": PROBES[name].exclusive, **peaks,
                     "cgroup_peak_bytes": max(cg_peaks) if cg_peaks else None}
    return out


def container_memory(daemon: dict, probes: dict, cuda_context_mib: float, gpus: int) -> dict:
    """The container's memory at its worst moment the scheduler allows: the daemon's busy-window peak,
    the largest exclusive ("gpu" class, serialized) probe's tree and every other probe's tree at once.
    Per probe the larger of the sampled tree RSS and the cgroup peak. Then the same on a GPU node, with
    an assumed (not measured) host RSS per CUDA context for each process that makes one."""
    def peak(p: dict) -> int:
        return max(p["peak_tree_rss_bytes"], p["cgroup_peak_bytes"] or 0)

    exclusive = {n: peak(p) for n, p in probes.items() if p["exclusive"]}
    shared = {n: peak(p) for n, p in probes.items() if not p["exclusive"]}
    daemon_peak = max(daemon[m]["rss_peak_bytes"] for m in daemon)
    largest = max(exclusive, key=exclusive.get)
    measured = daemon_peak + exclusive[largest] + sum(shared.values())
    ctx = cuda_context_mib * MiB
    gpu_exclusive = {}
    for n, here in exclusive.items():
        contexts, host = CUDA_CONTEXTS.get(n, 0), here
        if contexts is None:  # one rank per GPU instead of cpu_ranks: scale by processes, then a context each
            host, contexts = here / max(probes[n]["peak_processes"], 1) * (gpus + 1), gpus
        gpu_exclusive[n] = int(host + ctx * contexts)
    gpu_largest = max(gpu_exclusive, key=gpu_exclusive.get)
    measured_cg = [d["cgroup"]["lifetime_peak_bytes"] for d in daemon.values() if d.get("cgroup")]
    return {"daemon_idle_rss_bytes": daemon["idle"]["rss_bytes"], "daemon_peak_rss_bytes": daemon_peak,
            "largest_exclusive_probe": largest, "largest_exclusive_bytes": exclusive[largest],
            "non_exclusive_bytes": shared, "non_exclusive_sum_bytes": sum(shared.values()),
            "peak_bytes": measured,
            "daemon_cgroup_peak_bytes": max(measured_cg) if measured_cg else None,
            "gpu_node_estimate": {"estimated": True, "cuda_context_bytes_assumed": ctx, "gpus": gpus,
                                  "largest_exclusive_probe": gpu_largest,
                                  "largest_exclusive_bytes": gpu_exclusive[gpu_largest],
                                  "peak_bytes": daemon_peak + gpu_exclusive[gpu_largest] + sum(shared.values())}}


def gpu_budget() -> dict:
    """GPU seconds per hour per GPU at the default schedule of every probe that charges the GPU budget."""
    settings = configmod.settings_model()()
    rows = {}
    for name, cls in PROBES.items():
        expected = cls.Config.model_fields.get("expected_gpu_seconds")
        if expected is None:
            continue
        entry = settings.probe_entries()[name]
        per_run = float(expected.default)
        window = budget_window(entry.interval_seconds)
        rows[name] = {"enabled": entry.enabled, "interval_seconds": entry.interval_seconds,
                      "expected_gpu_seconds": per_run,
                      "gpu_seconds_per_hour": per_run * 3600.0 / entry.interval_seconds,
                      "budget_window_seconds": window, "window_budget_seconds": settings.gpu.budget_ratio * window,
                      "fits_window": per_run <= settings.gpu.budget_ratio * window}
    total = sum(r["gpu_seconds_per_hour"] for r in rows.values() if r["enabled"])
    budget = settings.gpu.budget_ratio * 3600.0
    fits = all(r["fits_window"] for r in rows.values() if r["enabled"])
    return {"probes": rows, "gpu_seconds_per_hour": total, "budget_seconds_per_hour": budget,
            "budget_ratio": settings.gpu.budget_ratio, "every_run_fits_its_window": fits,
            "within_budget": total <= budget and fits}


def print_gpu_budget(b: dict) -> None:
    print(f"{'GPU probe':16} {'enabled':>8} {'interval':>10} {'GPU s/run':>10} {'GPU s/hour':>11} "
          f"{'window':>8} {'its budget':>11}")
    for name, r in b["probes"].items():
        print(f"{name:16} {r['enabled']!s:>8} {r['interval_seconds']:>9.0f}s {r['expected_gpu_seconds']:>10.2f} "
              f"{r['gpu_seconds_per_hour']:>11.2f} {r['budget_window_seconds']:>7.0f}s "
              f"{r['window_budget_seconds']:>10.1f}s{'' if r['fits_window'] else '  RUN OVER ITS WINDOW'}")
    print(f"{'all enabled':16} {'':>8} {'':>10} {'':>10} {b['gpu_seconds_per_hour']:>11.2f}  per GPU; budget "
          f"{b['budget_seconds_per_hour']:.1f} s/hour ({100 * b['budget_ratio']:.1f}%): "
          f"{'within' if b['within_budget'] else 'OVER'} "
          f"({100 * b['gpu_seconds_per_hour'] / b['budget_seconds_per_hour']:.0f}% of it)")
    print("(GPU s/hour: per-run charge x runs per hour, a daily probe amortized; window: the span each probe is "
          "held to the ratio over, its interval clamped to 1 h..1 day.)")
    print("(GPU s/run: each probe's expected_gpu_seconds default, what the budget check charges before a run; "
          "measured GPU seconds on an H200 are in docs/gpu-validation.md.)")


def print_memory(daemon: dict, probes: dict, c: dict, cpu_paths: dict) -> None:
    def mib(b: float | None) -> str:
        return "-" if b is None else f"{b / MiB:.0f}"

    print(f"{'daemon memory':14} {'RSS end':>8} {'RSS peak':>9} {'VmHWM':>7} {'tree peak':>10} {'cgroup peak':>12} "
          f"{'cgroup anon/file at end':>24}  (MiB)")
    for mode, d in daemon.items():
        cg = d.get("cgroup") or {}
        end = cg.get("end")
        print(f"{mode:14} {mib(d['rss_bytes']):>8} {mib(d['rss_peak_bytes']):>9} {mib(d['vm_hwm_bytes']):>7} "
              f"{mib(d['tree_window']['peak_tree_rss_bytes']):>10} {mib(cg.get('lifetime_peak_bytes')):>12} "
              f"{(mib(end['anon_bytes']) + ' / ' + mib(end['file_bytes'])) if end else '-':>24}")
    print("(RSS peak: the daemon's process over the window; tree peak: it and its workers over the window; cgroup "
          "peak: everything in the daemon's cgroup from its start, page cache included)")
    print()
    print(f"{'probe memory':22} {'class':>6} {'procs':>6} {'tree RSS':>9} {'tree anon':>10} {'HWM sum':>8} "
          f"{'cgroup peak':>12}  (MiB, largest of the runs)")
    for name, p in [*probes.items(), *((f"{n} (cpu)", p) for n, p in cpu_paths.items())]:
        label = name if p["outcome"] != "skipped" else f"{name} [{p['reason']}]"
        print(f"{label[:22]:22} {p['exclusive'] or '-':>6} {p['peak_processes']:>6} {mib(p['peak_tree_rss_bytes']):>9} "
              f"{mib(p['peak_tree_anon_bytes']):>10} {mib(p['tree_hwm_sum_bytes']):>8} "
              f"{mib(p['cgroup_peak_bytes']):>12}")
    print(f"(tree: the worker and all it started, sampled every {SAMPLE_SECONDS * 1000:.0f} ms; HWM sum: each "
          "process's own peak, added - an upper bound; cgroup peak: anon + page cache charged by the run"
          f"{'' if MemCgroup.why_not == '' else '; no cgroup here: ' + MemCgroup.why_not})")
    print()
    g = c["gpu_node_estimate"]
    print(f"container peak, measured: daemon {mib(c['daemon_peak_rss_bytes'])} + largest exclusive "
          f"({c['largest_exclusive_probe']}) {mib(c['largest_exclusive_bytes'])} + all non-exclusive "
          f"{mib(c['non_exclusive_sum_bytes'])} = {mib(c['peak_bytes'])} MiB; the daemon's own cgroup peaked at "
          f"{mib(c['daemon_cgroup_peak_bytes'])} MiB")
    print(f"GPU node, ESTIMATED ({mib(g['cuda_context_bytes_assumed'])} MiB assumed per CUDA context, {g['gpus']} "
          f"GPUs): largest exclusive ({g['largest_exclusive_probe']}) {mib(g['largest_exclusive_bytes'])}, peak "
          f"{mib(g['peak_bytes'])} MiB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="isolated runs per probe (median reported)")
    ap.add_argument("--idle", type=float, default=30.0)
    ap.add_argument("--busy", type=float, default=30.0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/overhead.json"))
    ap.add_argument("--gpu-budget-only", action="store_true", help="only the GPU-budget table (no runs)")
    ap.add_argument("--cuda-context-mib", type=float, default=600.0,
                    help="assumed host RSS of one CUDA context (torch CUDA build), for the GPU-node estimate only")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per node for the GPU-node estimate (NCCL ranks)")
    ap.add_argument("--no-cgroup", action="store_true", help="no transient memory cgroups, /proc sampling only")
    ap.add_argument("--cpu-paths", action="store_true",
                    help="also run the GPU probes that can on the CPU (device: cpu), for their torch host memory; "
                    "reported apart, not in the duty cycle or the container peak")
    args = ap.parse_args()
    MemCgroup.disabled = args.no_cgroup
    budget = gpu_budget()
    if args.gpu_budget_only:
        print_gpu_budget(budget)
        return 0 if budget["within_budget"] else 1
    work = Path(tempfile.mkdtemp(prefix="fc-overhead-"))
    server, _ = start_in_thread(SimSettings(ttft_ms=40, itl_ms=8, max_tokens_default=64))
    llm_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        probes = per_probe(work, llm_url, args.runs)
        cpu_paths = per_probe(work, llm_url, args.runs, cpu_paths=True) if args.cpu_paths else {}
        daemon = daemon_windows(work, llm_url, args.idle, args.busy)
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(work, ignore_errors=True)
    cores = os.cpu_count() or 1
    print(f"fleetcanary overhead on {platform.machine()}, {cores} cores, Python {platform.python_version()}")
    print()
    print(f"{'daemon':8} {'CPU (% of one core)':>20} {'RSS':>10} {'scrapes':>8}")
    for mode in ("idle", "busy"):
        d = daemon[mode]
        print(f"{mode:8} {100 * d['cpu_ratio']:>19.2f}% {d['rss_bytes'] / 2**20:>8.1f} MiB {d['scrapes']:>8}")
    print("(busy: every CPU probe due every 6-12 s and a scrape every second; probe work is in the workers)")
    print()
    print(f"{'probe':22} {'outcome':>16} {'wall s':>8} {'CPU s':>8} {'GPU s':>7} {'interval':>9} "
          f"{'wall duty':>10} {'CPU duty':>9} {'CPU s/hour':>11}")
    total_cpu_hour = 0.0
    for name, p in probes.items():
        runs_per_hour = 3600.0 / p["interval_seconds"]
        wall_duty = p["wall_seconds"] / p["interval_seconds"]
        cpu_duty = p["cpu_seconds"] / p["interval_seconds"]
        cpu_hour = p["cpu_seconds"] * runs_per_hour
        total_cpu_hour += cpu_hour
        p.update(wall_duty=wall_duty, cpu_duty=cpu_duty, cpu_seconds_per_hour=cpu_hour)
        label = p["outcome"] + (f" ({p['reason']})" if p["reason"] else "")
        print(f"{name:22} {label:>16} {p['wall_seconds']:>8.2f} {p['cpu_seconds']:>8.2f} {p['gpu_seconds']:>7.3f} "
              f"{p['interval_seconds']:>8.0f}s {100 * wall_duty:>9.2f}% {100 * cpu_duty:>8.3f}% {cpu_hour:>11.1f}")
    print(f"{'all CPU probes':22} {'':>16} {'':>8} {'':>8} {'':>7} {'':>9} {'':>10} "
          f"{100 * total_cpu_hour / 3600:>8.3f}% {total_cpu_hour:>11.1f}")
    print(f"(CPU duty is of one core; this node has {cores}. GPU probes skip here without a GPU: see "
          "docs/gpu-validation.md for their GPU seconds on an H200.)")
    print()
    container = container_memory(daemon, probes, args.cuda_context_mib, args.gpus)
    print_memory(daemon, probes, container, cpu_paths)
    print()
    print_gpu_budget(budget)
    result = {"machine": {"arch": platform.machine(), "cores": cores, "python": platform.python_version(),
                          "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
              "daemon": daemon, "probes": probes, "cpu_seconds_per_hour_all_probes": total_cpu_hour,
              "container_memory": container, "cgroup_unavailable": MemCgroup.why_not or None,
              "gpu_probes_on_cpu": cpu_paths,
              "gpu_budget": budget}
    write_result(args.out, result)
    return 0 if budget["within_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())
