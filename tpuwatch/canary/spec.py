"""What the runner needs to know about the reference model, without numpy: sizes, version, tolerances.

Tolerance derivation (docs/canary.md): a dot product of length K computed in a
dtype with unit roundoff u is off by at most about K*u times the sum of its
terms' magnitudes (the standard worst-case bound).  The model is scaled so
activations stay near 1, and errors along the chain of dots from input to
output add up, so the bound is u * sum(K along the chain) * max|output|.  A
device kind's factor covers arithmetic looser than IEEE float32 with
round-to-nearest (GPU fused multiply-add ordering and fast transcendentals,
TPU float32 matmuls emulated with bfloat16 passes), and SAFETY covers the
approximation of "sum of magnitudes" by the output's magnitude.
"""

from __future__ import annotations

MODEL_VERSION = "attn-mlp-v1"
SUITE_VERSION = "v2"  # the suite's checks (canary/checks): a change that moves their bits bumps it (v2: gemm 512 rows)
CHECKS = ("model", "gemm", "transcendental", "bf16", "memory", "collective")  # canary/checks, in run order
TIMED_CHECKS = ("gemm",)  # whose device time is the chip's arithmetic (canary/checks/gemm.py): the speed check
TOKENS, WIDTH, HIDDEN, OUT = 32, 128, 256, 32
DTYPE = "float32"
# Fire drills on one chip, run through the worker's own loop (model.injected, worker.misbehave, checks/faults.py:
# those take parameters, CLASS[:key=value,...]).
INJECTIONS = ("bitflip", "scale", "nan", "hang", "crash", "matmul", "transcendental", "memory", "collective", "slow")

# Dot-product lengths along the longest path from input to output:
# q/k projections, scores (q.k), attention x v, output projection, MLP in, MLP out, head.
CHAIN_DOT_LENGTHS = (WIDTH, WIDTH, TOKENS, WIDTH, WIDTH, HIDDEN, WIDTH)
UNIT_ROUNDOFF = {"float32": 2.0 ** -24}
DEVICE_FACTOR = {"cpu": 1.0, "gpu": 2.0, "tpu": 4.0}
SAFETY = 4.0


def tolerance(platform: str, dtype: str, scale: float) -> float:
    """Largest max-abs error accepted on ``platform`` (jax's name) for outputs of magnitude ``scale``.

    An unknown platform gets the loosest known factor.
    """
    factor = DEVICE_FACTOR.get(platform, max(DEVICE_FACTOR.values()))
    return SAFETY * factor * UNIT_ROUNDOFF[dtype] * sum(CHAIN_DOT_LENGTHS) * scale
