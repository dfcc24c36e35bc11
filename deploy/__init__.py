"""Deployment manifests; build.py (`python -m deploy.build`) generates the ones derived from the rules,
the dashboards and the config models. Not part of the wheel."""
