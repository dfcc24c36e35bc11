"""What tests/ and benchmarks/ share, so that neither imports the other (tests/test_layout.py checks
it): the one implementation of each.

- ports.py: free loopback ports; poll.py: polling with a deadline (wait_for, wait_http); durations.py:
  Prometheus durations as seconds; http.py: a plain GET.
- servers.py: test HTTP servers in a thread; prometheus.py, alertmanager.py: the real servers on 127.0.0.1
  (and where their binaries are); backfill.py: synthetic series and recording rules into a Prometheus TSDB.
- series_budget.py: one node's exposition and its series count; kube_api.py: the Kubernetes API stand-in;
  netns.py: network namespaces on a bridge; container.py: running the images; wrk.py: the wrk load generator.

A checkout-only package: not part of the wheel (pyproject.toml lists the packages it ships), carried
by the sdist beside tests/ and benchmarks/. It imports nothing from either, and nothing of pytest: a missing
binary is a RuntimeError here, and a skip (or a failure under CI=true) in tests/support.
"""
