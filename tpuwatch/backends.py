"""The device backends by name: the module that reads each kind of accelerator.

Plain data at the bottom of the house, so that the config (which offers these
names for ``devices.backend``) and ``tpuwatch.devices`` (which imports the
chosen module) read one list: a new backend is its module plus one line here.
The module has ``build(config) -> DeviceBackend`` and, to be picked by
``devices.backend: auto`` and counted by ``devices.expected: auto``,
``chips(sysfs) -> list[str]``: the PCI address of each chip of its kind under
``sysfs``, one per chip.  A module is imported when it is chosen or asked for
its chips: a command that needs no backend does not pay for their imports.
"""

from __future__ import annotations

BACKENDS: dict[str, str] = {
    "tpu": "tpuwatch.devices.tpu",
    "nvidia": "tpuwatch.devices.nvidia",
    "sim": "tpuwatch.devices.sim",
    "amd": "tpuwatch.devices.amd",
}
