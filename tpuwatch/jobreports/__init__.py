"""The daemon's side of tpuwatch.probe: the Unix socket in-job probes report to, and their verdicts.

``protocol`` is the message both sides share (standard library only),
``message`` checks a report, ``chips`` says which chips its sender holds,
``verdicts`` judges it as the canary's runs are judged, ``server`` serves the
socket, ``collector`` is the part the daemon runs, ``drill`` the probe-sdc
scenario's simulated job.  As a plugin (``tpuwatch.pluginspec``), ``plugin``
declares its config section, metrics and drill, and ``hooks`` builds it.
"""
