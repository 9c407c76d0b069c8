"""What the devices collector has seen this boot (chips, and their links seen active), kept across restarts.

A chip seen before and now missing is reported down, and a chip-to-chip link
is exported once it has been seen active (``tpuwatch_device_nvlink_up`` 1,
later 0: AcceleratorLinkDown; a link never active may be an unused port).
Both facts are saved under ``state_dir`` with this boot's id and the backend's
name and settings, so that a chip that vanished or a link that went down stays reported
down when tpuwatch restarts (an upgrade, a crash), instead of its series
disappearing and its alert resolving.  After a reboot the memory starts
empty: chips enumerate and links train afresh.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tpuwatch import statefile
from tpuwatch.devices.base import DeviceReading

MAX_CHIPS = 1024
MAX_LINK = 63
SHAPE = statefile.Fields({
    "boot_id": statefile.Str(64), "backend": statefile.Str(64),
    "chips": statefile.MapOf(statefile.Fields({"chip": statefile.Str(128), "pci": statefile.Str(16)}),
                             max_items=MAX_CHIPS, key_chars=64),
    "links": statefile.MapOf(statefile.Str(256), max_items=MAX_CHIPS, key_chars=64)})


class SeenThisBoot:
    """Chips and active links seen this boot; ``save()`` writes them to ``path`` (with ``boot_id``) when new."""

    def __init__(self, backend: str, path: Path | None = None, boot_id: str | None = None) -> None:
        self._backend = backend
        self._path = path if boot_id else None
        self._boot_id = boot_id
        self.chips: dict[str, tuple[str, str | None]] = {}  # device -> (chip, pci)
        self._links: dict[str, set[int]] = {}  # PCI address (else "device N") -> links seen active
        self._dirty = False
        state = statefile.load(self._path, "devices seen this boot", SHAPE)
        if state is None or state.get("boot_id") != boot_id or state.get("backend") != backend:
            return
        for device, chip in state.get("chips", {}).items():
            if "chip" in chip and is_number(device):  # the backends number chips 0, 1, ...
                self.chips[device] = (chip["chip"], chip.get("pci") or None)
        for key, links in state.get("links", {}).items():
            numbers = {int(n) for n in links.split(",") if is_number(n) and int(n) <= MAX_LINK}
            if numbers:
                self._links[key] = numbers

    def note(self, reading: DeviceReading) -> DeviceReading:
        """Remember the chip; the reading with only its links that are active or were seen active this boot."""
        changed = False
        if reading.pci is not None and self.chips.get(reading.device, (None, reading.pci))[1] != reading.pci:
            del self.chips[reading.device]  # another chip has this number now (a chip that does not answer says None)
        if reading.device not in self.chips and len(self.chips) < MAX_CHIPS:
            self.chips[reading.device] = (reading.chip, reading.pci)
            changed = True
        if reading.links is not None:
            key = reading.pci or f"device {reading.device}"
            seen = self._links.get(key)
            if seen is None and len(self._links) < MAX_CHIPS:
                seen = self._links[key] = set()
            new = {link.link for link in reading.links if link.up and 0 <= link.link <= MAX_LINK} - (seen or set())
            if seen is not None and new:
                seen |= new
                changed = True
            reading = dataclasses.replace(reading, links=tuple(
                link for link in reading.links if link.up or (seen is not None and link.link in seen)))
        self._dirty |= changed
        return reading

    def forget(self, device: str) -> None:
        """Drop a remembered chip (it was renumbered, or its number is another chip's now)."""
        self._dirty |= self.chips.pop(device, None) is not None

    def save(self) -> None:
        """Write what is new since the last save (one atomic write per read of all chips)."""
        if not self._dirty:
            return
        self._dirty = False
        statefile.save(self._path, {
            "boot_id": self._boot_id, "backend": self._backend,
            "chips": {device: {"chip": chip[:128], "pci": pci or ""} for device, (chip, pci) in self.chips.items()},
            "links": {key: ",".join(map(str, sorted(links))) for key, links in self._links.items() if links}})


def is_number(text: str) -> bool:
    """A decimal number of at most six ASCII digits ("²".isdigit() is true, and int("²") raises)."""
    return 0 < len(text) <= 6 and text.isascii() and text.isdecimal()
