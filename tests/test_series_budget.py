"""The series budget (issue 26, item 3): what an 8-GPU node with 8 InfiniBand ports costs Prometheus at the default
config, counted family by family against docs/metrics.md's "Series per node" table, within 400 series for the
exposition without the judge's statistics and 800 for the whole node.

The exposition is the daemon's own: its store, collector and HTTP body, with every default probe's job built as
the daemon builds it and executed in this process as the worker executes it (harness/series_budget.py,
in_process_exposition), on the fake NVML of an HGX H100 node and a sysfs tree of 8 NDR ports; the GPU probes'
torch work runs on the CPU, and the families the CPU cannot show in full are counted as the node has them (the
harness says how). `python -m benchmarks.series_budget` measures the same through a real `fleetcanary run`, and
`--docs` rewrites the table.

The whole node adds to that exposition (harness/series_budget.py, summarize):
- the judge's statistics at steady state: one run per probe gives warming series only, so the node's judged series
  are fed to a fresh figure store at the default intervals for STEADY_DAYS days (a baseline and a drift for every
  series, five daily burns) and the fleetcanary_judge_* families counted then;
- the recorded series, counted from the shipped rule files: a rule adds one series per distinct label set of its
  first `by (...)` over the node's input series; a rule whose `by` keeps `node` (or that aggregates nothing) counts
  whole for the node, one without `node` (per pool, model and driver) is shared by a pool of POOL_NODES nodes of the
  same model and driver, so the node counts 1/POOL_NODES of it.
"""
import pytest

from fleetcanary.core.record import CRASH_REASONS
from fleetcanary.probes import PROBES
from harness import series_budget as sb
from scripts import docgen

RERUN = "rerun `python -m benchmarks.series_budget && python -m benchmarks.series_budget --docs`"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEETCANARY_FAKE_NVML", str(sb.FAKE_NVML))
        text, ran = sb.in_process_exposition(tmp_path_factory.mktemp("node"))
    fams = sb.families(text)
    return fams, sb.summarize(fams, ran, {})


def test_every_default_probe_ran_or_skipped_for_want_of_targets(node):
    _, result = node
    assert result["probe_outcomes"] == {n: "skipped" if n in ("storage", "object_storage", "inference") else "success"
                                        for n, cls in PROBES.items() if cls.default_enabled}


def test_each_family_costs_what_docs_metrics_md_says(node):
    _, result = node
    doc = sb.doc_table(sb.DOC.read_text())
    assert doc, f"docs/metrics.md has no '{sb.SECTION}' table; {RERUN}"
    exposed = {f: n for f, n in result["by_family"].items() if not f.startswith(sb.JUDGE_PREFIX)}
    changed = {f: (doc.get(f), exposed.get(f)) for f in doc.keys() | exposed.keys() if doc.get(f) != exposed.get(f)}
    assert not changed, f"family: (docs/metrics.md, exposed now): {changed}; {RERUN}"
    assert sum(doc.values()) == result["series_without_judge"]
    section = sb.DOC.read_text().split(sb.SECTION, 1)[1]
    assert f"exposes **{result['series_without_judge']}**" in section
    assert f"| total per node | **{result['total_per_node']:g}** (budget {sb.NODE_BUDGET}) |" in section, RERUN
    for probe, param, _ in sb.opt_ins():  # every opt-in is documented with the table
        assert f"| `{probe}` | `{param}: true` |" in section, (probe, param)
    # scripts/docgen.py keeps the section up to its last line, which the harness writes
    assert section.rstrip("\n").endswith(sb.SECTION_END)
    assert docgen.SERIES_END == sb.SECTION_END


def test_the_exposition_stays_within_its_budget(node):
    _, result = node
    assert result["series_without_judge"] <= sb.BUDGET, result["by_family"]


def test_the_judge_and_the_rules_are_counted_at_steady_state(node):
    """Every judged series has its median and change (the daily burn its median only: no history), the newest runs
    only where a rule could act on them and a drift only near its alert (judge/publish.py: a steady node with
    0.2% run noise has no drift and the newest runs of about one series in eight, those no better than their
    median), and the peer records are shared by the pool: the count is of a node with a baseline, not of the
    single run the exposition holds. The judge's median stands in for each judged figure's gauge."""
    fams, result = node
    steady = result["judge_steady"]
    judged = steady["fleetcanary_judge_median"]
    assert judged > len(fams.get("fleetcanary_judge_median", []))  # more than the one run shows
    burns = sb.GPUS  # gpu_sustained's ratio: a median only
    assert steady["fleetcanary_judge_change"] == judged - burns
    assert steady.get("fleetcanary_judge_drift", 0) == 0
    assert 0 < steady["fleetcanary_judge_newest"] < (judged - burns) / 4
    assert result["judge_steady_series"] == sum(steady.values())
    stood_in = result["stood_in_by_median"]
    assert stood_in["fleetcanary_gpu_memory_bandwidth_bytes_per_second"] == 3 * sb.GPUS
    # the default P2P gauge is each source GPU's slowest link, the judged figure itself (a matrix cell stays)
    assert stood_in["fleetcanary_gpu_p2p_bandwidth_bytes_per_second"] == sb.GPUS
    assert "fleetcanary_gpu_sustained_throughput_ratio" not in stood_in      # each day's burn
    rec = result["recorded"]
    assert rec["node:fleetcanary_gpu_model:info"] == 1  # per node: by (node, model)
    assert rec["pool:fleetcanary_judge_median:peer_median"] == pytest.approx(
        len({(lab["figure"], lab["series"]) for lab in sb.steady_judge(sb.node_series(fams)[0])[
            "fleetcanary_judge_median"]}) / sb.POOL_NODES)  # per pool: the node's share
    assert result["total_per_node"] == pytest.approx(
        result["series_without_judge"] - sum(stood_in.values()) + result["judge_steady_series"]
        + result["recorded_series"], abs=0.1)


def test_the_whole_node_stays_within_the_budget(node):
    _, result = node
    assert result["total_per_node"] <= sb.NODE_BUDGET, (result["series_without_judge"], result["judge_steady"],
                                                        result["recorded"])


def test_detail_no_rule_reads_is_off_by_default(node):
    fams, _ = node
    assert {lab["link"] for lab in fams["fleetcanary_gpu_nvlink_errors_total"]} <= {""}  # per GPU, not per link
    assert len(fams["fleetcanary_gpu_nvlink_links_up"]) == sb.GPUS and not fams.get("fleetcanary_gpu_nvlink_links_down")
    assert {lab["dst_gpu"] for lab in fams["fleetcanary_gpu_p2p_bandwidth_bytes_per_second"]} == {""}
    assert len(fams["fleetcanary_gpu_p2p_bandwidth_bytes_per_second"]) == sb.GPUS  # each GPU's slowest link
    for family in ("fleetcanary_rdma_port_state", "fleetcanary_rdma_port_physical_state",
                   "fleetcanary_rdma_port_hw_events_total", "fleetcanary_gpu_p2p_access",
                   "fleetcanary_gpu_p2p_link_info", "fleetcanary_gpu_p2p_bidirectional_bandwidth_bytes_per_second",
                   "fleetcanary_gpu_nvlink_up", "fleetcanary_collective_algorithm_bandwidth_bytes_per_second",
                   "fleetcanary_collective_latency_seconds", "fleetcanary_gpu_sustained_flops_per_second",
                   "fleetcanary_gpu_sustained_clock_hertz", "fleetcanary_gpu_sustained_power_watts",
                   "fleetcanary_gpu_sustained_burn_seconds", "fleetcanary_gpu_mig_mode",
                   "fleetcanary_gpu_persistence_mode", "fleetcanary_gpu_power_limit_watts",
                   "fleetcanary_rdma_device_info"):
        assert not fams.get(family), family
    assert {"persistence_mode", "mig_mode", "power_limit_watts"} <= set(fams["fleetcanary_gpu_info"][0])
    # what is 0 on a healthy node is no series, but what an alert reads with increase() from 0
    assert {lab["counter"] for lab in fams["fleetcanary_rdma_port_errors_total"]} == {"link_downed"}
    assert len(fams["fleetcanary_rdma_port_errors_total"]) == sb.IB_PORTS
    assert {(lab["type"], lab["counter"]) for lab in fams["fleetcanary_gpu_ecc_errors_total"]} >= {
        ("uncorrected", "volatile")}
    assert len([lab for lab in fams["fleetcanary_gpu_ecc_errors_total"] if lab["type"] == "uncorrected"]) == sb.GPUS
    for family in ("fleetcanary_gpu_remapped_rows_total", "fleetcanary_gpu_remapped_rows_pending",
                   "fleetcanary_gpu_remapped_rows_failed", "fleetcanary_gpu_lost", "fleetcanary_rdma_port_present",
                   "fleetcanary_rdma_port_counters_saturated", "fleetcanary_probe_invalid_samples_total",
                   "fleetcanary_probe_confirmation_runs_total"):
        assert not fams.get(family), family
    assert {lab["reason"] for lab in fams["fleetcanary_gpu_clock_throttle_active"]} == {"gpu_idle"}  # active only
    assert {lab["status"] for lab in fams["fleetcanary_gpu_sdc_status"]} == {"match"}  # the current one only
    # the probes' own series: an enabled probe's runs from 0 for success, failure and skipped; fabric is off, and
    # the three target probes have no target (off in all but name: their runs skipped not_configured)
    runs = {(lab["probe"], lab["outcome"]) for lab in fams["fleetcanary_probe_runs_total"]}
    targetless = {n for n, cls in PROBES.items() if cls.needs_targets}
    assert targetless == {"storage", "object_storage", "inference"}
    on = {n for n, cls in PROBES.items() if cls.default_enabled} - targetless
    assert runs == {(p, o) for p in on for o in ("success", "failure", "skipped")}
    for off in ("fabric", *targetless):
        assert not [lab for f, labs in fams.items() if f.startswith("fleetcanary_probe_")
                    for lab in labs if lab.get("probe") == off], off
    # reasons: what happened and what the rules read from 0
    assert not fams.get("fleetcanary_probe_skips_total")
    assert [(lab["probe"], lab["reason"]) for lab in fams["fleetcanary_probe_failures_total"]] == [
        ("collectives", "wrong_result")]
    assert not fams.get("fleetcanary_probe_crashes_total") and len(CRASH_REASONS) > 1
