import os

from fleetcanary.core import environment


def test_host_record_has_every_field_and_unknown_instead_of_missing():
    rec = environment.collect(with_gpu=False)
    for key in ("hostname", "os", "kernel", "cpu_model", "cpu_cores", "numa_nodes", "memory_bytes",
                "cgroup_cpu_limit_cores", "cgroup_memory_limit_bytes", "python_version", "packages",
                "fleetcanary_version", "git_commit", "image", "gpu_model", "gpu_count", "driver_version",
                "cuda_driver_version"):
        assert key in rec, key
        assert rec[key] not in (None, ""), key
    assert rec["cpu_cores"] == os.cpu_count()
    assert rec["packages"]["numpy"] != "not installed"
    assert rec["gpu_model"] == "unknown"


def test_gpu_facts_without_a_driver_say_zero_gpus():
    rec = environment.collect(with_gpu=True)
    assert rec["gpu_count"] == 0 and rec["gpu_model"] == "unknown"


def test_image_reference_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("FLEETCANARY_IMAGE", "registry.example/fleetcanary@sha256:abc")
    assert environment.host_facts()["image"] == "registry.example/fleetcanary@sha256:abc"


def test_throttling_delta():
    before = {"nr_periods": 10, "nr_throttled": 2, "throttled_usec": 1000}
    after = {"nr_periods": 20, "nr_throttled": 5, "throttled_usec": 501000}
    assert environment.throttling_delta(before, after) == {"throttled_periods": 3, "throttled_seconds": 0.5}
    assert environment.throttling_delta(None, after)["throttled_seconds"] == "unknown"


def test_stable_labels_are_bounded_to_the_stable_fields():
    labels = environment.stable_labels(environment.collect(with_gpu=False))
    assert set(labels) == set(environment.STABLE_FIELDS)
    assert "hostname" not in labels


def test_hca_firmware_comes_from_sysfs_per_rdma_device(monkeypatch):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
    fw = environment.hca_firmware(str(root / "ndr_node"))
    assert fw and set(fw) == {p.name for p in (root / "ndr_node/class/infiniband").iterdir()}
    assert fw["mlx5_0"] == "28.39.1002"
    assert environment.hca_firmware(str(root / "cpu_node")) == {}
    monkeypatch.setenv(environment.SYSFS_ENV, str(root / "ndr_node"))
    assert environment.host_facts()["hca_firmware"] == fw
