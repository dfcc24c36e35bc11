"""The reference LLM server for tests, and a raw server that replays arbitrary bytes."""
import json
import socket
import threading

import pytest

from fleetcanary.offline.simulate_llm import SimSettings, start_in_thread


@pytest.fixture
def sim():
    server, simulator = start_in_thread(SimSettings(ttft_ms=20, itl_ms=2, max_tokens_default=16))
    base = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield base, simulator
    server.shutdown()
    server.server_close()


def sim_headers(**over) -> dict:
    return {"X-Sim": json.dumps(over)}


class RawStreamServer:
    """Answers every request with HTTP 200 and a chunked body of the bytes it is given."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.body = b""
        self._stop = False
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                try:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += c.recv(65536)
                    head, _, rest = data.partition(b"\r\n\r\n")
                    length = int(next((ln.split(b":")[1] for ln in head.split(b"\r\n")
                                       if ln.lower().startswith(b"content-length")), b"0"))
                    while len(rest) < length:
                        rest += c.recv(65536)
                    body = self.body
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                    if body:
                        c.sendall(b"%x\r\n%s\r\n" % (len(body), body))
                    c.sendall(b"0\r\n\r\n")
                except OSError:
                    pass

    def close(self):
        self._stop = True
        self.sock.close()


class RawHTTPServer:
    """A server that answers every request with exact bytes, written on a raw socket (no HTTP
    framework to normalise them): ``reply`` is a list of byte strings, each sent with its own
    write; the item ``HOLD`` keeps the connection open, silent, until the client hangs up.
    After the reply the connection is closed. ``requests`` counts the requests answered."""

    HOLD = object()

    def __init__(self, reply=None) -> None:
        import socketserver

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

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def chunked(*pieces: bytes) -> list[bytes]:
    """HTTP/1.1 chunked framing of each piece (one write each) and the last chunk."""
    return [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p] + [b"0\r\n\r\n"]


def sse_chunk(text: str, finish: str | None = None) -> bytes:
    obj = {"id": "chatcmpl-raw", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def sse_usage(n: int) -> bytes:
    return b'data: {"id":"chatcmpl-raw","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n' % n
