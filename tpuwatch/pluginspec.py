"""What a plugin declares: the whole story of one feature folder, in data (no imports but this layer's).

A plugin is a folder under ``tpuwatch/`` (the cloud's maintenance notices in
``tpuwatch/cloud/``, the in-job probe's socket in ``tpuwatch/jobreports/``)
that the rest of tpuwatch knows only through two modules of its own:

- ``plugin.py`` declares a ``PLUGIN`` (this module's ``Plugin``): its config
  section (a dataclass under the key ``name``), its metric families, the node
  conditions it offers, its fire drills, and the config keys beside its
  section that its build reads (a change to any of them rebuilds it on reload);
- the module ``hooks`` names does the work (``tpuwatch.registry`` lists the
  functions it may define): it builds the plugin's collector, and says what
  the plugin adds to ``tpuwatch check``, ``/healthz``, the status page and
  ``tpuwatch top``.

Registering one is one line in ``tpuwatch/plugins.py``.  Config, the metric
catalogue, the registry, the assembly, health, report, the views, the node
conditions and the drills loop over the registered plugins and name none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpuwatch.metricspec import MetricSpec


@dataclass(frozen=True)
class Condition:
    """A node condition the plugin offers (docs/kubernetes.md), on while its section's ``opt_in`` key is true."""

    type: str  # CamelCase, like HostMaintenanceScheduled
    alerts: tuple[tuple[str, str], ...]  # (alert name, the condition's reason while it fires), by priority
    opt_in: str  # a boolean key of the plugin's section


@dataclass(frozen=True)
class Drill:
    """A ``--simulate`` scenario the plugin runs: the simulated chips stay healthy, the plugin plays the fault."""

    scenario: str
    needs: str  # the part the drill needs, in words ("maintenance source")
    # Why the part cannot run with the plugin's section (the drill then says so instead of passing), or None.
    blocked: Callable[[Any], str | None]
    needs_jax: bool = False  # the drill runs jax in this interpreter (its simulated job)
    device_files: bool = False  # the simulated chips get device files a simulated job can hold
    not_checked: str | None = None  # what ``tpuwatch check`` says, where only a running daemon sees the fault


@dataclass(frozen=True)
class Plugin:
    """One plugin's declaration (module docstring)."""

    name: str  # its config key, its collector's name and its key in ``check --json`` and /healthz
    settings: type  # its config section: a frozen dataclass whose every field has a default
    hooks: str  # the dotted name of its hooks module
    metrics: tuple[MetricSpec, ...] = ()
    rebuild_on: tuple[str, ...] = ()  # top-level config keys beside its section that its build reads
    conditions: tuple[Condition, ...] = ()
    drills: tuple[Drill, ...] = ()
    # Whether, with its section, it records into the canary's book (which is then kept even with the canary off).
    uses_canary_book: Callable[[Any], bool] | None = None
