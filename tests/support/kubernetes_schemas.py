"""kubernetes-validate with each schema file parsed once per test process.

Its ``validate()`` opens and parses the object's schema and the whole ``_definitions.json`` of the version on
every call: test_chart's and test_deploy's hundreds of objects spent about 3 of their 25 CPU-s there. The
validator only reads a schema, so the parsed one is kept. Tests import the module from here:
``from tests.support.kubernetes_schemas import kubernetes_validate``."""
from __future__ import annotations

import functools

import kubernetes_validate
from kubernetes_validate import utils

utils.schema_contents = functools.cache(utils.schema_contents)  # a module runs once per process

__all__ = ["kubernetes_validate"]
