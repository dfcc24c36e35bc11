"""A GB200 NVL72 rack's NVML facts, for the fake NVML: CONSTRUCTED, NOT RECORDED.

18 compute trays of 4 GPUs, each tray the hand-written GB200 tray (probes/testing/nvml_facts/
gb200_4gpu_fabric_ready.json) with its own GPU UUIDs and serials, every GPU's fabric info as NVML documents it for a
registered NVL72 GPU (nvmlDeviceGetGpuFabricInfoV: state NVML_GPU_FABRIC_STATE_COMPLETED, status NVML_SUCCESS, the
rack's one cluster UUID and clique ID, the health mask: bandwidth not degraded, route healthy, configuration
correct, partition assigned). A rack whose NVLink fabric went away (its switch trays or NVLink management): every GPU
back in registration, NVML_GPU_FABRIC_STATE_IN_PROGRESS, with no clique or cluster yet (NVML fills them in once the
state is completed).

The same rack as alerts/build_tests.py's promtool test (DOMAIN there).
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from fleetcanary.probes.gpu_health import Config, GpuHealth
from fleetcanary.probes.testing.nvml_fake import FACTS_DIR

TRAYS, TRAY_GPUS = 18, 4
CLUSTER_UUID = "5f3a9c2e-1b7d-4e8a-9c6f-2d4b8a1e7c30"
CLIQUE_ID = 32766
DOMAIN = f"{CLUSTER_UUID}/{CLIQUE_ID}"
# nvmlGpuFabricInfo_v2_t.healthMask of a healthy registered GPU (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*):
# degraded bandwidth FALSE (2 << 0), route recovery FALSE (2 << 2), route unhealthy FALSE (2 << 4), access timeout
# recovery FALSE (2 << 6), incorrect configuration NONE (1 << 8), partition assigned TRUE (1 << 12)
HEALTHY_MASK = (2 << 0) | (2 << 2) | (2 << 4) | (2 << 6) | (1 << 8) | (1 << 12)


def node_name(tray: int) -> str:
    return f"nvl72-a-{tray:02d}"


def tray_facts(tray: int, fabric_up: bool = True) -> dict:
    facts = json.loads((FACTS_DIR / "gb200_4gpu_fabric_ready.json").read_text())
    facts = copy.deepcopy(facts)
    facts["recorded"] = (f"CONSTRUCTED, not recorded: tray {tray} of a GB200 NVL72 rack (tests/support/nvl72.py), "
                         + ("fabric registered" if fabric_up else "fabric back in registration"))
    for g, dev in enumerate(facts["devices"]):
        dev["uuid"] = f"GPU-b2c{tray:02d}{g:03d}-7a1e-4c3d-8f2b-6e5d4c3b2a1{g}"
        dev["serial"] = f"17814250{tray:02d}{g:03d}"
        if fabric_up:
            dev["fabric"] = {"state": 3, "status": 0, "clique_id": CLIQUE_ID, "cluster_uuid": CLUSTER_UUID,
                             "health_mask": HEALTHY_MASK}
        else:
            dev["fabric"] = {"state": 2, "status": 0, "clique_id": 0, "cluster_uuid": "", "health_mask": 0}
    return facts


def write_rack(directory: Path, fabric_up: bool = True) -> dict[str, Path]:
    """node name -> its facts file."""
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for t in range(TRAYS):
        path = directory / f"{node_name(t)}-{'up' if fabric_up else 'down'}.json"
        path.write_text(json.dumps(tray_facts(t, fabric_up)))
        out[node_name(t)] = path
    return out


def gpu_health(facts: Path, monkeypatch, tmp_path: Path):
    """gpu_health's real run on the fake NVML of `facts`."""
    from fleetcanary.probes.base import ProbeContext

    monkeypatch.setenv("FLEETCANARY_FAKE_NVML", str(facts))
    ctx = ProbeContext(node_name="t", state_dir=str(tmp_path), deadline_monotonic=time.monotonic() + 60)
    return GpuHealth().run(Config(xid_wait_seconds=0, host_proc_path=str(tmp_path / "no-proc")), ctx)


def exposition(result) -> str:
    """The probe's gauge samples as exposition text, rendered by prometheus_client with the probe's HELP texts."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    specs = {s.name: s for s in GpuHealth.metrics}
    fams: dict[str, GaugeMetricFamily] = {}
    for s in result.samples:
        spec = specs[s.metric]
        if spec.type != "gauge":
            continue
        if s.metric not in fams:
            fams[s.metric] = GaugeMetricFamily(s.metric, spec.help, labels=list(spec.labels))
        fams[s.metric].add_metric([s.labels.get(k, "") for k in spec.labels], s.value)

    class Snapshot:
        def collect(self):
            return list(fams.values())

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Snapshot())
    return generate_latest(reg).decode()
