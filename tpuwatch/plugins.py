"""The registered plugins (``tpuwatch.pluginspec``): one line each, in the order their parts run and show."""

from __future__ import annotations

import importlib

from tpuwatch.pluginspec import Drill, Plugin

_DECLARATIONS = (
    "tpuwatch.cloud.plugin",
    "tpuwatch.jobreports.plugin",
)

PLUGINS: tuple[Plugin, ...] = tuple(importlib.import_module(name).PLUGIN for name in _DECLARATIONS)


def drill(scenario: str) -> tuple[Plugin, Drill] | None:
    """The plugin that runs ``scenario`` and its drill, or None for a scenario of the simulated chips."""
    return next(((p, d) for p in PLUGINS for d in p.drills if d.scenario == scenario), None)
