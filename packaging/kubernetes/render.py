#!/usr/bin/env python3
"""Render the Helm chart into plain manifests for ``kubectl apply``, one file per node pool.

Usage::

    python packaging/kubernetes/render.py [--check]

Writes packaging/kubernetes/tpuwatch.yaml (any node), tpuwatch-tpu.yaml and
tpuwatch-gpu.yaml from chart/tpuwatch with Helm's own engine (PyPI
``helm-python-sdk``), release ``tpuwatch`` in namespace ``monitoring``.
``--check`` writes nothing and exits 1 when a file differs from the chart.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
CHART = HERE / "chart" / "tpuwatch"
RELEASE = "tpuwatch"
NAMESPACE = "monitoring"
POOLS = {"tpuwatch.yaml": None, "tpuwatch-tpu.yaml": "values-tpu.yaml", "tpuwatch-gpu.yaml": "values-gpu.yaml"}
HEADER = "# Rendered from chart/tpuwatch by render.py ({values}); edit the chart, not this file.\n"


def pool_values(values_file: str | None) -> dict[str, Any]:
    """The values a pool file overrides (empty for the chart's defaults)."""
    return yaml.safe_load((CHART / values_file).read_text()) if values_file else {}


def render(values: dict[str, Any]) -> str:
    """The chart rendered with ``values`` as one multi-document YAML text, templates in name order."""
    import helm_python

    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values=values, name=RELEASE, namespace=NAMESPACE)
    documents = [text.strip() for _, text in sorted(manifests.items()) if text.strip()]
    return "---\n" + "\n---\n".join(documents) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or, with --check, compare) every pool's manifests."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for name, values_file in POOLS.items():
        text = HEADER.format(values=values_file or "default values") + render(pool_values(values_file))
        path = HERE / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"render.py: out of date with the chart: {', '.join(stale)} (run packaging/kubernetes/render.py)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
