"""The fabric probe as a package: ``spec`` (settings, metric names), ``schedule`` (the
round robin), ``members`` (static or Kubernetes), ``rendezvous`` (the authenticated
handshake), ``pair`` (store, process group, sweep, check) and ``probe`` (the probe).
See probes/fabric/probe.py for the entry points and docs/fabric.md for the design."""
from fleetcanary.probes.fabric.probe import Fabric
from fleetcanary.probes.fabric.spec import Config

__all__ = ["Config", "Fabric"]
