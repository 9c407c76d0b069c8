"""``devices.backend: tpu``: Cloud TPU chips from sysfs, owners from procfs, load from libtpu's runtime.

What each chip reports, and where it comes from:

- presence, generation, PCI address, device file: PCI sysfs (vendor 0x1ae0);
- driver status and reset count (v2-v4, accel/gasket driver): the accel class
  directory; status DEAD marks the chip down;
- owners: processes holding its device file (/proc/*/fd); the HBM a process uses is the chip's HBM in
  use when the runtime answering for the chip is that process's (it listens on the metrics port and holds
  the chip), else absent;
- the ids the GKE TPU device plugin names the chip by (resource ``google.com/tpu``): its device file's
  name under /dev (``accel0``) or /dev/vfio (``12``), and its PCI slot on generations whose chips span
  functions (ai-on-gke/tpu-device-plugin ``pkg/tpu/manager.go``);
- HBM used/total, duty cycle, HBM bandwidth, TensorCore idle time, HLO queue
  and execution time, megascale latencies, and the runtime status (sequencers,
  queued programs, error messages of the cores): libtpu's runtime metric service,
  only while a workload runs; without it the HBM capacity is the published
  figure for the chip.  Which chips an address describes: those held open by
  the process listening on its port, else (that process not found) the
  address's chips numbered after those of the addresses configured before it;
- temperature and power: only from a hwmon device bound to the chip's PCI
  function.  TPUs expose no ECC counters.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from tpuwatch.config import Config
from tpuwatch.devices.base import MEGASCALE, DeviceReading, ProcessUse, summary_samples
from tpuwatch.devices.inventory import holder_scan
from tpuwatch.devices.libtpu import AddressAnswer, RuntimeClient
from tpuwatch.devices.procnet import port_owners
from tpuwatch.devices.runtime import US, Distribution, Folded, fold, merge, summary
from tpuwatch.devices.tpu_sysfs import TpuChip, discover_tpus, read_driver_state, read_hwmon
from tpuwatch.devices.tpustatus import fold_status
from tpuwatch.hw.procfs import Holder
from tpuwatch.samples import Sample, sample

log = logging.getLogger(__name__)

FORCED_RESCAN_S = 10.0  # an answering port whose process is unknown rescans owners at most this often
RESOURCE = "google.com/tpu"


@dataclasses.dataclass(frozen=True)
class _Placed:
    """Runtime fields for one chip, where they came from, and how the chip was matched to the address."""

    fields: dict[str, Any]
    source: str
    matched: str | None
    pid: int | None = None  # the process whose runtime answered for the chip, when found (it holds the chip)


def build(config: Config) -> TpuBackend:
    """The backend ``devices.backend: tpu`` names."""
    return TpuBackend(config)


def chips(sysfs: str) -> list[str]:
    """The first PCI function of each TPU chip under ``sysfs``."""
    return [chip.pci for chip in discover_tpus(sysfs)]


class TpuBackend:
    """Cloud TPU chips: sysfs discovery plus libtpu runtime metrics."""

    name = "tpu"

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.paths = config.paths
        self.runtime = RuntimeClient(config.devices.tpu.metrics_addr, config.devices.tpu.call_timeout)
        self.holders = holder_scan(config, clock)  # the cycle's one holder scan, published by the devices stage
        self._indices: dict[str, int] = {}  # PCI address -> chip index, kept for the life of the backend
        self._owners: dict[str, list[str]] = {}  # device file -> "PID (command)"
        self._held: dict[int, frozenset[str]] = {}  # PID -> device files it holds
        self._commands: dict[int, str] = {}  # PID -> command of a holder
        self._port_pids: dict[int, int] = {}  # metrics port -> PID listening on it
        self._scanned: Mapping[int, Holder] | None = None  # the holders the fields above were made from
        self._served: dict[str, int] = {}  # address -> chips it answered for when it last answered
        self._extra_samples: list[Sample] = []
        if self.runtime.missing is not None:
            log.warning("%s: HBM use, duty cycle and runtime metrics stay absent", self.runtime.missing)

    @property
    def missing(self) -> str | None:
        """What must be installed to read everything this backend can read, or None."""
        return self.runtime.missing

    def close(self) -> None:
        """Release the runtime client's channels."""
        self.runtime.close()

    def extra_samples(self) -> list[Sample]:
        """What the last read's runtime gave for no chip: megascale latencies (device ""), DCN packet counters
        and interconnect error flags."""
        return self._extra_samples

    def read(self) -> list[DeviceReading]:
        """One reading per chip present under sysfs."""
        chips = discover_tpus(self.paths.sysfs)
        for chip in chips:  # first come, first numbered: a vanished chip keeps its number
            self._indices.setdefault(chip.pci, len(self._indices))
        runtime = self.runtime.fetch()
        generation = chips[0].generation if chips else None
        folded = {}
        per_device = generation.devices_per_chip if generation and not generation.duty_cycle_per_chip else 1
        for answer in runtime:
            if answer.has_data or answer.cores:
                folded[answer.address] = fold(answer.entries, generation.devices_per_chip if generation else 1,
                                              generation.duty_cycle_per_chip if generation else False)
                for slot, status in fold_status(answer.cores or [], per_device).items():
                    folded[answer.address].fields.setdefault(slot, {})["runtime_status"] = status
                for metric, problem in folded[answer.address].problems:
                    self.runtime.log_problem(answer.address, metric, problem)
        owners = self._scan_owners(chips, unresolved=any(_port(a) not in self._port_pids for a in folded))
        placed = self._place(runtime, folded, {self._indices[c.pci]: set(c.device_files) for c in chips})
        self._extra_samples = _host_megascale(folded.values()) + _host_interconnect(folded.values())
        readings = []
        for chip in chips:
            index = self._indices[chip.pci]
            reading = self._sysfs_reading(str(index), chip, owners)
            reading = _with_runtime(reading, placed.get(index), _runtime_status(runtime))
            reading = dataclasses.replace(reading, processes=self._processes(chip, placed.get(index),
                                                                             reading.memory_used_bytes))
            if reading.memory_total_bytes is None and chip.hbm_bytes is not None:
                published = f"published capacity of {chip.generation.name}"
                reading = dataclasses.replace(reading, memory_total_bytes=float(chip.hbm_bytes),
                                              sources={**reading.sources, "memory_total_bytes": published})
            readings.append(reading)
        return readings

    def _place(self, answers: list[AddressAnswer], folded: dict[str, Folded],
               chips: dict[int, set[str]]) -> dict[int, _Placed]:
        """Chip index -> runtime fields: the chips the listening process holds, else the chips left, in order.

        Addresses whose process was found take its chips first; the others share the
        remaining chips in configured order, each as many as it answered for (when it
        last answered, if it does not now).
        """
        targets: dict[str, tuple[list[int], str | None]] = {}
        pids: dict[str, int] = {}
        for answer in answers:
            found = folded.get(answer.address)
            if found is not None:
                self._served[answer.address] = found.served
                port = _port(answer.address)
                pid = self._port_pids.get(port) if port is not None else None
                held_files = self._held.get(pid, frozenset()) if pid is not None else frozenset()
                held = [index for index in chips if chips[index] & held_files]
                if held and pid is not None and found.served <= len(held):
                    targets[answer.address] = (held, f"process {pid} listens on libtpu:{answer.address} and "
                                                     "holds this chip")
                    pids[answer.address] = pid
        left = [index for index in chips if not any(index in held for held, _ in targets.values())]
        offset = 0
        for answer in answers:
            if answer.address in targets:
                continue
            served = self._served.get(answer.address, 0)
            note = None if len(answers) == 1 else (
                f"chip {{slot}} of libtpu:{answer.address}, numbered after those of the addresses configured "
                "before it (the process listening on it was not found)")
            targets[answer.address] = (left[offset:offset + served], note)
            offset += served
        placed: dict[int, _Placed] = {}
        for address, found in folded.items():
            indices, note = targets[address]
            for slot, fields in sorted(found.fields.items()):
                if slot >= len(indices):
                    self.runtime.log_problem(address, "chips", f"answers for {found.served} chip(s), "
                                             f"{len(indices)} left for it under sysfs")
                    continue
                placed.setdefault(indices[slot], _Placed(fields, f"libtpu:{address}",
                                                         note.format(slot=slot) if note else None,
                                                         pids.get(address)))
        return placed

    def _sysfs_reading(self, device: str, chip: TpuChip, owners: dict[str, list[str]]) -> DeviceReading:
        sources = {"presence": f"sysfs:{self.paths.sysfs}/bus/pci/devices/{chip.pci}"}
        if chip.device_files:
            sources["device_file"] = ", ".join(f"{self.paths.dev}/{f}" for f in chip.device_files)
        status, resets, up, problem = None, None, True, None
        for accel_dir in chip.accel_dirs:
            state = read_driver_state(accel_dir)
            if state.status is not None and status in (None, "ALIVE"):
                status = state.status
                sources["status"] = state.status_source
            if state.reset_count is not None:
                resets = (resets or 0) + state.reset_count
        if status == "DEAD":
            up, problem = False, f"driver reports the chip DEAD ({sources['status']})"
        hwmon = read_hwmon(self.paths.sysfs, chip.pci)
        if hwmon is not None:
            sources["sensors"] = hwmon.source
        return DeviceReading(
            device=device, chip=chip.generation.name, pci=chip.pci, up=up, problem=problem, status=status,
            reset_count=resets, temperature_celsius=hwmon.temperature_celsius if hwmon else None,
            power_watts=hwmon.power_watts if hwmon else None,
            owners=tuple(o for f in chip.device_files for o in owners.get(f, [])), sources=sources,
            device_files=chip.device_files, plugin_ids=plugin_ids(chip),
        )

    def _processes(self, chip: TpuChip, placed: _Placed | None, used: float | None) -> tuple[ProcessUse, ...]:
        """The chip's holders; the one whose runtime answered for the chip uses the chip's HBM in use."""
        files = set(chip.device_files)
        return tuple(ProcessUse(pid, self._commands.get(pid, "?"),
                                used if placed is not None and placed.pid == pid else None)
                     for pid, held in sorted(self._held.items()) if held & files)

    def _scan_owners(self, chips: list[TpuChip], unresolved: bool) -> dict[str, list[str]]:
        """Device file -> "PID (command)" of its holders, and metrics port -> listening holder.

        From the holder scan (every holder_scan_interval), rescanned sooner (at
        most every FORCED_RESCAN_S) while an answering port's process is unknown.
        """
        holders = self.holders.scan([f for chip in chips for f in chip.device_files],
                                    max_age=FORCED_RESCAN_S if unresolved else None)
        if holders is not self._scanned:
            self._scanned = holders
            self._owners = {}
            self._held = {pid: holder.device_files for pid, holder in holders.items()}
            self._commands = {pid: holder.command for pid, holder in holders.items()}
            for pid, holder in sorted(holders.items()):
                for device_file in sorted(holder.device_files):
                    self._owners.setdefault(device_file, []).append(f"{pid} ({holder.command})")
            ports = {port for port in map(_port, self.runtime.addresses) if port is not None}
            self._port_pids = port_owners(self.paths.procfs, ports, holders) if holders and ports else {}
        return self._owners


def plugin_ids(chip: TpuChip) -> tuple[tuple[str, str], ...]:
    """The device plugin's ids for a chip: its device files' names (``accel0``, the vfio group ``12``) and,
    for chips of several PCI functions, the PCI slot (domain:bus:device)."""
    ids = [f.rsplit("/", 1)[-1] for f in chip.device_files]
    if len(chip.functions) > 1:
        ids.append(chip.pci.rsplit(".", 1)[0])
    return tuple((RESOURCE, i) for i in ids)


def _port(address: str) -> int | None:
    port = address.rsplit(":", 1)[-1]
    return int(port) if port.isdigit() else None


def _runtime_status(answers: list[AddressAnswer]) -> str:
    return "; ".join(f"libtpu:{a.address}: {a.status}" for a in answers)


def _host_megascale(folded: Any) -> list[Sample]:
    """Megascale latencies the runtime gave for no chip, merged over the addresses that gave them."""
    found: dict[tuple[str, str], list[Distribution]] = {}
    for one in folded:
        for key, dist in one.host_megascale.items():
            found.setdefault(key, []).append(dist)
    out = []
    for (metric, buffer_size), dists in sorted(found.items()):
        try:
            latency = summary(merge(dists), US)
        except ValueError:  # different buckets at different addresses: keep the first
            latency = summary(dists[0], US)
        out += summary_samples(MEGASCALE, latency, device="", metric=metric, buffer_size=buffer_size)
    return out


def _host_interconnect(folded: Any) -> list[Sample]:
    """DCN TCP packets summed over the addresses, and each interconnect error flag (1 while any address reports
    it non-zero)."""
    counters: dict[str, float] = {}
    errors: dict[tuple[str, str], float] = {}
    for one in folded:
        for kind, value in one.host_counters.items():
            counters[kind] = counters.get(kind, 0.0) + value
        for key, value in one.errors.items():
            errors[key] = max(errors.get(key, 0.0), value)
    out = [sample("tpuwatch_dcn_tcp_packets_total", value, kind=kind) for kind, value in sorted(counters.items())]
    return out + [sample("tpuwatch_interconnect_error_detected", 1 if value else 0, source=source, kind=kind)
                  for (source, kind), value in sorted(errors.items())]


def _with_runtime(reading: DeviceReading, placed: _Placed | None, status: str) -> DeviceReading:
    if placed is None:
        return dataclasses.replace(reading, runtime_metrics=False, sources={**reading.sources, "runtime": status})
    sources = {**reading.sources, **{name: placed.source for name in placed.fields}}
    if placed.matched:
        sources["runtime_chip"] = placed.matched
    return dataclasses.replace(reading, runtime_metrics=True, sources=sources, **placed.fields)
