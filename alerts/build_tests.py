#!/usr/bin/env python3
"""Generate the promtool tests for the peer-outlier alerts (alerts/tests/peers.test.yml).

For every family of alerts/build.py, on a fleet of peers scraped every minute:
- a degraded member fires at the right evaluation time with the expected labels and
  annotations, and stays silent one minute before its `for:` has elapsed;
- a pool of 4 (fewer than 5 peers) with the same degradation stays silent when the pool of 6
  fires and one `for:` later;
- one junk run (a single run at half the value) stays silent;
- +-3% noise on every member stays silent.
The hard-failure and history alerts have hand-written tests beside it.

promtool evaluates every rule group at every `evaluation_interval` step up to the last
`eval_time` of a case, whatever the groups' own intervals. A family run once a day needs a
timeline of days (its junk case needs 4 runs, its smoothing window is 3 days), which at one
step a minute with one sample a minute in 3-day windows took promtool over 7 minutes for that
family alone. Families with an interval of 30 minutes or more (SLOW_MINUTES) are therefore written
to peers_coarse.test.yml with samples and evaluation every COARSE_STEP_MINUTES: the same
timelines, values, peers, junk and noise, each eval_time on that grid, and the firing checked
as silent one step before its `for:` elapses and firing one step after (one minute either
side in the per-minute file). A series that changes once in 30 minutes or more changes on a
5-minute grid too, so that grid sees every change the per-minute one does.
"""
from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Loaded by path under its own name: other scripts in this repository are called build.py too.
_spec = importlib.util.spec_from_file_location("fleetcanary_alerts_build", Path(__file__).resolve().parent / "build.py")
build = sys.modules.get(_spec.name) or importlib.util.module_from_spec(_spec)
if _spec.name not in sys.modules:
    sys.modules[_spec.name] = build
    _spec.loader.exec_module(build)

HERE = Path(__file__).resolve().parent
HEALTHY = {"gpu_memory_bandwidth": 3.0e12, "gpu_p2p_bandwidth": 3.5e11, "collective_bus_bandwidth": 3.0e11,
           "host_memory_bandwidth": 1.0e11, "storage_read": 2.0e9, "storage_first_byte": 0.002,
           "inference_ttft": None, "gpu_matmul_throughput": 7.8e14, "gpu_sustained_ratio": 0.97,
           "train_step_time": 0.004}
SLOW_MINUTES = 30          # families run this rarely or less go to the coarse-step file
COARSE_STEP_MINUTES = 5    # sample and evaluation step of that file (divides every `for:` there)
HISTORY_STEP_MINUTES = 5   # sample and evaluation step of history.test.yml (divides every `for:` there)
# minutes from a run whose figure jumped to the exporter's confirmation run (its default 300 s)
CONFIRM_AFTER = 5
ENTITY_VALUES = {"gpu": "0", "direction": "d2d", "src_gpu": "0", "dst_gpu": "1", "collective": "all_reduce",
                 "size_bytes": "67108864", "ranks": "8", "backend": "nccl", "op": "triad", "target": "nvme",
                 "cache": "cold", "model": "llama", "dtype": "bf16"}


NODE_INFO = 'fleetcanary_node_info{{node="{}", pool="pool-a", cpu_model="Xeon 8480", driver_version="{}"}}'


def wobble(v: float, k: int) -> float:
    """A run's value with a relative difference of 1e-6 from its neighbours: every real run's figure is
    a new measured float, and the rules count runs by changes of the value."""
    return v * (1 + 1e-6 * (k % 2))


# promtool evaluates all groups at each step, by default in an order of its own; a group that reads
# another (the hourly group reads the inventory's joins) must come after it, as on a live Prometheus
# where the reader always finds the other's output of the last minute within the lookback.
ORDER = ["fleetcanary-inventory", "fleetcanary-peers", "fleetcanary-peers-slow", "fleetcanary-daily",
         "fleetcanary-hard-failures", "fleetcanary-peer-outliers", "fleetcanary-regressions"]


def series_for_runs(runs: list[float], per_run: int) -> str:
    return " ".join(f"{wobble(v, k)!r}x{per_run - 1}" for k, v in enumerate(runs))


DAILY_STEP_MINUTES = 15    # the daily burn's file: its 5.5-day windows at 5 minutes took promtool minutes


def step_of(f: build.Family) -> int:
    """Minutes between samples and between evaluations in this family's test file."""
    if f.interval_minutes >= 1440:
        return DAILY_STEP_MINUTES
    return COARSE_STEP_MINUTES if f.interval_minutes >= SLOW_MINUTES else 1


def fleet(f: build.Family, n_nodes: int, values: dict[int, list[float]], minutes: int) -> list[dict]:
    step = step_of(f)
    per_run = max(1, f.interval_minutes)
    runs = minutes // per_run
    assert per_run % step == 0 and minutes % step == 0, (f.key, per_run, minutes, step)
    samples = minutes // step
    out = []
    for i in range(1, n_nodes + 1):
        node = f"n{i}"
        out.append({"series": f'fleetcanary_node_info{{node="{node}", pool="pool-a", cpu_model="Xeon 8480", '
                              f'driver_version="550.90.07"}}', "values": f"1x{samples}"})
        if f.join in ("gpu_model", "node_model"):
            out.append({"series": f'fleetcanary_gpu_info{{node="{node}", gpu="0", model="H100", uuid="GPU-{i}"}}',
                        "values": f"1x{samples}"})
        labels = ", ".join(f'{k}="{ENTITY_VALUES[k]}"' for k in f.entity if k != "node")
        if f.key == "inference_ttft":
            # All observations of a run in one bucket: 0.05 < TTFT <= 0.1 (or 0.2 < TTFT <= 0.45 when slow).
            slow = values[i][0] > 1
            for le in build_ttft_buckets():
                inc = 1 if (le >= 0.45 if slow else le >= 0.1) else 0
                out.append({"series": f'fleetcanary_inference_time_to_first_token_seconds_bucket{{node="{node}", '
                                      f'{labels}, le="{le:g}"}}', "values": f"0+{inc}x{samples}"})
            out.append({"series": f'fleetcanary_inference_time_to_first_token_seconds_bucket{{node="{node}", '
                                  f'{labels}, le="+Inf"}}', "values": f"0+1x{samples}"})
            continue
        runs_v = values[i][:runs] + [values[i][-1]] * max(0, runs - len(values[i]))
        out.append({"series": f"{f.metric}{{node=\"{node}\", {labels}}}",
                    "values": series_for_runs(runs_v, per_run // step)})
    return out


def build_ttft_buckets():
    from fleetcanary.probes.inference import TTFT_BUCKETS

    return TTFT_BUCKETS


def alert_name(f: build.Family) -> str:
    return build.peer_alert(f)["alert"]


def expected(f: build.Family, node: str, value_pct: str) -> dict:
    a = build.peer_alert(f)
    labels = {"severity": a["labels"]["severity"], "family": f.key, "node": node, "pool": "pool-a"}
    for k in f.entity:
        if k != "node":
            labels[k] = ENTITY_VALUES[k]
    if "model" in f.group and f.key != "inference_ttft":
        labels["model"] = "H100"
    if "driver_version" in f.group:
        labels["driver_version"] = "550.90.07"
    if "cpu_model" in f.group:
        labels["cpu_model"] = "Xeon 8480"
    ent = ", ".join(f"{x} {labels[x]}" for x in f.entity)
    desc = a["annotations"]["description"]
    desc = desc.split(": ", 1)[1].replace("{{ $value | humanizePercentage }}", value_pct)
    return {"exp_labels": labels, "exp_annotations": {"summary": a["annotations"]["summary"],
                                                      "description": f"{ent}: {desc}",
                                                      "runbook_url": a["annotations"]["runbook_url"]}}


def tests_for(f: build.Family) -> list[dict]:
    out = _tests_for(f)
    step = step_of(f)
    for case in out:
        case["interval"] = f"{step}m"
        for check in case["alert_rule_test"]:
            assert int(check["eval_time"].rstrip("m")) % step == 0, (f.key, check["eval_time"], step)
    return out


def _tests_for(f: build.Family) -> list[dict]:
    a = build.peer_alert(f)
    step = step_of(f)
    for_m = build.seconds(a["for"]) // 60
    assert for_m % step == 0, (f.key, for_m, step)
    per_run = max(f.interval_minutes, 1)
    # The first minute with MIN_RUNS runs in the window (the constant-value ttft has no run count).
    gate = (build.MIN_RUNS - 1) * per_run if f.runs_by_changes else 0
    minutes = gate + 2 * for_m + 2 * per_run + 120
    minutes += (-minutes) % per_run
    base = 1.0
    bad = 0.8 if f.higher_is_better else 1.25
    name = alert_name(f)
    rng = random.Random(f.key)
    out = []
    vals = {i: [base] for i in range(1, 7)}
    vals[6] = [bad]
    fire_at = gate + for_m + step
    if f.key == "inference_ttft":
        fire_at = for_m + 2  # the rate window needs two samples
        pct = None
    else:
        pct = "20%" if f.higher_is_better else "25%"
    healthy = HEALTHY[f.key]
    scale = (lambda v: v * healthy) if healthy else (lambda v: v)
    case = {"interval": "1m", "input_series": fleet(f, 6, {i: [scale(x) for x in v] for i, v in vals.items()}, minutes),
            "alert_rule_test": [{"eval_time": f"{fire_at - 2 * step}m", "alertname": name, "exp_alerts": []}]}
    if pct:
        case["alert_rule_test"].append({"eval_time": f"{fire_at}m", "alertname": name,
                                        "exp_alerts": [expected(f, "n6", pct)]})
    out.append(case)
    # fewer than 5 peers
    vals4 = {i: [base] for i in range(1, 5)}
    vals4[4] = [bad]
    out.append({"interval": "1m", "input_series": fleet(f, 4, {i: [scale(x) for x in v] for i, v in vals4.items()},
                                                         minutes),
                # When the 6-member fleet fires and one `for:` later: every value is constant from the
                # start, so a later time would evaluate the same ratios again (and cost promtool a step
                # per minute up to it).
                "alert_rule_test": [{"eval_time": f"{m}m", "alertname": name, "exp_alerts": []}
                                    for m in (fire_at, fire_at + for_m)]})
    if f.key != "inference_ttft":
        # one junk run
        runs = minutes // per_run
        junk = {i: [base] * runs for i in range(1, 7)}
        junk[6] = [base] * 3 + [0.5 if f.higher_is_better else 2.0] + [base] * (runs - 4)
        out.append({"interval": "1m", "input_series": fleet(f, 6, {i: [scale(x) for x in v] for i, v in junk.items()},
                                                             minutes),
                    "alert_rule_test": [{"eval_time": f"{m}m", "alertname": name, "exp_alerts": []}
                                        # the junk run (the 4th) is in every window from run 4 to run 8
                                        for m in range(gate, minutes, max(per_run, 15))][:6]})
        # +-3% noise
        noise = {i: [base * rng.uniform(0.97, 1.03) for _ in range(runs)] for i in range(1, 7)}
        out.append({"interval": "1m", "input_series": fleet(f, 6, {i: [scale(x) for x in v] for i, v in noise.items()},
                                                             minutes),
                    "alert_rule_test": [{"eval_time": f"{m}m", "alertname": name, "exp_alerts": []}
                                        # promtool evaluates every step up to the last check: a few suffice
                                        for m in range(gate + for_m, minutes, max(per_run, 15))][:4]})
    return out


def render(step: int = 1) -> str:
    doc = {"rule_files": ["../fleetcanary.rules.yml", "../fleetcanary.alerts.yml"], "evaluation_interval": f"{step}m",
           "group_eval_order": ORDER,
           "tests": [t for f in build.FAMILIES if step_of(f) == step for t in tests_for(f)]}
    return ("# Generated by alerts/build_tests.py; do not edit.\n" +
            yaml.safe_dump(doc, sort_keys=False, width=200))





# --------------------------------------------------------------------------- hard failures
def _render(text: str, labels: dict[str, str], value: str) -> str:
    import re

    text = re.sub(r"\{\{ \$value[^}]*\}\}", value, text)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)


def _alert(name: str) -> dict:
    for g in build.build()[1]["groups"]:
        for r in g["rules"]:
            if r["alert"] == name:
                return r
    raise KeyError(name)


def exp(name: str, labels: dict[str, str], value: str) -> dict:
    a = _alert(name)
    ann = {k: _render(v, labels, value) for k, v in a["annotations"].items()}
    return {"exp_labels": {**a["labels"], **labels}, "exp_annotations": ann}


def case(name: str, series: list[tuple[str, str]], silent_at: str | None, fire_at: str, labels: dict[str, str],
         value: str) -> dict:
    checks = []
    if silent_at:
        checks.append({"eval_time": silent_at, "alertname": name, "exp_alerts": []})
    checks.append({"eval_time": fire_at, "alertname": name, "exp_alerts": [exp(name, labels, value)]})
    return {"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": checks}


def silent(name: str, series: list[tuple[str, str]], at: str) -> dict:
    return {"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": []}]}


def hard_cases() -> list[dict]:
    n = 'node="n1"'
    ttft_buckets = [(f'fleetcanary_inference_time_to_first_token_seconds_bucket{{{n}, target="llm", model="m", '
                     f'le="{le}"}}', f"0+{inc}x60") for le, inc in (("1", 0), ("2", 0), ("4", 1), ("+Inf", 1))]
    itl_buckets = [(f'fleetcanary_inference_inter_token_latency_seconds_bucket{{{n}, target="llm", model="m", '
                    f'le="{le}"}}', f"0+{inc}x60") for le, inc in (("0.1", 0), ("0.2", 0), ("0.5", 1), ("+Inf", 1))]
    return [
        case("FleetCanaryProbeFailing", [(f'fleetcanary_probe_runs_total{{{n}, probe="storage", outcome="failure"}}',
                                          "0+0.1x120")],
             "20m", "75m", {"node": "n1", "probe": "storage"}, "6"),
        case("FleetCanaryProbeStale", [(f'fleetcanary_probe_last_success_timestamp_seconds{{{n}, probe="gpu_health"}}',
                                        "0x60"),
                                       (f'fleetcanary_probe_interval_seconds{{{n}, probe="gpu_health"}}', "60x60"),
                                       (f'fleetcanary_probe_enabled{{{n}, probe="gpu_health"}}', "1x60"),
                                       (f'fleetcanary_probe_runs_total{{{n}, probe="gpu_health", outcome="skipped"}}',
                                        "0x60")],
             "10m", "30m", {"node": "n1", "probe": "gpu_health"}, "30m 0s"),
        silent("FleetCanaryProbeStale",
               [(f'fleetcanary_probe_last_success_timestamp_seconds{{{n}, probe="gpu_bandwidth"}}', "0x60"),
                (f'fleetcanary_probe_interval_seconds{{{n}, probe="gpu_bandwidth"}}', "60x60"),
                (f'fleetcanary_probe_enabled{{{n}, probe="gpu_bandwidth"}}', "1x60"),
                (f'fleetcanary_probe_runs_total{{{n}, probe="gpu_bandwidth", outcome="skipped"}}', "0+1x60")], "40m"),
        case("FleetCanaryGPUsMissing", [(f"fleetcanary_gpus_healthy{{{n}}}", "8 7x30"),
                                        (f"fleetcanary_gpus_expected{{{n}}}", "8x31")], "0m", "1m", {"node": "n1"},
             "7"),
        silent("FleetCanaryGPUsMissing", [(f"fleetcanary_gpus_healthy{{{n}}}", "8x30"),
                                          (f"fleetcanary_gpus_expected{{{n}}}", "8x30")], "20m"),
        case("FleetCanaryGPULost", [(f'fleetcanary_gpu_lost{{{n}, gpu="4"}}', "0 1x30")], "0m", "1m",
             {"node": "n1", "gpu": "4"}, "1"),
        case("FleetCanaryPCIeLinkWidthDegraded", [(f'fleetcanary_gpu_pcie_link_width{{{n}, gpu="2"}}', "16 8x30"),
                                                  (f'fleetcanary_gpu_pcie_link_width_max{{{n}, gpu="2"}}', "16x31")],
             "0m", "1m", {"node": "n1", "gpu": "2"}, "8"),
        case("FleetCanaryPCIeLinkGenerationDegraded",
             [(f'fleetcanary_gpu_pcie_link_generation{{{n}, gpu="1"}}', "3x40"),
              (f'fleetcanary_gpu_pcie_link_generation_max{{{n}, gpu="1"}}', "5x40"),
              (f'fleetcanary_gpu_clock_throttle_active{{{n}, gpu="1", reason="gpu_idle"}}', "0x40")],
             "29m", "31m", {"node": "n1", "gpu": "1"}, "3"),
        silent("FleetCanaryPCIeLinkGenerationDegraded",
               [(f'fleetcanary_gpu_pcie_link_generation{{{n}, gpu="1"}}', "1x40"),
                (f'fleetcanary_gpu_pcie_link_generation_max{{{n}, gpu="1"}}', "5x40"),
                (f'fleetcanary_gpu_clock_throttle_active{{{n}, gpu="1", reason="gpu_idle"}}', "1x40")], "35m"),
        case("FleetCanaryNVLinkDown", [(f'fleetcanary_gpu_nvlink_up{{{n}, gpu="5", link="7"}}', "1 0x30")], "0m", "1m",
             {"node": "n1", "gpu": "5", "link": "7"}, "0"),
        case("FleetCanaryGPUCriticalXid", [(f'fleetcanary_gpu_xid_errors_total{{{n}, gpu="6", xid="79"}}',
                                            "0x10 1x50")], "9m", "12m", {"node": "n1", "gpu": "6", "xid": "79"},
             "1.0714285714285714"),
        case("FleetCanaryGPUUncorrectableECC",
             [(f'fleetcanary_gpu_ecc_errors_total{{{n}, gpu="6", type="uncorrected", counter="volatile"}}',
               "0x10 2x70")], "9m", "80m", {"node": "n1", "gpu": "6", "type": "uncorrected", "counter": "volatile"},
             "2"),
        case("FleetCanaryGPURowRemapPending", [(f'fleetcanary_gpu_remapped_rows_pending{{{n}, gpu="6"}}', "1x30")],
             "4m", "6m", {"node": "n1", "gpu": "6"}, "1"),
        case("FleetCanaryGPURowRemapFailed", [(f'fleetcanary_gpu_remapped_rows_failed{{{n}, gpu="6"}}', "0 1x30")],
             "0m", "2m", {"node": "n1", "gpu": "6"}, "1"),
        case("FleetCanaryCollectiveWrongResult",
             [(f'fleetcanary_probe_failures_total{{{n}, probe="collectives", reason="wrong_result"}}', "0x10 1x200")],
             "9m", "130m", {"node": "n1", "probe": "collectives", "reason": "wrong_result"}, "1"),
        case("FleetCanaryGPUWrongResult",
             [(f'fleetcanary_gpu_sdc_status{{{n}, gpu="3", status="mismatch"}}', "0x10 1x30"),
              (f'fleetcanary_gpu_sdc_status{{{n}, gpu="3", status="match"}}', "1x10 0x30")],
             "9m", "12m", {"node": "n1", "gpu": "3"}, "1"),
        silent("FleetCanaryGPUWrongResult",
               [(f'fleetcanary_gpu_sdc_status{{{n}, gpu="3", status="mismatch"}}', "0x40"),
                (f'fleetcanary_gpu_sdc_status{{{n}, gpu="3", status="unjudged"}}', "1x40")], "30m"),
        case("FleetCanaryGPUSDCNoConsensus",
             [(f'fleetcanary_gpu_sdc_status{{{n}, gpu="0", status="no_consensus"}}', "0x10 1x30")],
             "9m", "12m", {"node": "n1", "gpu": "0"}, "1"),
        case("FleetCanaryGPUThrottlingUnlikePeers", _throttle_fleet(hot=0.6, peers=0.0), "5m", "15m",
             {"node": "n6", "gpu": "0", "model": "H100", "pool": "pool-a"}, "60%"),
        silent("FleetCanaryGPUThrottlingUnlikePeers", _throttle_fleet(hot=0.6, peers=0.4), "30m"),
        silent("FleetCanaryGPUThrottlingUnlikePeers", _throttle_fleet(hot=0.6, peers=0.0, nodes=4), "30m"),
        case("FleetCanaryTrainStepLossWrong",
             [(f'fleetcanary_train_step_loss_check_pass{{{n}, gpu="2", dtype="bf16"}}', "1x10 0x30")],
             "9m", "12m", {"node": "n1", "gpu": "2", "dtype": "bf16"}, "0"),
        case("FleetCanaryInferenceErrors",
             [(f'fleetcanary_inference_requests_total{{{n}, target="llm", model="m", outcome="success"}}', "0+1x60"),
              (f'fleetcanary_inference_requests_total{{{n}, target="llm", model="m", outcome="http_5xx"}}', "0+1x60")],
             "10m", "40m", {"node": "n1", "target": "llm", "model": "m"}, "50%"),
        # a truncated stream (closed with no end of answer) is an error like any other outcome
        case("FleetCanaryInferenceErrors",
             [(f'fleetcanary_inference_requests_total{{{n}, target="llm", model="m", outcome="success"}}', "0+3x60"),
              (f'fleetcanary_inference_requests_total{{{n}, target="llm", model="m", outcome="truncated"}}', "0+1x60")],
             "10m", "40m", {"node": "n1", "target": "llm", "model": "m"}, "25%"),
        case("FleetCanaryInferenceTTFTSLOBreach", ttft_buckets, "10m", "50m",
             {"node": "n1", "target": "llm", "model": "m"}, "3.9s"),
        case("FleetCanaryInferenceITLSLOBreach", itl_buckets, "10m", "50m",
             {"node": "n1", "target": "llm", "model": "m"}, "485ms"),
        case("FleetCanaryInferenceQualityFailing",
             [(f'fleetcanary_inference_quality_pass{{{n}, target="llm", check="arithmetic"}}', "0x30")],
             "9m", "11m", {"node": "n1", "target": "llm", "check": "arithmetic"}, "0"),
        case("FleetCanaryInferenceOutputChanged", [(f'fleetcanary_inference_output_stable{{{n}, target="llm"}}',
                                                    "0x40")], "29m", "31m", {"node": "n1", "target": "llm"}, "0"),
        case("FleetCanaryExporterDown", [(f'up{{{n}, job="fleetcanary", instance="10.0.0.1:9835"}}', "0x30")],
             "4m", "6m", {"node": "n1", "job": "fleetcanary", "instance": "10.0.0.1:9835"}, "0"),
        case("FleetCanaryConfigReloadFailed", [(f"fleetcanary_config_last_reload_successful{{{n}}}", "0x30")],
             "4m", "6m", {"node": "n1"}, "0"),
    ]


def _throttle_fleet(hot: float, peers: float, nodes: int = 6) -> list[tuple[str, str]]:
    """GPU 0 of ``nodes`` nodes of one model and pool; the last node's GPU spends ``hot`` of its burn in a
    slowdown, the others ``peers``."""
    out = []
    for i in range(1, nodes + 1):
        node = f'node="n{i}"'
        out += [(f'fleetcanary_node_info{{{node}, pool="pool-a", cpu_model="Xeon 8480", driver_version="550.90.07"}}',
                 "1x40"),
                (f'fleetcanary_gpu_info{{{node}, gpu="0", model="H100", uuid="GPU-{i}"}}', "1x40"),
                (f'fleetcanary_gpu_sustained_slowdown_ratio{{{node}, gpu="0"}}',
                 f"{hot if i == nodes else peers:g}x40")]
    return out


def _minutes(window: str) -> int:
    return int(window[:-1]) * {"m": 1, "h": 60, "d": 1440}[window[-1]]


def _values(per_step: list[float | None]) -> str:
    """promtool values, one per step (None: no sample, as after a staleness marker)."""
    out, i = [], 0
    while i < len(per_step):
        j = i
        while j + 1 < len(per_step) and per_step[j + 1] == per_step[i]:
            j += 1
        k = j - i + 1
        v = per_step[i]
        out.append(" ".join(["_"] * k) if v is None else (f"{v!r}x{k - 1}" if k > 1 else repr(v)))
        i = j + 1
    return " ".join(out)


def _runs(per_run: list[float], run_steps: int) -> list[float]:
    """One value per step from one value per run (each run wobbled against its neighbours)."""
    return [wobble(v, k) for k, v in enumerate(per_run) for _ in range(run_steps)]


def _labels(f: build.Family) -> str:
    return ", ".join(f'{k}="{ENTITY_VALUES[k]}"' for k in f.entity if k != "node")


def history_cases() -> list[dict]:
    """Every history family on 6 nodes, 2 days healthy, then node n6 25% worse (30% slower for a
    lower-is-better family such as the training step time), samples and evaluation every
    HISTORY_STEP minutes:
    - the fast path (the first bad run followed by the exporter's confirmation run): silent until its window
      of FAST_CONFIRMED intervals holds the three bad runs alone, firing then (within 2 intervals);
    - the self-history alert: silent 30 minutes after the change, firing once half the smoothing
      window and its `for` have passed;
    - the drift rule: silent 11 hours after, firing 14 hours after (the day's median has turned);
    - the fast path on its own history stays silent there (6 peer nodes: the peer fast path judges);
    and on one node whose driver changes at that moment: the driver alert fires, the history and
    drift alerts stay silent; and in a pool of 3 nodes (below the peer minimum), the third 25% worse:
    the fast path on its own history fires with the peer fast path's timing, the peer fast path cannot."""
    day = 1440
    k = HISTORY_STEP_MINUTES
    drop_at = 2 * day
    fams = [f for f in build.FAMILIES if f.history]
    total = drop_at + 15 * 60
    steps = total // k

    def member(f: build.Family, node: str, bad: bool) -> tuple[str, str]:
        """The degraded member's first bad run (at drop_at) gets its confirmation run CONFIRM_AFTER later."""
        h = HEALTHY[f.key]
        worse = (0.75 if f.higher_is_better else 1.3) * h if bad else h
        per_run = f.interval_minutes // k
        n_runs = -(-steps // per_run)
        runs = [h if r * f.interval_minutes < drop_at else worse for r in range(n_runs)]
        fig = _runs(runs, per_run)[:steps]
        if bad:
            first = drop_at // k
            fig[first + CONFIRM_AFTER // k:first + per_run] = [worse * (1 + 3e-6)] * (per_run - CONFIRM_AFTER // k)
        return f'{f.metric}{{node="{node}", {_labels(f)}}}', _values(fig)

    def fast_fires(f: build.Family) -> int:
        """Minutes after drop_at of the first evaluation where the fast path's window of FAST_CONFIRMED
        intervals holds the three bad runs (first, confirmation, next) and not the healthy run before."""
        w = build.FAST_CONFIRMED * f.interval_minutes
        t = f.interval_minutes
        while not t - w > -k:
            t += k
        assert t <= 2 * f.interval_minutes, (f.key, t)  # the issue's bound: within 2 intervals
        return t


    def pool(size: int) -> list[tuple[str, str]]:
        """Nodes n1..n<size> on one driver, the last one degraded at drop_at."""
        out = []
        for i in range(1, size + 1):
            node = f"n{i}"
            out += [(NODE_INFO.format(node, "550.90.07"), f"1x{steps}"),
                    (f'fleetcanary_gpu_info{{node="{node}", gpu="0", model="H100", uuid="GPU-{i}"}}', f"1x{steps}")]
            out += [member(f, node, i == size) for f in fams]
        return out

    small, same = pool(3), pool(6)
    one = [('fleetcanary_gpu_info{node="n1", gpu="0", model="H100", uuid="GPU-1"}', f"1x{steps}"),
           (NODE_INFO.format("n1", "550.90.07"), f"1x{drop_at // k - 1}"),
           (NODE_INFO.format("n1", "570.124.06"), f"_x{drop_at // k - 1} 1x{steps - drop_at // k + 1}")]
    one += [member(f, "n1", True) for f in fams]
    checks_same, checks_drv, checks_small = [], [], []
    def joined(f: build.Family, labels: dict, driver: str = "550.90.07") -> dict:
        """The labels the peer join adds to an entity's series."""
        if "cpu_model" in f.group:
            return {**labels, "cpu_model": "Xeon 8480", "pool": "pool-a"}
        if "model" in f.group:
            return {**labels, "model": "H100", "pool": "pool-a", "driver_version": driver}
        return {**labels, "pool": "pool-a"}

    for f in fams:
        labels = {x: ENTITY_VALUES.get(x, "n6") for x in f.entity}
        labels["node"] = "n6"
        reg, drv, drift = [a["alert"] for a in build.history_alerts(f)]
        for_m = build.seconds(build.history_alerts(f)[0]["for"]) // 60
        fire = drop_at + -(-(_minutes(f.window) // 2 + for_m + 15) // k) * k
        pct = "75%" if f.higher_is_better else "130%"
        fam = {"family": f.key}
        checks_same += [{"eval_time": f"{drop_at + 30}m", "alertname": reg, "exp_alerts": []},
                        {"eval_time": f"{fire}m", "alertname": reg,
                         "exp_alerts": [_with(exp(reg, joined(f, labels), pct), fam)]},
                        {"eval_time": f"{fire}m", "alertname": drv, "exp_alerts": []},
                        {"eval_time": f"{drop_at + 11 * 60}m", "alertname": drift, "exp_alerts": []},
                        {"eval_time": f"{drop_at + 14 * 60}m", "alertname": drift,
                         "exp_alerts": [_with(exp(drift, {**labels, "driver_version": "550.90.07"}, pct), fam)]}]
        if f.fast:
            fast = build.fast_alert(f)["alert"]
            fl = joined(f, labels)
            at = drop_at + fast_fires(f)
            checks_same += [{"eval_time": f"{at - k}m", "alertname": fast, "exp_alerts": []},
                            {"eval_time": f"{at}m", "alertname": fast,
                             "exp_alerts": [_with(exp(fast, fl, "25%" if f.higher_is_better else "30%"), fam)]}]
            own = build.fast_history_alert(f)["alert"]
            checks_same.append({"eval_time": f"{at}m", "alertname": own, "exp_alerts": []})
            sl = joined(f, {**labels, "node": "n3"})
            checks_small += [{"eval_time": f"{at - k}m", "alertname": own, "exp_alerts": []},
                             {"eval_time": f"{at}m", "alertname": own, "exp_alerts": [_with(exp(own, sl, pct), fam)]},
                             {"eval_time": f"{at}m", "alertname": fast, "exp_alerts": []}]
        one_l = {**labels, "node": "n1"}
        checks_drv += [{"eval_time": f"{fire}m", "alertname": reg, "exp_alerts": []},
                       {"eval_time": f"{fire}m", "alertname": drv,
                        "exp_alerts": [_with(exp(drv, joined(f, one_l, "570.124.06"), pct), fam)]},
                       {"eval_time": f"{drop_at + 14 * 60}m", "alertname": drift, "exp_alerts": []}]
    return [
        {"interval": f"{k}m", "input_series": [{"series": s, "values": v} for s, v in same],
         "alert_rule_test": checks_same},
        {"interval": f"{k}m", "input_series": [{"series": s, "values": v} for s, v in one],
         "alert_rule_test": checks_drv},
        {"interval": f"{k}m", "input_series": [{"series": s, "values": v} for s, v in small],
         "alert_rule_test": checks_small},
    ]


def ramp_case() -> dict:
    """A slow ramp: GPU memory bandwidth healthy for a day, then 1% lower every day. The 3-day
    history follows it along (never 5% off); the drift rule (4%) fires within a day of it crossing 5%
    (day 6): silent at day 4.5 (3.5% down, its day's median 3%), firing at day 7."""
    f = next(x for x in build.FAMILIES if x.key == "gpu_memory_bandwidth")
    k, day = f.interval_minutes, 1440
    steps = 7 * day // k + 1
    per_run = f.interval_minutes // k
    h = HEALTHY[f.key]
    runs = [h * (1 - 0.01 * max(0.0, r * f.interval_minutes / day - 1)) for r in range(-(-steps // per_run))]
    labels = {"node": "n1", "gpu": "0", "direction": "d2d", "driver_version": "550.90.07"}
    drift = build.history_alerts(f)[2]["alert"]
    reg = build.history_alerts(f)[0]["alert"]
    return {"interval": f"{k}m", "input_series": [
        {"series": 'fleetcanary_node_info{node="n1", pool="pool-a", cpu_model="Xeon 8480", driver_version="550.90.07"}',
         "values": f"1x{steps}"},
        {"series": 'fleetcanary_gpu_info{node="n1", gpu="0", model="H100", uuid="GPU-1"}', "values": f"1x{steps}"},
        {"series": f'{f.metric}{{node="n1", gpu="0", direction="d2d"}}',
         "values": _values(_runs(runs, per_run)[:steps])}],
        "alert_rule_test": [{"eval_time": f"{int(4.5 * day)}m", "alertname": drift, "exp_alerts": []},
                            {"eval_time": f"{7 * day}m", "alertname": drift,
                             "exp_alerts": [_with(exp(drift, labels, "94.5%"), {"family": f.key})]},
                            {"eval_time": f"{7 * day}m", "alertname": reg, "exp_alerts": []}]}


def upgraded_case() -> dict:
    """Baselines per driver: GPU memory bandwidth on a node whose driver changes at day 2 (the new driver
    costs 6%), then 15% lower from day 4.5. By day 4.5 the node has a baseline on its new driver (a day on
    it and a day of its 1-day medians), so the self-history alert fires within hours of the drop; with the
    old rule, which left out every node upgraded in the last 3 days, it stayed silent until day 5."""
    f = next(x for x in build.FAMILIES if x.key == "gpu_memory_bandwidth")
    k, day = f.interval_minutes, 1440
    steps = 6 * day // k + 1
    h = HEALTHY[f.key]
    runs = [h * (1.0 if r * k < 2 * day else 0.94 if r * k < 4.5 * day else 0.94 * 0.85) for r in range(steps)]
    up = 2 * day // k
    labels = {"node": "n1", "gpu": "0", "direction": "d2d", "model": "H100", "pool": "pool-a",
              "driver_version": "570.124.06"}
    reg = build.history_alerts(f)[0]["alert"]
    return {"interval": f"{k}m", "input_series": [
        {"series": NODE_INFO.format("n1", "550.90.07"), "values": f"1x{up - 1}"},
        {"series": NODE_INFO.format("n1", "570.124.06"), "values": f"_x{up} 1x{steps - up - 1}"},
        {"series": 'fleetcanary_gpu_info{node="n1", gpu="0", model="H100", uuid="GPU-1"}', "values": f"1x{steps}"},
        {"series": f'{f.metric}{{node="n1", gpu="0", direction="d2d"}}', "values": _values(_runs(runs, 1)[:steps])}],
        "alert_rule_test": [{"eval_time": f"{int(4.45 * day)}m", "alertname": reg, "exp_alerts": []},
                            {"eval_time": f"{int(4.5 * day) + 180}m", "alertname": reg,
                             "exp_alerts": [_with(exp(reg, labels, "85%"), {"family": f.key})]}]}


def cohort_case() -> dict:
    """A rolling upgrade over 6 nodes of one pool (one an hour from day 3; the new driver costs 6%), and
    n6's GPU 7% lower from day 3.5, 6 hours after its own upgrade: no node has a baseline on the new
    driver for about 2 more days and 7% is under the raw path's 10%, so only the change against the
    previous driver's baseline, judged against the upgraded cohort's changes, can see it. It fires within
    2 hours; no other node does (the driver's 6% is common to the cohort)."""
    f = next(x for x in build.FAMILIES if x.key == "gpu_memory_bandwidth")
    k, day = f.interval_minutes, 1440
    drop, end = int(3.5 * day), int(3.5 * day) + 150
    steps = end // k + 1
    h = HEALTHY[f.key]
    series = []
    for i in range(1, 7):
        node, up = f"n{i}", (3 * day + i * 60) // k
        runs = [h * (1.0 if r < up else 0.94) * (0.93 if i == 6 and r * k >= drop else 1.0) for r in range(steps)]
        series += [{"series": NODE_INFO.format(node, "550.90.07"), "values": f"1x{up - 1}"},
                   {"series": NODE_INFO.format(node, "570.124.06"), "values": f"_x{up} 1x{steps - up - 1}"},
                   {"series": f'fleetcanary_gpu_info{{node="{node}", gpu="0", model="H100", uuid="GPU-{i}"}}',
                    "values": f"1x{steps}"},
                   {"series": f'{f.metric}{{node="{node}", gpu="0", direction="d2d"}}',
                    "values": _values([wobble(v, r + i) for r, v in enumerate(runs)])}]
    peers = build.peer_alert(f)["alert"]
    labels = {"node": "n6", "gpu": "0", "direction": "d2d", "model": "H100", "pool": "pool-a",
              "driver_version": "570.124.06"}
    n = build.names(f)
    at = f"{drop + 120}m"
    return {"interval": f"{k}m", "input_series": series,
            # the path that judges it: no change against a baseline on the new driver, one against the old
            "promql_expr_test": [{"expr": f'count({n["change"]}{{node="n6"}})', "eval_time": at, "exp_samples": []},
                                 {"expr": f'count({n["upgrade_ratio"]}{{node="n6"}} < 0.95)', "eval_time": at,
                                  "exp_samples": [{"labels": "{}", "value": 1}]}],
            "alert_rule_test": [{"eval_time": f"{drop - k}m", "alertname": peers, "exp_alerts": []},
                                {"eval_time": at, "alertname": peers,
                                 "exp_alerts": [_with(exp(peers, labels, "7%"), {"family": f.key})]}]}


# --------------------------------------------------------------------------- windows of runs
def run_series(runs: list, per_run: int, frozen: bool = False, confirm: dict | None = None) -> list:
    """Per-minute figure for one run per `per_run` minutes (None: the run skipped, "down": the exporter
    was down). The exporter exports a figure for at most FRESH intervals after its run (the old
    exporter, `frozen`: until the next value). confirm: run index -> the figure of the confirmation run
    the exporter adds CONFIRM_AFTER minutes after that run."""
    fresh = 1.5
    confirm = confirm or {}
    fig, last, last_at = [], None, None
    for m in range(len(runs) * per_run):
        r = runs[m // per_run]
        if m % per_run == 0 and r not in (None, "down"):
            last, last_at = wobble(r, m // per_run), m
        elif m % per_run == CONFIRM_AFTER and m // per_run in confirm and r not in (None, "down"):
            last, last_at = confirm[m // per_run] * (1 + 3e-6), m
        if r == "down":
            fig.append(None)
            last = None  # a restart forgets everything
            continue
        fig.append(last if last is not None and (frozen or m - last_at < fresh * per_run) else None)
    return fig


def gpu_bw_fleet(members: dict[str, list], per_run: int = 15, frozen: frozenset = frozenset(),
                 confirm: dict | None = None) -> list[dict]:
    h = HEALTHY["gpu_memory_bandwidth"]
    minutes = max(len(r) for r in members.values()) * per_run
    out = []
    for node, runs in members.items():
        fig = run_series(runs, per_run, frozen=node in frozen, confirm=(confirm or {}).get(node))
        out += [{"series": f'fleetcanary_node_info{{node="{node}", pool="pool-a", cpu_model="Xeon 8480", '
                           f'driver_version="550.90.07"}}', "values": f"1x{minutes}"},
                {"series": f'fleetcanary_gpu_info{{node="{node}", gpu="0", model="H100", uuid="GPU-{node}"}}',
                 "values": f"1x{minutes}"},
                {"series": f'fleetcanary_gpu_memory_bandwidth_bytes_per_second{{node="{node}", gpu="0", '
                           f'direction="d2d"}}', "values": _values([None if v is None else v * h for v in fig])}]
    return out


def runs_cases() -> list[dict]:
    """GPU memory bandwidth (15-minute runs) on 6 or 7 nodes; n1-n5 healthy throughout."""
    peers, fast = "FleetCanaryGPUMemoryBandwidthBelowPeers", "FleetCanaryGPUMemoryBandwidthFarBelowPeers"
    reg = "FleetCanaryGPUMemoryBandwidthRegression"
    n_runs = 40  # 10 hours
    healthy = {f"n{i}": [1.0] * n_runs for i in range(1, 6)}
    labels = {"node": "n6", "gpu": "0", "direction": "d2d", "model": "H100", "pool": "pool-a",
              "driver_version": "550.90.07"}
    fam = {"family": "gpu_memory_bandwidth"}

    def quiet(names, times):
        return [{"eval_time": f"{m}m", "alertname": a, "exp_alerts": []} for a in names for m in times]

    # 1. A junk run (half the value) just before 6 hours of busy skips: with the freshness bound (n6)
    # and, for the rules alone, with the old exporter's frozen value (n7): one run is not a window.
    busy = [1.0] * 12 + [0.5] + [None] * 24 + [1.0] * 3
    frozen_case = {"interval": "1m",
                   "input_series": gpu_bw_fleet({**healthy, "n6": busy, "n7": busy}, frozen=frozenset({"n7"})),
                   "alert_rule_test": quiet([peers, fast, reg], range(190, 600, 30))}
    # 2. An exporter restart after a 2-hour outage, then runs 15% low: silent with 2, 3 and 4 runs in
    # the window; the 5th run (at 360 min) makes the median and the alert fires `for` (15 min) later.
    restart = [1.0] * 12 + ["down"] * 8 + [0.85] * 20
    restart_case = {"interval": "1m", "input_series": gpu_bw_fleet({**healthy, "n6": restart}),
                    "alert_rule_test": quiet([peers, fast, reg], (316, 329, 340, 355, 372))
                    + [{"eval_time": "377m", "alertname": peers,
                        "exp_alerts": [_with(exp(peers, labels, "15%"), fam)]}]}
    # 3. A firing peer alert through 4 hours of busy skips: held (neither resolved nor refreshed on no
    # data), then healthy runs resolve it once 5 are in the window and keep_firing_for has passed.
    hold = [0.85] * 12 + [None] * 16 + [1.0] * 12
    hold_case = {"interval": "1m", "input_series": gpu_bw_fleet({**healthy, "n6": hold}),
                 "alert_rule_test": [{"eval_time": f"{m}m", "alertname": peers,
                                      "exp_alerts": [_with(exp(peers, labels, "15%"), fam)]} for m in (100, 260, 400)]
                 + quiet([peers], (580,))}
    # 4. Junk runs (the first at 180 min). Two in a row that do not agree (50%, 65%), or that agree (55%, 56%: two
    # runs cannot tell them from a fault), or a junk run whose confirmation run 5 minutes later is junk too
    # (55%, 56%) while the next run is healthy: the fast path needs three agreeing runs, and stays silent
    # (nor is the 5-run median moved).
    junk = [1.0] * 12 + [0.50, 0.65] + [1.0] * 10
    pair = [1.0] * 12 + [0.55, 0.56] + [1.0] * 10
    junk_conf = [1.0] * 12 + [0.55] + [1.0] * 11
    junk_case = {"interval": "1m", "input_series": gpu_bw_fleet({**healthy, "n6": junk, "n7": pair, "n8": junk_conf},
                                                                 confirm={"n8": {12: 0.56}}),
                 "alert_rule_test": quiet([fast, peers, reg], (186, 196, 199, 200, 205, 210, 218, 225, 240, 300))}
    # A real 22% drop at 180 min, its confirmation run at 185 agreeing: fires once the window of 1.2 intervals
    # (18 min) holds the three bad runs alone, at 198 (1.2 intervals after the first bad run), and
    # keep_firing_for holds it until the window of 2.5 intervals carries it (from 217, when the healthy run's
    # last sample at 179 has left it). Where the confirmation was skipped (the GPU busy at 185), the third
    # scheduled bad run fires it at 210, 2 intervals after the first.
    real = [1.0] * 12 + [0.78, 0.77] + [0.78] * 10
    real_case = {"interval": "1m", "input_series": gpu_bw_fleet({**healthy, "n6": real}, confirm={"n6": {12: 0.77}}),
                 "alert_rule_test": quiet([fast], (181, 186, 194, 197))
                 + [{"eval_time": f"{m}m", "alertname": fast, "exp_alerts": [_with(exp(fast, labels, "22%"), fam)]}
                    for m in (198, 203, 210, 218, 240, 300)]}
    unconfirmed_case = {"interval": "1m", "input_series": gpu_bw_fleet({**healthy, "n6": real}),
                        "alert_rule_test": quiet([fast], (198, 205, 209))
                        + [{"eval_time": f"{m}m", "alertname": fast,
                            "exp_alerts": [_with(exp(fast, labels, "22%"), fam)]} for m in (210, 216, 217, 240, 300)]}
    # 5. Junk and low runs scattered through one window (50%, healthy, 85%, 50%, healthy, 85%): its median is
    # 15% below the peers for an hour (the expression test), which the raw path alone would call a fault;
    # but among the newest runs (2.5 intervals) one is always healthy, so nothing confirms it: silent.
    scattered = [1.0] * 12 + [0.5, 1.0, 0.85, 0.5, 1.0, 0.85] + [1.0] * 10
    gpu_bw = next(x for x in build.FAMILIES if x.key == "gpu_memory_bandwidth")
    ratio = f'{build.names(gpu_bw)["ratio"]}{{node="n6"}}'
    scattered_case = {"interval": "1m", "input_series": gpu_bw_fleet({**healthy, "n6": scattered}),
                      "promql_expr_test": [{"expr": f"count({ratio} < 0.9)", "eval_time": f"{m}m",
                                            "exp_samples": [{"labels": "{}", "value": 1}]} for m in (240, 265, 290)],
                      "alert_rule_test": quiet([peers, fast, reg], range(236, 330, 6))}
    # 6. The same runs, each healthy run 85% instead: the newest runs confirm the window, and it fires.
    confirmed = [1.0] * 12 + [0.5, 0.85, 0.85, 0.5, 0.85, 0.85] + [0.85] * 10
    confirmed_case = {"interval": "1m", "input_series": gpu_bw_fleet({**healthy, "n6": confirmed}),
                      "alert_rule_test": [{"eval_time": "300m", "alertname": peers,
                                           "exp_alerts": [_with(exp(peers, labels, "15%"), fam)]}]}
    # 7. Low runs (88%) around a healthy one, then a busy period: its last figures expire one by one. With 3
    # runs in the newest 2.5 intervals (240) the newest-runs ratio exists (and the healthy run keeps it from
    # confirming); with 2 left (250) it is absent although the window's median is still 12% low, so a lone
    # low last run never confirms a window, and nothing fires through the busy period.
    confirm = f'{build.names(gpu_bw)["confirm"]}{{node="n6"}}'
    edge = [1.0] * 12 + [0.88, 1.0, 0.88, 0.88] + [None] * 16 + [1.0] * 8
    edge_case = {"interval": "1m", "input_series": gpu_bw_fleet({**healthy, "n6": edge}),
                 "promql_expr_test": [{"expr": f"count({confirm})", "eval_time": "240m",
                                       "exp_samples": [{"labels": "{}", "value": 1}]},
                                      {"expr": f"count({confirm})", "eval_time": "250m", "exp_samples": []},
                                      {"expr": f"count({ratio} < 0.9)", "eval_time": "250m",
                                       "exp_samples": [{"labels": "{}", "value": 1}]}],
                 "alert_rule_test": quiet([peers, fast, reg], range(240, 480, 10))}
    return [frozen_case, restart_case, hold_case, junk_case, real_case, unconfirmed_case, scattered_case,
            confirmed_case, edge_case]


def _with(e: dict, labels: dict) -> dict:
    e["exp_labels"].update(labels)
    return e


def render_more() -> dict[str, str]:
    head = "# Generated by alerts/build_tests.py; do not edit.\n"
    files = ["../fleetcanary.rules.yml", "../fleetcanary.alerts.yml"]
    return {
        "hard_failures.test.yml": head + yaml.safe_dump({"rule_files": files, "group_eval_order": ORDER,
                                                         "evaluation_interval": "1m",
                                                         "tests": hard_cases()}, sort_keys=False, width=200),
        # The ramp's week at its probe interval (15 min): every group evaluates each step.
        "drift.test.yml": head + yaml.safe_dump({"rule_files": files, "group_eval_order": ORDER,
                                                 "evaluation_interval": "15m",
                                                 "tests": [ramp_case(), upgraded_case(), cohort_case()]},
                                                sort_keys=False, width=200),
        "runs.test.yml": head + yaml.safe_dump({"rule_files": files, "group_eval_order": ORDER,
                                                "evaluation_interval": "1m",
                                                "tests": runs_cases()}, sort_keys=False, width=200),
        "history.test.yml": head + yaml.safe_dump({"rule_files": files, "group_eval_order": ORDER,
                                                   "evaluation_interval": f"{HISTORY_STEP_MINUTES}m",
                                                   "tests": history_cases()}, sort_keys=False, width=200),
    }


def outputs() -> dict[str, str]:
    return {"peers.test.yml": render(), "peers_coarse.test.yml": render(COARSE_STEP_MINUTES),
            "peers_daily.test.yml": render(DAILY_STEP_MINUTES), **render_more()}


def main() -> int:
    (HERE / "tests").mkdir(exist_ok=True)
    for name, text in outputs().items():
        (HERE / "tests" / name).write_text(text)
        print(f"wrote alerts/tests/{name}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    sys.exit(main())
