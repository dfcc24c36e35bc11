"""Receive Alertmanager's webhooks and apply the remediation policy to Kubernetes nodes (docs/remediation.md).

Dry-run unless the config says `dry_run: false`: it then only logs, audits and posts Events of what it would do.

  fleetcanary remediate --config remediate.yaml            serve POST /webhook, /metrics, /healthz
  fleetcanary remediate --config remediate.yaml --check    validate the config; exit 2 on any error
"""
from __future__ import annotations

import logging
import signal
import sys
import threading

EXIT_CONFIG = 2


def add_arguments(p) -> None:
    p.add_argument("--config", "-c", metavar="FILE", required=True, help="the controller's YAML config")
    p.add_argument("--check", action="store_true", help="validate the config and exit (2 on any error)")


def main(args) -> int:
    from fleetcanary.core.config import ConfigError, parse_listen_address

    from . import config

    try:
        settings = config.load(args.config)
    except ConfigError as exc:
        for line in exc.lines:
            print(f"fleetcanary remediate: config error: {line}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check:
        print(f"{args.config}: ok ({len(settings.rules)} rules, "
              f"{'dry run' if settings.dry_run else 'ACTING: dry_run is false'})")
        return 0
    logging.basicConfig(level=getattr(logging, settings.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .controller import Controller
    from .kubeapi import KubeAPI
    from .server import Server

    try:
        k = settings.kubernetes
        api = KubeAPI.at(k.api_url, k.api_timeout_seconds) if k.api_url else KubeAPI.in_cluster(k.api_timeout_seconds)
    except Exception as exc:  # noqa: BLE001 - no service account, a bad CA: one line, not a traceback
        print(f"fleetcanary remediate: no Kubernetes API: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        return 1
    identity = settings.identity()
    controller = Controller(settings, api, identity, namespace=settings.lease_namespace())
    host, port = parse_listen_address(settings.listen_address)
    try:
        server = Server((host, port), controller, settings.max_body_bytes)
    except OSError as exc:
        print(f"fleetcanary remediate: cannot listen on {settings.listen_address}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                controller.tick()
            except Exception:  # a bug in one tick is logged; the next one runs
                logging.getLogger("fleetcanary.remediate").exception("tick failed")
            stop.wait(settings.lease.retry_seconds if settings.lease.enabled
                      else settings.tick_seconds)

    def on_term(signum, frame) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    ticker = threading.Thread(target=loop, name="remediate-tick", daemon=True)
    ticker.start()
    logging.getLogger("fleetcanary.remediate").info(
        "serving on %s as %s (%s)", settings.listen_address, identity,
        "dry run" if settings.dry_run else "acting")
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    return 0

