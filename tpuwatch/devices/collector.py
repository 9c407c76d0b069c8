"""The devices collector: a backend's readings as samples, chips that vanished kept as down, the processes
using each chip named by pod, and the chips the host should have but does not report.  It is the pipeline's
first stage: each cycle it publishes the chips and their holders as the cycle's inventory (devices/inventory.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from tpuwatch.config import HangConfig
from tpuwatch.devices.base import DeviceBackend, DeviceReading, reading_samples
from tpuwatch.devices.expected import Expectation, missing_problem, missing_samples
from tpuwatch.devices.hang import HangWatch
from tpuwatch.devices.inventory import Board
from tpuwatch.devices.processes import DEFAULT_CAP, hang_samples, process_samples
from tpuwatch.devices.seen import SeenThisBoot, is_number
from tpuwatch.hw.procfs import Holder, HolderScan
from tpuwatch.pods import PodLookup
from tpuwatch.samples import Sample, sample

log = logging.getLogger(__name__)

MAX_REMEMBERED_DEVICES = 1024
MAX_READ_ERROR_SERIES = 1024  # (device, field) pairs counted; past it, new pairs are logged, not counted


class LateRead(Exception):
    """A device read that finished after the first stage was sealed (counted as the collector's failure)."""


class DeviceCollector:
    """Collects a backend's chips; a chip seen before and now missing is reported down.

    With ``expected`` it also exports how many chips the host should have and which are missing
    (``missing_problem`` says so in one sentence); with ``pods`` the processes using each chip are named
    by pod, at most ``max_processes`` per chip.  ``seen`` remembers the chips and the links seen active this
    boot (across restarts of tpuwatch when it keeps them in state_dir): only those links are exported, and a
    chip it remembers that the backend no longer reports is down.  With ``hang`` each held chip's progress is
    judged (tpuwatch.devices.hang).  With ``board`` every read publishes the chips and the holders ``holders``
    finds (the scan the backend itself reads, where it reads one) as the cycle's inventory.
    """

    name = "devices"

    def __init__(self, backend: DeviceBackend, expected: Expectation | None = None, pods: PodLookup | None = None,
                 max_processes: int = DEFAULT_CAP, seen: SeenThisBoot | None = None,
                 hang: HangConfig | None = None, holders: HolderScan | None = None, board: Board | None = None) -> None:
        self.backend = backend
        self.holders = holders
        self.board = board
        self.seen = seen or SeenThisBoot(backend.name)
        self.expected = expected
        self.pods = pods
        self.max_processes = max_processes
        self.hang = HangWatch(hang) if hang is not None and hang.enabled else None
        self.last_readings: list[DeviceReading] = []
        self.missing_problem: str | None = None
        self._known: dict[str, DeviceReading] = {device: DeviceReading(device=device, chip=chip, pci=pci)
                                                  for device, (chip, pci) in self.seen.chips.items()}
        self._restored = set(self._known)
        self._read_errors: dict[tuple[str, str], int] = {}
        self._scan_problem: str | None = None

    @property
    def degraded(self) -> str | None:
        """Why the backend cannot read everything it could (an extra not installed), or None."""
        return getattr(self.backend, "missing", None)

    def close(self) -> None:
        """Release what the backend holds (channels), if anything."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()

    def collect(self) -> list[Sample]:
        """Read every chip; remember identities so a vanished chip stays visible as down."""
        if self.pods is not None:
            self.pods.refresh()
        readings = {r.device: r for r in self.backend.read()}
        if self._restored:  # the first read after a restart: forget remembered chips that were renumbered
            self._forget_renumbered(readings)
        readings = {device: self.seen.note(r) for device, r in readings.items()}
        if self.hang is not None:
            readings = {r.device: r for r in self.hang.apply(list(readings.values()), time.monotonic())}
        self.seen.save()
        for device, previous in self._known.items():
            if device not in readings:
                readings[device] = DeviceReading(device=device, chip=previous.chip, pci=previous.pci, up=False,
                                                 device_files=previous.device_files,
                                                 plugin_ids=previous.plugin_ids)
        for device, reading in readings.items():
            known = self._known.get(device)
            if known is None and len(self._known) < MAX_REMEMBERED_DEVICES:
                log.info("device %s found: %s, pci %s", device, reading.chip, reading.pci or "unknown")
            if not reading.up and (known is None or known.up):
                log.error("device %s (%s, pci %s) is down: %s", device, reading.chip, reading.pci or "unknown",
                          reading.problem or "lost")
            elif reading.up and known is not None and not known.up:
                log.warning("device %s (%s, pci %s) is back", device, reading.chip, reading.pci or "unknown")
            if device in self._known or len(self._known) < MAX_REMEMBERED_DEVICES:
                self._known[device] = reading
        self.last_readings = sorted(readings.values(), key=lambda r: _device_order(r.device))
        if self.board is not None and not self.board.publish(self.last_readings, self._holders()):
            # The read outlived its stage: the cycle's later parts went on without it, so its samples must not
            # reach the store either (a cycle's parts and its /metrics show the same chips).
            raise LateRead("the read finished after its stage was over: not published")
        out = [s for r in self.last_readings for s in reading_samples(r, self.backend.name)]
        out += [s for r in self.last_readings for s in process_samples(r, self.pods, self.max_processes)]
        out += self._read_error_samples()
        out += [s for r in self.last_readings for s in hang_samples(r, self.pods)]
        out += self._expected_samples()
        extra_samples = getattr(self.backend, "extra_samples", None)  # readings the backend ties to no chip
        return out + list(extra_samples()) if extra_samples is not None else out

    def _holders(self) -> Mapping[int, Holder]:
        """The holders of the chips' device files (and ``host.device_files``), from the cycle's one scan."""
        if self.holders is None:
            return {}
        try:
            found = self.holders.scan([f for r in self.last_readings for f in r.device_files])
        except OSError as exc:  # procfs cannot be listed: the holders last found stand
            problem = f"cannot scan {self.holders.procfs} for device-file holders: {exc.strerror or exc}"
            if problem != self._scan_problem:
                log.warning("devices: %s", problem)
            self._scan_problem = problem
            return self.holders.holders
        self._scan_problem = None
        return found

    def _forget_renumbered(self, readings: dict[str, DeviceReading]) -> None:
        """A chip remembered from before a restart whose address is now read under another number, or whose
        number another chip now has, cannot be told apart from a renumbering (a backend numbers the chips it
        finds in order): forgotten, never reported down under a number that is not its own."""
        numbers = {r.pci: device for device, r in readings.items() if r.pci}
        for device in self._restored:
            remembered = self._known[device]
            now = readings.get(device)
            moved = remembered.pci is not None and numbers.get(remembered.pci, device) != device
            if moved or (now is not None and now.pci is not None and now.pci != remembered.pci):
                del self._known[device]
                self.seen.forget(device)
        self._restored = set()

    def _read_error_samples(self) -> list[Sample]:
        """``tpuwatch_device_read_errors_total{device,field}``: reads of a field that failed (not for want of
        support), counted per cycle since tpuwatch started; a pair appears with its first failure."""
        for reading in self.last_readings:
            for field in reading.read_errors:
                key = (reading.device, field)
                if key in self._read_errors or len(self._read_errors) < MAX_READ_ERROR_SERIES:
                    self._read_errors[key] = self._read_errors.get(key, 0) + 1
        return [sample("tpuwatch_device_read_errors_total", count, device=device, field=field)
                for (device, field), count in sorted(self._read_errors.items())]

    def _expected_samples(self) -> list[Sample]:
        if self.expected is None:
            return []
        problem = missing_problem(self.expected, self.last_readings)
        if problem != self.missing_problem:
            if problem is not None:
                log.error("%s", problem)
            else:
                log.warning("every expected accelerator is reported again (%s)", self.expected.why)
            self.missing_problem = problem
        return missing_samples(self.expected, self.last_readings)


def _device_order(device: str) -> tuple[int, str]:
    return (int(device), "") if is_number(device) else (1 << 30, device)
