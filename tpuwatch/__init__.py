"""tpuwatch: health monitor and alerting agent for ML accelerator hosts."""

__version__ = "0.1.0"
