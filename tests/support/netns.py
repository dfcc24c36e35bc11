"""Network namespaces for tests: harness/netns.py's NamespaceNet (which benchmarks/fabric.py shares; the
namespaces, the bridge, link faults and cleanup are all there), plus what only tests need: a missing
prerequisite (root, ip, tc) is a skip, or a failure under CI=true, and a real daemon runs inside a
node's namespace.

    with NamespaceNet(4) as net:
        d = net.start_daemon(net.nodes[0], {"probes": {...}}, workdir=tmp_path / "a")
"""
from __future__ import annotations

from pathlib import Path

from harness import netns
from harness.netns import DAEMON_PORT, Node  # noqa: F401 - the names tests use beside NamespaceNet

from .daemon import READY_TIMEOUT_S, Daemon
from .helpers import unavailable


class NamespaceNet(netns.NamespaceNet):
    def __init__(self, n: int, names: list[str] | None = None) -> None:
        try:
            super().__init__(n, names)
        except netns.Unavailable as exc:
            unavailable(str(exc))

    def start_daemon(self, node, config: dict, workdir: Path, env: dict | None = None, port: int = DAEMON_PORT,
                     ready_timeout: float = READY_TIMEOUT_S) -> Daemon:
        """A real `fleetcanary run` inside the node's namespace, listening on the node's address, in its own
        session (python -I: the installed package only, never the test tree); close() stops it."""
        n = self.node(node)
        d = Daemon(Path(workdir), config, host=n.ip, port=port, wrap=lambda argv: self.exec_argv(n, argv),
                   env={"NODE_NAME": n.name, **(env or {})}, isolated=True, new_session=True, cwd=Path(workdir),
                   ready=False, registered=False)
        self.daemons.append(d)
        d.wait_ready(ready_timeout)
        return d
