"""The fixed reference workload: one attention block and one MLP block over numpy weights.

The forward pass is written once against an array namespace: the worker runs
it with ``jax.numpy`` in float32 on each chip (every matmul at explicit
``HIGHEST`` precision), and ``reference()`` runs it with numpy in float64 on
the host CPU.  The reference shares the model's definition, not its arithmetic:
it never touches XLA or the chip, so it is independent of what is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tpuwatch.canary.spec import HIDDEN, OUT, TOKENS, WIDTH

SEED = 20240605

# Weight shapes, in a fixed order.
SHAPES: dict[str, tuple[int, ...]] = {
    "wq": (WIDTH, WIDTH), "wk": (WIDTH, WIDTH), "wv": (WIDTH, WIDTH), "wo": (WIDTH, WIDTH),
    "w1": (WIDTH, HIDDEN), "w2": (HIDDEN, WIDTH), "wout": (WIDTH, OUT),
}

Params = dict[str, np.ndarray]


def inputs() -> np.ndarray:
    """The fixed input: TOKENS x WIDTH float32 values from the seed."""
    return np.random.default_rng(SEED).standard_normal((TOKENS, WIDTH)).astype(np.float32)


def weights() -> Params:
    """The fixed weights: float32, scaled by 1/sqrt(fan_in) so activations stay near 1."""
    rng = np.random.default_rng(SEED + 1)
    return {name: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
            for name, shape in SHAPES.items()}


def forward(xp: Any, matmul: Callable[[Any, Any], Any], params: Params, x: Any) -> Any:
    """One attention block and one MLP block, each residual; ``xp`` is numpy or jax.numpy."""
    q, k, v = matmul(x, params["wq"]), matmul(x, params["wk"]), matmul(x, params["wv"])
    scores = matmul(q, k.T) / np.sqrt(WIDTH)
    scores = xp.exp(scores - xp.max(scores, axis=-1, keepdims=True))
    attention = scores / xp.sum(scores, axis=-1, keepdims=True)
    h = x + matmul(matmul(attention, v), params["wo"])
    h = h + matmul(xp.tanh(matmul(h, params["w1"])), params["w2"])
    return matmul(h, params["wout"])


def reference(params: Params, x: np.ndarray) -> np.ndarray:
    """The float64 numpy answer to compare every chip against."""
    wide = {name: w.astype(np.float64) for name, w in params.items()}
    return forward(np, np.matmul, wide, x.astype(np.float64))

