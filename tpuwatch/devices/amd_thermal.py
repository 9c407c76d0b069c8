"""amdgpu temperature sensors and the limit each is judged against: pure parsing, no I/O.

The driver's hwmon device shows up to three sensors, each by its ``tempN_label`` (edge, junction, mem; the MI300
series hides edge), with ``tempN_input`` in millidegrees C and, on SOC15 dGPUs, the sensor's own limits
(docs.kernel.org gpu/amdgpu/thermal.html; amdgpu_pm.c ``hwmon_attributes_visible``):

- ``tempN_crit``: the "critical max", the throttle limit the SMU holds the sensor under;
- ``tempN_emergency``: the "emergency max", where the ASIC shuts down (the SMU drivers set it to the throttle
  limit plus a CTF offset of 5 °C: ``CTF_OFFSET_EDGE``/``_HOTSPOT``/``_MEM`` in swsmu).

A sensor is judged against its ``crit``; without one, against its ``emergency`` less the CTF offset; without
either, against the driver's default thermal range, 99 °C for each sensor (``smu11_thermal_policy`` in swsmu's
smu_v11_0.h, what the driver assumes before a power-play table gives it limits).  Only limits the hardware shows
are exported; the margin (limit judged against, less the reading) says how the sensor was judged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

LABELS = ("edge", "junction", "mem")  # the labels amdgpu writes, in the order the chip temperature prefers them
LIMIT_KINDS = ("crit", "emergency")
CTF_OFFSET_C = 5.0
DEFAULT_LIMIT_C = 99.0
_NUMBER = re.compile(r"-?\d{1,20}")
_LABEL_FILE = re.compile(r"temp(\d{1,2})_label")


@dataclass(frozen=True)
class SensorReading:
    """One amdgpu temperature sensor: its reading, the limits its hwmon files show, and how it is judged."""

    label: str
    celsius: float
    limits: dict[str, float]  # "crit", "emergency" -> °C, only those the driver shows
    number: int  # N of tempN_*

    @property
    def limit(self) -> tuple[float, str]:
        """(°C, whence) of the limit the sensor is judged against: crit, else emergency less the CTF offset,
        else the driver's default."""
        if "crit" in self.limits:
            return self.limits["crit"], f"temp{self.number}_crit"
        if "emergency" in self.limits:
            return self.limits["emergency"] - CTF_OFFSET_C, f"temp{self.number}_emergency - {CTF_OFFSET_C:g}"
        return DEFAULT_LIMIT_C, "default"

    @property
    def margin(self) -> float:
        """Degrees below the limit (negative: over it)."""
        return self.limit[0] - self.celsius


def _millidegrees(text: str | None) -> float | None:
    return int(text) / 1000.0 if text is not None and _NUMBER.fullmatch(text.strip()) else None


def parse_temperatures(files: Mapping[str, str]) -> dict[str, SensorReading]:
    """The sensors of a hwmon directory's files (name -> text), by label: those whose label amdgpu writes and
    whose input reads as a number; limit files that do not read as numbers are left out."""
    sensors: dict[str, SensorReading] = {}
    for name, text in files.items():
        match = _LABEL_FILE.fullmatch(name)
        label = text.strip()
        if match is None or label not in LABELS or label in sensors:
            continue
        celsius = _millidegrees(files.get(f"temp{match[1]}_input"))
        if celsius is None:
            continue
        limits = {kind: value for kind in LIMIT_KINDS
                  if (value := _millidegrees(files.get(f"temp{match[1]}_{kind}"))) is not None}
        sensors[label] = SensorReading(label, celsius, limits, int(match[1]))
    return {label: sensors[label] for label in LABELS if label in sensors}


def chip_sensor(sensors: Mapping[str, SensorReading]) -> SensorReading | None:
    """The sensor whose reading is the chip's temperature (tpuwatch_device_temperature_celsius, as before
    sensors were judged one by one): edge, else junction, else memory."""
    return next((sensors[label] for label in LABELS if label in sensors), None)


def hottest(sensors: Mapping[str, SensorReading]) -> SensorReading | None:
    """The sensor nearest its own limit (or furthest over it), None without sensors."""
    return min(sensors.values(), key=lambda s: s.margin, default=None)
