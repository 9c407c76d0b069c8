"""The reference model (canary/model.py) in float32 at HIGHEST precision: one fixed input, the check the canary
always ran and the in-job probe runs; its fingerprints continue the history of those runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpuwatch.canary import model, spec
from tpuwatch.canary.checks import faults
from tpuwatch.canary.checks.base import Case

NAME = "model"
FIXED = True  # one input, every run


def case(entry: int, platform: str, fault: faults.Fault | None = None) -> Case:
    """The fixed input; a weight drill (bitflip, scale, nan) changes the weights the chip gets."""
    params, x = model.weights(), model.inputs()
    expected = model.reference(params, x)
    bound = spec.tolerance(platform, spec.DTYPE, float(abs(expected).max()))
    return Case((model.injected(params, fault.kind if fault else None), x), expected, bound)


def program(jax: Any, kind: str | None) -> Callable[..., Any]:
    """forward(params, x) with every matmul at HIGHEST, operands through fault ``kind``."""
    jnp = jax.numpy
    highest = jax.lax.Precision.HIGHEST

    def run(fires: Any, knob: dict[str, Any], params: model.Params, x: Any) -> Any:
        def matmul(a: Any, b: Any) -> Any:
            return jnp.matmul(faults.corrupt_operand(jax, kind, knob, fires, a), b, precision=highest)

        return faults.slowed(jax, kind, knob, fires, lambda p, v: model.forward(jnp, matmul, p, v), (params, x))

    return run
