"""The unit of data that collectors produce and the store keeps."""

from __future__ import annotations

import math
from typing import NamedTuple

Labels = tuple[tuple[str, str], ...]


class Sample(NamedTuple):
    """One reading: metric name (from the catalogue), sorted label pairs, value."""

    name: str
    labels: Labels
    value: float


def sample(name: str, value: float, **labels: str) -> Sample:
    """Build a Sample with its labels sorted, the store's canonical form."""
    return Sample(name, tuple(sorted(labels.items())), float(value))


INVALID_REASONS = ("nan", "inf", "negative")


def invalid_reason(value: float, allow_negative: bool) -> str | None:
    """Why ``value`` is not a reading to keep ("nan", "inf", "negative"), or None."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    if value < 0 and not allow_negative:
        return "negative"
    return None
