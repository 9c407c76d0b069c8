"""Whether a simulated scenario's fire drill can run here: a drill whose part cannot run must say so, not pass.

A scenario names what its drill needs beyond the simulated chips (``tpuwatch.devices.sim.NEEDS``: ``sdc``
corrupts no reading, so only the canary sees it).  ``blocked_drill(config)`` asks each need's probe in
``PROBES`` whether that part can run with ``config``, and names the first that cannot and why; a plugin's drill
answers for itself (``tpuwatch.pluginspec.Drill``).  The daemon
keeps the answer as ``tpuwatch_drill_cannot_run`` (``drill_samples``), from which its start-up log, /healthz,
the status page (``blocked_drills``) and the ``TpuwatchDrillCannotRun`` alert read it; ``tpuwatch check``
counts it as a problem.

Nothing here imports jax: this interpreter is asked with ``importlib.util.find_spec``, the one
``canary.python`` names by a subprocess that does the same.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tpuwatch.config import Config
from tpuwatch.devices.sim import NEEDS
from tpuwatch.plugins import drill
from tpuwatch.samples import Sample, sample

METRIC = "tpuwatch_drill_cannot_run"
INSTALL = "pip install 'tpuwatch[canary]'"
PROBE_TIMEOUT_S = 30.0
_FIND_JAX = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('jax') else 1)"


def jax_missing_here() -> str | None:
    """Why a canary run by this interpreter cannot start (jax not installed), or None."""
    if importlib.util.find_spec("jax") is not None:
        return None
    return f"jax is not installed for {sys.executable} ({INSTALL}, or point canary.python at an interpreter with jax)"


def canary_unavailable(config: Config, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the daemon's canary cannot run with ``config`` (off, or no jax where its worker would run), or None."""
    if not config.canary.enabled:
        return "canary.enabled is false"
    python = config.canary.python
    if python is None:
        return jax_missing_here()
    try:
        answer = subprocess.run([python, "-c", _FIND_JAX], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, timeout=timeout, check=False)
    except OSError as exc:
        return f"canary.python {python} cannot be started ({exc.strerror or exc})"
    except subprocess.TimeoutExpired:
        return f"canary.python {python} did not answer within {timeout:g} s"
    if answer.returncode == 0:
        return None
    if answer.returncode == 1:
        return f"jax is not installed for canary.python {python} ({python} -m {INSTALL})"
    return f"canary.python {python} cannot run Python (exit status {answer.returncode})"


# Each need a scenario may declare, and its probe: why that part cannot run with a config, or None.
PROBES: dict[str, Callable[[Config], str | None]] = {
    "canary": canary_unavailable,
    "hang detector": lambda config: None if config.devices.hang.enabled else "devices.hang.enabled is false",
}


@dataclass(frozen=True)
class BlockedDrill:
    """A simulated scenario whose drill cannot run: the part it needs, and why that part cannot run."""

    scenario: str
    needs: str
    reason: str

    def sentence(self) -> str:
        """The one line the log, /healthz, the status page and ``tpuwatch check`` give."""
        return f"fire drill {self.scenario} cannot run: it needs the {self.needs}, and {self.reason}"

    def sample(self) -> Sample:
        """``tpuwatch_drill_cannot_run{scenario, needs, reason} 1``."""
        return sample(METRIC, 1, scenario=self.scenario, needs=self.needs, reason=self.reason)


def blocked_drill(config: Config) -> BlockedDrill | None:
    """The first need of ``config``'s simulated scenario that cannot run here; None on real chips, for a scenario
    that needs nothing more, or when every need can run."""
    if config.devices.backend != "sim":
        return None
    scenario = config.devices.sim.scenario
    for need in NEEDS.get(scenario, ()):
        reason = PROBES[need](config)
        if reason is not None:
            return BlockedDrill(scenario, need, reason)
    found = drill(scenario)
    if found is not None:
        plugin, its = found
        reason = its.blocked(config.sections[plugin.name]) or (jax_missing_here() if its.needs_jax else None)
        if reason is not None:
            return BlockedDrill(scenario, its.needs, reason)
    return None


def drill_samples(config: Config) -> Callable[[], list[Sample]]:
    """The sample source of ``tpuwatch_drill_cannot_run`` for a pipeline running ``config``, probed once, now."""
    blocked = blocked_drill(config)
    found = [blocked.sample()] if blocked is not None else []
    return lambda: list(found)


def blocked_drills(samples: Iterable[Sample]) -> list[BlockedDrill]:
    """The drills the daemon found unable to run, read back from its samples (``tpuwatch_drill_cannot_run``)."""
    out = []
    for s in samples:
        if s.name == METRIC and s.value:
            labels = dict(s.labels)
            out.append(BlockedDrill(labels.get("scenario", ""), labels.get("needs", ""), labels.get("reason", "")))
    return out
