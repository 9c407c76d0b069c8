"""The jobs' precision: the reference model with every matmul's operands in bfloat16 and float32 accumulation
(what TPU's default precision and bf16 training do), beside the float32 HIGHEST check.

The host emulates the same rounding: the float64 forward pass rounds each
matmul's operands to bfloat16 (ml_dtypes, which jax ships with), so chip and
host differ only by float32 accumulation and the rare operand that lands on
the other side of a bfloat16 rounding boundary.  Such a flip moves that
operand by one bfloat16 unit (u = 2^-8 relative), which moves an output by
at most u times the output's scale for each matmul along the chain: the bound
is SAFETY x factor x u x (matmuls on the chain) x max|output|.  Chips compare
bits as for every check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from tpuwatch.canary import model, spec
from tpuwatch.canary.checks import faults
from tpuwatch.canary.checks.base import Case, factor

NAME = "bf16"
FIXED = True
U_BF16 = 2.0 ** -8
SAFETY = 4.0


def _rounded(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float64)


def case(entry: int, platform: str, fault: faults.Fault | None = None) -> Case:
    """The reference model's weights and input, and the float64 answer with bf16-rounded matmul operands."""
    params, x = model.weights(), model.inputs()
    wide = {name: w.astype(np.float64) for name, w in params.items()}
    expected = model.forward(np, lambda a, b: _rounded(a) @ _rounded(b), wide, x.astype(np.float64))
    bound = SAFETY * factor(platform) * U_BF16 * len(spec.CHAIN_DOT_LENGTHS) * float(np.abs(expected).max())
    return Case((params, x), expected, bound)


def program(jax: Any, kind: str | None) -> Callable[..., Any]:
    """forward(params, x) with bf16 matmul operands, float32 accumulation, default precision (on TPU one bf16
    pass, exact for operands bf16 already holds)."""
    jnp = jax.numpy

    def run(fires: Any, knob: dict[str, Any], params: model.Params, x: Any) -> Any:
        def matmul(a: Any, b: Any) -> Any:
            a = faults.corrupt_operand(jax, kind, knob, fires, a)
            rounded = [v.astype(jnp.bfloat16).astype(jnp.float32) for v in (a, b)]  # not every backend has bf16 dots
            return jnp.matmul(*rounded, precision=jax.lax.Precision.DEFAULT)

        return faults.slowed(jax, kind, knob, fires, lambda p, v: model.forward(jnp, matmul, p, v), (params, x))

    return run
