"""One cycle's inventory: the chips the devices stage read and their holders, frozen, and the board that hands
it to every later part of the cycle.

The devices stage runs first in every cycle and publishes what it found once
(``Board.publish``): the readings (each chip's PCI address, device files and
device-plugin ids among them) and the holders of the device files, from the
cycle's one holder scan.  Every later part reads ``Board.current``, never the
devices collector: the host collector (holders, named by chip), kernel-log
attribution (PCI address -> chip), the canary's chips, the probe socket's
chips, the actions (chip -> PCI address) and the views.  The sampler opens
the board before the first stage and seals it after (``begin``, ``seal``):
a device read that outlives its deadline publishes nothing, so every part of
one cycle reads one inventory, this cycle's when the chips answered in time,
else the last one that did.  Outside a sampler's cycles (one-shot reads) a
publish always lands.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from tpuwatch.config import Config
from tpuwatch.devices.base import DeviceReading
from tpuwatch.host.collector import ChipFiles
from tpuwatch.hw.procfs import Holder, HolderScan

log = logging.getLogger(__name__)


def holder_scan(config: Config, clock: Callable[[], float] = time.monotonic) -> HolderScan:
    """The cycle's one scan of device-file holders: ``host.device_files`` and the chips' own device files, every
    ``host.holder_scan_interval`` (a backend that reads holders reads this one; the devices stage publishes it)."""
    return HolderScan(config.paths.procfs, config.paths.dev, config.host.device_files,
                      config.host.holder_scan_interval, clock)


@dataclass(frozen=True)
class Inventory:
    """The chips one cycle's devices stage read and the holders of their device files (and of
    ``host.device_files``).  ``cycle`` is the board's count of cycles when it was published (0: before any,
    or outside a sampler)."""

    cycle: int = 0
    readings: tuple[DeviceReading, ...] = ()
    holders: Mapping[int, Holder] = field(default_factory=lambda: MappingProxyType({}))

    @cached_property
    def devices(self) -> tuple[str, ...]:
        """The chips' indices, in the devices collector's order."""
        return tuple(r.device for r in self.readings)

    @cached_property
    def pci_by_device(self) -> Mapping[str, str]:
        """chip -> PCI address, for the chips whose address is known."""
        return MappingProxyType({r.device: r.pci for r in self.readings if r.pci})

    @cached_property
    def chip_files(self) -> ChipFiles:
        """device file (relative to /dev) -> (chip, device-plugin ids)."""
        return MappingProxyType({f: (r.device, r.plugin_ids) for r in self.readings for f in r.device_files})


class Board:
    """Where the devices stage publishes each cycle's inventory and every later part reads it.

    ``current`` is one immutable object, swapped whole under a lock: a reader never sees half of an inventory.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current = Inventory()
        self._cycle = 0
        self._open = True

    @property
    def current(self) -> Inventory:
        """The inventory the latest (sealed) cycle's devices stage published."""
        return self._current

    def begin(self) -> None:
        """A cycle starts: what its first stage publishes is this cycle's inventory."""
        with self._lock:
            self._cycle += 1
            self._open = True

    def seal(self) -> None:
        """The first stage is over: the inventory stands for the rest of the cycle; later publishes are refused."""
        with self._lock:
            self._open = False

    def publish(self, readings: Iterable[DeviceReading], holders: Mapping[int, Holder]) -> bool:
        """Make ``readings`` and ``holders`` the cycle's inventory; False (nothing changed) once it is sealed."""
        with self._lock:
            if not self._open:
                log.debug("devices: a read that finished after its stage was not published (cycle %d)", self._cycle)
                return False
            self._current = Inventory(self._cycle, tuple(readings), MappingProxyType(dict(holders)))
            return True
