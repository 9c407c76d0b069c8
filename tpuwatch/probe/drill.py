"""The ``probe-sdc`` scenario's simulated job: ``python -m tpuwatch.probe.drill`` (tpuwatch.jobreports.drill starts it).

It opens every simulated chip's device file (``devices.sim.device_dir``), so
the daemon sees it hold them, and calls ``Probe.step()`` in its loop, one
host CPU device per chip; from ``fault_after`` on its probe injects ``scale``
on ``fault_device``.  It exits when its parent (the daemon) is gone.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from tpuwatch.probe.core import Probe

STEP_S = 0.2  # the simulated job's step time
EVERY_S = 5.0  # its probe's period: the drill fires within seconds of fault_after


def main(argv: list[str] | None = None) -> int:
    """The simulated job: hold the chips' device files, step, probe; exit when the parent is gone."""
    parser = argparse.ArgumentParser(prog="python -m tpuwatch.jobreports.drill")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--device-dir", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--fault-device", type=int, default=0)
    parser.add_argument("--fault-after", type=float, default=30.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="probe-sdc job: %(message)s")
    parent = os.getppid()
    os.makedirs(args.device_dir, exist_ok=True)
    held = [open(os.path.join(args.device_dir, f"accel{i}"), "a") for i in range(args.count)]  # noqa: SIM115
    started = time.monotonic()
    probe = Probe(every=EVERY_S, socket=args.socket)
    faulty = False
    while os.getppid() == parent:
        if not faulty and time.monotonic() - started >= args.fault_after:
            probe = Probe(every=EVERY_S, socket=args.socket, inject=f"scale@{args.fault_device}")
            faulty = True
        probe.step()
        time.sleep(STEP_S)
    for handle in held:
        handle.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
