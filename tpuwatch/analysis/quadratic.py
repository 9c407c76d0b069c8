"""Least-squares quadratics over a climb's newest minutes, for the fast check (``fast.py``).

``fits(span)`` gives, once per span (cached), the weights that turn the values
at t = -span..0 into a straight line's slope and a quadratic's level, slope at
the newest value and curvature; ``quadratic`` fits one climb and says how
rough it is: the noise of one value and the factor by which residuals that
follow each other widen the curvature's standard error.
"""

from __future__ import annotations

import math
from functools import lru_cache


def quadratic(climb: list[float], noise: float, max_lag: float) -> tuple[float, float, float, float]:
    """The quadratic a + b t + c t^2 fitted to ``climb`` (t = -span..0): b (its slope at the newest value, per
    bucket), c (half its acceleration), the noise of one value (``noise``, or what the quadratic leaves
    unexplained if more: a staircase's steps, a sawtooth's teeth) and the factor by which residuals that follow
    each other widen c's standard error (their AR(1) factor, the lag at most ``max_lag``)."""
    span = len(climb) - 1
    _, fit_a, fit_b, fit_c, _ = fits(span)
    level = sum(w * y for w, y in zip(fit_a, climb))
    current = sum(w * y for w, y in zip(fit_b, climb))
    curvature = sum(w * y for w, y in zip(fit_c, climb))
    if span <= 3:
        return current, curvature, noise, 1.0
    residuals = [y - level - current * t - curvature * t * t for t, y in zip(range(-span, 1), climb)]
    squares = sum(r * r for r in residuals)
    noise = max(noise, math.sqrt(squares / (span - 2)))
    # Residuals that follow each other (a staircase's flat steps, a sawtooth's tops held for minutes) hold fewer
    # independent values than minutes.
    lag = sum(a * b for a, b in zip(residuals, residuals[1:])) / squares if squares > 0 else 0.0
    lag = min(max(lag, 0.0), max_lag)
    return current, curvature, noise, math.sqrt((1.0 + lag) / (1.0 - lag))


@lru_cache(maxsize=128)
def fits(span: int) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...], tuple[float, ...], float]:
    """Least-squares weights over t = -span..0: the straight line's slope; the quadratic a + b t + c t^2's a, b
    (the slope at the newest point) and c (half the acceleration); and the norm of c's weights (its standard
    error per unit of noise)."""
    ts = [float(t) for t in range(-span, 1)]
    mean = sum(ts) / len(ts)
    spread = sum((t - mean) ** 2 for t in ts)
    line = tuple((t - mean) / spread for t in ts)
    sums = [sum(t**k for t in ts) for k in range(5)]
    inverse = _inverse3([[sums[i + j] for j in range(3)] for i in range(3)])
    a, b, c = ([sum(inverse[r][k] * t**k for k in range(3)) for t in ts] for r in range(3))
    return line, tuple(a), tuple(b), tuple(c), math.sqrt(sum(w * w for w in c))


def _inverse3(m: list[list[float]]) -> list[list[float]]:
    (a, b, c), (d, e, f), (g, h, i) = m
    det = a * (e * i - f * h) - b * (d * i - f * g) + c * (d * h - e * g)
    cof = [[e * i - f * h, c * h - b * i, b * f - c * e],
           [f * g - d * i, a * i - c * g, c * d - a * f],
           [d * h - e * g, b * g - a * h, a * e - b * d]]
    return [[v / det for v in row] for row in cof]
