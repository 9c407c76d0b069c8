"""The ``tpuwatch`` command line.  Usage and config errors exit 2 with one line, never a traceback."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

from tpuwatch import __version__, logsetup, statedir
from tpuwatch import config as config_module
from tpuwatch.config import SCENARIOS, Config
from tpuwatch.drills.simulate import namespaced, simulated
from tpuwatch.schema import ConfigError

log = logging.getLogger("tpuwatch")

EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE = 0, 1, 2



@dataclass(frozen=True)
class Command:
    """One subcommand: its help, its exit statuses, and the module that implements it (None: here)."""

    help: str
    exits: dict[int, str]
    module: str | None = None


USAGE_EXIT = "usage or config error (one line on stderr)"

# Every subcommand, in the order --help lists them.  The man page and the shell completions are generated
# from this table and the parser (tpuwatch.clidoc), so what they say cannot drift from what the code does.
# A subcommand with a module has it imported only when chosen: `tpuwatch run` must not load what others use.
COMMANDS: dict[str, Command] = {
    "run": Command("Run the monitoring daemon.",
                   {0: "stopped by SIGTERM or SIGINT", 2: "cannot start: " + USAGE_EXIT}),
    "check": Command("Run every collector once and report.",
                     {0: "healthy", 1: "unhealthy: the problems are listed", 2: USAGE_EXIT}),
    "canary": Command("Run the reference inference once on every idle chip, exactly as the daemon runs it.",
                      {0: "every chip passed", 1: "wrong results on a chip", 2: USAGE_EXIT,
                       3: "could not run (error, timeout, crash, every chip skipped), or a fire drill that nothing "
                          "here could catch (undetected)",
                       130: "interrupted (SIGINT or SIGTERM): the worker's process group is killed"},
                      "tpuwatch.canary.cli"),
    "logscan": Command("Run the kernel-log rules over a file (kmsg, dmesg or journalctl -o json).",
                       {0: "no critical event", 1: "a critical event was found", 2: USAGE_EXIT + " or rule error"},
                       "tpuwatch.kernel_log.logscan"),
    "analyze": Command("Replay recorded memory series through the daemon's leak detector.",
                       {0: "no leak (or a series too short to tell: insufficient)", 1: "a leak in a series",
                        2: USAGE_EXIT + " or bad input"}, "tpuwatch.analysis.analyze"),
    "test-alert": Command("Send a test alert down the real delivery path and print what each receiver answered.",
                          {0: "every receiver accepted it", 1: "a receiver did not",
                           2: "no such receiver, none configured, a secret unreadable, no outbox, or " + USAGE_EXIT},
                          "tpuwatch.alerting.testalert"),
    "top": Command("Show the chips live in the terminal: from the running daemon, else read from the hardware.",
                   {0: "quit (q or Ctrl-C), or with --once the host ok",
                    1: "with --once: a chip is not ok, a fire drill cannot run, or the daemon of --url does not "
                       "answer",
                    2: USAGE_EXIT}, "tpuwatch.views.top"),
    "alerts": Command("List the running daemon's pending and firing alerts.",
                      {0: "listed", 1: "the daemon cannot be asked", 2: USAGE_EXIT}, "tpuwatch.alerting.listing"),
    "ack": Command("Tell the daemon chips were repaired: their current alerts stop holding node conditions and "
                   "remediation (Kubernetes).",
                   {0: "the daemon applied it", 1: "left for the daemon, which did not confirm within --wait",
                    2: "kubernetes.node_conditions off, the state directory not writable, or " + USAGE_EXIT},
                   "tpuwatch.kubernetes.cli"),
    "set-healthy": Command("Tell the daemon the node was repaired: every current alert, the repeat counts and the "
                           "marks kept for manual release are cleared (Kubernetes).",
                           {0: "the daemon applied it", 1: "left for the daemon, which did not confirm within --wait",
                            2: "kubernetes.node_conditions off, the state directory not writable, or " + USAGE_EXIT},
                           "tpuwatch.kubernetes.cli"),
    "config": Command("Validate or show the configuration.",
                      {0: "valid (check) or printed (show)", 2: "invalid: path.to.key: reason"}),
}
CONFIG_COMMANDS = {"check": "Validate the config and every file it names; exit 2 naming the bad key.",
                   "show": "Print the effective config, secrets redacted."}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see --help)\n")


def _epilog(exits: dict[int, str]) -> str:
    return "exit status:\n" + "\n".join(f"  {code:<3} {text}" for code, text in sorted(exits.items()))


def parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The command line parser; with ``argv`` only the chosen subcommand's module is imported, with None all."""
    top = _Parser(prog="tpuwatch", description="Health monitor and alerting agent for ML accelerator hosts.")
    top.add_argument("-V", "--version", action="version", version=f"tpuwatch {__version__}")
    commands = top.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    chosen = None if argv is None else next((arg for arg in argv if not arg.startswith("-")), None)
    for name, command in COMMANDS.items():
        sub = commands.add_parser(name, help=command.help, description=command.help, epilog=_epilog(command.exits),
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        if name == "config":
            config_sub = sub.add_subparsers(dest="config_command", required=True, parser_class=_Parser,
                                            metavar="ACTION")
            for action, text in CONFIG_COMMANDS.items():
                _config_option(config_sub.add_parser(action, help=text, description=text))
            continue
        _config_option(sub)
        if name in ("run", "check"):
            sub.add_argument("--simulate", metavar="SCENARIO", choices=SCENARIOS,
                             help=f"use simulated chips running a scenario: {', '.join(SCENARIOS)}")
        if name == "run":
            sub.add_argument("--listen", metavar="HOST:PORT", type=config_module.option_type("listen"),
                             help="serve there instead of at the config's listen (a second daemon beside the first)")
            sub.add_argument("--state-dir", metavar="DIR", type=config_module.option_type("state_dir"),
                             help="keep the state there instead of in the config's state_dir (an absolute path; "
                                  "one daemon per directory)")
        elif name == "check":
            sub.add_argument("--json", action="store_true", help="machine-readable output")
        elif command.module is not None and chosen in (None, name):
            importlib.import_module(command.module).add_arguments(sub)
    return top


def _config_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--config", metavar="PATH",
                     help=f"config file (default {config_module.DEFAULT_PATH} if it exists, else built-in defaults)")


KEY_OPTIONS = ("listen", "state_dir")  # config keys an option sets over the file: --listen, --state-dir


def _from_command_line(args: argparse.Namespace, config: Config) -> Config:
    """``config`` as the command line changes it: --simulate's chips, and the keys options set."""
    scenario = getattr(args, "simulate", None)
    config = simulated(config, scenario) if scenario else config
    keys = {key: value for key in KEY_OPTIONS if (value := getattr(args, key, None)) is not None}
    return dataclasses.replace(config, **keys)


def _load(args: argparse.Namespace) -> Config:
    """The config the command works with; simulated chips' state_dir is their namespace (the daemon applies it
    to every config it loads, reloads included)."""
    config = _from_command_line(args, config_module.load(args.config))
    return config if args.command == "run" else namespaced(config)


def _cmd_run(args: argparse.Namespace, config: Config) -> int:
    from tpuwatch.daemon import Daemon
    from tpuwatch.web import StartupError

    logsetup.configure(config.log_level)
    try:
        daemon = Daemon(config, args.config, functools.partial(_from_command_line, args))
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
    from tpuwatch.analysis import trend
    from tpuwatch.kernel_log import collector

    for warning in [*collector.config_warnings(config), *trend.config_warnings(config)]:
        print(f"tpuwatch: config warning: {warning}", file=sys.stderr)
    print(f"{args.config or 'built-in defaults'}: ok")
    return EXIT_OK


def _check_referenced_files(config: Config) -> None:
    """What ``run`` reads beside the config: the web config, alert and kernel-log rule files, secret files; and
    whether it can keep its state in state_dir."""
    from tpuwatch.alerting.service import rules_and_notifiers
    from tpuwatch.kernel_log.rulefile import load_rules
    from tpuwatch.webconfig import load_web_config

    load_web_config(config.web_config)
    rules_and_notifiers(config)
    load_rules(config.kernel_log.rules_dirs)
    problem = statedir.probe(config.state_dir, create=False)
    if problem is not None:
        raise ConfigError("state_dir", f"{config.state_dir} cannot be written: {problem} (the daemon would run, "
                                       "keeping its state in memory only)")


_BUILTIN: dict[str, Any] = {"run": _cmd_run, "check": _cmd_check, "config": _cmd_config}


def _say_what_the_canary_lacks(config: Config) -> None:
    """After a canary run that could not run: where jax is missing, the install that gives it (the extra)."""
    from tpuwatch.canary.needs import canary_unavailable

    enabled = dataclasses.replace(config, canary=dataclasses.replace(config.canary, enabled=True))
    why = canary_unavailable(enabled, timeout=10.0)
    if why is not None and why.startswith("jax is not installed"):
        print(f"tpuwatch canary: {why}", file=sys.stderr)


def _reader_gone() -> int:
    """The reader of our output went away (``tpuwatch alerts | head``): stop quietly with the status of a Unix
    tool killed by SIGPIPE (141), and let nothing more be written to the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return 128 + signal.SIGPIPE


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tpuwatch`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser(argv).parse_args(argv)
    try:
        config = _load(args)
    except ConfigError as exc:
        print(f"tpuwatch: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        module = COMMANDS[args.command].module
        if module is not None:
            code = importlib.import_module(module).run(args, config)
        else:
            code = _BUILTIN[args.command](args, config)
        if args.command == "canary" and code == 3:
            _say_what_the_canary_lacks(config)
        sys.stdout.flush()  # a reader gone (`| head`) is found here, not by the interpreter's last flush
        return code
    except BrokenPipeError:
        return _reader_gone()
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, no traceback
        if os.environ.get("TPUWATCH_DEBUG"):
            raise
        print(f"tpuwatch: internal error: {type(exc).__name__}: {exc} (TPUWATCH_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return EXIT_UNHEALTHY
