"""The controller's settings: one YAML file, pydantic models, unknown keys refused, a default for every field
(docs/remediation.md lists them). Dry-run is the default: a config must say ``dry_run: false`` to act."""
from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleetcanary.core import config as coreconfig
from fleetcanary.core import config_keys
from fleetcanary.core.config import ConfigError

DOMAIN = "fleetcanary.io"
# a qualified Kubernetes name with an optional DNS prefix (labels, annotation and taint keys)
_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _key(v: str) -> str:
    if not _KEY.match(v) or len(v) > 316:
        raise ValueError(f"{v!r} is not a Kubernetes label/taint key (prefix/name, name at most 63 characters)")
    return v


def _value(v: str) -> str:
    if len(v) > 63 or not _VALUE.match(v):
        raise ValueError(f"{v!r} is not a Kubernetes label value (at most 63 of [A-Za-z0-9-_.], alphanumeric ends)")
    return v


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Match(Strict):
    """Which alerts a rule takes: every given condition must hold (an empty one holds for all)."""
    alertnames: list[str] = Field(default_factory=list, description="exact alert names; empty: any")
    severities: list[Literal["critical", "warning", "info"]] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict, description="exact label values, e.g. {path: fast}")


class Taint(Strict):
    effect: Literal["NoSchedule", "PreferNoSchedule"] = "NoSchedule"  # never NoExecute: evicting is not ours


class Actions(Strict):
    labels: dict[str, str] = Field(default_factory=dict, description="node labels to set, e.g. "
                                   "{fleetcanary.io/health: degraded}")
    taint: Taint | None = None
    cordon: bool = False

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            _key(k)
            _value(val)
        return v

    @model_validator(mode="after")
    def _something(self) -> Actions:
        if not self.labels and self.taint is None and not self.cordon:
            raise ValueError("a rule must do something: labels, taint or cordon")
        return self


class Rule(Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    match: Match = Field(default_factory=Match)
    actions: Actions
    min_hold_seconds: float = Field(3600.0, ge=0, description="the least time a node stays quarantined")
    confirm: bool = Field(False, description="a performance verdict: act only once a fresh run on the node "
                          "confirms it (docs/remediation.md, Confirming runs; the settings under confirm:)")
    confirm_floor: float = Field(0.15, gt=0, lt=1, description="confirmed when the fresh run's figure is worse "
                                 "than the peers' value the alert carries by more than this share (the alert's "
                                 "own floor: 0.15 for the FarBelowPeers alerts)")


class Breaker(Strict):
    """At most max_nodes nodes, and at most max_pool_ratio of a pool (but always 1), quarantined by the
    controller with a start within window_seconds, per pool; beyond it nothing more is touched."""
    max_nodes: int = Field(3, ge=0)
    max_pool_ratio: float = Field(0.1, gt=0, le=1)
    window_seconds: float = Field(3600.0, gt=0)


class Release(Strict):
    """A node is released once every alert that quarantined it resolved, it stayed resolved quiet_seconds
    (a re-fire starts over), and its rules' minimum hold passed."""
    quiet_seconds: float = Field(1800.0, ge=0)


class Lease(Strict):
    enabled: bool = True
    name: str = "fleetcanary-remediate"
    namespace: str = Field("", description="default: the pod's namespace (POD_NAMESPACE), else fleetcanary")
    identity: str = Field("", description="default: POD_NAME, else the host name")
    duration_seconds: float = Field(15.0, gt=0)
    retry_seconds: float = Field(2.0, gt=0, description="how often the lease is tried or renewed")

    @model_validator(mode="after")
    def _renew_in_time(self) -> Lease:
        if self.retry_seconds * 2 > self.duration_seconds:
            raise ValueError("retry_seconds must be at most half of duration_seconds (a renewal may fail once)")
        return self


class Confirm(Strict):
    """How the controller asks a node's exporter for a confirming run (rules with confirm: true)."""
    url_pattern: str = Field("http://{instance}", description="the exporter's URL from the alert's labels: "
                             "{instance} (the scrape target host:port) and {node}, e.g. https://{node}:9835")
    username: str = Field("", description="basic auth user of the exporter's web config; '' = none")
    password_file: str = Field("", description="a file holding that user's password (read at each request, "
                               "never logged)")
    ca_file: str = Field("", description="CA bundle for an https exporter; '' = the system's")
    peers_annotation: str = Field("peers_value", description="the alert annotation holding the peers' value "
                                  "(a plain number in the figure's unit) the fresh run is judged against")
    timeout_seconds: float = Field(5.0, gt=0, le=60, description="each HTTP request to the exporter")
    poll_seconds: float = Field(15.0, gt=0, description="how often a pending confirmation is looked at")
    deadline_seconds: float = Field(1800.0, gt=0, description="no fresh run by then: not confirmed (timeout)")

    @field_validator("url_pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        try:
            url = v.format(instance="h:1", node="n")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{instance}} and {{node}} may be used: {exc}") from None
        if not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v


class Kubernetes(Strict):
    api_timeout_seconds: float = Field(5.0, gt=0, le=60)
    api_url: str = Field("", description="'' = in cluster (the service account); else a loopback plain-HTTP API "
                         "such as `kubectl proxy` (http://127.0.0.1:8001) or the demo's")
    event_namespace: str = Field("default", description="Events about nodes go here, as the kubelet's do")

    @field_validator("api_url")
    @classmethod
    def _loopback_only(cls, v: str) -> str:
        return coreconfig.loopback_api_url(v)


class Settings(Strict):
    listen_address: str = ":9841"
    dry_run: bool = True
    node_label: str = Field("node", description="the alert label naming the node (fleetcanary's target label)")
    pool_label: str = Field("", description="the node label naming its pool (the breaker's unit); '' = one pool")
    opt_out_label: str = f"{DOMAIN}/remediation"
    opt_out_value: str = "disabled"
    taint_key: str = f"{DOMAIN}/quarantine"
    audit_log: str = Field("", description="append-only JSON lines; '' = none (the log and Events still say all)")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="a larger webhook body is refused (413)")
    tick_seconds: float = Field(5.0, gt=0, description="how often the lease is renewed and pending "
                                "confirmations polled; the nodes are listed when a release may be due, after a "
                                "notification and at least every 5 minutes")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    rules: list[Rule] = Field(default_factory=list)
    breaker: Breaker = Field(default_factory=Breaker)
    release: Release = Field(default_factory=Release)
    lease: Lease = Field(default_factory=Lease)
    kubernetes: Kubernetes = Field(default_factory=Kubernetes)
    confirm: Confirm = Field(default_factory=Confirm)

    @field_validator("opt_out_label", "taint_key", "node_label")
    @classmethod
    def _keys(cls, v: str) -> str:
        return _key(v)

    @field_validator("pool_label")
    @classmethod
    def _pool(cls, v: str) -> str:
        return _key(v) if v else v

    @field_validator("listen_address")
    @classmethod
    def _listen(cls, v: str) -> str:
        coreconfig.parse_listen_address(v)
        return v

    @model_validator(mode="after")
    def _unique(self) -> Settings:
        names = [r.name for r in self.rules]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"rule names must be unique: {', '.join(dup)}")
        for r in self.rules:
            if self.taint_key in r.actions.labels:
                raise ValueError(f"rule {r.name}: the label {self.taint_key} is the taint key")
        return self

    def identity(self, environ=os.environ) -> str:
        import socket

        return self.lease.identity or environ.get("POD_NAME") or socket.gethostname()

    def lease_namespace(self, environ=os.environ) -> str:
        return self.lease.namespace or environ.get("POD_NAMESPACE") or "fleetcanary"


def load(path: str | os.PathLike) -> Settings:
    """The settings, or ConfigError with one line per problem (never another exception)."""
    source = str(path)
    try:
        data = coreconfig.parse_yaml(coreconfig.read_bounded(path, source), source)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError([f"{source}: (top level): must be a mapping of settings, not {type(data).__name__}"])
        if renamed := config_keys.apply_renames(data, source, config_keys.REMEDIATE_RENAMED):
            raise ConfigError([f"{source}: {p}" for p in renamed])
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(coreconfig._format_errors(exc, source)) from None
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a loader bug is still one line and a refused config
        raise ConfigError([f"{source}: cannot load: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"]) \
            from None
