"""The config keys fleetcanary promises to keep (docs/stability.md), and the renamed ones it still accepts.

A key of a release stays in the next minor release; renamed, the old key is still read for one minor release
at least: its value moves to the new key, with one warning line naming both, so a config that worked before an
upgrade does not make the new pod exit 2 and crash-loop. Giving both the old and the new key is refused (one
line): which of the two was meant is not for the exporter to guess. Each rename is listed here (the loader's
table) and in release/deprecations.yaml as kind "config" (the changelog's list); tests/test_stability.py holds
the two to each other and the code to the last release's keys (release/names-VERSION.json).
"""
from __future__ import annotations

import logging
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

log = logging.getLogger("fleetcanary.config")


@dataclass(frozen=True)
class Renamed:
    old: str             # dotted key, as in the file: "kubernetes.claim.after_seconds"
    new: str
    deprecated_in: str
    removed_in: str


# The renames in force, of the exporter's config and of the remediation controller's (`fleetcanary remediate`;
# its keys as in its own file; names-*.json and release/deprecations.yaml put "remediate." before them).
# Empty until a key is renamed: add one here and in release/deprecations.yaml.
RENAMED: tuple[Renamed, ...] = ()
REMEDIATE_RENAMED: tuple[Renamed, ...] = ()


def _model_of(ann: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (through Optional, list and dict values), if any."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in typing.get_args(ann):
        if (m := _model_of(arg)) is not None:
            return m
    return None


def keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key a config of `model` may give (a list of models or a mapping to models: its items' keys
    under `key.*`)."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        out.append(key)
        sub = _model_of(field.annotation)
        if sub is not None:
            container = typing.get_origin(field.annotation) in (list, dict, tuple)
            out += keys(sub, f"{key}.*." if container else f"{key}.")
    return sorted(out)


def _pop(data: dict, dotted: str) -> tuple[bool, Any]:
    parts = dotted.split(".")
    node: Any = data
    for p in parts[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(p), dict):
            return False, None
        node = node[p]
    if not isinstance(node, dict) or parts[-1] not in node:
        return False, None
    return True, node.pop(parts[-1])


def _has(data: dict, dotted: str) -> bool:
    node: Any = data
    for p in dotted.split("."):
        if not isinstance(node, dict) or p not in node:
            return False
        node = node[p]
    return True


def set_path(data: dict, dotted: str, value: Any) -> None:
    """data's value at a dotted key, set; a missing (or non-mapping) level on the way becomes a mapping."""
    keys = dotted.split(".")
    cur = data
    for k in keys[:-1]:
        nxt = cur.get(k)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[k] = nxt
        cur = nxt
    cur[keys[-1]] = value


def apply_renames(data: dict, source: str, renamed: tuple[Renamed, ...] | None = None) -> list[str]:
    """Move each renamed key's value to its new key (a warning line each); the problems (both keys given) as
    lines for ConfigError. Changes `data` in place. `renamed`: RENAMED unless given."""
    problems: list[str] = []
    for r in RENAMED if renamed is None else renamed:
        if not _has(data, r.old):
            continue
        if _has(data, r.new):
            problems.append(f"{r.old}: renamed {r.new} in {r.deprecated_in}, and both are given; keep {r.new}")
            continue
        _, value = _pop(data, r.old)
        set_path(data, r.new, value)
        log.warning("%s: config key %s is deprecated since %s and goes in %s: read as %s; rename it", source,
                    r.old, r.deprecated_in, r.removed_in, r.new)
    return problems
