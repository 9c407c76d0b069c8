"""What every check of the suite gives: a ``Case`` (inputs, the float64 answer, a bound per element) and how an
output is judged against it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tpuwatch.canary.model import fingerprint
from tpuwatch.canary.spec import DEVICE_FACTOR, UNIT_ROUNDOFF

U32 = UNIT_ROUNDOFF["float32"]


def factor(platform: str) -> float:
    """How much looser than IEEE float32 with round-to-nearest the platform's arithmetic may be (spec.py says
    why); an unknown platform gets the loosest."""
    return DEVICE_FACTOR.get(platform, max(DEVICE_FACTOR.values()))


@dataclass(frozen=True)
class Case:
    """One input of a check: what goes to the chip, the float64 answer, the largest accepted error per element."""

    inputs: tuple[Any, ...]
    reference: np.ndarray
    bound: np.ndarray | float


def measure(output: np.ndarray, case: Case) -> dict[str, Any]:
    """finite, max_abs_error, error_ratio (largest error / its bound; over 1 fails) and the fingerprint."""
    finite = bool(np.isfinite(output).all())
    result: dict[str, Any] = {"finite": finite, "max_abs_error": None, "error_ratio": None,
                              "fingerprint": fingerprint(output)}
    if finite:
        error = np.abs(output.astype(np.float64) - case.reference)
        result["max_abs_error"] = float(error.max())
        result["error_ratio"] = float((error / case.bound).max())
    return result
