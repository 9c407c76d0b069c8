"""``--simulate``: a config turned into a fire drill, and the state its simulated chips keep apart.

- ``simulated(config, scenario)``: the simulated backend forced on, running
  ``scenario``, with what that drill needs of the rest of the config;
- ``namespaced(config)``: simulated chips keep all their state (alerts,
  kernel-log positions, canary history) in ``state_dir/simulated``, apart from
  the real chips';
- ``canary_drill(config)``: how the daemon's canary runs with simulated chips
  (the ``sdc`` drill's wrong numbers are the canary's).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from tpuwatch.config import Config, Scenario
from tpuwatch.plugins import drill

SIMULATED = "simulated"  # the simulated chips' state directory, under state_dir
DRILL_HANG_AFTER_S = 30.0  # --simulate hung: the hang time, when devices.hang.after is longer


def is_simulated(config: Config) -> bool:
    """True when the chips are simulated (``--simulate`` or ``devices.backend: sim``)."""
    return config.drill is not None


def simulated(config: Config, scenario: Scenario) -> Config:
    """``config`` with the simulated backend forced on, running ``scenario``; the ``hung`` drill judges a chip
    hung after at most DRILL_HANG_AFTER_S, so that it fires while one waits; a plugin's drill that asks for device
    files (the probe-sdc drill's simulated job holds them) gets them under state_dir unless devices.sim.device_dir
    names a place."""
    sim = dataclasses.replace(config.devices.sim, scenario=scenario)
    found = drill(scenario)
    if found is not None and found[1].device_files and sim.device_dir is None:
        sim = dataclasses.replace(sim, device_dir=os.path.join(config.state_dir, "drill", "dev"))
    hang = config.devices.hang
    if scenario == "hung":
        hang = dataclasses.replace(hang, after=min(hang.after, DRILL_HANG_AFTER_S))
    return dataclasses.replace(config, devices=dataclasses.replace(config.devices, backend="sim", sim=sim, hang=hang))


def namespaced(config: Config) -> Config:
    """``config`` with ``state_dir`` pointing at the state its chips keep: ``state_dir/simulated`` for simulated
    ones.  Apply once to a loaded config."""
    if not is_simulated(config):
        return config
    return dataclasses.replace(config, state_dir=os.path.join(config.state_dir, SIMULATED))


def canary_drill(config: Config) -> dict[str, Any]:
    """The daemon canary's run options: with simulated chips, as many CPU devices as chips, and the sdc scenario's
    corruption on its chip (none on real chips)."""
    if not is_simulated(config):
        return {}
    sim = config.devices.sim
    options: dict[str, Any] = {"env": {"XLA_FLAGS": f"--xla_force_host_platform_device_count={sim.count}"}}
    if sim.scenario == "sdc":
        options |= {"inject": "scale", "inject_device": sim.fault_device}
    return options
