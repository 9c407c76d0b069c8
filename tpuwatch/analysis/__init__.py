"""Trend analysis: the online leak detector, drift detection, the daemon hook and ``tpuwatch analyze``."""
