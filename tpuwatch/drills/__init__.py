"""Fire drills: what ``--simulate SCENARIO`` (or ``devices.backend: sim``) changes, in one place.

A drill is a scenario played on simulated chips.  Each part contributes its
own: the simulated device backend (``tpuwatch.devices.sim``, a backend like
any other) plays the chips' scenarios in their readings, a plugin plays its
drill itself and declares it (``tpuwatch.pluginspec.Drill``), and the part a
drill needs says whether it can run here (the canary: ``tpuwatch.canary.needs``).
This package holds what the rest of tpuwatch does about drills:

- ``simulate``: a config turned into a drill (``simulated``), what makes a
  config simulated (``is_simulated``), the state its chips keep apart
  (``namespaced``: ``state_dir/simulated``), and the canary's part in the
  ``sdc`` drill (``canary_drill``);
- ``needs``: what each scenario needs beyond the simulated chips, whether
  that can run here (``blocked_drill``, ``tpuwatch_drill_cannot_run``), and
  what ``tpuwatch check`` cannot judge of a drill (``not_checked``);
- ``history``: the simulated chips' past, fed to the trend detectors and the
  store at start (``replay``), so that the ``hbm-leak`` drill is judged from
  the first minute.

The scenarios' names are declarations, as a plugin's are: the choices of
``devices.sim.scenario`` (``tpuwatch.config.SCENARIOS``: the chips' own, then
the plugins' drills), checked where the config is, below this package, which
reads the collectors and the analysis.  Which drill a config runs is
``Config.drill`` (None on real chips), the one question every part asks.
"""
