#!/usr/bin/env python3
"""Run every benchmark script and let each rewrite its own section of BENCHMARKS.md.

Usage::

    python benchmarks/run.py [--quick] [--only NAME ...]

Each script is also runnable alone; ``--quick`` is passed on for smoke runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = ["daemon", "footprint", "days", "soak", "devices", "kernel_log", "storm", "trend", "analyze", "config", "state", "canary", "sdc", "probe", "alerting", "flood", "fleet", "previous_boot", "status", "quickstart"]


def main() -> int:
    """Run the selected scripts in order; exit non-zero if any failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke runs: short windows, figures not to quote")
    parser.add_argument("--only", nargs="+", choices=SCRIPTS, metavar="NAME", help=f"any of {', '.join(SCRIPTS)}")
    args = parser.parse_args()
    failed = []
    for name in args.only or SCRIPTS:
        script = HERE / f"{name}.py"
        if not script.exists():
            continue
        print(f"==> benchmarks/{name}.py", file=sys.stderr, flush=True)
        command = [sys.executable, str(script), *(["--quick"] if args.quick else [])]
        if subprocess.run(command, check=False).returncode != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
