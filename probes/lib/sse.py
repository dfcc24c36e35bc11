"""An incremental server-sent events parser that keeps each event's arrival time.

Written here because the maintained SSE clients (sseclient-py, httpx-sse) parse from
an iterator of lines and cannot say when each event's bytes arrived, which is what
time-to-first-token and inter-token latency are made of.

Follows the WHATWG event-stream rules: lines end in CRLF, LF or CR (a CR at the end
of one read and an LF at the start of the next are one line end); a blank line
dispatches the event; ``:`` starts a comment; ``data`` lines are joined with LF;
one space after the colon is dropped; unknown fields are ignored. One deliberate
difference: an event with a type but no data (a bare ``event: error``) is dispatched
rather than dropped, so a server's error signal is never lost. An event's time
is the arrival time of the read that completed it (the one holding its blank line).
Bytes that are not UTF-8 are replaced, never raised.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass
class Event:
    event: str          # "message" unless the stream named it
    data: str
    id: str | None
    arrival_ns: int     # perf_counter_ns of the read that completed the event
    comment_only: bool = False


class SSEParser:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._seen_field = False
        self.comments = 0
        self.bytes = 0

    def feed(self, chunk: bytes, arrival_ns: int) -> list[Event]:
        """Parse one read's bytes; returns the events it completed."""
        self.bytes += len(chunk)
        self._buf += self._decoder.decode(chunk)
        return self._lines(arrival_ns, final=False)

    def close(self, arrival_ns: int) -> list[Event]:
        """End of stream: a trailing line without its blank line is not dispatched (per spec)."""
        self._buf += self._decoder.decode(b"", final=True)
        return self._lines(arrival_ns, final=True)

    def _lines(self, t: int, final: bool) -> list[Event]:
        out: list[Event] = []
        buf = self._buf
        pos = 0
        n = len(buf)
        while pos < n:
            cr = buf.find("\r", pos)
            lf = buf.find("\n", pos)
            if cr == -1 and lf == -1:
                break
            if cr != -1 and (lf == -1 or cr < lf):
                if cr == n - 1 and not final:
                    break  # a CR at the end: an LF may follow in the next read
                end, nxt = cr, cr + 2 if cr + 1 < n and buf[cr + 1] == "\n" else cr + 1
            else:
                end, nxt = lf, lf + 1
            self._line(buf[pos:end], t, out)
            pos = nxt
        self._buf = buf[pos:]
        if final and self._buf:
            self._line(self._buf, t, out)  # a last line without an end: processed, not dispatched
            self._buf = ""
        return out

    def _line(self, line: str, t: int, out: list[Event]) -> None:
        if line == "":
            if self._seen_field:
                out.append(Event(self._event or "message", "\n".join(self._data), self._id, t))
            self._data, self._event, self._seen_field = [], "", False
            return
        if line.startswith(":"):
            self.comments += 1
            return
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._seen_field = True
        elif field == "event":
            self._event = value
            self._seen_field = True
        elif field == "id":
            if "\x00" not in value:
                self._id = value
            self._seen_field = True
        # "retry" and unknown fields are ignored
