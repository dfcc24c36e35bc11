"""What tests/ and benchmarks/ share, so that neither imports the other (tests/test_layout.py checks
it): polling with a deadline, the wrk load generator's runner, network namespaces on a bridge.

A checkout-only package: not part of the wheel (pyproject.toml lists the packages it ships), carried
by the sdist beside tests/ and benchmarks/. It imports nothing from either, and nothing of pytest.
"""
