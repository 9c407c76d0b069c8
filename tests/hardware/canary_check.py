#!/usr/bin/env python3
"""Run the canary on a real accelerator host and print what every chip computed.

Usage (on a TPU VM or GPU host with jax installed for that accelerator)::

    python tests/hardware/canary_check.py [--python PATH] [--state-dir DIR] [--drill]

Prints the worker's platform, chip kind and software stack, then per chip: the
verdict, the max abs error against the float64 numpy reference next to the
tolerance for that device kind, the fingerprint, the compile time and the
device time of one inference; then a second (warm cache) run to show the
fingerprints repeat bit for bit.  With ``--drill`` it also runs each weight
injection on chip 0, judged against the first run's fingerprints, and shows
that the drill is caught and only chip 0 is flagged.  Exit 0 when every
step behaved as expected.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tpuwatch.canary.judge import Drill, History, judge
from tpuwatch.canary.runner import run_worker
from tpuwatch.config import CanaryConfig, Config


def show(title: str, config: Config, inject: str | None = None, history: History | None = None
         ) -> tuple[str, dict[str, str], History]:
    """One run through the real runner: print every chip; the status, the fingerprints, the history it leaves."""
    lines, ended = run_worker(config, inject, 0)
    result, after = judge(lines, ended, history or {}, Drill(inject, "0") if inject else None)
    compile_times = {line["device"]: line["compile_seconds"] for line in lines if line["event"] == "result"}
    print(f"\n== {title}: {result.status}" + (f" ({result.reason})" if result.reason else ""))
    if result.stack:
        print(f"platform {result.platform}, chip {result.chip}, stack {result.stack}, "
              f"tolerance {result.tolerance:.3g}")
    for d in result.devices:
        error = "-" if d.max_abs_error is None else f"{d.max_abs_error:.3e}"
        timing = "" if d.duration_seconds is None else \
            f" compile {compile_times[d.device] * 1000:.1f} ms, run {d.duration_seconds * 1000:.3f} ms"
        print(f"  chip {d.device}: {d.status:7} err {error:>10} fp {d.fingerprint or '-':16}{timing}"
              + (f"  [{d.check}: {d.reason}]" if d.reason else ""))
    if result.drill:
        print(f"  drill {'caught' if result.drill.caught else 'NOT caught'}: {result.drill.reason}")
    caught = result.drill is None or result.drill.caught
    return result.status if caught else "undetected", {d.device: d.fingerprint or "" for d in result.devices}, after


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the tpuwatch canary on this host's accelerators.")
    parser.add_argument("--python", help="interpreter with the accelerator's jax (default: this one)")
    parser.add_argument("--state-dir", help="where the compile cache goes (default: a temp dir)")
    parser.add_argument("--drill", action="store_true", help="also run the weight injections on chip 0")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(state_dir=args.state_dir or tmp,
                        canary=dataclasses.replace(CanaryConfig(), python=args.python, timeout=600.0))
        first_status, first, history = show("cold run", config)
        second_status, second, _ = show("warm run", config)
        ok = first_status == second_status == "pass" and first == second
        print(f"\nfingerprints repeat bit for bit: {first == second}")
        if args.drill:
            for kind in ("bitflip", "scale", "nan"):
                status, _, _ = show(f"drill {kind} on chip 0", config, kind, history)  # judged against run 1
                ok = ok and status == "fail"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
