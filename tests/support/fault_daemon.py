"""`fleetcanary run` with the fault-injecting probes added to the probe map, for reliability tests.

    python -m tests.support.fault_daemon run --config CONFIG

(the command line of `fleetcanary run`, so that tests/support/daemon.py starts either the same way).

Everything else is the real daemon: the same Daemon class, signal handling, subreaper and
worker isolation as `fleetcanary run`.
"""
import argparse
import logging
import sys

from fleetcanary.core import config as configmod
from fleetcanary.daemon.service import Daemon
from fleetcanary.probes import PROBES
from tests.support.fault_probes import FAULT_PROBES


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.support.fault_daemon")
    ap.add_argument("command", choices=["run"])
    ap.add_argument("--config", "-c", required=True)
    config = ap.parse_args().config
    probe_map = {**PROBES, **FAULT_PROBES}
    try:
        settings = configmod.load(config, probe_map=probe_map)
    except configmod.ConfigError as exc:
        print("\n".join(exc.lines), file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    return Daemon(settings, config_path=config, probe_map=probe_map, reap_everything=True).serve_forever()


if __name__ == "__main__":
    sys.exit(main())
