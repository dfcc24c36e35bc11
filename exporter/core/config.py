"""Configuration: one YAML file, pydantic models, unknown keys refused.

Every field has a default, so no file at all gives a working exporter. Units are in
field names (``_seconds``, ``_bytes``, ``_ratio``) or descriptions. The environment
overrides what Kubernetes and container images inject (see ENV_OVERRIDES); the
environment wins over the file, because it is how a deployment specialises one
shared ConfigMap per node.
"""
from __future__ import annotations

import collections.abc
import functools
import os
import re
import stat
import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from fleetcanary.core import config_keys, statefile
from fleetcanary.core.rulesettings import RuleSettings
from fleetcanary.probes import PROBES
from fleetcanary.probes.base import Probe
from fleetcanary.probes.lib import yamltext

DEFAULT_PORT = 9835

# environment variable -> dotted config path
ENV_OVERRIDES: dict[str, str] = {
    "NODE_NAME": "node_name",
    "FLEETCANARY_NODE_NAME": "node_name",
    "FLEETCANARY_LISTEN_ADDRESS": "server.listen_address",
    "FLEETCANARY_STATE_DIR": "state_dir",
    "FLEETCANARY_POOL": "pool",
    "FLEETCANARY_WEB_CONFIG_FILE": "server.web_config_file",
}


class ConfigError(Exception):
    """A configuration problem; ``lines`` holds one message per problem."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


MAX_CONFIG_BYTES = 4 << 20  # a config is kilobytes; anything near this is not one
MAX_DEPTH = 64              # nesting of mappings and lists; the settings themselves go 8 deep
MAX_NODES = 1_000_000       # scalars and collections once aliases are expanded (a billion laughs is refused)

def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


def _mark(node_or_event: Any) -> str:
    return _where(getattr(node_or_event, "start_mark", None))


class _Loader(yamltext.LOADER):  # type: ignore[misc, valid-type]
    """yaml's safe loader that refuses a key given twice in one mapping (yaml keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a complex key: the constructor refuses an unhashable one itself
                key = (key_node.tag, key_node.value)
                if key in seen:
                    first = seen[key].start_mark.line + 1
                    raise ConfigError([f"{_mark(key_node)}duplicate key {key_node.value[:80]!r} "
                                       f"(first given on line {first})"])
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _check_shape(text: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH and more than MAX_NODES nodes with aliases expanded, from yaml's
    event stream (iterative, no recursion), before anything is composed or constructed."""
    depth = 0
    total = 0
    anchors: dict[str, tuple[int, int]] = {}   # anchor -> (nodes, height) of the node it names
    open_: list[tuple[str | None, int, int]] = []  # (anchor, total at its start, depth at its start)
    max_below: list[int] = []                  # deepest depth reached inside each open collection
    for ev in yaml.parse(text, Loader=yamltext.LOADER):
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            total += 1
            if depth > MAX_DEPTH:
                raise ConfigError([f"{_mark(ev)}nested deeper than {MAX_DEPTH} levels"])
            open_.append((ev.anchor, total - 1, depth))
            max_below.append(depth)
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, start, d0 = open_.pop()
            deepest = max_below.pop()
            if max_below:
                max_below[-1] = max(max_below[-1], deepest)
            if anchor is not None:
                anchors[anchor] = (total - start, deepest - d0 + 1)
            depth -= 1
        elif isinstance(ev, yaml.ScalarEvent):
            total += 1
            if ev.anchor is not None:
                anchors[ev.anchor] = (1, 0)
        elif isinstance(ev, yaml.AliasEvent):
            nodes, height = anchors.get(ev.anchor, (1, 0))
            total += nodes
            if depth + height > MAX_DEPTH:
                raise ConfigError([f"{_mark(ev)}nested deeper than {MAX_DEPTH} levels (through alias "
                                   f"*{ev.anchor[:40]})"])
            if max_below:
                max_below[-1] = max(max_below[-1], depth + height)
        if total > MAX_NODES:
            raise ConfigError([f"{_mark(ev)}more than {MAX_NODES} values with aliases expanded"])


def _yaml_problem(exc: yaml.YAMLError) -> str:
    return f"{_where(getattr(exc, 'problem_mark', None))}{getattr(exc, 'problem', None) or 'invalid YAML'}"


def parse_yaml(raw: bytes, source: str) -> Any:
    """The YAML document in ``raw``, or ConfigError with one line: too large, not UTF-8, not YAML, nested too
    deep, too many values, a duplicate key, a value yaml cannot construct. Never another exception."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError([f"{source}: larger than {MAX_CONFIG_BYTES >> 20} MiB ({len(raw)} bytes); "
                           "not a config file"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{source}: not UTF-8 (byte {exc.start})"]) from None
    try:
        _check_shape(text)
        loader = _Loader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except ConfigError as exc:
        raise ConfigError([f"{source}: {line}" for line in exc.lines]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{source}: {_yaml_problem(exc)}"]) from None
    except RecursionError:
        raise ConfigError([f"{source}: nested too deeply to read"]) from None
    except (ValueError, TypeError, OverflowError, AttributeError, IndexError, KeyError) as exc:
        # a scalar yaml resolves but cannot build (a timestamp like 2001-02-30, an unhashable merge)
        raise ConfigError([f"{source}: a value YAML cannot read: {type(exc).__name__}: {_one_line(str(exc))}"]) \
            from None


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        """A boolean is never a number here, however the model is built (load() also checks the probes'
        own Configs, which derive from probes/base.py, with their field paths): pydantic's lax mode would
        take `yes` as 1.0."""
        if isinstance(data, dict):
            bad = [k for k, v in data.items() if isinstance(v, bool) and isinstance(k, str)
                   and k in cls.model_fields and _numeric_without_bool(cls.model_fields[k].annotation)]
            if bad:
                raise ValueError(f"{', '.join(bad)}: must be a number, not a boolean")
        return data


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/fleetcanary"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "fleetcanary")


def parse_listen_address(value: str) -> tuple[str, int]:
    host, sep, port_txt = value.rpartition(":")
    if not sep:
        raise ValueError("must be HOST:PORT or :PORT")
    if not port_txt.isdigit() or not 1 <= int(port_txt) <= 65535:
        raise ValueError(f"port {port_txt!r} is not a number from 1 to 65535")
    host = host.strip("[]")
    return host, int(port_txt)


class ServerConfig(Strict):
    listen_address: str = Field(
        f":{DEFAULT_PORT}", description="HOST:PORT to serve HTTP on; an empty host means all addresses.")
    request_timeout_seconds: float = Field(10.0, gt=0, le=300, description="Per-connection socket timeout.")
    max_connections: int = Field(
        64, ge=2, le=4096, description="HTTP connections served at once (each holds a thread and a file "
        "descriptor). When all are taken, the one that has waited longest for its request's headers is cut for "
        "a new one; with none waiting, the new one gets 503 and is closed at once.")
    max_connections_per_client: int = Field(
        8, ge=1, le=4096, description="HTTP connections from one source address, once half of max_connections "
        "are in use (so one address holds at most half, and others still get in); past it a new connection from "
        "that address gets 503 and is closed at once.")
    header_timeout_seconds: float = Field(
        10.0, gt=0, le=300, description="Seconds a client has to send a request's whole request line and "
        "headers (and to start the next request on a kept-alive connection), however slowly it sends them.")
    web_config_file: str | None = Field(
        None, description="TLS and basic auth, in the Prometheus exporter-toolkit web-config format "
        "(docs/security.md). Also --web.config.file.")
    confirm_requests: bool = Field(
        False, description="Serve POST /confirm: `fleetcanary remediate` (or a person) asks for a fresh run of a "
        "probe before it acts on a performance verdict (docs/remediation.md). A write endpoint: off unless set, "
        "and behind the web config's basic auth like /metrics (docs/security.md).")
    confirm_requests_per_hour: int = Field(
        6, ge=1, le=3600, description="Requested runs accepted per sliding hour, all probes together; past it, "
        "429. Each probe also takes at most one request per its confirm_delay_seconds.")

    @field_validator("listen_address")
    @classmethod
    def _check_listen(cls, v: str) -> str:
        parse_listen_address(v)
        return v


class HistoryConfig(Strict):
    enabled: bool = Field(True, description="Append every run to results.jsonl in state_dir.")
    max_bytes: int = Field(16 << 20, ge=64 << 10,
                           description="Rotate results.jsonl when it would exceed this many bytes.")
    backups: int = Field(3, ge=0, le=100, description="Rotated files kept (results.jsonl.1 ... .N).")


class GpuConfig(Strict):
    budget_ratio: float = Field(
        0.005, gt=0, le=1,
        description="GPU-time budget for invasive probes per GPU, as a fraction of wall time. Each probe is "
        "held to it over a window as long as its interval, at least an hour and at most a day (0.005 = 18 s per "
        "hour for probes that run hourly or more often, 432 s per day for a daily probe); in a shorter window a "
        "longer-interval probe's run counts as its amortized share (a daily 22 s burn as 0.92 s an hour). Over "
        "budget, invasive probes skip with reason 'budget'.")
    busy_utilization_ratio: float = Field(
        0.05, ge=0, le=1,
        description="An invasive probe skips a GPU (reason gpu_busy) whose utilization is above this ratio.")
    skip_when_compute_processes: bool = Field(
        True, description="An invasive probe skips a GPU (reason gpu_busy) that has compute processes (gpu_mps where "
        "they are an MPS server or its clients, docs/allocation.md).")
    expected_count: int | None = Field(
        None, ge=0, description="GPUs this node should have; None reads it from the node label when known.")
    xid_watch: str = Field(
        "auto", pattern="^(auto|on|off)$",
        description="Watch the kernel log for NVIDIA Xid records all the time (a long-lived reader process, "
        "restarted if it dies), so a critical XID is caught whenever it happens, not only in gpu_health's event "
        "waits: the kernel log where `xid_log` is readable (deploy/overlays/xid-watch mounts it), else NVML's "
        "events. auto: NVML's events where no NVIDIA driver is loaded (/proc/driver/nvidia); on: the kernel log "
        "regardless, and an error logged while it is not readable.")
    xid_log: str = Field("/dev/kmsg", description="What the XID watch reads: the kernel log (/dev/kmsg, or a "
                         "file of kmsg records), or `nvml` (NVML's critical-XID events, what it falls back to where "
                         "the kernel log is not readable; no GPU driver: the watch stays off).")
    spread_first_runs: bool = Field(
        True, description="Invasive GPU probes run at this node's own point of their interval (a phase drawn "
        "from the node name, or a seed kept in the state directory), so a rollout does not start them on every "
        "node at once and a restart keeps each node's slot; false: within seconds of the start, like the rest.")


class XidOverride(Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    cls: str | None = Field(None, alias="class", pattern="^(hardware|memory|bus|nvlink|driver|thermal|application)$",
                            description="The code's class here: hardware, memory, bus, nvlink, driver, thermal or "
                            "application (application: pages only when it repeats on one GPU across processes).")
    severity: str | None = Field(None, pattern="^(critical|warning|info|ignore)$",
                                 description="critical, warning, info or ignore (counted, never alerted).")
    action: str | None = Field(None, max_length=300, description="The first action this site takes.")


class XidConfig(Strict):
    overrides: dict[int, XidOverride] = Field(
        default_factory=dict, description="Per XID code, what this site says instead of the catalogue "
        "(docs/xid-catalogue.md), e.g. {109: {class: application}} or {92: {severity: ignore}}.")
    escalate_processes: int = Field(3, ge=2, le=100, description="An application-class XID escalates (and pages) "
                                    "when one GPU logs the same code from this many different processes ...")
    escalate_window_seconds: float = Field(3600.0, ge=60, le=7 * 86400,
                                           description="... within this many seconds.")
    fault_hold_seconds: float = Field(3600.0, ge=60, le=7 * 86400, description="How long a GPU counts as failed "
                                      "(health state, node condition) after a hardware-side critical XID or an "
                                      "escalation, degraded after a warning one.")

    @field_validator("overrides")
    @classmethod
    def _codes(cls, v):
        bad = [c for c in v if not 0 < c < 1000]
        if bad:
            raise ValueError(f"XID codes are 1..999; not {', '.join(map(str, bad))}")
        return v

    def override_map(self) -> dict[str, dict]:
        return {str(c): {k: x for k, x in o.model_dump(by_alias=True).items() if x is not None}
                for c, o in self.overrides.items()}


class NodeConditionConfig(Strict):
    enabled: bool = Field(
        False, description="Set the node condition (needs the patch nodes/status permission of the "
        "node-conditions overlay).")
    type: str = Field("FleetCanaryHealthy", pattern=r"^[A-Za-z][A-Za-z0-9]{0,62}$",
                      description="Condition type; True while healthy, False after repeated failures.")
    probes: tuple[str, ...] = Field(("gpu_health", "gpu_bandwidth", "collectives"),
                                    description="Probes whose failures count.")
    consecutive_failures: int = Field(3, ge=1, le=100, description="Consecutive failed runs (failure, timeout "
                                      "or crash) of one of the probes that set the condition to False.")
    heartbeat_seconds: float = Field(300.0, ge=10, le=3600,
                                     description="Re-patch the condition at least this often (lastHeartbeatTime).")
    per_fault: bool = Field(
        False, description="Also set one condition per hard-fault class, node-problem-detector style (True: the "
        "fault is present): <prefix>GPULost, GPUHardwareXid, GPUUncorrectableECC, GPURowRemapFailure, "
        "GPUPCIeDegraded, GPUNVLinkDown, GPUFabricNotReady (docs/node-conditions.md).")
    per_fault_prefix: str = Field("FleetCanary", pattern=r"^[A-Za-z][A-Za-z0-9]{0,40}$",
                                  description="Prefix of the per-fault condition types, so they cannot collide "
                                  "with another detector's.")
    clear_after_observations: int = Field(
        3, ge=1, le=100, description="A fault condition clears after this many consecutive gpu_health runs "
        "without the fault ...")
    min_hold_seconds: float = Field(900.0, ge=0, le=86400,
                                    description="... and at least this long after it was set (hysteresis).")


class ClaimConfig(Strict):
    enabled: bool = Field(
        False, description="Scheduled runs (deploy/overlays/scheduled-runs): when tenants have kept the invasive "
        "probes off this node's GPUs for `after_seconds`, ask the scheduler for GPU time with a lowest-priority, "
        "non-preempting pod bound to this node that requests the GPUs, runs the due probes and leaves its records "
        "in `inbox` for this exporter to publish. Needs create, get and delete on pods in the namespace.")
    after_seconds: float = Field(21600.0, ge=600, le=604800, description="How long an invasive probe must have "
                                 "had no successful run, its last run skipped for a tenant, before a claim is made.")
    spread_ratio: float = Field(0.25, ge=0, le=1, description="Each node waits up to this share of `after_seconds` "
                                "longer, at its own point (its phase, daemon/phase.py), so a fleet whose nodes were "
                                "all held since a rollout does not create its claim pods in the same minute.")
    image: str = Field("", description="The claim pod's image (this exporter's; the overlay sets it).")
    namespace: str = Field("", description="Where the claim pod is created; empty: POD_NAMESPACE.")
    priority_class: str = Field("fleetcanary-claim", description="The claim pod's PriorityClass: the lowest "
                                "priority, preemptionPolicy Never (it never displaces a pod).")
    service_account: str = Field("fleetcanary-claim", description="The claim pod's service account (no API "
                                 "access; its token is not mounted).")
    gpus: int = Field(0, ge=0, le=64, description="GPUs the claim requests (nvidia.com/gpu, or the ResourceClaim's "
                      "count on a DRA node); 0: the node's capacity (its GPU devices in its ResourceSlices on DRA).")
    device_class: str = Field("gpu.nvidia.com", min_length=1, max_length=253,
                              description="On a node without nvidia.com/gpu whose ResourceSlices publish GPUs (a DRA "
                              "driver), the DeviceClass of the ResourceClaim the claim pod takes its GPUs through.")
    pending_seconds: float = Field(3600.0, ge=60, le=86400, description="A claim the scheduler has not placed "
                                   "within this is withdrawn (deleted) and asked again after `after_seconds`.")
    max_run_seconds: int = Field(1800, ge=60, le=86400, description="The claim pod's activeDeadlineSeconds.")
    inbox: str = Field("", description="Where claim pods leave their records (a hostPath both mount); empty: "
                       "state_dir/inbox.")
    inbox_host_path: str = Field("/var/lib/fleetcanary-inbox", description="The host directory the claim pod "
                                 "mounts as its inbox (the overlay mounts the same into this exporter at `inbox`).")
    testing_label: bool = Field(False, description="While the claim pod runs (placed, holding the GPUs), label "
                                "the node fleetcanary.io/testing=true, and remove it after (only a label this exporter "
                                "set: recorded in the annotation fleetcanary.io/testing-set-by). Needs patch on nodes.")


# What kubernetes.api_url may name (the remediation controller's setting of the same name means the same): a
# loopback API server over plain HTTP that authenticates for us (`kubectl proxy`, the demo's). Anything else is
# the in-cluster server over https with the service account's token and CA: a token never travels over plain
# HTTP, and never to a host this setting names.
LOOPBACK_API_URL = re.compile(r"^http://(127\.0\.0\.1|localhost|\[::1\]):[0-9]{1,5}$")


def loopback_api_url(v: str) -> str:
    """A kubernetes.api_url as both the exporter's and the controller's config take it: empty, or loopback HTTP."""
    if v and not LOOPBACK_API_URL.match(v):
        raise ValueError(
            f"{v!r} is not a loopback plain-HTTP API (http://127.0.0.1:PORT, http://localhost:PORT or "
            "http://[::1]:PORT, such as `kubectl proxy`); leave it empty for the in-cluster API server over "
            "https with the service account (its token never goes over plain HTTP or to a named host)")
    return v


class KubernetesConfig(Strict):
    mode: str = Field("auto", pattern="^(auto|on|off)$",
                      description="auto: use the API when running in a pod (KUBERNETES_SERVICE_HOST set) or when "
                      "`api_url` is set.")
    api_url: str = Field("", description="'' = the in-cluster API server (https, the pod's service account); else "
                         "a loopback plain-HTTP API server that authenticates for the exporter, such as `kubectl "
                         "proxy` (http://127.0.0.1:8001) or the demo's. No credentials are sent to it.")
    api_timeout_seconds: float = Field(5.0, gt=0, le=60, description="Connect and read timeout of each API call.")
    refresh_seconds: float = Field(60.0, ge=5, le=3600, description="How often this node's pods are listed: each "
                                   "period drawn within +-10% of it, after a first one at a random phase, so a fleet "
                                   "rolled out at once does not list in step; the list is served from the API "
                                   "server's watch cache (resourceVersion=0), not from etcd.")
    node_refresh_seconds: float = Field(300.0, ge=5, le=86400, description="How often this node's Node object is "
                                        "read (labels, GPU capacity: they change rarely), on the same jittered "
                                        "schedule; at least refresh_seconds.")
    gpu_product_label: str = Field("nvidia.com/gpu.product", description="Node label with the GPU product "
                                   "(GPU feature discovery); node_info label gpu_product.")
    instance_type_label: str = Field("node.kubernetes.io/instance-type",
                                     description="Node label with the instance type; node_info label instance_type.")
    zone_label: str = Field("topology.kubernetes.io/zone",
                            description="Node label with the zone; node_info label zone.")
    pool_label: str = Field("", description="Node label naming the pool (e.g. a node-pool label); used when "
                            "`pool` is not set.")
    gpu_allocation_policy: str = Field(
        "skip", pattern="^(skip|ignore)$",
        description="skip: GPUs held by pods are left alone: per GPU where the kubelet's pod-resources socket "
        "answers (invasive probes run on the free GPUs), else every invasive GPU probe skips with gpu_allocated "
        "while any pod on this node requests a GPU resource (gpu_resource_names) or holds a GPU through a "
        "ResourceClaim (dra_gpu_drivers). ignore: rely on the NVML process and utilization "
        "checks only.")
    pod_resources_socket: str = Field(
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        description="The kubelet's pod-resources API socket (v1 List): which GPU each pod holds. \"\" turns it off; "
        "while it is absent or does not answer, the node-wide check above applies.")
    pod_resources_refresh_seconds: float = Field(
        5.0, ge=1, le=300, description="How often the pod-resources socket is read; a view older than three "
        "refreshes is dropped.")
    gpu_resource_names: list[str] = Field(
        ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*"], max_length=32,
        description="Extended-resource names (shell-style patterns) whose devices are GPUs or MIG slices: what the "
        "kubelet's pod-resources view and the API server's pod requests count as held. The defaults cover the "
        "NVIDIA device plugin's whole GPUs, its time-slicing/MPS replicas renamed by `renameByDefault` "
        "(nvidia.com/gpu.shared) and MIG slices of the mixed strategy; add a resource a sharing config renames.")
    dra_gpu_drivers: list[str] = Field(
        ["gpu.nvidia.com"], max_length=8,
        description="DRA drivers whose devices are GPUs (NVIDIA's DRA driver: gpu.nvidia.com). Their devices, "
        "from pod-resources' dynamic resources and from ResourceClaims allocated to pods on this node, are held "
        "GPUs, mapped to GPU UUIDs through this node's ResourceSlices (daemon/dra.py; needs list on resourceslices "
        "and get on resourceclaims in resource.k8s.io; without them the device names place GPUs by minor number).")
    node_condition: NodeConditionConfig = Field(default_factory=NodeConditionConfig)
    claim: ClaimConfig = Field(default_factory=ClaimConfig)

    @field_validator("api_url")
    @classmethod
    def _loopback_only(cls, v: str) -> str:
        return loopback_api_url(v)


class ProbeEntryBase(Strict):
    """Schedule settings shared by every probe; ``params`` holds the probe's own Config."""

    jitter_seconds: float = Field(
        -1.0, description="Random delay added to each run, seconds; -1 = 10% of the interval. "
        "Spreads a fleet so it does not hit one target in lock-step.")
    confirm_change: float = Field(
        0.05, ge=0, le=10, description="A run in which a figure the alerts' fast path judges moved by this share or "
        "more from the median of its previous 3 runs, or by 3 times the series' own run-to-run noise if that is "
        "larger, starts a suspicion: it gets a confirmation run (see confirm_runs); 0 turns confirmation runs off. "
        "Probes without such figures ignore it.")
    confirm_runs: int = Field(
        3, ge=0, le=10, description="Confirmation runs a suspicion may ask for, one at a time, each while the figure "
        "still confirms it (still that far from the median it started from): 3 turn a median of 7 within minutes "
        "instead of four intervals; a confirmation that agrees with the old figure (a junk run) ends it. 1: one "
        "confirmation run; 0 turns confirmation runs off.")
    confirm_delay_seconds: float = Field(
        300.0, gt=0, description="Seconds from such a run to its confirmation run, and from each confirmation to "
        "the next; at most half the interval (the default is held to that; a scheduled run that comes first ends "
        "the chain). Longer than the scrape interval, so Prometheus sees each run's figures before the next "
        "replaces them.")

    @model_validator(mode="after")
    def _check_schedule(self) -> ProbeEntryBase:
        interval = self.interval_seconds
        timeout = self.timeout_seconds
        problems = []
        if timeout >= interval:
            problems.append(f"timeout_seconds ({timeout:g}) must be shorter than interval_seconds ({interval:g})")
        if self.jitter_seconds >= interval:
            problems.append(f"jitter_seconds ({self.jitter_seconds:g}) must be shorter than "
                            f"interval_seconds ({interval:g})")
        if "confirm_delay_seconds" in self.model_fields_set and self.confirm_delay_seconds > interval / 2:
            problems.append(f"confirm_delay_seconds ({self.confirm_delay_seconds:g}) must be at most half of "
                            f"interval_seconds ({interval:g})")
        if self.jitter_seconds < 0 and self.jitter_seconds != -1:
            problems.append("jitter_seconds must be >= 0, or -1 for 10% of the interval")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def effective_confirm_delay_seconds(self) -> float:
        """The default 300 s, held to half the interval for probes that run more often than every 10 minutes."""
        return min(self.confirm_delay_seconds, self.interval_seconds / 2)

    @property
    def effective_jitter_seconds(self) -> float:
        return 0.1 * self.interval_seconds if self.jitter_seconds == -1 else self.jitter_seconds


def entry_model(cls: type[Probe]) -> type[ProbeEntryBase]:
    return create_model(
        f"{cls.name}_entry",
        __base__=ProbeEntryBase,
        enabled=(bool, Field(cls.default_enabled, description="Run this probe on schedule.")),
        interval_seconds=(float, Field(cls.default_interval_seconds, gt=0, le=7 * 86400,
                                       description="Seconds between runs.")),
        timeout_seconds=(float, Field(cls.default_timeout_seconds, gt=0,
                                      description="Hard deadline of one run, seconds; the worker's process "
                                      "group is killed at it. Must be shorter than the interval.")),
        params=(cls.Config, Field(default_factory=cls.Config, description=f"{cls.name} settings.")),
    )


@functools.lru_cache(maxsize=8)
def _settings_model(probe_items: tuple[tuple[str, type[Probe]], ...]) -> type[BaseModel]:
    probe_fields: dict[str, Any] = {}
    for name, cls in probe_items:
        model = entry_model(cls)
        probe_fields[name] = (model, Field(default_factory=model))
    probes_model = create_model("ProbesConfig", __config__=ConfigDict(extra="forbid", frozen=True), **probe_fields)

    class Settings(Strict):
        node_name: str = Field("", description="This node's name (env NODE_NAME). Recorded in results; the "
                               "`node` metric label comes from Prometheus relabeling.")
        pool: str = Field("", description="Pool this node belongs to (env FLEETCANARY_POOL); a node_info label.")
        state_dir: str = Field(default_factory=default_state_dir,
                               description="Directory for results history and probe scratch files.")
        log_level: str = Field("info", pattern="^(debug|info|warning|error)$",
                               description="Log level: debug, info, warning or error. Logs go to stderr.")
        server: ServerConfig = Field(default_factory=ServerConfig)
        history: HistoryConfig = Field(default_factory=HistoryConfig)
        gpu: GpuConfig = Field(default_factory=GpuConfig)
        kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
        xid: XidConfig = Field(default_factory=XidConfig)
        alerts: RuleSettings = Field(
            default_factory=RuleSettings,
            description="The fleet's rule settings (docs/alerting.md, 'Settings'): `fleetcanary rules --settings` "
            "reads this section of this file, and the exporter reads its figures' change floors (a quiet series is "
            "one whose run noise is under a fifth of its floor), so a floor changed here moves both.")
        probes: probes_model = Field(default_factory=probes_model)  # type: ignore[valid-type]
        worker_kill_grace_seconds: float = Field(
            2.0, gt=0, le=30, description="Seconds between SIGTERM and SIGKILL to a worker's process group.")

        def probe_entries(self) -> dict[str, ProbeEntryBase]:
            return {name: getattr(self.probes, name) for name, _ in probe_items}

        @model_validator(mode="after")
        def _known_condition_probes(self):
            names = [n for n, _ in probe_items]
            unknown = [p for p in self.kubernetes.node_condition.probes if p not in names]
            if unknown:
                raise ValueError(f"kubernetes.node_condition.probes: unknown probe {', '.join(unknown)}; "
                                 f"known: {', '.join(names)}")
            return self

    return Settings


def settings_model(probe_map: dict[str, type[Probe]] | None = None) -> type[BaseModel]:
    return _settings_model(tuple((probe_map or PROBES).items()))


def _format_errors(exc: ValidationError, source: str) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        msg = msg.removeprefix("Value error, ")
        lines.append(f"{source}: {loc}: {msg}")
    return lines


# --- rules pydantic's lax mode does not hold --------------------------------------------------------------
_NUMBERS = (int, float)


def _numeric_without_bool(ann: Any) -> bool:
    """Whether a value of this annotation may be a number but not a boolean."""
    ann = _unwrap(ann)
    if ann is bool or ann is Any:
        return False
    if isinstance(ann, type) and issubclass(ann, _NUMBERS) and not issubclass(ann, bool):
        return True
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [_unwrap(a) for a in typing.get_args(ann)]
        return any(_numeric_without_bool(a) for a in args) and not any(a is bool or a is Any for a in args)
    return False


def _unwrap(ann: Any) -> Any:
    while typing.get_origin(ann) is typing.Annotated:
        ann = typing.get_args(ann)[0]
    return ann


def _bool_numbers(ann: Any, value: Any, path: str, out: list[str]) -> None:
    """Walk ``value`` (raw YAML data) along the model annotation ``ann``: every boolean given for a number or
    ratio field is a problem. pydantic's lax mode takes True as 1 and 1.0 (`budget_ratio: yes` would be 100%
    of GPU time); YAML 1.1 reads yes/no/on/off as booleans."""
    ann = _unwrap(ann)
    if isinstance(value, bool):
        if _numeric_without_bool(ann):
            out.append(f"{path}: must be a number, not a boolean (YAML reads yes/no/on/off/true/false as "
                       "booleans)")
        return
    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(ann):
            if _unwrap(arg) is not type(None):
                _bool_numbers(arg, value, path, out)
                if isinstance(value, dict) and _is_model(_unwrap(arg)):
                    return
        return
    if _is_model(ann) and isinstance(value, dict):
        fields = ann.model_fields
        for k, v in value.items():
            f = fields.get(k) if isinstance(k, str) else None
            if f is not None:
                _bool_numbers(f.annotation, v, f"{path}.{k}" if path else k, out)
        return
    if isinstance(value, list) and origin in (tuple, list, set, frozenset, collections.abc.Sequence):
        args = typing.get_args(ann)
        for i, v in enumerate(value):
            if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
                if i >= len(args):
                    return
                arg = args[i]
            else:
                arg = args[0] if args else Any
            _bool_numbers(arg, v, f"{path}.{i}", out)
        return
    if isinstance(value, dict) and origin is dict:
        args = typing.get_args(ann)
        for k, v in value.items():
            _bool_numbers(args[1] if len(args) == 2 else Any, v, f"{path}.{k}", out)


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


# Settings that name a file the exporter or a probe reads (not one it writes: a pid or log file may not exist yet).
INPUT_FILE_FIELDS = frozenset({"web_config_file", "token_file", "secret_file", "ca_file", "url_file",
                               "sdc_golden_file"})


def _missing_files(model: BaseModel, path: str, out: list[str]) -> None:
    """Every setting in INPUT_FILE_FIELDS that names a file must name one that exists now, not at the first
    run: a typo is caught by check-config and refused by a reload. Disabled probes are not checked (their
    files may not be mounted)."""
    if isinstance(model, ProbeEntryBase) and not getattr(model, "enabled", True):
        return
    for name in type(model).model_fields:
        value = getattr(model, name)
        where = f"{path}.{name}" if path else name
        if name in INPUT_FILE_FIELDS and isinstance(value, str) and value:
            try:
                st = os.stat(value)
            except FileNotFoundError:
                out.append(f"{where}: file not found: {_one_line(value, 120)}")
                continue
            except OSError as exc:
                out.append(f"{where}: cannot read {_one_line(value, 120)}: {exc.strerror or type(exc).__name__}")
                continue
            if stat.S_ISDIR(st.st_mode):
                out.append(f"{where}: {_one_line(value, 120)} is a directory, not a file")
        _missing_in(value, where, out)


def _missing_in(value: Any, path: str, out: list[str]) -> None:
    if isinstance(value, BaseModel):
        _missing_files(value, path, out)
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            _missing_in(v, f"{path}.{i}", out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _missing_in(v, f"{path}.{k}", out)


def read_bounded(path: str | os.PathLike, source: str) -> bytes:
    """The file's bytes, at most MAX_CONFIG_BYTES, checked before anything is parsed. A FIFO, a device or a
    directory is refused without blocking or reading it (core/statefile.read_raw; a link is followed: a
    ConfigMap's file is one)."""
    raw, kind, detail = statefile.read_raw(path, MAX_CONFIG_BYTES, follow_links=True)
    if raw is not None:
        return raw
    if not kind:
        raise ConfigError([f"{source}: file not found"])
    if kind == "too_large":
        raise ConfigError([f"{source}: larger than {MAX_CONFIG_BYTES >> 20} MiB ({detail}); not a config file"])
    raise ConfigError([f"{source}: cannot read: {'not a regular file' if kind == 'not_a_file' else detail}"])


def load(path: str | os.PathLike | None = None, *, env: dict[str, str] | None = None,
         probe_map: dict[str, type[Probe]] | None = None, check_files: bool = True):
    """Load and validate the config. Raises ConfigError with one line per problem, never anything else (a
    hostile file included: too large, too deep, duplicate keys, booleans for numbers). ``check_files``: each
    input file setting (INPUT_FILE_FIELDS) of the server and of enabled probes must name an existing file."""
    env = os.environ if env is None else env
    source = str(path) if path else "<defaults>"
    try:
        return _load(path, env, probe_map, source, check_files)
    except ConfigError as exc:
        raise ConfigError([_one_line(line, 400) for line in exc.lines] or [f"{source}: invalid"]) from None
    except RecursionError:
        raise ConfigError([f"{source}: nested too deeply to read"]) from None
    except Exception as exc:  # noqa: BLE001 - a loader bug is still one line and a refused config, never a crash
        raise ConfigError([f"{source}: cannot load: {type(exc).__name__}: {_one_line(str(exc))}"]) from None


def _load(path, env, probe_map, source: str, check_files: bool):
    data: Any = {}
    if path is not None:
        data = parse_yaml(read_bounded(path, source), source)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError([f"{source}: (top level): must be a mapping of settings, not {type(data).__name__}"])
    if renamed := config_keys.apply_renames(data, source):
        raise ConfigError([f"{source}: {p}" for p in renamed])
    for var, dotted in ENV_OVERRIDES.items():
        if env.get(var):
            config_keys.set_path(data, dotted, env[var])
    model = settings_model(probe_map)
    problems: list[str] = []
    _bool_numbers(model, data, "", problems)
    if problems:
        # alone: validating the coerced 1/1.0 would add errors about a value the file never gave
        raise ConfigError([f"{source}: {p}" for p in problems])
    try:
        settings = model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None
    if check_files:
        _missing_files(settings, "", problems)
    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    return settings
