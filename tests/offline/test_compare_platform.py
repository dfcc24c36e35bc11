"""`fleetcanary compare` and the platform record: an NCCL version change between collective results is a refusal
(one clear line per field, exit 2), platform and firmware changes are listed as changes, and the report's
environment section shows them.

The records are constructed: collective runs of an 8-GPU node with NCCL's version in their record as the
collectives probe writes it (result.extra.nccl_version), the platform fields as core/kube_platform.py writes them.
A real NCCL needs a GPU; what is tested here is compare's reading of the record, which is the same either way."""
from __future__ import annotations

import json

from fleetcanary.core.record import RunRecord
from tests.support.results import fleetcanary

ENV = {"gpu_model": "NVIDIA GB200", "gpu_count": 4, "cpu_model": "Grace", "cpu_cores": 72, "numa_nodes": 2,
       "memory_bytes": 512 << 30, "cgroup_cpu_limit_cores": "max", "driver_version": "570.133.20",
       "kubelet_version": "v1.31.4", "container_runtime": "containerd://1.7.24", "gpu_operator_version": "v25.3.0",
       "device_plugin_version": "v0.17.1", "hca_firmware": {"mlx5_0": "28.39.1002"},
       "image": "ghcr.io/fleetcanary/fleetcanary@sha256:" + "ab" * 32}


def side(path, nccl: str | None, t0: float, **env) -> str:
    """Three all_reduce runs at 360 GB/s (+-0.3%), NCCL `nccl` in their record."""
    runs = []
    for i, f in enumerate((1.0, 1.003, 0.997)):
        bw = 3.6e11 * f
        runs.append(RunRecord(
            "collectives", "success", node="gb200-a-03", started_at=t0 + 1800 * i, wall_seconds=20,
            result={"figures": [{"name": "bus_bandwidth", "labels": {"collective": "all_reduce",
                                                                     "size_bytes": "268435456"},
                                 "unit": "bytes_per_second", "higher_is_better": True, "median": bw,
                                 "repeats": [bw * 0.999, bw, bw * 1.001]}],
                    "parameters": {"collectives": ["all_reduce"]},
                    "extra": {"nccl_version": nccl} if nccl else {}},
            environment={**ENV, **env}).to_json())
    path.write_text("\n".join(json.dumps(r) for r in runs) + "\n")
    return str(path)


def test_a_changed_nccl_version_refuses_the_comparison_of_collective_results(tmp_path):
    base = side(tmp_path / "base.jsonl", "2.21.5", 1000.0)
    cand = side(tmp_path / "cand.jsonl", "2.23.4", 90000.0)
    r = fleetcanary("compare", base, cand)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("fleetcanary compare: refusing to compare results from different setups")
    assert lines[1:] == ["  environment.nccl_version: baseline '2.21.5' vs candidate '2.23.4' (collective results)"]
    assert "Traceback" not in r.stderr and not r.stdout
    # forced: at best a conditional pass, the change named
    forced = fleetcanary("compare", base, cand, "--allow-incomparable")
    assert forced.returncode == 3, forced.stdout + forced.stderr
    assert "incomparable (forced): environment.nccl_version" in forced.stdout
    # the same NCCL: a pass
    same = fleetcanary("compare", base, side(tmp_path / "same.jsonl", "2.21.5", 90000.0))
    assert same.returncode == 0, same.stdout + same.stderr


def test_platform_changes_are_listed_and_do_not_refuse(tmp_path):
    base = side(tmp_path / "base.jsonl", "2.21.5", 1000.0)
    cand = side(tmp_path / "cand.jsonl", "2.21.5", 90000.0, kubelet_version="v1.32.1",
                container_runtime="containerd://2.0.2", gpu_operator_version="v25.3.1",
                hca_firmware={"mlx5_0": "28.43.1014"})
    r = fleetcanary("compare", base, cand)
    assert r.returncode == 0, r.stdout + r.stderr
    changed = [line for line in r.stdout.splitlines() if line.startswith("changed: ")]
    assert "changed: kubelet_version: 'v1.31.4' -> 'v1.32.1'" in changed
    assert "changed: container_runtime: 'containerd://1.7.24' -> 'containerd://2.0.2'" in changed
    assert "changed: gpu_operator_version: 'v25.3.0' -> 'v25.3.1'" in changed
    assert any(line.startswith("changed: hca_firmware:") and "28.43.1014" in line for line in changed)
    assert not any("device_plugin_version" in line for line in changed)
    # a time-sliced GPU against a dedicated one is refused (gpu_sharing_strategy is fixed)
    shared = side(tmp_path / "shared.jsonl", "2.21.5", 90000.0, gpu_sharing_strategy="time-slicing")
    dedicated = side(tmp_path / "dedicated.jsonl", "2.21.5", 1000.0, gpu_sharing_strategy="none")
    r = fleetcanary("compare", dedicated, shared)
    assert r.returncode == 2 and "environment.gpu_sharing_strategy: baseline 'none' vs candidate 'time-slicing'" \
        in r.stderr


def test_the_reports_environment_section_shows_the_platform_and_nccl(tmp_path):
    from fleetcanary.offline import report, results

    runs = results.load([side(tmp_path / "base.jsonl", "2.21.5", 1000.0)])
    env = report.environment_section(runs)
    assert env["platform"]["kubelet_version"] == "v1.31.4"
    assert env["platform"]["container_runtime"] == "containerd://1.7.24"
    assert env["platform"]["gpu_operator_version"] == "v25.3.0"
    assert env["platform"]["image"].startswith("ghcr.io/fleetcanary/fleetcanary@sha256:")
    assert env["communication"] == {"nccl_version": "2.21.5", "hca_firmware": {"mlx5_0": "28.39.1002"}}
