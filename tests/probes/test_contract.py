"""Every probe in the map honours the contract in probes/base.py."""
import ast
import re
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from fleetcanary.probes import PROBES
from fleetcanary.probes.base import SKIP_REASONS, MetricSpec, ProbeSkipped
from fleetcanary.probes.lib.gpu_probe import GpuDeviceConfig, GpuProbeConfig

NAME = re.compile(r"^fleetcanary_[a-z0-9_]+$")
BASE_UNITS = {"bytes", "seconds", "bytes_per_second", "ratio", "info", "total", "celsius", "watts", "ops_per_second",
              "tokens_per_second", "count", "flops_per_second", "hertz", "operations_per_second", "boolean"}


@pytest.mark.parametrize("name", list(PROBES))
def test_probe_declares_a_valid_contract(name):
    cls = PROBES[name]
    assert cls.name == name
    cls.Config()  # every field has a default
    with pytest.raises(ValidationError):
        cls.Config(definitely_not_a_field=1)
    assert cls.metrics, "a probe declares its metrics"
    for spec in cls.metrics:
        assert isinstance(spec, MetricSpec) and NAME.match(spec.name)
        assert spec.unit in BASE_UNITS, spec
        assert spec.help.endswith(".")
        assert all(re.match(r"^[a-z_]+$", label) for label in spec.labels)
        assert "node" not in spec.labels, "node comes from relabeling, not the exporter"
        # opt-in detail names its param, a boolean of the probe's config that is off by default, and says so
        if spec.opt_in:
            assert cls.Config.model_fields[spec.opt_in].annotation is bool, spec
            assert getattr(cls.Config(), spec.opt_in) is False, spec
        assert ("with detail only" in spec.help) == (spec.opt_in == "detail"), spec
    assert cls.exclusive in (None, "gpu")
    assert cls.default_timeout_seconds < cls.default_interval_seconds


@pytest.mark.parametrize("name", list(PROBES))
def test_probe_module_imports_nothing_heavy_at_module_level(name):
    src = Path(sys.modules[PROBES[name].__module__].__file__).read_text()
    for node in ast.parse(src).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            assert not (mod or "").startswith(("torch", "pynvml", "prometheus_client", "requests")), mod


def test_skip_reasons_are_a_fixed_set():
    with pytest.raises(ValueError, match="unknown skip reason"):
        ProbeSkipped("because I said so")
    assert ProbeSkipped("no_gpu").reason == "no_gpu"
    # a label value; small, and none costs a series before it happened (13: gpu_mps, issue 40; 14: driver_too_old,
    # issue 41)
    assert len(SKIP_REASONS) == len(set(SKIP_REASONS)) <= 14


def test_metric_names_are_unique_across_probes():
    names = [s.name for cls in PROBES.values() for s in cls.metrics]
    assert len(names) == len(set(names))


GPU_FIELDS = ("busy_policy", "expected_gpu_seconds")


@pytest.mark.parametrize("name", list(PROBES))
def test_gpu_probes_build_on_the_gpu_base_config(name):
    """An invasive GPU probe (exclusive "gpu") takes busy_policy and expected_gpu_seconds (and device, where it
    runs torch itself) from probes/lib/gpu_probe.py, so an eighth one cannot copy them; a probe may re-declare
    one for its own default or wording, but only with the base's type and bound."""
    cls = PROBES[name]
    fields = cls.Config.model_fields
    if cls.exclusive != "gpu":
        assert not issubclass(cls.Config, GpuProbeConfig)
        assert not set(GPU_FIELDS) & set(fields), f"{name}: GPU gating settings on a probe that is not exclusive gpu"
        return
    assert issubclass(cls.Config, GpuProbeConfig), f"{name}: a GPU probe's Config derives from gpu_probe.GpuProbeConfig"
    if "device" in fields:
        assert issubclass(cls.Config, GpuDeviceConfig), f"{name}: device comes from gpu_probe.GpuDeviceConfig"
    base = GpuDeviceConfig.model_fields
    for field in (*GPU_FIELDS, "device"):
        if field in fields:
            f = fields[field]
            assert (f.annotation, f.metadata) == (base[field].annotation, base[field].metadata), (name, field)
            assert f.description, (name, field)
    with pytest.raises(ValidationError):
        cls.Config(expected_gpu_seconds=0)
    with pytest.raises(ValidationError):
        cls.Config(busy_policy="sometimes")
