"""The inference canary: errors, the p95 time to first token and inter-token latency against their bounds and
against the pool's nodes calling the same endpoint, and the golden answers. The bounds are settings
(inference_ttft_p95_seconds, inference_itl_p95_seconds, inference_error_ratio, inference_ttft_peer_ratio).
"""
from __future__ import annotations

from fleetcanary.core.rulesettings import RuleSettings
from fleetcanary.probes.inference import TTFT_BUCKETS
from fleetcanary.rules.common import Group, Shard, alert, record

TTFT = "node:fleetcanary_inference_ttft_seconds:p95_30m"
TTFT_POOLED = f"{TTFT} * on(node) group_left(pool) node:fleetcanary_pool:info"


def groups(s: RuleSettings, shards: list[Shard]) -> list[Group]:
    # the records read node:fleetcanary_pool:info, recorded before them in the same group (rules_hard)
    return [Group("rules", "fleetcanary-inventory", "hard_interval", recording()),
            Group("alerts", "fleetcanary-hard-failures", "hard_interval", alerts(s))]


def recording() -> list[dict]:
    def rec(name, expr):
        return record(name, " ".join(expr.split()))

    ttft = TTFT
    return [
        rec(ttft, "histogram_quantile(0.95, sum by (node, target, model, le) "
                  "(rate(fleetcanary_inference_time_to_first_token_seconds_bucket[30m])))"),
        rec("node:fleetcanary_inference_itl_seconds:p95_30m",
            "histogram_quantile(0.95, sum by (node, target, model, le) "
            "(rate(fleetcanary_inference_inter_token_latency_seconds_bucket[30m])))"),
        rec("node:fleetcanary_inference_errors:ratio_rate15m",
            'sum by (node, target, model) (rate(fleetcanary_inference_requests_total{outcome!="success"}[15m])) '
            "/ sum by (node, target, model) (rate(fleetcanary_inference_requests_total[15m]))"),
        rec("pool:fleetcanary_inference_ttft_seconds:peer_median_p95_30m",
            f"quantile by (pool, target, model) (0.5, {ttft} * on(node) group_left(pool) node:fleetcanary_pool:info)"),
        rec("pool:fleetcanary_inference_ttft_seconds:peer_nodes",
            f"count by (pool, target, model) ({ttft} * on(node) group_left(pool) node:fleetcanary_pool:info)"),
        # the upper bound of the TTFT histogram bucket the peers' median p95 lies in (the first bound at or above)
        rec("pool:fleetcanary_inference_ttft_seconds:peer_median_p95_bucket_bound_30m",
            " or ".join(f"(pool:fleetcanary_inference_ttft_seconds:peer_median_p95_30m <= {b}) * 0 + {b}"
                        for b in TTFT_BUCKETS)),
    ]


def alerts(s: RuleSettings) -> list[dict]:
    def a(name, expr, for_, sev, summary, desc):
        return alert(name, " ".join(expr.split()), for_, {"severity": sev}, summary, desc)

    return [
        a("FleetCanaryInferenceErrors",
          f"node:fleetcanary_inference_errors:ratio_rate15m > {s.inference_error_ratio:g}", "15m", "warning",
          "Inference canary requests fail",
          "{{ $value | humanizePercentage }} of canary requests from {{ $labels.node }} to {{ $labels.target }} "
          "failed in the last 15 minutes."),
        a("FleetCanaryInferenceTTFTSLOBreach", f"{TTFT} > {s.inference_ttft_p95_seconds:g}", "15m",
          "warning", "Inference TTFT p95 over its bound",
          "p95 TTFT from {{ $labels.node }} to {{ $labels.target }} is {{ $value | humanizeDuration }} (bound "
          f"{s.inference_ttft_p95_seconds:g} s, the setting inference_ttft_p95_seconds)."),
        a("FleetCanaryInferenceITLSLOBreach",
          f"node:fleetcanary_inference_itl_seconds:p95_30m > {s.inference_itl_p95_seconds:g}", "15m",
          "warning", "Inference ITL p95 over its bound",
          "p95 inter-token latency from {{ $labels.node }} to {{ $labels.target }} is {{ $value | humanizeDuration }} "
          f"(bound {s.inference_itl_p95_seconds * 1000:g} ms, the setting inference_itl_p95_seconds)."),
        # 10% over the peers, and past the histogram bucket the peers' p95 lies in: within one bucket the p95 is
        # interpolated (0.05-0.1 s is one bucket), and 2 of 5 healthy demo nodes went pending on that alone
        a("FleetCanaryInferenceTTFTSlowerThanPeers",
          f"({TTFT_POOLED}) / on(pool, target, model) group_left "
          f"pool:fleetcanary_inference_ttft_seconds:peer_median_p95_30m > {s.inference_ttft_peer_ratio:g} "
          f"and on(pool, target, model) (pool:fleetcanary_inference_ttft_seconds:peer_nodes >= {s.min_peers}) "
          f"and ({TTFT_POOLED}) > on(pool, target, model) group_left "
          "pool:fleetcanary_inference_ttft_seconds:peer_median_p95_bucket_bound_30m",
          "30m", "warning", "Inference TTFT p95 slower than peers",
          "p95 TTFT from {{ $labels.node }} to {{ $labels.target }} is {{ $value | humanize }} times the median of the "
          "pool's nodes calling the same endpoint, and past the histogram bucket theirs lies in (a node-side cause: "
          "its network path, its client)."),
        a("FleetCanaryInferenceQualityFailing", "fleetcanary_inference_quality_pass == 0", "10m", "critical",
          "An inference endpoint answers a golden prompt wrongly",
          "Check {{ $labels.check }} fails against {{ $labels.target }} (seen from {{ $labels.node }})."),
        a("FleetCanaryInferenceOutputChanged", "fleetcanary_inference_output_stable == 0", "30m", "info",
          "Greedy output changed", "The temperature-0 output of {{ $labels.target }} differs from the first one seen "
          "for this model (a quantization, kernel or sampling change?)."),
    ]
