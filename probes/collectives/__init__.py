"""The collectives probe as a package: ``spec`` (settings and definitions), ``probe``
(the probe: plans, launches the ranks, reduces), ``rank`` (the program each rank
runs) and ``nccl_tests`` (the nccl-tests runner and parser). The modules import
``spec`` and never each other in a circle."""
from fleetcanary.probes.collectives.probe import Collectives
from fleetcanary.probes.collectives.spec import ALGBW, BUSBW, COLLECTIVES, LAT, Config, bus_factor

__all__ = ["ALGBW", "BUSBW", "COLLECTIVES", "LAT", "Collectives", "Config", "bus_factor"]
