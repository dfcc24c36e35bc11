"""An incremental server-sent events parser that keeps each event's arrival time.

Written here because the maintained SSE clients (sseclient-py, httpx-sse) parse from
an iterator of lines and cannot say when each event's bytes arrived, which is what
time-to-first-token and inter-token latency are made of; nor do they bound a line.

Follows the WHATWG event-stream rules: lines end in CRLF, LF or CR (a CR at the end
of one read and an LF at the start of the next are one line end); a blank line
dispatches the event; ``:`` starts a comment; ``data`` lines are joined with LF;
one space after the colon is dropped; unknown fields are ignored; a leading UTF-8
BOM is dropped. One deliberate difference: an event with a type but no data (a bare
``event: error``) is dispatched rather than dropped, so a server's error signal is
never lost. An event's time is the arrival time of the read that completed it (the
one holding its blank line).

What a careful client needs that the spec leaves open, decided here:
- strict UTF-8: a line that is not UTF-8 stops the parser with ``error`` set (the
  spec would replace the bytes with U+FFFD, which turns a corrupted token into a
  "successful" answer);
- bounded memory: a line, or an event's joined data, longer than ``max_line_bytes``
  (default 1 MiB) stops the parser with ``error`` set, instead of buffering forever;
- linear cost: bytes are scanned for line ends once (a regular expression from the
  last unscanned byte), never re-scanned as a line grows; ``work`` counts the bytes
  scanned and copied, so tests can check the cost is linear without a clock.
After an error, ``feed`` and ``close`` return no events: the stream is broken.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_MAX_LINE_BYTES = 1 << 20
_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


@dataclass
class Event:
    event: str          # "message" unless the stream named it
    data: str
    id: str | None
    arrival_ns: int     # perf_counter_ns of the read that completed the event
    comment_only: bool = False


class SSEParser:
    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if max_line_bytes < 16:
            raise ValueError("max_line_bytes must be at least 16")
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        self._scanned = 0          # bytes of _buf already searched for a line end
        self._data: list[str] = []
        self._data_bytes = 0
        self._event = ""
        self._id: str | None = None
        self._seen_field = False
        self._started = False      # the BOM check is done
        self.comments = 0
        self.bytes = 0
        self.work = 0              # bytes scanned + bytes moved: the parser's cost, for linearity checks
        self.error: str | None = None

    def feed(self, chunk: bytes, arrival_ns: int) -> list[Event]:
        """Parse one read's bytes; returns the events it completed."""
        if self.error is not None:
            return []
        self.bytes += len(chunk)
        self._buf += chunk
        self.work += len(chunk)
        if not self._started:
            if len(self._buf) < len(_BOM) and _BOM.startswith(bytes(self._buf)):
                return []
            self._started = True
            if self._buf.startswith(_BOM):
                del self._buf[:len(_BOM)]
        return self._lines(arrival_ns, final=False)

    def close(self, arrival_ns: int) -> list[Event]:
        """End of stream: a trailing line without its blank line is not dispatched (per spec)."""
        if self.error is not None:
            return []
        self._started = True
        return self._lines(arrival_ns, final=True)

    def _fail(self, why: str) -> list[Event]:
        self.error = why
        self._buf = bytearray()
        self._data = []
        return []

    def _lines(self, t: int, final: bool) -> list[Event]:
        out: list[Event] = []
        buf = self._buf
        n = len(buf)
        pos = 0
        start = self._scanned
        for m in _EOL.finditer(buf, start):
            end, nxt = m.start(), m.end()
            if nxt == n and nxt - end == 1 and buf[end] == 0x0D and not final:
                break  # a CR at the end: an LF may follow in the next read
            if end - pos > self.max_line_bytes:
                self._fail(f"a line exceeds {self.max_line_bytes} bytes")
                return out
            self._line(bytes(buf[pos:end]), t, out)
            if self.error is not None:
                return out
            pos = nxt
        self.work += n - start
        if pos:
            self.work += n - pos
            del buf[:pos]
        # what is left has no line end, except perhaps a final CR that waits for its LF
        self._scanned = max(len(buf) - 1, 0) if buf.endswith(b"\r") else len(buf)
        if len(buf) > self.max_line_bytes + 1:
            self._fail(f"a line exceeds {self.max_line_bytes} bytes")
            return out
        if final and buf:
            self._line(bytes(buf), t, out)  # a last line without an end: processed, not dispatched
            self._buf = bytearray()
            self._scanned = 0
        return out

    def _line(self, raw: bytes, t: int, out: list[Event]) -> None:
        if not raw:
            if self._seen_field:
                out.append(Event(self._event or "message", "\n".join(self._data), self._id, t))
            self._data, self._data_bytes, self._event, self._seen_field = [], 0, "", False
            return
        if raw[:1] == b":":
            self.comments += 1
            return
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.error = (f"invalid UTF-8 in a {raw.partition(b':')[0][:16].decode('ascii', 'replace')!r} line "
                          f"at byte {exc.start}")
            return
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data_bytes += len(raw) + 1
            if self._data_bytes > self.max_line_bytes:
                self.error = f"an event's data exceeds {self.max_line_bytes} bytes"
                return
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
