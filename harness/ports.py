"""Free loopback ports: the one way tests and benchmarks pick a port for a server they start."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the kernel's pick). Another process may still take it before
    the caller binds it; a server started on it checks that the answer comes from itself."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
