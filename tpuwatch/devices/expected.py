"""How many chips this host should have (``devices.expected``), and which of them do not answer.

``auto`` takes, in order: the TPU slice the environment describes (``TPU_CHIPS_PER_HOST_BOUNDS``, the
chips of one host as the TPU device plugin and Cloud TPU's ``tpu-env`` write them, e.g. ``2,2,1``;
else ``TPU_ACCELERATOR_TYPE`` / ``ACCELERATOR_TYPE`` such as ``v5litepod-8``); the simulator's chip
count; else the chips the backend finds on the PCI bus at start (its module's ``chips``: one PCI function
per TPU chip, NVIDIA display-class functions, AMD Instinct functions).
A count in the config wins over all of them; ``off`` expects nothing.

An accelerator type names the slice, not the host: ``v2``/``v3``/``v4``/``v5p`` count TensorCores (two per
chip), ``v5litepod`` and ``v6e`` count chips (Ray's ``tpu.py``; the GKE TPU device plugin's
``convertAcceleratorType``).  A slice of at most 8 chips (v5e, v6e) or 4 (the others) is taken to be one
host's; a larger slice has 4 chips per host (every multi-host slice in the device plugin's tests).  A
v5litepod-8 or v6e-8 may also be two 4-chip GKE nodes: there the device plugin sets the per-host bounds,
which come first.  Other generations (7x) are left to the bounds, the config or the PCI count.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tpuwatch.config import Config
from tpuwatch.devices import BACKENDS, chips_of
from tpuwatch.devices.base import DeviceReading
from tpuwatch.samples import Sample, sample

BOUNDS_VARIABLES = ("TPU_CHIPS_PER_HOST_BOUNDS", "CHIPS_PER_HOST_BOUNDS")
TYPE_VARIABLES = ("TPU_ACCELERATOR_TYPE", "ACCELERATOR_TYPE")
CORES_PER_CHIP = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2, "v5litepod": 1, "v6e": 1}
ONE_HOST_CHIPS = {"v5litepod": 8, "v6e": 8}  # the largest slice one host holds; 4 for the others
MULTI_HOST_CHIPS = 4
_TYPE_RE = re.compile(r"(v2|v3|v4|v5p|v5litepod|v6e)-(\d{1,6})")
_BOUNDS_RE = re.compile(r"(\d{1,3}),(\d{1,3}),(\d{1,3})")


@dataclass(frozen=True)
class Expectation:
    """How many chips the host should have, from where, and the PCI functions expected where known."""

    count: int
    source: str  # config, accelerator_type, simulator, pci
    why: str
    pci: tuple[str, ...] = ()


def chips_from_environment(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """(chips on this host, the variable that says so), or None when the environment names no TPU slice."""
    for name in BOUNDS_VARIABLES:
        match = _BOUNDS_RE.fullmatch(environ.get(name, "").strip().strip("'\""))
        if match:
            chips = math.prod(int(group) for group in match.groups())
            if chips:
                return chips, f"{name}={match[0]}"
    for name in TYPE_VARIABLES:
        value = environ.get(name, "").strip().strip("'\"")
        match = _TYPE_RE.fullmatch(value)
        if match and int(match[2]) >= CORES_PER_CHIP[match[1]]:
            slice_chips = int(match[2]) // CORES_PER_CHIP[match[1]]
            one_host = ONE_HOST_CHIPS.get(match[1], MULTI_HOST_CHIPS)
            chips = slice_chips if slice_chips <= one_host else MULTI_HOST_CHIPS
            return chips, f"{name}={value}"
    return None


def pci_functions(config: Config, backend: str) -> tuple[str, ...]:
    """The PCI address of each chip ``backend`` finds under ``paths.sysfs`` (``chips`` of its module)."""
    return tuple(chips_of(backend, config.paths.sysfs)) if backend in BACKENDS else ()


def expect(config: Config, backend: str, environ: Mapping[str, str] = os.environ) -> Expectation | None:
    """What ``devices.expected`` makes of this host (None: nothing expected)."""
    setting = config.devices.expected
    if setting == "off":
        return None
    if setting != "auto":
        return Expectation(int(setting), "config", f"devices.expected is {setting}")
    found = chips_from_environment(environ) if backend == "tpu" else None
    if found is not None:
        return Expectation(found[0], "accelerator_type", f"{found[1]}: {found[0]} chip(s) on this host")
    if backend == "sim":
        count = config.devices.sim.count
        return Expectation(count, "simulator", f"devices.sim.count is {count}")
    functions = pci_functions(config, backend)
    if not functions:
        return None
    return Expectation(len(functions), "pci", f"{len(functions)} accelerator PCI function(s) at start", functions)


def candidates(expectation: Expectation, readings: Iterable[DeviceReading]) -> list[str]:
    """Expected PCI functions no reading names."""
    present = {r.pci for r in readings if r.pci}
    return [pci for pci in expectation.pci if pci not in present]


def missing(expectation: Expectation, readings: Iterable[DeviceReading]) -> tuple[list[str], int]:
    """(expected PCI functions no chip answers for, how many more are missing that no PCI function names).

    A chip the backend still reports, even down, is not missing: it is the lost-chip alert's.  When a chip
    is reported without its PCI address (lost before it was ever read), which of the unclaimed functions
    are missing is not known: they are counted, not named.
    """
    found = list(readings)
    short = max(0, expectation.count - len(found))
    unclaimed = candidates(expectation, found)
    named = unclaimed if len(unclaimed) <= short else []
    return named, short - len(named)


def missing_samples(expectation: Expectation, readings: Iterable[DeviceReading]) -> list[Sample]:
    """``tpuwatch_devices_expected`` and ``tpuwatch_devices_missing``: one series per missing PCI function,
    one (``pci=""``) for those known by count only, 0 when nothing is missing."""
    named, unnamed = missing(expectation, readings)
    out = [sample("tpuwatch_devices_expected", expectation.count, source=expectation.source)]
    out += [sample("tpuwatch_devices_missing", 1, pci=pci) for pci in named]
    if unnamed or not named:
        out.append(sample("tpuwatch_devices_missing", unnamed, pci=""))
    return out


def missing_problem(expectation: Expectation, readings: Iterable[DeviceReading]) -> str | None:
    """One sentence naming what is missing (for ``tpuwatch check`` and /healthz), or None."""
    found = list(readings)
    named, unnamed = missing(expectation, found)
    if not named and not unnamed:
        return None
    what = [f"pci {', '.join(named)} (on the bus, not answering)"] if named else []
    unclaimed = [] if named else candidates(expectation, found)
    if unnamed:
        what.append(f"{unnamed} among pci {', '.join(unclaimed)}" if unclaimed
                    else f"{unnamed} not on the PCI bus or not enumerated")
    return (f"{len(named) + unnamed} of {expectation.count} expected accelerator(s) missing "
            f"({expectation.why}; {len(found)} reported): {'; '.join(what)}")
