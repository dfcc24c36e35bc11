"""The fabric probe's settings and metric names, shared by its modules (none imports
another in a circle)."""
from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetcanary.probes.lib.gpu_probe import GpuProbeConfig, GpuSeconds
from fleetcanary.probes.lib.kube_pods import DaemonSetPods

PROBE = "fabric"
ELEMENT = 4  # float32
DEFAULT_SIZES = (8, 1 << 10, 64 << 10, 1 << 20)
PROTOCOL = "fleetcanary-fabric/1"
SECRET_ENV = "FLEETCANARY_FABRIC_SECRET"
MIN_SECRET_BYTES = 16
FAULT_ENV = "FLEETCANARY_FABRIC_FAULT"   # tests: "corrupt" flips one received element before the check

BUSBW = "fleetcanary_fabric_bus_bandwidth_bytes_per_second"
LAT = "fleetcanary_fabric_latency_seconds"
SENDRECV = "fleetcanary_fabric_sendrecv_bandwidth_bytes_per_second"
PARTNER = "fleetcanary_fabric_last_partner_info"
PAIR_SLOT = "fleetcanary_fabric_pair_slot_timestamp_seconds"
SLOT = "fleetcanary_fabric_slot_seconds"
MEMBERS = "fleetcanary_fabric_members"
REJECTED = "fleetcanary_fabric_rendezvous_rejected_total"
REJECT_REASONS = ("unexpected_address", "bad_handshake", "silent")

NCCL_ENV_ALLOWLIST = ("NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_TC",
                      "NCCL_IB_SL", "NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT", "NCCL_IB_DISABLE",
                      "NCCL_IB_PCI_RELAXED_ORDERING",
                      "NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_CROSS_NIC",
                      "NCCL_ALGO", "NCCL_PROTO", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class Member(BaseModel):
    """One fabric member: its name (the node name its own daemon runs under) and the address
    its rendezvous listens on (host or IP, optionally with :port; IPv6 as [addr]:port)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(description="The member's node name (what `node_name` is on that node).")
    address: str = Field(description="host, IP, host:port or [IPv6]:port of its rendezvous listener.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("a member name is letters, digits, '.', '_' or '-' (at most 253)")
        return v


class Config(GpuProbeConfig, DaemonSetPods):
    expected_gpu_seconds: GpuSeconds = 5.0
    members_from: Literal["static", "kubernetes"] = Field(
        "static", description="static: the `members` list; kubernetes: the pods of this DaemonSet "
        "(`kubernetes_label_selector` in `kubernetes_namespace`), named by their node, at their pod IP.")
    members: tuple[Member, ...] = Field((), description="The fabric members (static); this node is among them.")
    member_name: str = Field("", description="This node's member name; empty: the daemon's node_name.")
    port: int = Field(29400, ge=1, le=65535, description="Rendezvous TCP port (members without their own :port).")
    slot_seconds: float = Field(
        300.0, ge=5, le=86400, description="Length of one schedule slot, seconds; one partner per slot. Keep it "
        "equal to the probe's interval_seconds.")
    meet_offset_seconds: float = Field(
        5.0, ge=0, description="Seconds after the slot starts by which both sides are at the rendezvous.")
    rendezvous_wait_seconds: float = Field(
        8.0, gt=0, le=120, description="How long past the meeting time the host listens and the guest keeps "
        "trying; past it the partner counts as unavailable (skip peer_unavailable).")
    handshake_timeout_seconds: float = Field(
        2.0, gt=0, le=30, description="A connection that has not sent a complete hello by then is dropped.")
    secret_file: str = Field(
        "", description=f"File holding the fleet's shared secret (>= {MIN_SECRET_BYTES} bytes); empty: the "
        f"{SECRET_ENV} environment variable. Never logged, published or recorded.")
    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="auto: NCCL on one GPU where GPUs exist, else gloo over TCP.")
    collectives: tuple[Literal["all_reduce", "all_gather"], ...] = Field(
        ("all_reduce", "all_gather"), description="Collectives swept over `sizes_bytes`.")
    sizes_bytes: tuple[int, ...] = Field(DEFAULT_SIZES, description="Collective message sizes, bytes "
                                         "(nccl-tests' size definition); each a label value.")
    sendrecv_bytes: int = Field(16 << 20, ge=1 << 10, le=8 << 30,
                                description="Message size of the send/recv bandwidth ping-pong, bytes.")
    warmup_iterations: int = Field(2, ge=0, le=100, description="Untimed iterations per size.")
    iterations: int = Field(10, ge=1, le=1000, description="Timed iterations per collective size.")
    sendrecv_iterations: int = Field(5, ge=1, le=1000, description="Timed ping-pongs of sendrecv_bytes.")
    collective_timeout_seconds: float = Field(
        60.0, gt=0, description="Timeout of the store and of each collective; capped below the probe's deadline.")
    gpu_index: int | None = Field(None, ge=0, description="GPU for the NCCL rank; None: the first usable one.")
    nccl_env: dict[str, str] = Field(default_factory=dict, description="NCCL variables to set (names from "
                                     "`nccl_env_allowlist`), e.g. NCCL_IB_HCA: mlx5_0:1.")
    nccl_env_allowlist: tuple[str, ...] = Field(
        NCCL_ENV_ALLOWLIST, description="NCCL_* variables passed from the daemon's environment to NCCL; every "
        "other NCCL_* variable is removed before NCCL starts.")

    @field_validator("members")
    @classmethod
    def _unique(cls, v):
        names = [m.name for m in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"member names must be unique; repeated: {dup}")
        return v

    @model_validator(mode="after")
    def _window(self) -> Config:
        if self.meet_offset_seconds + self.rendezvous_wait_seconds >= self.slot_seconds:
            raise ValueError(f"meet_offset_seconds + rendezvous_wait_seconds ({self.meet_offset_seconds:g} + "
                             f"{self.rendezvous_wait_seconds:g}) must be shorter than "
                             f"slot_seconds ({self.slot_seconds:g})")
        return self

    @field_validator("nccl_env")
    @classmethod
    def _nccl(cls, v):
        bad = sorted(k for k in v if not k.startswith("NCCL_"))
        if bad:
            raise ValueError(f"nccl_env holds NCCL_* variables only; not: {bad}")
        return v


def parse_address(address: str, default_port: int) -> tuple[str, int]:
    """(host, port) from host, host:port, [v6] or [v6]:port. ValueError with a one-line message."""
    a = address.strip()
    if a.startswith("["):
        host, _, rest = a[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"bad address {address!r}")
    elif a.count(":") == 1:
        host, _, port = a.partition(":")
    else:
        host, port = a, ""
    if not host:
        raise ValueError(f"bad address {address!r}: no host")
    if port:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"bad address {address!r}: port must be 1..65535")
        return host, int(port)
    return host, default_port
