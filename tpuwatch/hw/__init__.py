"""The bottom layer: what the host and its hardware expose, and the primitives that reading them needs.

``procfs`` (which processes hold which device files, and their cgroups), ``pci`` (PCI functions
under sysfs, vendor ids), ``chips`` (the table of chip kinds), ``units``,
``deadline`` (calls that may never return, run with a deadline) and
``locks`` (file locks taken within a deadline).  Standard library only, and
nothing else of tpuwatch: the canary worker imports it before jax, and every
other part may import it (tests/test_layers.py checks both).
"""
