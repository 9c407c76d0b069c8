"""Which device a kernel message is about: the kernel's device tag, the message's prefix, and sysfs.

The kernel tags a record printed with ``dev_printk()`` with the device
(drivers/base/core.c, Documentation/ABI/testing/dev-kmsg): /dev/kmsg's
``DEVICE=`` continuation line, the journal's ``_KERNEL_DEVICE``, as
``+subsystem:name`` (``+pci:0000:3b:00.0``), ``cMAJ:MIN`` (a character
device, e.g. ``c121:0`` for the Cloud TPU driver's /dev/accel0),
``bMAJ:MIN`` (a block device) or ``nIFINDEX`` (a network interface).  The
message text itself starts with ``<driver> <device name>: ``
(``nvidia 0000:3b:00.0: ``, ``accel accel0: ``).  Decoding is pure;
``SysfsResolver`` follows ``/sys/dev/char/MAJ:MIN``, ``/sys/dev/block/MAJ:MIN``,
``/sys/class/net/*/ifindex`` and ``/sys/class/<class>/<name>`` (under
``paths.sysfs``) to the PCI function the device sits on.
"""

from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from tpuwatch.kernel_log.records import Record
from tpuwatch.kernel_log.rule import normalise

if TYPE_CHECKING:
    from tpuwatch.devices.base import DeviceReading

CACHE_SIZE = 1024
CACHE_SECONDS = 300.0
MAX_NET_INTERFACES = 4096

_PCI = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_PCI_RE = re.compile(_PCI)
_DEVICE_RE = re.compile(r"\+(?P<subsystem>[a-z0-9_-]{1,32}):(?P<name>[^/\s]{1,128})|(?P<kind>[cb])(?P<major>\d{1,9}):"
                        r"(?P<minor>\d{1,9})|n(?P<ifindex>\d{1,9})")
# "<driver> <device>: ", e.g. "nvidia 0000:3b:00.0: ", "vfio-pci 0000:00:05.0: ", "accel accel0: " (a class
# device without a driver prints its class); netdev_printk adds the interface: "mlx5_core 0000:ab:00.0 mlx5_5: ".
_PREFIX_RE = re.compile(r"(?P<driver>[a-z][a-z0-9_.-]{0,63}) (?:(?P<pci>" + _PCI
                        + r")|(?P<name>[A-Za-z][A-Za-z0-9_.-]{0,62}[0-9]))(?: [A-Za-z0-9_.-]{1,64})?: ")
# The same prefix reversed, to search a reversed text: the engine skips to each ": " (its literal start) instead of
# trying every letter, as a search for the prefix anywhere in a line would.
_REVERSED_PREFIX_RE = re.compile(r" :(?:[A-Za-z0-9_.-]{1,64} )?(?:[0-7]\.[0-9a-fA-F]{2}:[0-9a-fA-F]{2}:[0-9a-fA-F]{4}|"
                                 r"[0-9][A-Za-z0-9_.-]{0,62}[A-Za-z]) [a-z0-9_.-]{0,63}[a-z]")
_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def pci_of_key(key: str | None) -> str | None:
    """The PCI address a ``device_key`` names, or None (no device, or one that is not a PCI function)."""
    return key if key is not None and _PCI_RE.fullmatch(key) else None


def kernel_device_key(value: str | None) -> str | None:
    """A DEVICE=/_KERNEL_DEVICE value as a stable key: the PCI address for ``+pci:``, else the value itself."""
    if not value:
        return None
    if value.startswith("+pci:"):
        return normalise(value[5:]) or value
    return value if _DEVICE_RE.fullmatch(value) else None


def printed_prefix(message: str) -> str | None:
    """The ``dev_printk`` prefix a message starts with, as printed (``"nvidia 0000:3b:00.0: "``), or None."""
    found = _PREFIX_RE.match(message)
    return None if found is None else found[0]


def names_a_device(text: str) -> bool:
    """True if a ``dev_printk`` prefix is anywhere in ``text`` (a raw line: after its timestamp or syslog head)."""
    return _REVERSED_PREFIX_RE.search(text[::-1]) is not None


def prefix_device(message: str) -> tuple[str, str] | None:
    """The ``(driver, device)`` a message's ``dev_printk`` prefix names, e.g. ``("accel", "accel0")``."""
    found = _PREFIX_RE.match(message)
    if found is None:
        return None
    device = normalise(found["pci"]) if found["pci"] else found["name"]
    return None if device is None else (found["driver"], device)


def device_key(record: Record) -> str | None:
    """A key for the device a record is about, without sysfs: the PCI address where the record itself says it."""
    key = kernel_device_key(record.kernel_device)
    if key is not None:
        return key
    prefix = prefix_device(record.message)
    if prefix is None:
        return None
    driver, device = prefix
    return device if _PCI_RE.fullmatch(device) else f"{driver}/{device}"


class SysfsResolver:
    """Kernel device tags and class devices -> PCI address, reading only under ``sysfs``; cached, bounded."""

    def __init__(self, sysfs: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.sysfs = os.path.realpath(sysfs)
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, str | None]] = OrderedDict()

    def pci_of_kernel_device(self, value: str | None) -> str | None:
        """The PCI function a DEVICE=/_KERNEL_DEVICE value sits on, or None."""
        if not value:
            return None
        found = _DEVICE_RE.fullmatch(value)
        if found is None:
            return None
        if found["subsystem"] == "pci":
            return normalise(found["name"])
        return self._cached(value, lambda: self._resolve_device(found))

    def pci_of_class_device(self, cls: str, name: str) -> str | None:
        """The PCI function under ``/sys/class/<cls>/<name>`` (or ``/sys/bus/<cls>/devices/<name>``), or None."""
        if not _NAME_RE.fullmatch(cls) or not _NAME_RE.fullmatch(name) or "." in (cls[:1], name[:1]):
            return None
        return self._cached(f"{cls}/{name}", lambda: self._pci_under(
            os.path.join(self.sysfs, "class", cls, name)) or self._pci_under(
            os.path.join(self.sysfs, "bus", cls, "devices", name)))

    def _resolve_device(self, found: re.Match[str]) -> str | None:
        if found["subsystem"]:
            name = found["name"]
            return None if not _NAME_RE.fullmatch(name) or name[0] == "." else self.pci_of_class_device(
                found["subsystem"], name)
        if found["kind"]:
            kind = "char" if found["kind"] == "c" else "block"
            number = f"{int(found['major'])}:{int(found['minor'])}"
            return self._pci_under(os.path.join(self.sysfs, "dev", kind, number))
        return self._pci_of_ifindex(int(found["ifindex"]))

    def _pci_of_ifindex(self, ifindex: int) -> str | None:
        root = os.path.join(self.sysfs, "class", "net")
        try:
            names = sorted(os.listdir(root))[:MAX_NET_INTERFACES]
        except OSError:
            return None
        for name in names:
            try:
                with open(os.path.join(root, name, "ifindex"), "rb") as file:
                    if int(file.read(32).strip() or b"-1") != ifindex:
                        continue
            except (OSError, ValueError):
                continue
            return self._pci_under(os.path.join(root, name))
        return None

    def _pci_under(self, path: str) -> str | None:
        """The deepest PCI address in the real path of ``path`` (the device or the bridge it hangs off)."""
        try:
            real = os.path.realpath(path, strict=True)
        except (OSError, RuntimeError):
            return None
        if os.path.commonpath([real, self.sysfs]) != self.sysfs:
            return None
        for part in reversed(real[len(self.sysfs):].split(os.sep)):
            if _PCI_RE.fullmatch(part):
                return normalise(part)
        return None

    def _cached(self, key: str, resolve: Callable[[], str | None]) -> str | None:
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            self._cache.move_to_end(key)
            return hit[1]
        value = resolve()
        self._cache[key] = (now, value)
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return value


class Attribution:
    """PCI address and chip for a match: the rule's own PCI field, else the kernel's device tag, else the prefix.

    Called with a PCI address it gives the chip index (``device_for_pci``), so
    it can stand wherever a plain lookup is expected.
    """

    def __init__(self, device_for_pci: Callable[[str], str | int | None], sysfs: SysfsResolver | None = None) -> None:
        self._device_for_pci = device_for_pci
        self.sysfs = sysfs

    def __call__(self, pci: str) -> str | None:
        device = self._device_for_pci(pci)
        return None if device is None else str(device)

    def pci_of(self, record: Record) -> str | None:
        """The PCI function ``record`` is about, from its device tag, else its message prefix, or None."""
        value = record.kernel_device
        if value and value.startswith("+pci:"):
            return normalise(value[5:])
        if value and self.sysfs is not None:
            pci = self.sysfs.pci_of_kernel_device(value)
            if pci is not None:
                return pci
        prefix = prefix_device(record.message)
        if prefix is None:
            return None
        driver, device = prefix
        if _PCI_RE.fullmatch(device):
            return device
        return self.sysfs.pci_of_class_device(driver, device) if self.sysfs is not None else None


def as_attribution(lookup: Attribution | Callable[[str], str | int | None]) -> Attribution:
    """``lookup`` itself if it is an Attribution, else one over it that decodes without sysfs."""
    return lookup if isinstance(lookup, Attribution) else Attribution(lookup)


def device_lookup(readings: Callable[[], Iterable[DeviceReading]]) -> Callable[[str], str | None]:
    """A PCI-address -> chip-index lookup over the device backend's latest readings.

    ``readings`` is called on every lookup, e.g. ``lambda: board.current.readings`` (the cycle's inventory).
    """
    def lookup(pci: str) -> str | None:
        for reading in readings():
            if reading.pci and normalise(reading.pci) == pci:  # normalise caches: the same few addresses
                return reading.device
        return None
    return lookup
