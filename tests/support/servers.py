"""The test servers live in harness/servers.py (benchmarks use them too); tests keep importing them from here."""
from harness.servers import *  # noqa: F403
from harness.servers import JsonHandler, ServerThread, tls_context  # noqa: F401
