"""The vector and transcendental units: exp, tanh, log, rsqrt, erf and a softmax, swept across the ranges
models use, each against float64 within a bound derived per function.

Each function gets a fixed sweep (evenly spaced, or log-spaced for log and
rsqrt) plus points drawn for the schedule's entry.  XLA computes these with
polynomial or rational approximations, not correctly rounded: the bound is
ULPS units in the last place of the float32 result (one for the input's own
rounding, the rest for the approximation), times the platform's factor, plus
an absolute floor for results near zero where a relative bound means
nothing.  The softmax's bound is the exp bound plus the rounding of a
row sum of its length.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tpuwatch.canary.checks import faults
from tpuwatch.canary.checks.base import U32, Case, factor

NAME = "transcendental"
FIXED = False
POINTS = 2048  # per function: half a fixed sweep, half drawn for the entry
ULPS = 8.0
FLOOR = 2.0 ** -60
ROW = 128
ROWS = 16
SEED = 20261207
RANGES = {"exp": (-80.0, 80.0, False), "tanh": (-12.0, 12.0, False), "log": (1e-30, 1e30, True),
          "rsqrt": (1e-30, 1e30, True), "erf": (-6.0, 6.0, False)}
_ERF = np.vectorize(math.erf, otypes=[np.float64])
REFERENCE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp, "tanh": np.tanh, "log": np.log, "rsqrt": lambda v: 1.0 / np.sqrt(v), "erf": _ERF}


def _points(entry: int, name: str) -> np.ndarray:
    lo, hi, logarithmic = RANGES[name]
    rng = np.random.default_rng((SEED, entry, faults.FUNCTIONS.index(name)))
    if logarithmic:
        sweep = np.geomspace(lo, hi, POINTS // 2)
        drawn = np.exp(rng.uniform(math.log(lo), math.log(hi), POINTS // 2))
    else:
        sweep = np.linspace(lo, hi, POINTS // 2)
        drawn = rng.uniform(lo, hi, POINTS // 2)
    return np.concatenate([sweep, drawn]).astype(np.float32)


def case(entry: int, platform: str, fault: faults.Fault | None = None) -> Case:
    """Every function's points, the softmax's rows, and the answers (one flat vector each)."""
    xs = np.stack([_points(entry, name) for name in faults.FUNCTIONS])
    refs = [REFERENCE[name](x.astype(np.float64)) for name, x in zip(faults.FUNCTIONS, xs)]
    rng = np.random.default_rng((SEED, entry, len(faults.FUNCTIONS)))
    logits = rng.uniform(-20, 20, (ROWS, ROW)).astype(np.float32)
    wide = logits.astype(np.float64)
    e = np.exp(wide - wide.max(axis=1, keepdims=True))
    soft = e / e.sum(axis=1, keepdims=True)
    reference = np.concatenate([*refs, soft.ravel()])
    ulp = np.spacing(np.abs(reference).astype(np.float32)).astype(np.float64)
    bound = factor(platform) * np.maximum(ULPS * ulp, FLOOR)
    bound[-soft.size:] += factor(platform) * U32 * ROW * soft.ravel()
    return Case((xs, logits), reference, bound)


def program(jax: Any, kind: str | None) -> Callable[..., Any]:
    """Each function on its row of points and the softmax, flattened into one vector."""
    jnp = jax.numpy
    functions = {"exp": jnp.exp, "tanh": jnp.tanh, "log": jnp.log, "rsqrt": jax.lax.rsqrt,
                 "erf": jax.scipy.special.erf}

    def run(fires: Any, knob: dict[str, Any], xs: Any, logits: Any) -> Any:
        def work(xs: Any, logits: Any) -> Any:
            outs = [faults.corrupt_function(jax, kind, knob, fires, name, xs[i], functions[name](xs[i]))
                    for i, name in enumerate(faults.FUNCTIONS)]
            return jnp.concatenate([*outs, jax.nn.softmax(logits, axis=-1).ravel()])

        return faults.slowed(jax, kind, knob, fires, work, (xs, logits))

    return run
