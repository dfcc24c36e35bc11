"""Which rule an alert matches, and what a set of rules asks of a node (the union of their actions and the
longest of their holds). Pure functions of the settings and the alert."""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import Rule, Settings
from .webhook import Alert


def matches(rule: Rule, alert: Alert) -> bool:
    m = rule.match
    if m.alertnames and alert.name not in m.alertnames:
        return False
    if m.severities and alert.labels.get("severity") not in m.severities:
        return False
    return all(alert.labels.get(k) == v for k, v in m.labels.items())


def rule_for(settings: Settings, alert: Alert) -> Rule | None:
    """The first rule that matches (rules are ordered as in the file, most specific first)."""
    return next((r for r in settings.rules if matches(r, alert)), None)


@dataclass
class Wanted:
    """What the controller wants on a node: labels, a taint effect, a cordon, and the hold."""
    labels: dict[str, str] = field(default_factory=dict)
    taint_effect: str | None = None
    cordon: bool = False
    min_hold_seconds: float = 0.0

    def add(self, rule: Rule) -> None:
        a = rule.actions
        self.labels.update(a.labels)
        if a.taint is not None and self.taint_effect != "NoSchedule":
            self.taint_effect = a.taint.effect   # NoSchedule is the stronger of the two
        self.cordon = self.cordon or a.cordon
        self.min_hold_seconds = max(self.min_hold_seconds, rule.min_hold_seconds)

    def describe(self, taint_key: str) -> str:
        parts = [f"label {k}={v}" for k, v in sorted(self.labels.items())]
        if self.taint_effect:
            parts.append(f"taint {taint_key}:{self.taint_effect}")
        if self.cordon:
            parts.append("cordon")
        return ", ".join(parts) or "nothing"
