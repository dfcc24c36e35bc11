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
