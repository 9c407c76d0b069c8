"""Whether a simulated scenario's fire drill can run here: a drill whose part cannot run must say so, not pass.

A scenario of the simulated chips names what its drill needs beyond them in ``NEEDS`` (``sdc`` corrupts no
reading, so only the canary sees it); ``blocked_drill(config)`` asks each need's probe in ``PROBES`` whether
that part can run with ``config``, and names the first that cannot and why; a plugin's drill answers for itself
(``tpuwatch.pluginspec.Drill``).  The daemon keeps the answer as ``tpuwatch_drill_cannot_run``
(``drill_samples``), from which its start-up log, /healthz, the status page (``blocked_drills``) and the
``TpuwatchDrillCannotRun`` alert read it; ``tpuwatch check`` counts it as a problem, and says what of a drill
that can run it cannot judge itself (``not_checked``).

Nothing here imports jax: the canary's probe (``tpuwatch.canary.needs``) asks with ``importlib.util.find_spec``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tpuwatch.canary.needs import canary_unavailable, jax_missing_here
from tpuwatch.config import Config, Scenario
from tpuwatch.plugins import PLUGINS, drill
from tpuwatch.samples import Sample, sample

METRIC = "tpuwatch_drill_cannot_run"

# What a scenario of the simulated chips needs beyond them: sdc corrupts no reading, only the canary's numbers;
# hung needs the hang detector on (devices.hang.enabled).  A plugin's drill (tpuwatch.pluginspec.Drill) plays
# its fault itself and says what it needs; the simulated chips stay healthy.
NEEDS: dict[Scenario, tuple[str, ...]] = {"sdc": ("canary",), "hung": ("hang detector",)}

# Each need a scenario may declare, and its probe: why that part cannot run with a config, or None.
PROBES: dict[str, Callable[[Config], str | None]] = {
    "canary": canary_unavailable,
    "hang detector": lambda config: None if config.devices.hang.enabled else "devices.hang.enabled is false",
}

# Drills whose fault only a part of the running daemon sees, never one reading: what ``check`` cannot judge, and
# where to see it instead (a plugin's drill says it in its declaration).  (A drill whose part cannot run here at
# all is a problem: blocked_drill.)
NOT_CHECKED = {
    "sdc": "`tpuwatch check` does not run the canary, the only part that sees the sdc drill's wrong numbers: "
           "`tpuwatch canary --inject scale` runs that drill now, `tpuwatch run --simulate sdc` on the canary's "
           "schedule",
    **{d.scenario: d.not_checked for p in PLUGINS for d in p.drills if d.not_checked},
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
    scenario = config.drill
    if scenario is None:
        return None
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


def not_checked(config: Config) -> list[str]:
    """What ``check`` did not judge for this config: a simulated drill only a daemon's part can see."""
    why = NOT_CHECKED.get(config.drill or "")
    return [why] if why else []
