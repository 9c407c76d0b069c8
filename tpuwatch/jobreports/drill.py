"""The ``probe-sdc`` scenario's simulated job, started by the daemon (the job itself is tpuwatch.probe.drill).

``start(config)`` (the daemon, with ``--simulate probe-sdc``) runs ``python -m
tpuwatch.probe.drill`` with one host CPU device per simulated chip.  Its
reports go through the daemon's real socket and checks.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import tpuwatch
from tpuwatch.config import Config
from tpuwatch.jobreports.plugin import ProbeConfig

log = logging.getLogger(__name__)

def start(config: Config) -> subprocess.Popen[bytes] | None:
    """The simulated job for ``config``'s probe-sdc scenario (None for any other scenario)."""
    sim = config.devices.sim
    if config.drill != "probe-sdc" or sim.device_dir is None:
        return None
    root = str(Path(tpuwatch.__file__).resolve().parent.parent)
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={sim.count}", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "tpuwatch.probe.drill", "--socket", config.section(ProbeConfig).socket,
               "--device-dir", sim.device_dir, "--count", str(sim.count), "--fault-device", str(sim.fault_device),
               "--fault-after", str(sim.fault_after)]
    try:
        job = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
    except OSError as exc:
        log.warning("probe-sdc drill: cannot start its simulated job: %s", exc.strerror or exc)
        return None
    log.info("probe-sdc drill: simulated job pid %d holds %d simulated chip(s) and probes them", job.pid, sim.count)
    return job
