"""The ``tpuwatch`` command line.  Usage and config errors exit 2 with one line, never a traceback."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Any, NoReturn

from tpuwatch import __version__, logsetup, statedir
from tpuwatch import config as config_module
from tpuwatch.config import SCENARIOS, Config
from tpuwatch.schema import ConfigError

log = logging.getLogger("tpuwatch")

EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE = 0, 1, 2

# Subcommands implemented in their subsystem's package: module with add_arguments(parser) and run(args, config).
_EXTENSIONS = {
    "canary": ("tpuwatch.canary.cli", "Run the reference inference once on every idle chip; exit 0 pass, "
                                      "1 wrong results, 3 could not run."),
    "logscan": ("tpuwatch.kernel_log.logscan", "Run the kernel-log rules over a file (kmsg, dmesg or journalctl "
                                               "-o json); exit 1 if a critical event is found."),
    "analyze": ("tpuwatch.analysis.analyze", "Replay recorded memory series through the daemon's leak detector; "
                                             "exit 1 if a leak is found."),
    "test-alert": ("tpuwatch.alerting.testalert", "Send a test alert down the real delivery path and print what "
                                                  "each receiver answered."),
    "alerts": ("tpuwatch.alerting.listing", "List the running daemon's pending and firing alerts."),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see --help)\n")


def _parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = _Parser(prog="tpuwatch", description="Health monitor and alerting agent for ML accelerator hosts.")
    parser.add_argument("--version", action="version", version=f"tpuwatch {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--config", metavar="PATH",
                         help=f"config file (default {config_module.DEFAULT_PATH} if it exists, else built-in "
                              "defaults)")
        return sub

    run = command("run", "Run the monitoring daemon.")
    run.add_argument("--simulate", metavar="SCENARIO", choices=SCENARIOS,
                     help=f"use simulated chips running a scenario: {', '.join(SCENARIOS)}")
    check = command("check", "Run every collector once and report; exit 0 healthy, 1 unhealthy.")
    check.add_argument("--json", action="store_true", help="machine-readable output")

    # Only the chosen subcommand's module is imported: `tpuwatch run` must not load what the others use.
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (module, help_text) in _EXTENSIONS.items():
        sub = command(name, help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(sub)

    config_cmd = commands.add_parser("config", help="Validate or show the configuration.")
    config_sub = config_cmd.add_subparsers(dest="config_command", required=True, parser_class=_Parser)
    for name, text in (("check", "Validate the config; exit 2 naming the bad key."),
                       ("show", "Print the effective config, secrets redacted.")):
        sub = config_sub.add_parser(name, help=text, description=text)
        sub.add_argument("--config", metavar="PATH", help="config file")
    return parser


def _load(args: argparse.Namespace) -> Config:
    """The config the command works with; simulated chips' state_dir is their namespace (the daemon applies it
    to every config it loads, reloads included)."""
    config = config_module.load(args.config)
    scenario = getattr(args, "simulate", None)
    config = config_module.simulated(config, scenario) if scenario else config
    return config if args.command == "run" else statedir.namespaced(config)


def _cmd_run(args: argparse.Namespace, config: Config) -> int:
    from tpuwatch.daemon import Daemon
    from tpuwatch.web import StartupError

    logsetup.configure(config.log_level)
    try:
        daemon = Daemon(config, args.config, getattr(args, "simulate", None))
    except (StartupError, ConfigError, statedir.InUse) as exc:
        log.error("cannot start: %s", exc)
        return EXIT_USAGE
    daemon.start()
    try:
        daemon.wait()
    finally:
        daemon.stop()
    return EXIT_OK


def _cmd_check(args: argparse.Namespace, config: Config) -> int:
    from tpuwatch.report import check_once, render_check

    logsetup.configure("error")
    result = check_once(config)
    print(json.dumps(result, indent=2) if args.json else render_check(result))
    return EXIT_OK if result["status"] == "healthy" else EXIT_UNHEALTHY


def _cmd_config(args: argparse.Namespace, config: Config) -> int:
    if args.config_command == "show":
        sys.stdout.write(config_module.to_yaml(config))
        return EXIT_OK
    try:
        _check_referenced_files(config)
    except ConfigError as exc:
        print(f"tpuwatch: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{args.config or 'built-in defaults'}: ok")
    return EXIT_OK


def _check_referenced_files(config: Config) -> None:
    """What ``run`` reads beside the config: the web config, alert and kernel-log rule files, secret files; and
    whether it can keep its state in state_dir."""
    from tpuwatch.alerting.service import rules_and_notifiers
    from tpuwatch.kernel_log.rules import load_rules
    from tpuwatch.webconfig import load_web_config

    load_web_config(config.web_config)
    rules_and_notifiers(config)
    load_rules(config.kernel_log.rules_dirs)
    problem = statedir.probe(config.state_dir, create=False)
    if problem is not None:
        raise ConfigError("state_dir", f"{config.state_dir} cannot be written: {problem} (the daemon would run, "
                                       "keeping its state in memory only)")


_COMMANDS: dict[str, Any] = {"run": _cmd_run, "check": _cmd_check, "config": _cmd_config}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tpuwatch`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(argv).parse_args(argv)
    try:
        config = _load(args)
    except ConfigError as exc:
        print(f"tpuwatch: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command in _EXTENSIONS:
            return importlib.import_module(_EXTENSIONS[args.command][0]).run(args, config)
        return _COMMANDS[args.command](args, config)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, no traceback
        if os.environ.get("TPUWATCH_DEBUG"):
            raise
        print(f"tpuwatch: internal error: {type(exc).__name__}: {exc} (TPUWATCH_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return EXIT_UNHEALTHY
