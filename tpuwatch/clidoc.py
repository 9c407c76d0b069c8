"""The man page and the bash and zsh completions, generated from the command-line parser at build time.

``python -m tpuwatch.clidoc --man FILE --bash FILE --zsh FILE`` writes them
(the Debian build does); every subcommand, option and exit status comes from
``tpuwatch.cli.parser()`` and ``tpuwatch.cli.COMMANDS``, so they say what the
code does.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tpuwatch import __version__
from tpuwatch.cli import COMMANDS, parser


@dataclass(frozen=True)
class Option:
    """One option or positional argument of a subcommand."""

    flags: tuple[str, ...]  # empty for a positional
    metavar: str | None    # None for a flag that takes no value
    help: str
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Subcommand:
    """A subcommand (``config check`` is one too) and its options."""

    name: str
    help: str
    options: tuple[Option, ...]


def _options(sub: argparse.ArgumentParser) -> tuple[Option, ...]:
    found = []
    for action in sub._actions:  # noqa: SLF001 - argparse has no public way to list a parser's arguments
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):  # noqa: SLF001
            continue
        takes_value = action.nargs != 0
        metavar = str(action.metavar) if action.metavar else action.dest.upper()
        found.append(Option(tuple(action.option_strings), metavar if takes_value else None,
                            (action.help or "").replace("%%", "%"),
                            tuple(str(c) for c in action.choices or ())))
    return tuple(found)


def subcommands() -> list[Subcommand]:
    """Every subcommand with its options, in --help order."""
    out = []
    for action in parser()._subparsers._group_actions:  # type: ignore[union-attr] # noqa: SLF001
        assert isinstance(action, argparse._SubParsersAction)  # noqa: SLF001
        for name, sub in action.choices.items():
            nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
            if nested:
                out += [Subcommand(f"{name} {inner}", inner_parser.description or "", _options(inner_parser))
                        for inner, inner_parser in nested[0].choices.items()]
            else:
                out.append(Subcommand(name, sub.description or "", _options(sub)))
    return out


def _roff(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line for line in escaped.splitlines())


def _synopsis(sub: Subcommand) -> list[str]:
    lines = [f".B tpuwatch {_roff(sub.name)}"]
    for option in sub.options:
        if not option.flags:
            lines.append(f".I {_roff(option.metavar or '')}")
        elif option.metavar:
            lines.append(f".RB [ {_roff(option.flags[-1])}\n.IR {_roff(option.metavar)} ]")
        else:
            lines.append(f".RB [ {_roff(option.flags[-1])} ]")
    return [*lines, ".br"]


def man_page(date: datetime.date | None = None) -> str:
    """The roff source of tpuwatch(1)."""
    when = date or datetime.date.today()
    subs = subcommands()
    out = [f'.TH TPUWATCH 1 "{when:%Y-%m-%d}" "tpuwatch {__version__}" "User Commands"',
           ".SH NAME", "tpuwatch \\- health monitor and alerting agent for ML accelerator hosts",
           ".SH SYNOPSIS", ".B tpuwatch", ".RB [ \\-V | \\-\\-version | \\-h | \\-\\-help ]", ".br"]
    for sub in subs:
        out += _synopsis(sub)
    out += [".SH DESCRIPTION",
            ".B tpuwatch",
            "samples every accelerator (Cloud TPU chips, NVIDIA GPUs) and the host, follows the kernel log for",
            "hardware errors, runs a small reference inference on idle chips, watches memory for leaks, serves",
            "everything on a Prometheus", ".I /metrics", "endpoint and sends alerts to webhooks, Alertmanager,",
            "PagerDuty or Slack.", ".B tpuwatch run",
            "is the daemon, normally started by the", ".B tpuwatch.service",
            "systemd unit as the", ".B tpuwatch", "system user.",
            ".SH COMMANDS"]
    for name, command in COMMANDS.items():
        for sub in (s for s in subs if s.name.split()[0] == name):
            out += [".SS " + _roff(f"tpuwatch {sub.name}"), _roff(sub.help)]
            for option in sub.options:
                flags = ", ".join(option.flags) or (option.metavar or "")
                head = (f'.BI "{_roff(flags)}" " {_roff(option.metavar)}"' if option.flags and option.metavar
                        else f".B {_roff(flags)}")
                out += [".TP", head, _roff(option.help)]
        out += [".PP", f"Exit status of tpuwatch {name}:"]
        for code, text in sorted(command.exits.items()):
            out += [".TP", f".B {code}", _roff(text)]
    out += [".SH FILES", ".TP", ".I /etc/tpuwatch/config.yaml",
            "The configuration; every key is shown with its default in the file the package installs.",
            ".TP", ".I /var/lib/tpuwatch", "State kept across restarts: alert state and outbox, kernel-log "
            "positions, learned trends, canary fingerprints.",
            ".SH ENVIRONMENT", ".TP", ".B TPUWATCH_DEBUG",
            "Set to 1 to see the traceback of an internal error instead of one line.",
            ".TP", ".B CREDENTIALS_DIRECTORY", "Where relative secret files are read from (systemd's LoadCredential).",
            ".SH SEE ALSO", ".BR systemctl (1),", ".BR journalctl (1),", ".BR prometheus (1)"]
    return "\n".join(out) + "\n"


def _words(sub: Subcommand) -> Iterator[str]:
    for option in sub.options:
        yield from option.flags


def bash_completion() -> str:
    """A bash completion function for tpuwatch (self-contained: no bash-completion helpers needed)."""
    subs = subcommands()
    top = sorted({s.name.split()[0] for s in subs})
    cases = []
    for sub in subs:
        words = " ".join(["--help", *_words(sub)])
        values = [f"{flag}) COMPREPLY=($(compgen -W '{' '.join(o.choices)}' -- \"$cur\")); return;;"
                  for o in sub.options if o.choices for flag in o.flags]
        files = [f"{flag}) COMPREPLY=($(compgen -f -- \"$cur\")); return;;"
                 for o in sub.options if o.metavar in ("PATH", "FILE") for flag in o.flags]
        body = "\n".join(f"                {line}" for line in [*values, *files])
        cases.append(f"        '{sub.name}')\n            case \"$prev\" in\n{body}\n            esac\n"
                     f"            COMPREPLY=($(compgen -W '{words}' -- \"$cur\"));;")
    return f"""# bash completion for tpuwatch {__version__} (generated by tpuwatch.clidoc)
_tpuwatch() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" command=""
    local i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            -*) ;;
            *) if [ -z "$command" ]; then command="${{COMP_WORDS[i]}}";
               elif [ "$command" = config ]; then command="config ${{COMP_WORDS[i]}}"; break; fi;;
        esac
    done
    case "$command" in
        '') COMPREPLY=($(compgen -W '{' '.join(top)} -V --version -h --help' -- "$cur"));;
        config) COMPREPLY=($(compgen -W 'check show' -- "$cur"));;
{chr(10).join(cases)}
    esac
}}
complete -F _tpuwatch tpuwatch
"""


def _zsh_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "'\\''").replace("[", "\\[").replace("]", "\\]")


def zsh_completion() -> str:
    """A zsh completion function (#compdef tpuwatch) for zsh's completion system."""
    subs = subcommands()
    described = [f"'{name}:{_zsh_quote(COMMANDS[name].help)}'" for name in COMMANDS]
    cases = []
    for sub in subs:
        specs = []
        for option in sub.options:
            text = _zsh_quote(option.help)
            action = (f":{option.metavar}:({' '.join(option.choices)})" if option.choices
                      else ":file:_files" if option.metavar in ("PATH", "FILE")
                      else f":{option.metavar}:" if option.metavar else "")
            if not option.flags:
                specs.append(f"'1{action}'")
            for flag in option.flags:
                specs.append(f"'{flag}[{text}]{action}'")
        cases.append(f"    ({sub.name.replace(' ', '-')}) _arguments {' '.join(specs) or ':'} ;;")
    return f"""#compdef tpuwatch
# zsh completion for tpuwatch {__version__} (generated by tpuwatch.clidoc)
_tpuwatch() {{
  local -a commands
  commands=({' '.join(described)})
  if (( CURRENT == 2 )); then
    _describe -t commands 'tpuwatch command' commands
    return
  fi
  local command=$words[2]
  if [[ $command == config ]]; then
    if (( CURRENT == 3 )); then
      _values 'config action' check show
      return
    fi
    command=config-$words[3]
  fi
  case $command in
{chr(10).join(cases)}
  esac
}}
_tpuwatch "$@"
"""


def main(argv: list[str] | None = None) -> int:
    """Write the files named on the command line."""
    args = argparse.ArgumentParser(prog="python -m tpuwatch.clidoc", description=__doc__.splitlines()[0])
    args.add_argument("--man", type=Path, metavar="FILE", help="write the man page here")
    args.add_argument("--bash", type=Path, metavar="FILE", help="write the bash completion here")
    args.add_argument("--zsh", type=Path, metavar="FILE", help="write the zsh completion here")
    chosen = args.parse_args(argv)
    epoch = os.environ.get("SOURCE_DATE_EPOCH")  # reproducible builds: the date of the changelog entry
    date = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).date() if epoch else None
    for path, text in ((chosen.man, lambda: man_page(date)), (chosen.bash, bash_completion),
                       (chosen.zsh, zsh_completion)):
        if path is not None:
            path.write_text(text(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
