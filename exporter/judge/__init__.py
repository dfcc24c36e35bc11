"""Judging at the edge: each node keeps the figures its probes measured and computes, per judged
series, the statistics the fleet's rules compare (figures.py: which; stats.py: how; store.py: where
they are kept; exposition.py: how they are published). docs/alerting.md explains the split."""
