"""The reference LLM server for tests, and a raw server that replays arbitrary bytes."""
import json
import socketserver

import pytest

from fleetcanary.offline.simulate_llm import SimSettings, Simulator, serve

from .servers import ServerThread


def sim_server(settings: SimSettings) -> tuple[ServerThread, Simulator]:
    """The reference server (`fleetcanary simulate-llm`) on a free port; its base URL is ``.url + "/v1"``."""
    server, simulator = serve(settings)
    return ServerThread(server=server), simulator


@pytest.fixture
def sim():
    srv, simulator = sim_server(SimSettings(ttft_ms=20, itl_ms=2, max_tokens_default=16))
    with srv:
        yield f"{srv.url}/v1", simulator


def sim_headers(**over) -> dict:
    return {"X-Sim": json.dumps(over)}


class RawHTTPServer(ServerThread):
    """A server that answers every request with exact bytes, written on a raw socket (no HTTP
    framework to normalise them): ``reply`` is a list of byte strings, each sent with its own
    write; the item ``HOLD`` keeps the connection open, silent, until the client hangs up.
    After the reply the connection is closed. ``requests`` counts the requests answered."""

    HOLD = object()

    def __init__(self, reply=None) -> None:
        outer = self
        self.reply = list(reply or [])
        self.requests = 0

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                c = self.request
                c.settimeout(60)  # bounded: a client that never hangs up does not keep a thread forever
                try:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        got = c.recv(65536)
                        if not got:
                            return
                        data += got
                    head, _, rest = data.partition(b"\r\n\r\n")
                    length = int(next((ln.split(b":")[1] for ln in head.split(b"\r\n")
                                       if ln.lower().startswith(b"content-length")), b"0"))
                    while len(rest) < length:
                        got = c.recv(65536)
                        if not got:
                            return
                        rest += got
                    outer.requests += 1
                    for item in outer.reply:
                        if item is RawHTTPServer.HOLD:
                            while c.recv(65536):  # until the client closes (or the 60 s bound)
                                pass
                            return
                        c.sendall(item)
                except OSError:
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        super().__init__(server=Server(("127.0.0.1", 0), Handler))
        self.base = f"{self.url}/v1"


class RawStreamServer(RawHTTPServer):
    """Answers every request with HTTP 200 and a chunked event stream of the bytes in ``body``."""

    HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

    def __init__(self) -> None:
        super().__init__()
        self.body = b""

    @property
    def body(self) -> bytes:
        return self._body

    @body.setter
    def body(self, value: bytes) -> None:
        self._body = value
        self.reply = [self.HEAD, *chunked(value)]


def chunked(*pieces: bytes) -> list[bytes]:
    """HTTP/1.1 chunked framing of each piece (one write each) and the last chunk."""
    return [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p] + [b"0\r\n\r\n"]


def sse_chunk(text: str, finish: str | None = None) -> bytes:
    obj = {"id": "chatcmpl-raw", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def sse_usage(n: int) -> bytes:
    return b'data: {"id":"chatcmpl-raw","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n' % n
