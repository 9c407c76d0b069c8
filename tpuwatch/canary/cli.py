"""``tpuwatch canary``: one reference-inference run exactly as the daemon runs it, or a history reset.

Exit 0 pass, 1 wrong results, a suspect or a slow chip (a caught drill included), 3 could
not run (error, timeout, crash, every chip skipped) or a fire drill no check
caught (``undetected``), 2 usage or config error, 130 interrupted (SIGINT or
SIGTERM: the worker's process group is killed first).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from types import FrameType
from typing import TextIO

from tpuwatch.canary.checks import faults
from tpuwatch.canary.history import FingerprintHistory, HistoryBusy, Removed, history_path
from tpuwatch.canary.judge import CanaryResult
from tpuwatch.canary.runner import Progress, run_canary
from tpuwatch.canary.spec import INJECTIONS
from tpuwatch.config import Config
from tpuwatch.syntax import parse_duration

EXIT_CODES = {"pass": 0, "fail": 1, "suspect": 1, "slow": 1, "skipped": 3, "error": 3, "undetected": 3}
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
ALL = "all"


def _seconds(text: str) -> float:
    try:
        value = float(text) if text.replace(".", "", 1).isdigit() else parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration")
    return value


class _Classes(tuple[str, ...]):
    """The fault classes, as completions list them; every fault ``_fault`` accepted is one of them."""

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and text.partition(":")[0] in tuple(self)


def _fault(text: str) -> str:
    try:
        return faults.parse(text).text() if ":" in text else faults.parse(text).kind
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _device(text: str) -> str:
    if text != ALL and not (text.isdigit() and len(text) <= 6):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device index or {ALL!r}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tpuwatch canary``."""
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--inject", metavar="CLASS[:KEY=VALUE,...]", type=_fault, choices=_Classes(INJECTIONS),
                        help=f"fire drill on one chip, never recorded: {', '.join(INJECTIONS)}, with parameters "
                             "as docs/canary.md#fire-drills lists (e.g. matmul:bits=8,pattern=0x5a,p=0.5)")
    parser.add_argument("--inject-device", metavar="N", type=int,
                        help="the chip the injection hits (default 0)")
    parser.add_argument("--timeout", metavar="S", type=_seconds,
                        help="hard limit for the run, like 30 or 30s (default canary.timeout)")
    parser.add_argument("--reset-history", metavar="DEVICE", nargs="?", const=ALL, type=_device,
                        help="remove the recorded fingerprints of DEVICE (default: all) on every stack, "
                             "say what was removed, and run nothing")


def render(result: CanaryResult) -> str:
    """The readable report: a verdict line, the drill's, then a row per chip."""
    head = f"canary: {result.status.upper()}"
    if result.reason:
        head += f": {result.reason}"
    lines = [head]
    if result.drill is not None:
        drill = result.drill
        said = result.status == "undetected"  # the verdict line already says why
        lines.append(f"drill: {drill.kind} on device {drill.device} "
                     + (drill.reason if drill.caught else "not caught" + ("" if said else f": {drill.reason}"))
                     + "; the fingerprint history was left as it was")
    if result.stack:
        lines.append(f"chip: {result.chip} ({result.platform}); stack: {result.stack}; "
                     f"tolerance {result.tolerance:.2g}")
    if result.devices:
        rows = [("DEVICE", "STATUS", "MAX ABS ERR", "FINGERPRINT", "TIME ms", "NOTE")]
        for d in result.devices:
            rows.append((d.device, d.status, "-" if d.max_abs_error is None else f"{d.max_abs_error:.2e}",
                         d.fingerprint or "-",
                         "-" if d.duration_seconds is None else f"{d.duration_seconds * 1000:.2f}",
                         d.reason or ""))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        lines.append("")
        lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[5]
                  for row in rows]
    lines.append(f"\nwall time {result.wall_seconds:.2f}s")
    return "\n".join(line.rstrip() for line in lines)


def render_removed(removed: Removed) -> str:
    """What ``--reset-history`` removed, one line per fingerprint."""
    if removed.unreadable is not None:
        return f"canary: removed {removed.path}, which could not be used: {removed.unreadable}"
    if not removed.fingerprints:
        return f"canary: nothing to remove in {removed.path}"
    lines = [f"canary: removed {len(removed.fingerprints)} fingerprint(s) from {removed.path}:"]
    lines += [f"  device {device}: {fingerprint} ({key})" for key, device, fingerprint in removed.fingerprints]
    return "\n".join(lines)


class ProgressLine:
    """``canary: device 0 running for 12 s (...)`` on a terminal, rewritten in place about once a second."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.shown = ""

    def __call__(self, progress: Progress) -> None:
        """Show where the run is, once it has taken a second."""
        if progress.run_seconds < 1:
            return
        where = "starting the worker" if progress.device is None else \
            f"device {progress.device} running for {int(progress.device_seconds)} s"
        text = f"canary: {where} ({int(progress.run_seconds)} s of the {progress.timeout:g} s timeout)"
        if text != self.shown:
            self.stream.write(f"\r{text}\x1b[K")
            self.stream.flush()
            self.shown = text

    def clear(self) -> None:
        """Erase the line, if one was shown."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = ""


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _reset(args: argparse.Namespace, config: Config) -> int:
    device = None if args.reset_history == ALL else args.reset_history
    try:
        removed = FingerprintHistory(history_path(config.state_dir)).reset(device)
    except (OSError, HistoryBusy) as exc:
        print(f"tpuwatch canary: cannot reset the fingerprint history: {exc}", file=sys.stderr)
        return EXIT_CODES["error"]
    if args.json:
        print(json.dumps({"path": str(removed.path), "unreadable": removed.unreadable,
                          "removed": [{"stack_key": key, "device": d, "fingerprint": fp}
                                      for key, d, fp in removed.fingerprints]}, indent=2))
    else:
        print(render_removed(removed))
    return 0


def run(args: argparse.Namespace, config: Config) -> int:
    """Run the canary once and report; the exit code says pass, wrong results, could not run, or interrupted."""
    if args.inject_device is not None and args.inject is None:
        print("tpuwatch canary: --inject-device needs --inject KIND", file=sys.stderr)
        return EXIT_USAGE
    if args.reset_history is not None:
        if args.inject is not None or args.timeout is not None:
            print("tpuwatch canary: --reset-history runs nothing: no --inject or --timeout with it", file=sys.stderr)
            return EXIT_USAGE
        return _reset(args, config)
    line = ProgressLine(sys.stderr) if sys.stderr.isatty() and not args.json else None
    previous = {signum: signal.signal(signum, _interrupted) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = run_canary(config, args.inject, args.inject_device or 0, args.timeout, progress=line)
    except KeyboardInterrupt:
        if line:
            line.clear()
        print("tpuwatch canary: interrupted; the worker's process group was killed", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if line:
        line.clear()
    print(json.dumps(result.to_json(), indent=2) if args.json else render(result))
    return EXIT_CODES[result.status]
