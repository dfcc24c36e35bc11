"""The `fleetcanary` command line."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from fleetcanary.core.version import git_commit, version

# The config model (every probe's settings) and the probe map are imported by the commands that use them: an
# offline tool (compare, report, rules, loadtest...) starts without building the exporter's pydantic models.

EXIT_CONFIG = 2

DESCRIPTION = """\
fleetcanary: a Prometheus exporter and canary benchmarker for GPU nodes.

Probes (GPU, fabric, storage, inference and host checks; `fleetcanary probes` lists
them) run on a schedule in isolated worker processes; /metrics serves their last
results. With no --config, embedded defaults apply.
"""

EPILOG = """\
examples:
  fleetcanary run                          serve on :9835 with the embedded defaults
  fleetcanary run --config /etc/fleetcanary/config.yaml
  fleetcanary once                         run every enabled probe once, print a table
  fleetcanary once --probe host_memory_bandwidth --json
  fleetcanary once --repeat 5 --expect acceptance.yaml    node acceptance; exit 1 on any failed check
  fleetcanary compare base.jsonl cand.jsonl  Pass / Conditional pass / Blocked (exit 0 / 3 / 1)
  fleetcanary report --baseline base.jsonl --candidate cand.jsonl --out report/
  fleetcanary check-config config.yaml     validate a config; exit 2 on any error
  kill -HUP <pid>                          reload the config (a bad file keeps the old one)
  fleetcanary demo                         a simulated fleet with one failing GPU, its alerts as they fire
  fleetcanary simulate-llm --itl-ms 10     a reference LLM server on 127.0.0.1:8000
  fleetcanary loadtest http://127.0.0.1:8000/v1 --mode concurrency --slo-itl-p99 0.05
  fleetcanary remediate --config remediate.yaml   the quarantine controller (dry-run unless the config says not)
"""


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def _load(path: str | None):
    from fleetcanary.core import config as configmod

    try:
        return configmod.load(path)
    except configmod.ConfigError as exc:
        for line in exc.lines:
            print(f"fleetcanary: config error: {line}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)


def cmd_run(args) -> int:
    if args.web_config_file:
        if not os.path.isfile(args.web_config_file):
            print(f"fleetcanary: config error: --web.config.file: file not found: {args.web_config_file}",
                  file=sys.stderr)
            return EXIT_CONFIG
        # Through the environment, so a SIGHUP reload (which re-reads the file) keeps it too.
        os.environ["FLEETCANARY_WEB_CONFIG_FILE"] = args.web_config_file
    settings = _load(args.config)
    if args.listen_address:
        from fleetcanary.core import config as configmod

        try:
            configmod.parse_listen_address(args.listen_address)
        except ValueError as exc:
            print(f"fleetcanary: config error: --listen-address: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        settings = settings.model_copy(update={"server": settings.server.model_copy(
            update={"listen_address": args.listen_address})})
    _setup_logging(settings.log_level)
    from fleetcanary.core.statefile import StateDirError
    from fleetcanary.daemon.service import Daemon
    from fleetcanary.daemon.webconfig import WebConfigError

    try:
        daemon = Daemon(settings, config_path=args.config, reap_everything=True)
    except WebConfigError as exc:
        print(f"fleetcanary: web config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StateDirError as exc:
        print(f"fleetcanary: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"fleetcanary: cannot listen on {settings.server.listen_address}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return daemon.serve_forever()


def cmd_once(args) -> int:
    from fleetcanary.probes import PROBES

    settings = _load(args.config)
    _setup_logging("warning")
    entries = settings.probe_entries()
    if args.probe:
        unknown = [p for p in args.probe if p not in PROBES]
        if unknown:
            print(f"fleetcanary: unknown probe {', '.join(unknown)}; known: {', '.join(PROBES)}", file=sys.stderr)
            return EXIT_CONFIG
        names = list(args.probe)
    else:
        names = [n for n, e in entries.items() if e.enabled]
    from fleetcanary.offline import once

    return once.main(settings, PROBES, names, args.json, repeat=args.repeat, expect=args.expect,
                     write_history=args.history)


def cmd_check_config(args) -> int:
    settings = _load(args.file)
    enabled = [n for n, e in settings.probe_entries().items() if e.enabled]
    print(f"{args.file}: ok ({len(enabled)} probes enabled: {', '.join(enabled) or 'none'})")
    return 0


def cmd_version(args) -> int:
    print(f"fleetcanary {version()} (commit {git_commit()})")
    return 0


def cmd_probes(args) -> int:
    from fleetcanary.probes import PROBES

    for name, cls in PROBES.items():
        print(f"{name:28} every {cls.default_interval_seconds:>6g}s  "
              f"{'exclusive=' + cls.exclusive if cls.exclusive else ''}")
    return 0


# The offline tools: each module has add_arguments(parser) and main(args), and is imported
# only when its subcommand runs, so the daemon never loads them.
TOOLS: dict[str, tuple[str, str]] = {
    "compare": ("fleetcanary.offline.compare",
                "baseline vs candidate result files: classified figures and a verdict"),
    "report": ("fleetcanary.offline.report",
               "the result template (Markdown + JSON, optional PNG plots) from result files"),
    "demo": ("fleetcanary.offline.demo",
             "a simulated GPU fleet with one failing GPU, Prometheus with the rules and Alertmanager"),
    "simulate-llm": ("fleetcanary.offline.simulate_llm", "run the reference OpenAI-compatible streaming server"),
    "loadtest": ("fleetcanary.offline.loadtest",
                 "find the highest request rate an LLM endpoint sustains within an SLO"),
    "claim": ("fleetcanary.runner.claim",
              "a claim pod's process: run the exporter's jobs, leave the records in its inbox"),
    "remediate": ("fleetcanary.remediate.main",
                  "the quarantine controller: Alertmanager webhooks -> node labels, taints, cordons (dry-run default)"),
    "rules": ("fleetcanary.rules.build",
              "write the alert and recording rules with your settings (selectors, thresholds, pools)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``command`` names the subcommand about to run, whose tool module (if it is
    one) is imported to add its arguments."""
    p = argparse.ArgumentParser(prog="fleetcanary", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser("run", help="run the exporter daemon")
    r.add_argument("--config", "-c", metavar="FILE", help="YAML config file (default: embedded defaults)")
    r.add_argument("--listen-address", "--web.listen-address", metavar="HOST:PORT",
                   help="override server.listen_address")
    r.add_argument("--web-config-file", "--web.config.file", metavar="FILE",
                   help="TLS and basic auth (exporter-toolkit format); overrides server.web_config_file")
    r.set_defaults(func=cmd_run)

    o = sub.add_parser("once", help="run the enabled probes once and print a table")
    o.add_argument("--config", "-c", metavar="FILE", help="YAML config file (default: embedded defaults)")
    o.add_argument("--probe", "-p", action="append", metavar="NAME", help="run only this probe (repeatable)")
    o.add_argument("--json", action="store_true", help="print JSON records instead of a table")
    o.add_argument("--repeat", type=int, default=1, metavar="N", help="run each probe N times (default 1)")
    o.add_argument("--expect", metavar="FILE", help="node acceptance: check the results against per-GPU-model "
                   "expectations (YAML); exit 1 on any failed check")
    o.add_argument("--history", action="store_true", help="also append every run to the results history in the "
                   "config's state_dir (default: leave the daemon's history alone)")
    o.set_defaults(func=cmd_once)

    c = sub.add_parser("check-config", help="validate a config file; exit 2 on any error")
    c.add_argument("file", metavar="FILE")
    c.set_defaults(func=cmd_check_config)

    v = sub.add_parser("version", help="print the version and commit")
    v.set_defaults(func=cmd_version)

    pr = sub.add_parser("probes", help="list the probes this build has")
    pr.set_defaults(func=cmd_probes)

    for name, (module, help_text) in TOOLS.items():
        if name != command:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        mod = importlib.import_module(module)
        tp = sub.add_parser(name, help=help_text, description=mod.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(tp)
        tp.set_defaults(func=mod.main)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_CONFIG
    if getattr(args, "repeat", 1) is not None and getattr(args, "repeat", 1) < 1:
        print("fleetcanary: --repeat must be at least 1", file=sys.stderr)
        return EXIT_CONFIG
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`fleetcanary once --json | head`): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
