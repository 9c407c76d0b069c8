"""``devices.backend: amd``: AMD Instinct GPUs from the amdgpu driver's sysfs files alone (no ROCm).

What each GPU (each PCI function: an MI250X's two dies are two GPUs) reports, and where from, all under
its PCI function ``paths.sysfs``/bus/pci/devices/DBDF (the directory /sys/class/drm/cardN/device links to):

- presence, product, PCI address: ``vendor`` 0x1002 and a ``device`` id of ``hw.chips.INSTINCT``, or any 0x1002
  function of PCI class 0x12 (processing accelerator: the MI300 series, which amdgpu binds by class);
- VRAM total and used (bytes): ``mem_info_vram_total``, ``mem_info_vram_used``; busy: ``gpu_busy_percent``;
  ``unique_id`` (GFX9 and later) is named in the reading's sources (amdgpu_pm.c, amdgpu_device.c; the
  kernel's Documentation/gpu/amdgpu/driver-misc.rst);
- temperatures by label (``tempN_label`` edge, junction, mem; ``tempN_input`` in millidegrees), each with the
  limits its ``tempN_crit``/``tempN_emergency`` show and judged against its own (``amd_thermal``), and power
  (``power1_average``, else ``power1_input``, microwatts) of ``hwmon/hwmonM`` (Documentation/gpu/amdgpu/
  thermal.rst); the chip's temperature is edge, else junction (the MI300 series hides edge), as before;
- RAS error counts per block: ``ras/<block>_err_count``, ``ue: N``, ``ce: N`` and, on UMC and the MI300
  series, ``de: N`` (deferred) (amdgpu_ras.c ``amdgpu_ras_sysfs_read``; Documentation/gpu/amdgpu/ras.rst).
  Uncorrectable counts summed over the blocks are the chip's uncorrected ECC errors, correctable ones its
  corrected; a block that answers "Query currently inaccessible" counts what it last said;
- processes: holders of the GPU's render node (``drm/renderD*`` -> /dev/dri/renderD*).  /dev/kfd is
  shared by every AMD GPU of the host: a process holding it alone belongs to none of them.

A file the driver does not create is absent (None), never 0.  Each GPU is read in its own lane with a
deadline (``tpuwatch.hw.deadline.Lanes``): a read that does not return (a hung device) reports the GPU down
as unresponsive; a GPU whose directory vanishes, or whose files answer ENODEV, is reported down as lost.
"""

from __future__ import annotations

import errno
import functools
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuwatch.config import Config
from tpuwatch.devices.amd_thermal import SensorReading, chip_sensor, parse_temperatures
from tpuwatch.devices.base import DeviceReading, ProcessUse, SensorTemperature
from tpuwatch.devices.inventory import holder_scan
from tpuwatch.hw.chips import instinct_product
from tpuwatch.hw.deadline import CallTimeout, Lanes
from tpuwatch.hw.pci import pci_root, scan_pci
from tpuwatch.hw.procfs import Holder
from tpuwatch.logsetup import Once
from tpuwatch.samples import Sample, sample

log = logging.getLogger(__name__)

READ_TIMEOUT = 2.0  # at most; half the collector deadline when that is shorter
RAS_KINDS = {"ue": "uncorrected", "ce": "corrected", "de": "deferred"}
_NUMBER = re.compile(r"-?\d{1,20}")
_RAS_LINE = re.compile(r"(ue|ce|de): (\d{1,20})")


@dataclass(frozen=True)
class AmdGpu:
    """One GPU (PCI function) under sysfs: its product and render node (``renderD128``: what compute opens)."""

    pci: str
    product: str
    render: str | None


def discover(sysfs: str) -> list[AmdGpu]:
    """The Instinct GPUs under ``sysfs`` by PCI address, with their render nodes where the driver made them."""
    gpus = []
    for device in scan_pci(sysfs):
        name = instinct_product(device)
        if name is not None:
            drm = pci_root(sysfs) / device.address / "drm"
            gpus.append(AmdGpu(device.address, name, min((p.name for p in drm.glob("renderD[0-9]*")), default=None)))
    return gpus


def chips(sysfs: str) -> list[str]:
    """The PCI address of each Instinct GPU under ``sysfs`` (``devices.backend: auto``, expected count)."""
    return [gpu.pci for gpu in discover(sysfs)]


def build(config: Config) -> AmdBackend:
    """The backend ``devices.backend: amd`` names."""
    return AmdBackend(config)


# --- parsing: pure --------------------------------------------------------------------------------------

def parse_number(text: str | None) -> int | None:
    """A sysfs number ("68702699520\\n"); None for an absent file or anything else."""
    return int(text) if text is not None and _NUMBER.fullmatch(text.strip()) else None


def parse_ras(text: str) -> dict[str, int] | None:
    """``ue: N``/``ce: N``/``de: N`` lines of a RAS ``<block>_err_count`` as {"uncorrected": N, ...}; None
    when it says nothing else ("Query currently inaccessible") or any line is not one of them."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    found = [_RAS_LINE.fullmatch(line.strip()) for line in lines]
    if not lines or not all(found):
        return None
    return {RAS_KINDS[m[1]]: int(m[2]) for m in found if m is not None}


@dataclass(frozen=True)
class Sensors:
    """What one amdgpu hwmon device says: temperature sensors by label and power (W), each None if hidden."""

    sensors: dict[str, SensorReading]
    power_watts: float | None

    @property
    def temperatures(self) -> dict[str, float]:
        """°C by label."""
        return {label: sensor.celsius for label, sensor in self.sensors.items()}

    @property
    def chip_temperature(self) -> tuple[str, float] | None:
        """(label, °C) of the chip's temperature: edge, else junction, else memory."""
        sensor = chip_sensor(self.sensors)
        return (sensor.label, sensor.celsius) if sensor is not None else None


def parse_hwmon(files: Mapping[str, str]) -> Sensors:
    """Sensors from a hwmon directory's files (name -> text): ``tempN_label``/``tempN_input`` pairs whose
    label amdgpu writes with their ``tempN_crit``/``tempN_emergency``, ``power1_average`` else
    ``power1_input``; unreadable values are left out."""
    power = parse_number(files.get("power1_average"))
    power = power if power is not None else parse_number(files.get("power1_input"))
    return Sensors(parse_temperatures(files), power / 1e6 if power is not None else None)


def sensor_temperatures(sensors: Mapping[str, SensorReading]) -> tuple[SensorTemperature, ...]:
    """The reading's sensors, each with its hardware limits and its margin to the limit it is judged against."""
    return tuple(SensorTemperature(s.label, s.celsius, s.margin, dict(s.limits), s.limit[1])
                 for s in sensors.values())


# --- reading: I/O ---------------------------------------------------------------------------------------

class GpuLost(Exception):
    """The GPU's sysfs directory vanished, or its files answer ENODEV (unplugged, fell off the bus)."""


@dataclass
class _Read:
    """One GPU's files as read: their text (None: absent or unreadable) and what could not be read."""

    root: Path
    texts: dict[str, str | None]
    failures: dict[str, str]  # file -> why it could not be read


class _Reader:
    """Reads the files of one GPU's directory, noting the file in progress (for a read that hangs)."""

    def __init__(self, root: Path, current: dict[str, str]) -> None:
        self.root = root
        self.current = current
        self.read = _Read(root, {}, {})

    def text(self, relative: str) -> str | None:
        path = self.root / relative
        self.current[str(self.root)] = str(path)
        try:
            with open(path, encoding="ascii", errors="replace") as handle:
                text: str | None = handle.read(4096)
        except FileNotFoundError:
            if not self.root.is_dir():
                raise GpuLost(f"{self.root} vanished") from None
            text = None
        except OSError as exc:
            if exc.errno == errno.ENODEV:
                raise GpuLost(f"{path}: {exc.strerror}") from None
            self.read.failures[relative] = f"{path}: {exc.strerror or exc}"
            text = None
        self.read.texts[relative] = text
        return text


def read_gpu(root: Path, current: dict[str, str]) -> _Read:
    """Every file of one GPU the backend reads (runs in the GPU's lane)."""
    reader = _Reader(root, current)
    for name in ("mem_info_vram_total", "mem_info_vram_used", "gpu_busy_percent", "unique_id"):
        reader.text(name)
    hwmons = sorted((root / "hwmon").glob("hwmon[0-9]*"), key=lambda p: int(p.name[5:]))
    for hwmon in hwmons[:1]:
        for pattern in ("temp*_label", "temp*_input", "temp*_crit", "temp*_emergency"):
            for path in sorted(hwmon.glob(pattern)):
                reader.text(f"hwmon/{hwmon.name}/{path.name}")
        for name in ("power1_average", "power1_input"):
            if (hwmon / name).exists():
                reader.text(f"hwmon/{hwmon.name}/{name}")
    for path in sorted((root / "ras").glob("*_err_count")):
        reader.text(f"ras/{path.name}")
    if not (root / "vendor").exists():
        raise GpuLost(f"{root} vanished")
    current.pop(str(root), None)
    return reader.read


class AmdBackend:
    """Every Instinct GPU under sysfs, each read with a deadline in its own lane."""

    name = "amd"

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.paths = config.paths
        self.timeout = min(READ_TIMEOUT, config.collector_deadline / 2)
        self.holders = holder_scan(config, clock)  # the cycle's one holder scan, published by the devices stage
        self.lanes = Lanes()
        self._indices: dict[str, int] = {}  # PCI address -> GPU index, kept for the life of the backend
        self._current: dict[str, str] = {}  # GPU directory -> the file its lane is reading
        self._ras: dict[str, dict[str, dict[str, int]]] = {}  # PCI address -> block -> kind -> last count
        self._holders: Mapping[int, Holder] = {}
        self._logged = Once()
        self._extra_samples: list[Sample] = []

    def extra_samples(self) -> list[Sample]:
        """RAS error counts of the last read per GPU, block and kind (``tpuwatch_device_ras_errors_total``)."""
        return self._extra_samples

    def read(self) -> list[DeviceReading]:
        """One reading per GPU under sysfs; a lost or unresponsive GPU is reported down."""
        gpus = discover(self.paths.sysfs)
        for gpu in gpus:  # first come, first numbered: a vanished GPU keeps its number
            self._indices.setdefault(gpu.pci, len(self._indices))
        self._scan_holders(gpus)
        deadline = time.monotonic() + self.timeout
        calls: dict[str, Any] = {}
        readings: dict[str, DeviceReading] = {}
        for gpu in gpus:
            root = pci_root(self.paths.sysfs) / gpu.pci
            try:
                calls[gpu.pci] = self.lanes.start(gpu.pci, functools.partial(read_gpu, root, self._current))
            except CallTimeout as exc:
                readings[gpu.pci] = self._down(gpu, f"unresponsive: {self._current.get(str(root))}: {exc}")
        for gpu in gpus:
            root = pci_root(self.paths.sysfs) / gpu.pci
            if gpu.pci not in calls:
                continue
            try:
                readings[gpu.pci] = self._reading(gpu, self.lanes.wait(calls[gpu.pci], deadline))
            except CallTimeout as exc:
                readings[gpu.pci] = self._down(gpu, f"unresponsive: {self._current.get(str(root))}: {exc}")
            except GpuLost as exc:
                readings[gpu.pci] = self._down(gpu, f"GPU is lost ({exc})")
        self._extra_samples = [sample("tpuwatch_device_ras_errors_total", count, device=str(self._indices[pci]),
                                     block=block, kind=kind)
                              for pci, reading in readings.items() if reading.up
                              for block, counts in sorted(self._ras.get(pci, {}).items())
                              for kind, count in sorted(counts.items())]
        return sorted(readings.values(), key=lambda r: int(r.device))

    def _down(self, gpu: AmdGpu, problem: str) -> DeviceReading:
        return DeviceReading(device=str(self._indices[gpu.pci]), chip=gpu.product, pci=gpu.pci, up=False,
                             problem=problem, sources={"presence": f"sysfs:{pci_root(self.paths.sysfs) / gpu.pci}"},
                             device_files=self._files(gpu))

    def _files(self, gpu: AmdGpu) -> tuple[str, ...]:
        return (f"dri/{gpu.render}",) if gpu.render else ()

    def _reading(self, gpu: AmdGpu, read: _Read) -> DeviceReading:
        where = f"sysfs:{read.root}"
        for failure in read.failures.values():
            self._once(gpu.pci, failure)
        fields: dict[str, Any] = {}
        sources = {"presence": where}
        for field, name, scale in (("memory_total_bytes", "mem_info_vram_total", 1.0),
                                   ("memory_used_bytes", "mem_info_vram_used", 1.0),
                                   ("utilization_ratio", "gpu_busy_percent", 0.01)):
            value = self._number(gpu.pci, read, name)
            if value is not None:
                fields[field] = value * scale
                sources[field] = where
        unique_id = read.texts.get("unique_id")
        if unique_id and re.fullmatch(r"[0-9a-fA-F]{1,16}", unique_id.strip()):
            sources["unique_id"] = f"{unique_id.strip()} ({where}/unique_id)"
        hwmon = {name.rsplit("/", 1)[1]: text for name, text in read.texts.items()
                 if name.startswith("hwmon/") and text is not None}
        sensors = parse_hwmon(hwmon)
        hwmon_dir = next((f"{read.root}/{n.rsplit('/', 1)[0]}" for n in read.texts if n.startswith("hwmon/")), "")
        if sensors.chip_temperature is not None:
            label, fields["temperature_celsius"] = sensors.chip_temperature
            sources["temperature_celsius"] = f"hwmon:{hwmon_dir} ({label})"
            fields["sensors"] = sensor_temperatures(sensors.sensors)
            sources["sensors"] = f"hwmon:{hwmon_dir} ({', '.join(sensors.sensors)})"
        if sensors.power_watts is not None:
            fields["power_watts"] = sensors.power_watts
            sources["power_watts"] = f"hwmon:{hwmon_dir}"
        fields.update(self._ecc(gpu.pci, read, sources))
        processes = tuple(ProcessUse(pid, holder.command) for pid, holder in sorted(self._holders.items())
                          if holder.device_files.intersection(self._files(gpu)))
        return DeviceReading(device=str(self._indices[gpu.pci]), chip=gpu.product, pci=gpu.pci, sources=sources,
                             device_files=self._files(gpu), processes=processes, read_errors=read.failures,
                             owners=tuple(f"{p.pid} ({p.command})" for p in processes), **fields)

    def _number(self, pci: str, read: _Read, name: str) -> float | None:
        text = read.texts.get(name)
        value = parse_number(text)
        if value is None and text is not None:
            read.failures[name] = f"{read.root / name}: not a number: {text.strip()[:40]!r}"
            self._once(pci, f"{name}: not a number: {text.strip()[:40]!r}")
        return float(value) if value is not None else None

    def _ecc(self, pci: str, read: _Read, sources: dict[str, str]) -> dict[str, float]:
        """Corrected and uncorrected totals over the RAS blocks; a block that cannot be read now counts what
        it last said."""
        blocks = self._ras.setdefault(pci, {})
        for name, text in read.texts.items():
            if not name.startswith("ras/") or text is None:
                continue
            block = name[4:-len("_err_count")]
            counts = parse_ras(text)
            if counts is None:
                self._once(pci, f"ras/{block}_err_count: {text.strip()[:40]!r}")
            else:
                blocks[block] = counts
        if not blocks:
            return {}
        sources["ecc"] = f"sysfs:{read.root}/ras ({', '.join(sorted(blocks))})"
        return {f"ecc_{kind}_total": float(sum(c.get(kind, 0) for c in blocks.values()))
                for kind in ("corrected", "uncorrected")}

    def _once(self, pci: str, problem: str) -> None:
        if self._logged((pci, problem)):
            log.warning("AMD GPU %s: %s (logged once)", pci, problem)

    def _scan_holders(self, gpus: list[AmdGpu]) -> None:
        """Processes holding a GPU's render node, from the holder scan (every holder_scan_interval; /dev/kfd is
        every GPU's: its holders belong to none)."""
        try:
            self._holders = self.holders.scan([f for gpu in gpus for f in self._files(gpu)])
        except OSError as exc:  # procfs unreadable: the GPUs are still read, their holders unknown
            self._once("procfs", f"cannot scan {self.paths.procfs} for holders: {exc.strerror or exc}")
            self._holders = {}
