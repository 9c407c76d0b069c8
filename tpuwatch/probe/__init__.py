"""tpuwatch's reference check inside a running JAX job: ``Probe().step()`` in the loop, or ``check()``.

The scheduled canary runs on idle chips only; a job that holds every chip all
day hides them from it.  The probe runs the canary's own reference model (same
weights, inputs, precision and fingerprints) on the job's own devices, between
its steps, and reports to tpuwatch's daemon over a local socket, which judges
each chip as it judges the canary and pages on a wrong result.  Importing it
loads jax and numpy (and nothing of the daemon's).  See docs/probe.md.
"""

from tpuwatch.probe.core import Probe, check

__all__ = ["Probe", "check"]
