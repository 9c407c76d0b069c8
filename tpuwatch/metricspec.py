"""What one metric family is: its name, type, help and labels (the catalogue lists them all)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class MetricSpec:
    """What one metric family is."""

    name: str
    kind: Literal["gauge", "counter", "summary"]
    help: str
    labels: tuple[str, ...] = ()  # a summary's samples also carry "quantile", its _count and _sum do not
    allow_negative: bool = False
    # Labels only some samples carry (a MIG instance on NVIDIA), exposed only where they do.
    optional_labels: tuple[str, ...] = ()
