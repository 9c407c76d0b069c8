"""tpuwatch's reference check inside a running JAX job: ``Probe().step()`` in the loop, or ``check()``.

The scheduled canary runs on idle chips only; a job that holds every chip all
day hides them from it.  The probe runs the canary's own reference model (same
weights, inputs, precision and fingerprints) on the job's own devices, between
its steps, and reports to tpuwatch's daemon over a local socket, which judges
each chip as it judges the canary and pages on a wrong result.  ``Probe`` and
``check`` load jax and numpy when first used (nothing of the daemon's);
``channel`` and ``chips`` are standard library only.  See docs/probe.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Probe", "check"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tpuwatch.probe import core

        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
