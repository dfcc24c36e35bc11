"""Inference canary: latency percentiles, errors, quality and throughput per target."""
from dashboards.common import RATE, dashboard, node_var, panel, pool_var, query_var

SEL = 'node=~"$node", target=~"$target"'


def quantiles(hist: str) -> list:
    return [(f"histogram_quantile({q}, sum by (target, le) (rate({hist}_bucket{{{SEL}}}[{RATE}])))",
             f"{{{{target}}}} p{int(q * 100)}") for q in (0.5, 0.95, 0.99)]


panels = [
    panel("timeseries", "Time to first token (p50, p95, p99)",
          "From sending the streaming request to the first content token, over the canary's requests. "
          "Good: p95 under your TTFT SLO (FleetCanaryInferenceTTFTSLOBreach fires above it) and p99 close to "
          "p95; a widening p99 is queueing.", "s",
          quantiles("fleetcanary_inference_time_to_first_token_seconds"), w=8),
    panel("timeseries", "Inter-token latency (p50, p95, p99)",
          "Gaps between streamed tokens, vLLM's ITL. Good: p95 under your ITL SLO; steps up when the server "
          "batches more work or a GPU slows down.", "s",
          quantiles("fleetcanary_inference_inter_token_latency_seconds"), w=8),
    panel("timeseries", "End-to-end request latency (p50, p95, p99)",
          "Whole-request time of every canary request. Good: steady; it grows with output length, so compare "
          "like with like.", "s", quantiles("fleetcanary_inference_request_duration_seconds"), w=8),
    panel("timeseries", "Requests by outcome",
          "Share of canary requests per outcome (success, http_4xx, http_5xx, timeout, stream_error, ...). "
          "Good: success at 1.0; FleetCanaryInferenceErrors fires on a sustained error ratio.", "percentunit",
          [(f"sum by (target, outcome) (rate(fleetcanary_inference_requests_total{{{SEL}}}[{RATE}])) "
            f"/ on(target) group_left() sum by (target) (rate(fleetcanary_inference_requests_total{{{SEL}}}[{RATE}]))",
            "{{target}} {{outcome}}")], w=12),
    panel("timeseries", "Quality checks and output stability",
          "1 when every node passed the golden-answer check, and when the temperature-0 answer is the same as "
          "last time. Good: all at 1; a fast endpoint that answers wrongly is a failure, not a win.", "none",
          [(f"min by (target, check) (fleetcanary_inference_quality_pass{{{SEL}}})", "{{target}} {{check}}"),
           (f"min by (target) (fleetcanary_inference_output_stable{{{SEL}}})", "{{target}} output stable")],
          w=12),
    panel("timeseries", "Output tokens per second",
          "Decode throughput of the canary's streaming request, per node, and all canary output tokens per second. "
          "Good: steady; a drop with a rising ITL is a slower GPU or a busier server.", "none",
          [(f"fleetcanary_inference_output_tokens_per_second{{{SEL}}}", "{{target}} on {{node}} (stream)"),
           (f"sum by (target) (rate(fleetcanary_inference_output_tokens_total{{{SEL}}}[{RATE}]))",
            "{{target}} all canary tokens")], w=12),
    panel("timeseries", "Prefix-cache TTFT ratio",
          "TTFT of the second request sharing a long prefix over the first. Good: clearly below 1 when prefix "
          "caching is on; near 1 means the cache is off or missed.", "percentunit",
          [(f"fleetcanary_inference_prefix_cache_ttft_ratio{{{SEL}}}", "{{target}} on {{node}}")], w=12),
]

dashboard = dashboard(
    "fleetcanary / Inference canary", "fleetcanary-inference",
    "The LLM inference canary per endpoint: TTFT, ITL and E2E percentiles, outcomes, quality, throughput.",
    panels, [pool_var(), node_var(multi=True),
             query_var("target", "Endpoint", 'label_values(fleetcanary_inference_success{node=~"$node"}, target)')])
