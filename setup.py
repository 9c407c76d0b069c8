"""The optional native keyword matcher; everything else is in pyproject.toml.

Without a C compiler (or Python's headers) the build goes on without it and
tpuwatch uses its pure-Python matcher, which finds the same lines, slower.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tpuwatch.kernel_log._keywords",
                             ["tpuwatch/kernel_log/_keywords.c", "tpuwatch/kernel_log/_automaton.c",
                              "tpuwatch/kernel_log/_text.c"],
                             depends=["tpuwatch/kernel_log/_automaton.h", "tpuwatch/kernel_log/_text.h"], optional=True)])
