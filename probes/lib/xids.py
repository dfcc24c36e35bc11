"""The XID catalogue (xid_catalogue.yaml beside this module: each code's class, severity, meaning and first
action, from NVIDIA's XID documentation; the file names its sources) and the parsing of the kernel's Xid
and SXid lines. Shared by gpu_health's NVML event wait, the XID watch's reader and the daemon (which
never imports NVML); data, not code, so that a site changes a code's class with `xid.overrides`.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from importlib import resources

CLASSES = ("hardware", "memory", "bus", "nvlink", "driver", "thermal", "application")
SEVERITIES = ("critical", "warning", "info", "ignore")
UNKNOWN_CLASS = "unknown"   # a code the catalogue does not list: counted, alerted as a warning


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    cls: str
    severity: str
    meaning: str
    action: str

    @property
    def pages(self) -> bool:
        """A code that pages on first sight: a critical one of a hardware-side class."""
        return self.severity == "critical" and self.cls in ("hardware", "memory", "bus", "nvlink")


@functools.lru_cache(maxsize=1)
def _load() -> tuple[dict[int, XidInfo], tuple[str, ...]]:
    from fleetcanary.probes.lib import yamltext

    text = resources.files("fleetcanary.probes.lib").joinpath("xid_catalogue.yaml").read_text(encoding="utf-8")
    data = yamltext.load(text)
    out = {}
    for code, e in data["xids"].items():
        if e["class"] not in CLASSES or e["severity"] not in SEVERITIES:
            raise ValueError(f"xid_catalogue.yaml: XID {code}: class {e['class']!r} or severity {e['severity']!r} "
                             "is not one of the known ones")
        out[int(code)] = XidInfo(int(code), str(e["name"]), e["class"], e["severity"], " ".join(e["meaning"].split()),
                                 " ".join(e["action"].split()))
    return out, tuple(data.get("sources") or ())


def catalogue() -> dict[int, XidInfo]:
    return dict(_load()[0])


def sources() -> tuple[str, ...]:
    return _load()[1]


def lookup(code: int, overrides: dict | None = None) -> XidInfo:
    """The catalogue's entry for ``code`` with the site's override applied ({code: {"class", "severity",
    "action"}}, validated by the config); a code it does not list: class unknown, severity warning."""
    info = _load()[0].get(code) or XidInfo(code, f"XID {code}", UNKNOWN_CLASS, "warning",
                                           "Not in fleetcanary's XID catalogue.",
                                           "Look the code up in NVIDIA's XID catalogue.")
    o = (overrides or {}).get(code) or (overrides or {}).get(str(code))  # a job's context has string keys
    if o:
        info = replace(info, **{("cls" if k == "class" else k): v for k, v in o.items() if v is not None})
    return info


# --- the kernel's lines -------------------------------------------------------------------------------------
# NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-9A-Fa-f])?\): "
                      r"(\d+)(?:,|\s|$)(.*)")
# nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)
SXID_LINE = re.compile(r"nvidia-nvswitch(\d*): SXid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})"
                       r"(?:\.[0-9A-Fa-f])?\): (\d+)(?:,|\s|$)(.*)")
_PID = re.compile(r"(?:^|,\s*)pid=('?)(<unknown>|\d+)\1")
_NAME = re.compile(r"(?:^|,\s*)name=([^,]*)")
_LINK = re.compile(r"\blink (\d+)", re.IGNORECASE)
_RECOVERY = re.compile(r"GPU recovery action changed from \S+ \(([^)]*)\) to \S+ \(([^)]*)\)", re.IGNORECASE)


def details(code: int, message: str) -> dict[str, str]:
    """What the rest of an Xid line carries: pid and process name (where the driver knew them), the NVLink
    link (74 and the NVLink family), the new recovery action (154: "Reboot Required", "Drain and Reset" ...).
    Only what is there; never raises."""
    out: dict[str, str] = {}
    m = _PID.search(message)
    if m and m.group(2) != "<unknown>":
        out["pid"] = m.group(2)
    m = _NAME.search(message)
    if m and m.group(1).strip() not in ("", "<unknown>"):
        out["name"] = m.group(1).strip()[:64]
    m = _LINK.search(message)
    if m:
        out["link"] = m.group(1)
    m = _RECOVERY.search(message)
    if m:
        out["recovery_action"] = m.group(2).strip()[:64]
    elif code == 154:
        tail = message.rsplit("(", 1)
        if len(tail) == 2 and tail[1].rstrip(" .").endswith(")"):
            out["recovery_action"] = tail[1].rstrip(" .")[:-1].strip()[:64]
    return out


def severity_of(info: XidInfo, detail: dict[str, str]) -> str:
    """154 says in its text whether anything is needed: "None" is not a fault."""
    if info.code == 154 and detail.get("recovery_action", "").lower() == "none":
        return "info"
    return info.severity


def sxid_severity(message: str) -> str:
    """An NVSwitch SXid says Fatal or Non-fatal after its code."""
    head = message.lstrip(", ").lower()
    return "warning" if head.startswith("non-fatal") else "critical" if head.startswith("fatal") else "warning"
