"""Alerting: rules over the samples, alert state, and durable delivery to receivers.

The daemon builds one :class:`Alerting` from its config and ``state_dir``,
calls ``evaluate()`` after every sampling cycle, and ``start()``/``stop()``s
its delivery threads.  ``tpuwatch test-alert`` and ``tpuwatch alerts`` live in
:mod:`tpuwatch.alerting.testalert` and :mod:`tpuwatch.alerting.listing`.
"""

from tpuwatch.alerting.service import Alerting

__all__ = ["Alerting"]
