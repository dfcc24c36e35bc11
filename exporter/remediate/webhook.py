"""Alertmanager's webhook payload (version 4), parsed and bounded. What the controller reads of it: each
alert's status, labels, annotations, start and end, and fingerprint. Anything else Alertmanager adds is
ignored; anything malformed is refused with one line (BadPayload), never a traceback."""
from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_ALERTS = 1000       # Alertmanager's max_alerts is unlimited by default; a group of a whole fleet fits
MAX_TEXT = 4096         # a label or annotation value (descriptions are a few hundred characters)


class BadPayload(Exception):
    """One line saying what is wrong with the body."""


class Alert(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(max_length=64)
    annotations: dict[str, str] = Field(default_factory=dict, max_length=64)
    startsAt: str = ""  # noqa: N815 - Alertmanager's field names
    endsAt: str = ""  # noqa: N815
    fingerprint: str = Field(min_length=1, max_length=64, pattern=r"^[0-9a-fA-F]+$")

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")


class Payload(BaseModel):
    model_config = ConfigDict(extra="ignore")
    version: Literal["4"]
    status: Literal["firing", "resolved"]
    alerts: list[Alert] = Field(max_length=MAX_ALERTS)


def parse(body: bytes) -> Payload:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadPayload(f"not JSON: {str(exc)[:120]}") from None
    except RecursionError:
        raise BadPayload("not JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise BadPayload(f"not an Alertmanager webhook: a JSON {type(data).__name__}, not an object")
    try:
        payload = Payload.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise BadPayload(f"not an Alertmanager webhook v4: {loc}: {err['msg'][:160]}"
                         + (f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else "")) from None
    for a in payload.alerts:
        if any(len(v) > MAX_TEXT for v in (*a.labels.values(), *a.annotations.values())):
            raise BadPayload(f"alert {a.fingerprint}: a label or annotation longer than {MAX_TEXT} characters")
    return payload
