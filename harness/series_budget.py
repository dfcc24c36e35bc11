"""The series budget's measurement, shared by benchmarks/series_budget.py (through a real `fleetcanary run`)
and tests/test_series_budget.py (in its own process): an 8-GPU node with 8 InfiniBand ports at the default
config, counted family by family, and docs/metrics.md's "Series per node" section.

The node: the fake NVML of an HGX H100 node (tests/fixtures/nvml/h100_8gpu_healthy.json: 8 GPUs, 18 NVLinks
each) and a sysfs tree of 8 NDR InfiniBand ports (each a copy of tests/fixtures/sysfs/ndr_node's mlx5_0, every
IBTA and mlx5 hardware counter file present). Every probe at its default enabled state and default
parameters, except what this machine needs to run it (CPU_PARAMS), none of which changes a label: the GPU
probes run their torch work on the CPU (`device: cpu`, 8 pseudo-GPUs where the probe has that knob) with
small sizes, collectives runs gloo with 2 ranks (its `ranks` label reads 2 rather than 8: one value either
way), train_step runs 2 steps (its 4 series do not depend on them), and nic_health reads the fake tree
(`sysfs_root`). Probes that need targets (storage, object_storage, inference) have none at the defaults and
skip; fabric is off by default. A histogram's buckets, sum and count each count as a series.

What the CPU cannot show is counted from the measured labels as the node has it (gpu_node()):
- gpu_bandwidth and gpu_sustained measure one device on the CPU; a GPU node measures all 8;
- gpu_sustained's power and temperature come from NVML samples the fake does not have (one per GPU);
- gpu_compute times tf32 and fp8 on an H100, which the CPU lacks;
- collectives on gloo leaves out sizes over gloo_max_bytes; NCCL on the node runs every default size.

The fixtures are read as data files; nothing here imports tests/ or benchmarks/ (tests/test_layout.py).
"""
from __future__ import annotations

import os
import platform
import shutil
import socket
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
FAKE_NVML = ROOT / "tests/fixtures/nvml/h100_8gpu_healthy.json"
PORT_TEMPLATE = ROOT / "tests/fixtures/sysfs/ndr_node/class/infiniband/mlx5_0"
DOC = ROOT / "docs/metrics.md"
GPUS, IB_PORTS = 8, 8
# At most 800 series a node in Prometheus, scraped and recorded; of that, the judge statistics
# (fleetcanary_judge_*) have their own share and everything else at most BUDGET.
BUDGET, JUDGE_PREFIX = 400, "fleetcanary_judge_"

# Work sizes only: no label depends on them. Each probe runs once (long intervals); the "gpu" exclusive
# class runs them one after another.
ONCE = {"interval_seconds": 3600, "timeout_seconds": 900}
CPU_PARAMS: dict[str, dict] = {
    "host_memory_bandwidth": {"array_bytes": 4 << 20, "repeats": 2},
    "gpu_health": {"xid_wait_seconds": 0.5},
    "gpu_bandwidth": {"device": "cpu", "d2d_bytes": 1 << 20, "host_bytes": 1 << 20, "repeats": 1, "warmup": 0},
    "gpu_compute": {"device": "cpu", "cpu_gpus": GPUS, "size": 64, "repeats": 1, "warmup": 0, "sdc_size": 64,
                    "sdc_products": 1},
    "gpu_p2p": {"device": "cpu", "bytes": 1 << 20, "repeats": 1, "warmup": 0},
    "gpu_sustained": {"device": "cpu", "burn_seconds": 1.0, "size": 64, "initial_seconds": 0.2},
    "collectives": {"backend": "gloo", "cpu_ranks": 2, "iterations": 1, "warmup_iterations": 0},
    # 2 steps need a golden loss of their own (5.645 on the CPU); the check passes within 10%, as the default's
    "train_step": {"device": "cpu", "dtype": "fp32", "steps": 2, "warmup_steps": 1, "golden_loss": 5.645,
                   "loss_tolerance": 0.1},
}
ONE_DEVICE_ON_CPU = ("gpu_bandwidth", "gpu_sustained")
NVML_SAMPLED = ("fleetcanary_gpu_sustained_power_watts", "fleetcanary_gpu_sustained_temperature_celsius")
MATMUL = "fleetcanary_gpu_matmul_flops_per_second"
COLLECTIVE_FAMILIES = ("fleetcanary_collective_bus_bandwidth_bytes_per_second",
                       "fleetcanary_collective_algorithm_bandwidth_bytes_per_second",
                       "fleetcanary_collective_latency_seconds")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_ib_sysfs(root: Path, ports: int = IB_PORTS) -> Path:
    """A sysfs tree with `ports` NDR InfiniBand ports (mlx5_0/1 .. mlx5_{ports-1}/1), all ACTIVE and LinkUp."""
    ib = root / "class" / "infiniband"
    ib.mkdir(parents=True, exist_ok=True)
    (root / "class" / "net").mkdir(exist_ok=True)
    for i in range(ports):
        shutil.copytree(PORT_TEMPLATE, ib / f"mlx5_{i}", dirs_exist_ok=True)
    return root


def node_config(work: Path, params: dict[str, dict] | None = None) -> dict:
    """The daemon's config: the defaults plus what this machine needs (module docstring) plus `params`."""
    sysfs = fake_ib_sysfs(work / "sys")
    probes: dict[str, dict] = {}
    for name, p in CPU_PARAMS.items():
        probes[name] = {**({} if name == "gpu_health" else ONCE), "params": dict(p)}
    probes["nic_health"] = {"params": {"sysfs_root": str(sysfs)}}
    for name, extra in (params or {}).items():
        probes.setdefault(name, {}).setdefault("params", {}).update(extra)
    return {"node_name": "budget-node", "state_dir": str(work / "state"), "probes": probes}


def families(text: str) -> dict[str, list[dict[str, str]]]:
    """family -> the labels of each of its series (a counter's family under its _total name)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[dict[str, str]]] = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + ("_total" if fam.type == "counter" else "")
        out.setdefault(name, []).extend(s.labels for s in fam.samples)
    return out


def in_process_exposition(work: Path, params: dict[str, dict] | None = None) -> tuple[str, dict]:
    """The same exposition without the daemon's processes: its Daemon object (store, collector, HTTP body)
    built from the same config but not started, and each enabled probe's job (built as the daemon builds it)
    executed in this process as the worker executes it, then applied to the store. FLEETCANARY_FAKE_NVML
    must name FAKE_NVML in this process's environment (the probes and the environment record read it)."""
    from fleetcanary.core import config as configmod
    from fleetcanary.daemon.service import Daemon
    from fleetcanary.runner import job as jobmod
    from fleetcanary.runner import worker

    if os.environ.get("FLEETCANARY_FAKE_NVML") != str(FAKE_NVML):
        raise RuntimeError(f"set FLEETCANARY_FAKE_NVML={FAKE_NVML} first")
    (work / "node.yaml").write_text(yaml.safe_dump({**node_config(work, params),
                                                    "server": {"listen_address": f"127.0.0.1:{free_port()}"}}))
    settings = configmod.load(work / "node.yaml")
    daemon = Daemon(settings, str(work / "node.yaml"))
    ran = {}
    for name, entry in settings.probe_entries().items():
        if not entry.enabled:
            continue
        context = {**jobmod.probe_context(settings), "deadline_monotonic": time.monotonic() + entry.timeout_seconds}
        started = time.time()
        out = worker.execute(jobmod.build(name, daemon.probe_map[name], entry.params.model_dump(mode="json"),
                                          context))
        out.started_at, out.wall_seconds = started, time.time() - started
        daemon.store.apply(out)
        ran[name] = out.outcome
    return daemon.server.metrics_body(False).decode(), dict(sorted(ran.items()))


def gpu_node(fams: dict[str, list[dict[str, str]]], params: dict[str, dict] | None = None) -> dict[str, dict]:
    """family -> {"measured", "gpu_node", "why"} for the families an 8-GPU node has more of than the CPU run."""
    from fleetcanary.probes import PROBES

    cfg = {n: PROBES[n].Config.model_validate({**CPU_PARAMS.get(n, {}), **(params or {}).get(n, {})})
           for n in ("gpu_compute", "collectives")}
    out: dict[str, dict] = {}

    def gap(family: str, node: int, why: str) -> None:
        measured = len(fams.get(family, []))
        if node != measured:
            out[family] = {"measured": measured, "gpu_node": node, "why": why}

    for probe in ONE_DEVICE_ON_CPU:
        for spec in PROBES[probe].metrics:
            seen = fams.get(spec.name, [])
            if seen and len({lab.get("gpu") for lab in seen}) == 1:
                gap(spec.name, GPUS * len(seen), f"{probe} measures one device on the CPU, all {GPUS} GPUs on a node")
    if fams.get("fleetcanary_gpu_sustained_burn_seconds"):  # the burn ran: the node samples these on each GPU
        for name in NVML_SAMPLED:
            gap(name, max(len(fams.get(name, [])), GPUS), "NVML samples of each burning GPU (not in the fake)")
    matmul = fams.get(MATMUL, [])
    if matmul:
        gpus = {lab["gpu"] for lab in matmul}
        gap(MATMUL, len(gpus) * len(cfg["gpu_compute"].dtypes),
            "every default dtype on an H100 (the CPU has no tf32 or fp8)")
    sizes = cfg["collectives"].sizes_bytes
    for name in COLLECTIVE_FAMILIES:
        seen = fams.get(name, [])
        if seen:
            collectives = {lab["collective"] for lab in seen}
            gap(name, len(collectives) * len(sizes), "every default size with NCCL (gloo stops at gloo_max_bytes)")
    return out


def summarize(fams: dict[str, list[dict[str, str]]], ran: dict, params: dict | None) -> dict:
    measured = {f: len(labs) for f, labs in fams.items()}
    gaps = gpu_node(fams, params)
    node = {f: gaps[f]["gpu_node"] if f in gaps else n for f, n in measured.items()}
    judge = sum(n for f, n in node.items() if f.startswith(JUDGE_PREFIX))
    return {"node": f"{GPUS} GPUs (fake NVML {FAKE_NVML.name}), {IB_PORTS} InfiniBand ports",
            "params": params or {}, "probe_outcomes": ran,
            "series_measured": sum(measured.values()), "series": sum(node.values()), "judge_series": judge,
            "series_without_judge": sum(node.values()) - judge, "budget": BUDGET,
            "by_family": dict(sorted(((f, n) for f, n in node.items() if n), key=lambda kv: (-kv[1], kv[0]))),
            "gpu_node_gaps": gaps, "machine": {"python": platform.python_version(), "cpus": os.cpu_count()}}


# ------------------------------------------------------------------------------ docs/metrics.md
SECTION = "## Series per node"
OPT_IN = "Opt-in: "  # how a probe param's description begins when it turns on detail no rule reads


def opt_ins() -> list[tuple[str, str, str]]:
    """(probe, param, what it adds) of every opt-in param."""
    from fleetcanary.probes import PROBES

    return [(name, field, (info.description or "").removeprefix(OPT_IN)) for name, cls in PROBES.items()
            for field, info in cls.Config.model_fields.items() if (info.description or "").startswith(OPT_IN)]


def doc_section(result: dict) -> str:
    """The "Series per node" section of docs/metrics.md, from a result of this script at the defaults."""
    gaps = result["gpu_node_gaps"]
    out = [SECTION, "",
           f"What one node costs Prometheus at the default config: {result['node']}, every probe enabled by "
           "default run once (storage, object_storage and inference have no targets by default and skip; fabric "
           "is off). Measured by `python benchmarks/series_budget.py` (benchmarks/results/series_budget.json), "
           "which writes this section with `--docs`; `tests/test_series_budget.py` measures it again and fails "
           "when a family's count differs from this table.", "",
           "The budget: at most 800 series per node in Prometheus, scraped and recorded. Of that, everything but "
           f"the `{JUDGE_PREFIX}*` statistics is to stay within {result['budget']}; this node exposes "
           f"**{result['series_without_judge']}**.", "",
           "Families marked * are counted as the GPU node has them: the measurement runs the GPU probes on the "
           "CPU, which measures one device, no tf32 or fp8, and collectives only up to gloo's size limit "
           "(benchmarks/series_budget.py says how each is counted).", "",
           "| family | series |", "| --- | ---: |"]
    out += [f"| `{f}`{' *' if f in gaps else ''} | {n} |" for f, n in result["by_family"].items()
            if not f.startswith(JUDGE_PREFIX)]
    out += [f"| total | {result['series_without_judge']} |", "",
            "A reason label (`fleetcanary_probe_skips_total`, `..._failures_total`, `..._crashes_total`, "
            "`fleetcanary_kubernetes_api_errors_total`) appears once its count is above 0, except the reasons an "
            "alert or recording rule reads with `increase()` (`fabric`'s `peer_unavailable` skips, `collectives`' "
            "`wrong_result` failures), which start at 0: `increase()` misses the first event of a series born at "
            "1. `fleetcanary_probe_runs_total` has every outcome from the start, for the probe-health alerts.", "",
            "Opt-in detail (read by no rule): set the param under the probe's `params` in the config file. A "
            "param that changes the labels of a counter (`per_link`) leaves the counter's other form exported "
            "until the exporter restarts.", "",
            "| probe | param | what it adds |", "| --- | --- | --- |"]
    out += [f"| `{name}` | `{field}: true` | {desc.replace('|', '/')} |" for name, field, desc in opt_ins()]
    out += ["", "For example:", "", "```yaml", "probes:", "  gpu_health:", "    params:", "      per_link: true",
            "  nic_health:", "    params:", "      port_states: true", "      hw_counters: true", "```", ""]
    return "\n".join(out)


def replace_section(text: str, section: str) -> str:
    """`text` with its "Series per node" section (up to the next "## " heading or the end) set to `section`."""
    start = text.find(SECTION + "\n")
    if start < 0:
        return text.rstrip("\n") + "\n\n" + section
    nxt = text.find("\n## ", start + len(SECTION))
    return text[:start] + section + (text[nxt + 1:] if nxt >= 0 else "")


def doc_table(text: str) -> dict[str, int]:
    """family -> series, as the "Series per node" section of docs/metrics.md states them."""
    start = text.find(SECTION + "\n")
    if start < 0:
        return {}
    nxt = text.find("\n## ", start + len(SECTION))
    out = {}
    for line in text[start:nxt if nxt >= 0 else None].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`") and cells[1].isdigit():
            out[cells[0].split("`")[1]] = int(cells[1])
    return out
