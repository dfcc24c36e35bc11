"""What the shipped rules cost at fleet scale: rule evaluation time per group, missed iterations,
head series and memory, on a real Prometheus evaluating the shipped rule files live.

1. A node's exposition, modelled (v3: the node judges itself, the fleet compares peers):
   - the raw families at the counts benchmarks/series_budget.py measured on an 8-GPU node with
     8 InfiniBand ports at the default config (benchmarks/results/series_budget.json, its
     `by_family`; label values from the probes' declared metric specs, fitted to each count),
     plus the families of targets a deployment configures (--targets: two storage targets, one
     inference endpoint), which the default config leaves out;
   - the judge's per-series statistics (fleetcanary_judge_median / _newest / _change / _drift,
     labels figure, series, gpu, pool, model, driver_version), one series per judged figure the
     exporter's own fleetcanary.judge.figures.extract finds in that raw exposition (the training
     step on each of the 8 GPUs), at model levels: median at the GPU model's level with a per-GPU
     offset, change and drift 0.995 +- 1% (cut at 3%, so a healthy fleet fires no alert), and on
     the nodes that upgraded their driver in the last two weeks (--upgraded) the change against
     the previous driver's best day too.
2. A fleet (default 1,000 nodes x 8 GPUs, pools of 50, 60% H100 and 40% H200).
3. State of the TSDB:
   - fresh: none; Prometheus starts empty, its windows hold the minutes since it started;
   - steady: every series a rule reads through a range window is backfilled (promtool tsdb
     create-blocks-from openmetrics) at the scrape interval over that window, ending now: the NIC
     group's [1d] windows hold a day of samples, the hard-failure group's [1h]-[4h] windows are
     full, as in a Prometheus that has run for a day. Instant selectors read the head only (no
     block overlaps their 5-minute lookback), so the rest is not backfilled; the head's chunks
     fill while the benchmark runs (--warmup leaves more time before measuring).
4. Live: a real Prometheus scrapes every node's exposition (one target per node on 127.0.0.1,
   every 30 s) and evaluates alerts/fleetcanary.rules.yml and alerts/fleetcanary.alerts.yml
   unchanged (or, with --pools-sharded N, the same rules rendered by alerts/build.py with the
   first N pools in groups of their own). It records every group's evaluations
   (prometheus_rule_group_last_duration_seconds at each new evaluation timestamp) until the
   slowest group has run --cycles times after --warmup, then iterations missed, series and
   memory.

Loopback only. Prints a per-group table and the before (v2: benchmarks/results/rule_scale-200.json)
and after table, writes benchmarks/results/rule_scale-v3-<nodes>-<state>[-sharded<N>].json.

    python -m benchmarks.rule_scale --nodes 100 --state fresh --cycles 1   # a few minutes
    python -m benchmarks.rule_scale --nodes 1000 --state steady             # ~40 min
    python -m benchmarks.rule_scale --table                                 # the tables from the JSON on disk

The package: model.py (the node's exposition, the judge's statistics, the fleet), backfill.py (the steady
state's history), live.py (serving the fleet, the live Prometheus), tables.py, __main__.py (the command line).
"""
