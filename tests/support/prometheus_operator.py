"""The Prometheus Operator's custom resources (PrometheusRule, PodMonitor, ServiceMonitor) checked against its CRD
schemas offline: cloudcoil-models-prometheus-operator's pydantic models are generated from those CRDs' OpenAPI
schemas; closed here (extra="forbid"), so an unknown field fails as kubectl's strict field validation would."""
from __future__ import annotations

import functools
import inspect

import pydantic


@functools.cache
def _load():
    from cloudcoil.models.prometheus_operator import v1

    classes = [c for c in vars(v1).values() if inspect.isclass(c) and issubclass(c, pydantic.BaseModel)
               and c.__module__ == v1.__name__]
    for c in classes:
        c.model_config["extra"] = "forbid"
    for c in classes:
        c.model_rebuild(force=True)
    return v1


def validate(doc: dict) -> None:
    """Raises pydantic.ValidationError when doc breaks its CRD's schema; KeyError for a kind not known here."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1", doc["apiVersion"]
    getattr(_load(), doc["kind"]).model_validate(doc)
