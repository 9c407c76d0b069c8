"""Data variety and speed: a matrix product of fresh operands each run, drawn from a seeded schedule, done
REPEATS times in one program so that its device time is the chip's arithmetic, not the dispatch.

Faults that depend on operand bit patterns are never met by one fixed input.
Entry N of the schedule draws operands whose exponents span 2^-8..2^8 and
whose mantissa bits are uniform.  The left operand, the one a matmul fault
that fires on an operand's bit pattern is met through, has M x K = 512 x 256 =
131,072 elements per run (LEFT_ELEMENTS): a pattern of the low b mantissa bits
turns up in one run with chance 1 - (1 - 2^-b)^131072, about 39 % for
b = 18 and 63 % for b = 17, and in at least one of the 24 entries of a day's
schedule with chance 1 - exp(-24 * 131072 / 2^b): over 99.999 % for b <= 18.
(M was 128: 12 % a run for b = 18.)  The product is done REPEATS = 16 times,
twice the arithmetic of the 32 products of the 128-row operand: on this
project's CPU hosts XLA does the 512-row product faster per row, and 8 repeats
(the same arithmetic) gave the speed check ~2.3 ms against the 128-row
product's ~3.2 ms, leaving a busy host's jitter a larger share of each timing;
16 give ~4.2 ms.  The host computes the float64 product; the bound per
element is the worst-case rounding of a length-K float32 dot product,
u * K * sum|a_ik * b_kj|, times the platform's factor and SAFETY.  Chips
compare bits per entry; the history keeps each entry's fingerprint per chip
(keyed by spec.SUITE_VERSION, bumped with the shape), so a chip meets its own
past when the schedule comes round again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tpuwatch.canary.checks import faults
from tpuwatch.canary.checks.base import U32, Case, factor

NAME = "gemm"
FIXED = False
M, K, N = 512, 256, 128  # M x K left-operand elements a run: the variety a data-dependent fault is met by
LEFT_ELEMENTS = M * K
SEED = 20261206
SAFETY = 2.0
REPEATS = 16  # products per run, one dispatch: the chip's time, not the dispatch's, is what the speed check sees


def operands(entry: int, shape: tuple[int, ...]) -> np.ndarray:
    """Entry ``entry``'s operand: float32 with uniform mantissa bits, signs, and exponents in [-8, 8]."""
    rng = np.random.default_rng((SEED, entry, *shape))
    mantissa = rng.integers(0, 1 << 23, size=shape, dtype=np.uint32)
    exponent = rng.integers(127 - 8, 127 + 9, size=shape, dtype=np.uint32)
    sign = rng.integers(0, 2, size=shape, dtype=np.uint32)
    return ((sign << 31) | (exponent << 23) | mantissa).view(np.float32)


def case(entry: int, platform: str, fault: faults.Fault | None = None) -> Case:
    """Entry ``entry``'s operands, their float64 product and the per-element bound."""
    a, b = operands(entry, (M, K)), operands(entry, (K, N))
    wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
    bound = SAFETY * factor(platform) * U32 * K * (np.abs(wide_a) @ np.abs(wide_b))
    return Case((a, b), wide_a @ wide_b, bound)


def program(jax: Any, kind: str | None) -> Callable[..., Any]:
    """a @ b at HIGHEST precision, REPEATS times, the operands through fault ``kind``."""
    jnp = jax.numpy
    highest = jax.lax.Precision.HIGHEST

    def run(fires: Any, knob: dict[str, Any], a: Any, b: Any) -> Any:
        def product(x: Any, y: Any) -> Any:
            return jnp.matmul(faults.corrupt_operand(jax, kind, knob, fires, x), y, precision=highest)

        def work(x: Any, y: Any) -> Any:
            def again(_: Any, carried: Any) -> Any:
                return product(faults.after(jax, x, carried), y)

            return jax.lax.fori_loop(1, REPEATS, again, product(x, y))

        return faults.slowed(jax, kind, knob, fires, work, (a, b))

    return run
