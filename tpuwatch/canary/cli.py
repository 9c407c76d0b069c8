"""``tpuwatch canary``: one reference-inference run exactly as the daemon runs it.

Exit 0 pass, 1 wrong results, 3 could not run (error, timeout, crash, every
chip skipped), 2 usage or config error.
"""

from __future__ import annotations

import argparse
import json
import sys

from tpuwatch.canary.runner import CanaryResult, run_canary
from tpuwatch.canary.spec import INJECTIONS
from tpuwatch.config import Config
from tpuwatch.schema import parse_duration

EXIT_CODES = {"pass": 0, "fail": 1, "skipped": 3, "error": 3}
EXIT_USAGE = 2


def _seconds(text: str) -> float:
    try:
        value = float(text) if text.replace(".", "", 1).isdigit() else parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tpuwatch canary``."""
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--inject", metavar="KIND", choices=INJECTIONS,
                        help=f"fire drill on one chip: {', '.join(INJECTIONS)}")
    parser.add_argument("--inject-device", metavar="N", type=int,
                        help="the chip the injection hits (default 0)")
    parser.add_argument("--timeout", metavar="S", type=_seconds,
                        help="hard limit for the run, like 30 or 30s (default canary.timeout)")


def render(result: CanaryResult) -> str:
    """The readable report: a verdict line, then a row per chip."""
    head = f"canary: {result.status.upper()}"
    if result.reason:
        head += f": {result.reason}"
    lines = [head]
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


def run(args: argparse.Namespace, config: Config) -> int:
    """Run the canary once and report; the exit code says pass, wrong results or could not run."""
    if args.inject_device is not None and args.inject is None:
        print("tpuwatch canary: --inject-device needs --inject KIND", file=sys.stderr)
        return EXIT_USAGE
    result = run_canary(config, args.inject, args.inject_device or 0, args.timeout)
    print(json.dumps(result.to_json(), indent=2) if args.json else render(result))
    return EXIT_CODES[result.status]

