"""The XID watcher's worker: reads the kernel log and writes one JSON line per NVIDIA Xid record.

    python -m fleetcanary.runner.xid_reader --source /dev/kmsg [--after-seq N]

With `--source nvml` it waits on NVML's critical-XID events instead (no kernel log needed; the GPU's
PCI bus ID comes with each event), exiting 3 where NVML or its events are not there.

The kernel log is read as /dev/kmsg records ("PRI,SEQ,USEC,FLAGS;MESSAGE"), one per read on the
device, one per line in a file (a recorded log, tests). The NVIDIA driver logs an XID as

    NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.

(older drivers without "PCI:"), and an NVSwitch error (HGX and NVL systems, the switch's PCI bus ID) as

    nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)

Output, on stdout: {"seq", "usec", "pci", "xid", "message"} per Xid record, {"seq", "usec", "pci", "sxid",
"message"} per SXid record, and {"ready": seq} once the reader is positioned. Without --after-seq it starts after the
newest record present (XIDs before the exporter started are not its to count); with it (a restart of
the watcher) it goes on after that record, so nothing logged while the watcher was down is lost while
the kernel's ring buffer still holds it. A record that the ring buffer overwrote before it was read
(EPIPE on /dev/kmsg) is counted as `{"lost": n}`.

Runs in its own process, as a probe worker does: the daemon never reads the kernel log or NVML itself,
and a reader that hangs or dies is restarted by the daemon (daemon/xid_watch.py).
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import select
import stat
import sys
import time

from fleetcanary.probes.lib import xids

XID = xids.XID_LINE     # NVRM: Xid (PCI:0000:18:00): 79, pid=..., name=..., text
SXID = xids.SXID_LINE   # nvidia-nvswitchN: SXid (PCI:0000:05:00.0): 12028, Non-fatal, text
POLL_SECONDS = 0.2   # a regular file has no readiness: how often its end is looked at again


def parse(record: str) -> tuple[int, int, str] | None:
    """A kmsg record -> (seq, usec, message), or None."""
    head, sep, message = record.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    try:
        return int(fields[1]), int(fields[2]), message.rstrip("\n")
    except (IndexError, ValueError):
        return None


def xid(message: str) -> tuple[str, int, str] | None:
    m = XID.search(message)
    if not m:
        return None
    return m.group(1).lower(), int(m.group(2)), m.group(3).strip()[:300]


def sxid(message: str) -> tuple[str, int, str] | None:
    m = SXID.search(message)
    if not m:
        return None
    return m.group(2).lower(), int(m.group(3)), m.group(4).strip()[:300]


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _wait_readable(fd: int, seconds: float) -> None:
    """Until ``fd`` is readable or ``seconds`` pass; poll, not select.select (which fails on a descriptor
    numbered 1024 or more)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    p.poll(int(seconds * 1000))


def records_from_device(fd: int):
    """/dev/kmsg: one record per read; EPIPE: records were overwritten before being read."""
    while True:
        try:
            data = os.read(fd, 16384)
        except OSError as e:
            if e.errno == errno.EPIPE:
                yield None
                continue
            if e.errno == errno.EAGAIN:
                _wait_readable(fd, 5.0)
                continue
            raise
        if not data:
            return
        yield data.decode("utf-8", "replace")


def records_from_file(f):
    """A file: follow it like `tail -f` (a line at a time; a partial last line waits for its end)."""
    buf = ""
    while True:
        chunk = f.readline()
        if chunk:
            buf += chunk
            if buf.endswith("\n"):
                yield buf
                buf = ""
            continue
        time.sleep(POLL_SECONDS)


UNAVAILABLE = 3  # exit status: this source cannot work here (no NVML, no events); the daemon stops trying


def from_nvml() -> int:
    """NVML's critical-XID events, for as long as the process lives: {"xid", "gpu", "pci"} per event."""
    from fleetcanary.probes.lib import nvml

    try:
        session = nvml.open_session()
    except nvml.NvmlUnavailable as e:
        print(f"xid reader: NVML: {e}", file=sys.stderr)
        return UNAVAILABLE
    with session:
        stream = session.xid_event_stream(session.handles())
        try:
            first = next(stream)           # registered: watching from here
        except nvml.NvmlUnavailable as e:
            print(f"xid reader: {e}", file=sys.stderr)
            return UNAVAILABLE
        emit({"ready": None})
        try:
            ev = first
            while True:
                if ev:
                    emit({"xid": ev["xid"], "pci": ev["pci_bus_id"], "gpu": ev["gpu"], "message": "NVML event"})
                ev = next(stream)
        except (BrokenPipeError, KeyboardInterrupt):
            return 0
        except session.lib.NVMLError as e:
            print(f"xid reader: NVML event wait: {e}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="/dev/kmsg", help="/dev/kmsg, a file of kmsg records, or nvml")
    ap.add_argument("--after-seq", type=int, default=None)
    args = ap.parse_args(argv)
    if args.source == "nvml":
        return from_nvml()
    try:
        device = stat.S_ISCHR(os.stat(args.source).st_mode)
        if device:
            fd = os.open(args.source, os.O_RDONLY)
            if args.after_seq is None:
                os.lseek(fd, 0, os.SEEK_END)
            records = records_from_device(fd)
        else:
            f = open(args.source, encoding="utf-8", errors="replace")  # noqa: SIM115 - held for the process's life
            records = records_from_file(f)
    except OSError as e:
        print(f"xid reader: cannot read {args.source}: {e.strerror}", file=sys.stderr)
        return 2
    after = args.after_seq
    if after is None and not device:  # a file: skip what it holds, and say where that ends
        after = -1
        for line in iter(f.readline, ""):
            parsed = parse(line) if line.endswith("\n") else None
            if parsed:
                after = parsed[0]
    # the device was put at its end: its first record's sequence number says where that was
    emit({"ready": after})
    if after is None:
        after = -1
    try:
        for rec in records:
            if rec is None:
                emit({"lost": 1})
                continue
            parsed = parse(rec)
            if parsed is None:
                continue
            seq, usec, message = parsed
            if seq <= after:
                continue
            after = seq
            found = xid(message)
            if found:
                pci, code, detail = found
                emit({"seq": seq, "usec": usec, "pci": pci, "xid": code, "message": detail})
            elif (found := sxid(message)):
                pci, code, detail = found
                emit({"seq": seq, "usec": usec, "pci": pci, "sxid": code, "message": detail})
            else:
                emit({"seq": seq})
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
