"""The bottom of the pipeline: the collector protocol and the guard that runs each collector in isolation.

What is built from a config lives at the top, in ``tpuwatch.registry``; the host collector is in
``tpuwatch.host.collector``.
"""

from tpuwatch.collectors.guard import Collector, CollectorStatus, GuardedCollector

__all__ = ["Collector", "CollectorStatus", "GuardedCollector"]
