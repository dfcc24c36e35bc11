"""YAML read through libyaml's C loader when PyYAML is built with it (Debian's and PyPI's wheels are),
else PyYAML's pure-Python one: the same safe subset, 5-10 times less CPU. Rule files, manifests, Helm output and
the XID catalogue are parsed here; the config loader (fleetcanary.core.config) subclasses LOADER."""
from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

import yaml

LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(stream: str | bytes | IO) -> Any:
    """yaml.safe_load, on libyaml."""
    return yaml.load(stream, Loader=LOADER)


def load_all(stream: str | bytes | IO) -> Iterator[Any]:
    """yaml.safe_load_all, on libyaml."""
    return yaml.load_all(stream, Loader=LOADER)
