"""Which chip-to-chip links were seen active this boot, remembered across restarts of tpuwatch.

A backend reports every link a chip has, active or not; a link that is not
active may be an unused port, so it is exported only once it has been seen
active (``tpuwatch_device_nvlink_up`` 1, later 0: AcceleratorLinkDown).  The
links seen active are saved under ``state_dir`` with this boot's id, so that
a link that went down stays reported down when tpuwatch restarts (an upgrade,
a crash) instead of vanishing and resolving its alert; after a reboot the
links train afresh and the memory starts empty.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tpuwatch import statefile
from tpuwatch.devices.base import DeviceReading

MAX_CHIPS = 1024
MAX_LINK = 63
SHAPE = statefile.Fields({"boot_id": statefile.Str(64),
                          "links": statefile.MapOf(statefile.Str(256), max_items=MAX_CHIPS, key_chars=64)})


class LinkMemory:
    """The links seen active per chip (by PCI address, else index); saved at ``path`` when one is first seen."""

    def __init__(self, path: Path | None = None, boot_id: str | None = None) -> None:
        self._path = path if boot_id else None
        self._boot_id = boot_id
        self._seen: dict[str, set[int]] = {}
        state = statefile.load(self._path, "links seen active", SHAPE)
        if state is not None and state.get("boot_id") == boot_id:
            for chip, links in state.get("links", {}).items():
                numbers = {int(n) for n in links.split(",") if n.isdigit() and int(n) <= MAX_LINK}
                if numbers:
                    self._seen[chip] = numbers

    def apply(self, reading: DeviceReading) -> DeviceReading:
        """The reading with only the links that are active or were seen active this boot."""
        if reading.links is None:
            return reading
        key = reading.pci or f"device {reading.device}"
        seen = self._seen.get(key)
        if seen is None:
            if len(self._seen) >= MAX_CHIPS:
                return dataclasses.replace(reading, links=tuple(link for link in reading.links if link.up))
            seen = self._seen[key] = set()
        new = {link.link for link in reading.links if link.up and 0 <= link.link <= MAX_LINK} - seen
        if new:
            seen |= new
            self._save()
        return dataclasses.replace(reading, links=tuple(link for link in reading.links if link.up or link.link in seen))

    def _save(self) -> None:
        statefile.save(self._path, {"boot_id": self._boot_id,
                                    "links": {chip: ",".join(map(str, sorted(links)))
                                              for chip, links in self._seen.items() if links}})
