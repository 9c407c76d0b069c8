"""The reference-inference canary: a tiny fixed model run on every idle chip, checked three ways.

``model`` defines the workload (numpy weights from a fixed seed, one forward
pass written once over an array namespace), ``worker`` runs it under JAX in a
fresh subprocess, ``supervisor`` keeps that subprocess's process group from
outliving its parent, ``runner`` starts them, ``judge`` judges the answers
(and fire drills), ``history`` keeps the fingerprints between runs,
``collector`` keeps the results for the daemon, ``cli`` is ``tpuwatch canary``,
``needs`` tells whether the canary can run here (the fire drills ask it: tpuwatch.drills).
Only ``worker`` imports jax.
"""
