"""The fixed reference workload: one attention block and one MLP block over numpy weights.

The forward pass is written once against an array namespace: the worker runs
it with ``jax.numpy`` in float32 on each chip (every matmul at explicit
``HIGHEST`` precision), and ``reference()`` runs it with numpy in float64 on
the host CPU.  The reference shares the model's definition, not its arithmetic:
it never touches XLA or the chip, so it is independent of what is checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tpuwatch.canary.spec import HIDDEN, OUT, TOKENS, WIDTH

SEED = 20240605
# The weight drills (spec.INJECTIONS), shared by the scheduled worker and the in-job probe.
# bitflip: mantissa bit 7 of 23 of one query weight (a 1.5e-5 relative change, far inside the
# tolerance).  Flips of bits 0-2 are often absorbed by rounding; bit 7 changes ~660 of 1024 outputs.
BITFLIP_AT = ("wq", (0, 0), 7)
SCALE_AT = ("wout", (0, 0), 1.0 + 1e-3)
NAN_AT = ("wq", (0, 0))
WEIGHT_DRILLS = ("bitflip", "scale", "nan")
# XLA flags that cannot change a program's bits: they are left out of the stack a fingerprint is keyed by.
NEUTRAL_FLAGS = ("--xla_force_host_platform_device_count", "--xla_dump_")
# Flags for one platform only: another platform's flags are neutral there.
_PLATFORM_FLAGS = {"cpu": "--xla_cpu_", "gpu": "--xla_gpu_", "cuda": "--xla_gpu_", "rocm": "--xla_gpu_",
                   "tpu": "--xla_tpu_"}

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



def device_forward(jax: Any) -> Callable[[Params, Any], Any]:
    """The forward pass for a chip: jax.numpy in float32, every matmul at explicit HIGHEST precision."""
    highest = jax.lax.Precision.HIGHEST
    jnp = jax.numpy
    return lambda p, v: forward(jnp, lambda a, b: jnp.matmul(a, b, precision=highest), p, v)


def injected(params: Params, kind: str | None) -> Params:
    """``params`` with the weight drill ``kind`` applied to a copy (other kinds change none)."""
    if kind not in WEIGHT_DRILLS:
        return params
    out = {name: w.copy() for name, w in params.items()}
    if kind == "bitflip":
        name, index, bit = BITFLIP_AT
        out[name].view(np.uint32)[index] ^= np.uint32(1 << bit)
    elif kind == "scale":
        name, index, factor = SCALE_AT
        out[name][index] *= np.float32(factor)
    else:
        name, index = NAN_AT
        out[name][index] = np.nan
    return out


def fingerprint(output: np.ndarray) -> str:
    """Short hex digest of the output's exact bytes."""
    return hashlib.sha256(np.ascontiguousarray(output).tobytes()).hexdigest()[:16]


def stack(versions: str, platform: str, environ: Mapping[str, str]) -> str:
    """What can change the bits besides the chip: ``versions`` (jax, jaxlib, the runtime or driver) and the XLA
    and libtpu flags that apply to ``platform``, as a digest (neutral flags and other platforms' left out)."""
    other = tuple(prefix for name, prefix in _PLATFORM_FLAGS.items() if prefix != _PLATFORM_FLAGS.get(platform))
    flags = sorted(flag for var in ("XLA_FLAGS", "LIBTPU_INIT_ARGS") for flag in environ.get(var, "").split()
                   if not flag.startswith(NEUTRAL_FLAGS + other))
    if not flags:
        return versions
    return f"{versions}, flags {hashlib.sha256(' '.join(flags).encode()).hexdigest()[:8]}"
