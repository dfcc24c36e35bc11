"""The fleet's rule settings: every threshold, selector and link of the generated rules, in one model.

A deployer overrides them once, as a YAML file of these keys (`fleetcanary rules --settings FILE`), or as the
`alerts` section of the exporter's own config (docs/configuration.md; the same file then goes to `fleetcanary
rules --settings`). The exporter reads the section too: a figure's change floor is also the judge's bound of a
quiet series (fleetcanary.judge.figures.configured), so a floor changed there moves the rules and the exporter
together. The figures' own defaults (floors, MADs, alert names) are declared once, in
fleetcanary.judge.figures; `figures` here holds only what a deployer changes.

Keys of a release are a promise (docs/stability.md): a renamed key is read for a minor release with a warning
(RENAMED, as fleetcanary.core.config_keys does for the exporter's config).
"""
from __future__ import annotations

import logging
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetcanary.core import matchers

log = logging.getLogger("fleetcanary.rules")

DURATION = r"^(\d+[smhd])+$"
# old key -> new key of the rule settings (read for one minor release, with a warning). Empty until one is renamed.
RENAMED: dict[str, str] = {}


def seconds(d: str) -> int:
    """A duration of the settings (DURATION: 90s, 5m, 1h30m, 2d) in seconds."""
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[u] for n, u in re.findall(r"(\d+)([smhd])", d))


def runbook_base() -> str:
    """The runbooks of this release (its tag), so a page links to what was true of the rules that sent it; a
    development build (a local version, or none) links to main."""
    from fleetcanary.core.version import version

    v = version()
    ref = f"v{v}" if re.fullmatch(r"\d+\.\d+\.\d+", v) else "main"
    return f"https://github.com/fleetcanary/fleetcanary/blob/{ref}/docs/runbooks.md"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        """A boolean is never a number here (YAML reads yes/no/on/off as booleans; pydantic's lax mode would take
        `yes` as 1)."""
        if isinstance(data, dict):
            bad = [k for k, v in data.items() if isinstance(v, bool) and k in cls.model_fields
                   and cls.model_fields[k].annotation not in (bool, "bool")]
            if bad:
                raise ValueError(f"{', '.join(bad)}: must be a number, not a boolean")
        return data


class FigureSettings(_Model):
    """A deployer's change to one judged figure's thresholds; unset: fleetcanary.judge.figures' default."""
    floor: float | None = Field(None, ge=0, description="Change path: at least this far from the peers' median "
                                "change. Also the exporter's bound of a quiet series (a fifth of it).")
    k_mad: float | None = Field(None, ge=0, description="... and more than this many MADs of the peers' change "
                                "ratios.")
    history_floor: float | None = Field(None, ge=0, description="Regression and driver change: at least this far "
                                        "from its own best day.")
    interval_minutes: float | None = Field(None, ge=0, description="The `for` of its alerts (default: its probe's "
                                           "default interval).")


class RuleSettings(_Model):
    """The settings of the generated rules (alerts/build.py); docs/alerting.md, 'Settings'."""
    selector: str = Field("", description="Label matchers added to every fleetcanary selector of every rule, e.g. "
                          "`cluster=\"gpu-west\"`; refused unless they are PromQL label matchers.")
    peer_labels: tuple[str, ...] = Field((), description="Extra labels peers share, e.g. [cluster] (added to every "
                                         "peer grouping).")
    runbook_url: str = Field(default_factory=lambda: runbook_base() + "#{anchor}",
                             description="The runbook link of every alert; {anchor} is the alert name in lower case.")
    interval: str = Field("5m", pattern=DURATION, description="Evaluation interval of the peer, own-history and "
                          "coverage groups.")
    spread_interval: str = Field("15m", pattern=DURATION, description="Evaluation interval of the peers' spread "
                                 "(the MADs the gates scale) and node counts: slow to move, and two fifths of the "
                                 "peer group's cost at 2,000 nodes. The alerts read the newest within two intervals "
                                 "and a minute; at least `interval`.")
    hard_interval: str = Field("1m", pattern=DURATION, description="Evaluation interval of the hard failures, "
                               "inventory, NIC and fabric groups.")
    min_peers: int = Field(5, ge=1, description="Peer nodes a peer verdict needs.")
    level_floor: float = Field(0.10, ge=0, description="Level path: at least this far from the peers' median "
                               "level ...")
    level_k_mad: float = Field(5, ge=0, description="... and more than this many MADs (the peer fast path too).")
    fast_floor: float = Field(0.15, ge=0, description="Fast paths: the newest runs this far from the peers' level "
                              "(own_fast: from the best day).")
    drift_floor: float = Field(0.04, ge=0, description="Drift path: the last day this far from the best day.")
    hold: bool = Field(True, description="A firing judged alert holds while its gap stays past half its floor.")
    hold_gap: str = Field("6h", pattern=DURATION, description="... and through a gap this long in its figure "
                          "(last_over_time of the value recorded while it fired).")
    pools: tuple[str, ...] = Field((), description="Pools that get their own peer and own-history groups.")
    nvlink_domain_min_nodes: int = Field(2, ge=1, description="FleetCanaryNVLinkDomainDegraded: nodes of one NVLink "
                                         "domain with a fabric fault or NVLinks down.")
    coverage_min_share: float = Field(0.5, ge=0, le=1, description="FleetCanaryPoolUnmeasured: fewer of a pool's "
                                      "GPUs than this had a successful run of a probe ...")
    coverage_intervals: int = Field(3, ge=1, description="... in its last this many intervals.")
    inference_ttft_p95_seconds: float = Field(2.0, gt=0, description="FleetCanaryInferenceTTFTSLOBreach: the p95 "
                                              "time to first token over 30 minutes above this (MLPerf's server "
                                              "limit).")
    inference_itl_p95_seconds: float = Field(0.2, gt=0, description="FleetCanaryInferenceITLSLOBreach: the p95 "
                                             "inter-token latency above this.")
    inference_error_ratio: float = Field(0.1, ge=0, le=1, description="FleetCanaryInferenceErrors: the share of "
                                         "canary requests failing over 15 minutes above this.")
    inference_ttft_peer_ratio: float = Field(1.1, ge=1, description="FleetCanaryInferenceTTFTSlowerThanPeers: the "
                                             "node's TTFT p95 above this many times its pool's median.")
    rdma_line_errors_per_hour: float = Field(10, ge=0, description="FleetCanaryRDMAPortErrorsRising: a port's "
                                             "line error counters (symbol errors, link recoveries, receive errors "
                                             "...) rising by more than this in an hour (infiniband-diags' "
                                             "ibcheckerrs default).")
    rdma_discards_per_hour: float = Field(100, ge=0, description="... or its transmit discards by more than this.")
    net_carrier_changes_per_hour: float = Field(4, ge=0, description="FleetCanaryNetInterfaceFlapping: carrier "
                                                "changes in an hour (a down and up is 2).")
    net_errors_per_hour: float = Field(10, ge=0, description="FleetCanaryNetInterfaceErrors: an interface's errors "
                                       "in an hour above this.")
    fabric_slow_ratio: float = Field(0.7, gt=0, le=1, description="Fabric: a pair below this share of the pool's "
                                     "reference pair bandwidth is slow.")
    fabric_reference_quantile: float = Field(0.75, gt=0, le=1, description="Fabric: the pool's reference, this "
                                             "quantile of its current pair figures.")
    fabric_min_partners: int = Field(3, ge=1, description="Fabric: distinct partners measured in the hour before a "
                                     "node is judged.")
    fabric_unreachable_share: float = Field(0.5, gt=0, le=1, description="FleetCanaryFabricNodeUnreachable: the "
                                            "share of its slots a node missed its partner in, while the pool's "
                                            "median node misses fewer.")
    figures: dict[str, FigureSettings] = Field(default_factory=dict, description="Per judged figure (by its key): "
                                               "floor, k_mad, history_floor, interval_minutes.")

    @field_validator("selector")
    @classmethod
    def _matchers(cls, v: str) -> str:
        try:
            matchers.parse(v)
        except ValueError as exc:
            raise ValueError(f"not PromQL label matchers: {exc}") from None
        return v

    @field_validator("peer_labels", "pools")
    @classmethod
    def _names(cls, v: tuple[str, ...], info) -> tuple[str, ...]:
        bad = [n for n in v if not n or (info.field_name == "peer_labels" and not matchers.NAME.fullmatch(n))]
        if bad:
            raise ValueError(f"not label names: {bad}" if info.field_name == "peer_labels" else "empty pool name")
        return v

    @model_validator(mode="after")
    def _spread_not_faster(self) -> RuleSettings:
        if seconds(self.spread_interval) < seconds(self.interval):
            raise ValueError(f"spread_interval {self.spread_interval} is shorter than interval {self.interval}: the "
                             "peers' spread is read by the peer groups, and no faster than they run")
        return self

    @field_validator("runbook_url")
    @classmethod
    def _anchor(cls, v: str) -> str:
        try:
            v.format(anchor="x")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{anchor}} may be in braces: {exc}") from None
        return v


def renamed(data: dict, source: str) -> dict:
    """The settings with each renamed key under its new name, and a warning line for each."""
    out = dict(data)
    for old, new in RENAMED.items():
        if old in out:
            if new in out:
                raise ValueError(f"both {old!r} and its new name {new!r} are given")
            log.warning("%s: rule setting %r is renamed %r; read as that (the old name goes in a later release)",
                        source, old, new)
            out[new] = out.pop(old)
    return out
