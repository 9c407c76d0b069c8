"""Faults injected inside one chip's computation: the canary's fire drills and its scoreboard's trials.

``parse("matmul:bits=10,pattern=0x2a5,flip=20,p=0.05")`` reads a drill as
``tpuwatch canary --inject`` takes it: a class from the field and its
parameters, every one settable, every one defaulted.  The classes:

- ``matmul``: a matmul unit that is wrong only for some operands: an operand
  element whose low ``bits`` mantissa bits equal ``pattern`` has bit ``flip``
  flipped before every matrix product on the chip (the reference model, the
  data-variety GEMM and the bf16 path all multiply);
- ``transcendental``: ``fn`` (exp, tanh, log, rsqrt, erf) wrong by ``rel`` for
  inputs in [``lo``, ``hi``];
- ``memory``: bit ``flip`` of one word (``index``, a fraction of the buffer)
  of the memory kept at rest flipped while it rests;
- ``collective``: the chip's contribution to the collectives corrupted (``add``
  added to element ``index``);
- ``nan``: a NaN in one weight of the reference model (1 % of field outcomes);
- ``slow``: the chip does its work ``factor`` times over (whole times; same bits);
- the reference model's weight drills ``bitflip``, ``scale``, and ``hang`` and
  ``crash`` (canary/model.py, worker.misbehave).

Any class takes ``p`` (default 1): the fault fires in each program run with
that probability (an intermittent chip), drawn from ``seed``.  The device-side
helpers take the jax module as an argument, the class (static) and the
parameters (``knobs``: traced, one compiled program per class).  This module
imports numpy, not jax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CLASSES: dict[str, dict[str, float]] = {
    "matmul": {"bits": 10, "pattern": 0x2A5, "flip": 20},
    "transcendental": {"fn": 0, "lo": 0.5, "hi": 1.5, "rel": 1e-3},
    "memory": {"index": 0.5, "flip": 7},
    "collective": {"index": 3, "add": 1.0},
    "nan": {},
    "slow": {"factor": 4},
    "bitflip": {}, "scale": {}, "hang": {}, "crash": {},
}
COMMON = {"p": 1.0, "seed": 0}
FUNCTIONS = ("exp", "tanh", "log", "rsqrt", "erf")


@dataclass(frozen=True)
class Fault:
    """A drill: its class and parameters (defaults filled in)."""

    kind: str
    params: dict[str, float] = field(default_factory=dict)

    def __getitem__(self, key: str) -> float:
        return self.params[key]

    @property
    def function(self) -> str:
        """The transcendental a ``transcendental`` fault hits."""
        return FUNCTIONS[int(self.params.get("fn", 0))]

    def text(self) -> str:
        """The drill as the command line writes it."""
        shown = {k: v for k, v in self.params.items() if k != "seed" and v != {**COMMON, **CLASSES[self.kind]}.get(k)}
        if self.kind == "transcendental" and "fn" in shown:
            shown["fn"] = self.function  # type: ignore[assignment]
        return self.kind + (":" + ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in shown.items()) if shown else "")


def parse(text: str) -> Fault:
    """``CLASS[:key=value,...]`` -> Fault; ValueError saying what is wrong."""
    kind, _, rest = text.partition(":")
    if kind not in CLASSES:
        raise ValueError(f"unknown fault class {kind!r} (one of {', '.join(CLASSES)})")
    params = {**COMMON, **CLASSES[kind]}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in params:
            raise ValueError(f"{kind}: unknown parameter {key!r} (known: {', '.join(params)})")
        if key == "fn":
            if value not in FUNCTIONS:
                raise ValueError(f"{kind}: fn must be one of {', '.join(FUNCTIONS)}")
            params[key] = float(FUNCTIONS.index(value))
            continue
        try:
            number = float(int(value, 0)) if value.lower().startswith("0x") else float(value)
        except ValueError:
            raise ValueError(f"{kind}: {key}={value!r} is not a number") from None
        if not math.isfinite(number):
            raise ValueError(f"{kind}: {key} must be finite")
        params[key] = number
    if not 0 < params["p"] <= 1:
        raise ValueError(f"{kind}: p must be in (0, 1]")
    if kind == "matmul" and not (1 <= params["bits"] <= 22 and 0 <= params["flip"] <= 30
                                 and 0 <= params["pattern"] < 2 ** params["bits"]):
        raise ValueError("matmul: want 1 <= bits <= 22, 0 <= pattern < 2**bits, 0 <= flip <= 30")
    if kind == "memory" and not (0 <= params["index"] < 1 and 0 <= params["flip"] <= 31):
        raise ValueError("memory: want 0 <= index < 1 and 0 <= flip <= 31")
    if kind == "slow" and not (1 <= params["factor"] <= 64 and params["factor"] == int(params["factor"])):
        raise ValueError("slow: want a whole factor, 1 <= factor <= 64")
    return Fault(kind, params)


def knobs(fault: Fault | None) -> dict[str, Any]:
    """The fault's parameters as the programs take them: traced arguments, so that one compiled program per
    class serves every setting (the scoreboard draws hundreds)."""
    return {k: np.float32(v) for k, v in fault.params.items()} if fault is not None else {}


def corrupt_operand(jax: Any, kind: str | None, knob: dict[str, Any], fires: Any, a: Any) -> Any:
    """``a`` with the matmul fault applied where it fires (a float32 operand; others pass through)."""
    if kind != "matmul":
        return a
    jnp = jax.numpy
    one = jnp.uint32(1)
    bits = jax.lax.bitcast_convert_type(a.astype(jnp.float32), jnp.uint32)
    mask = jnp.left_shift(one, knob["bits"].astype(jnp.uint32)) - one
    hit = ((bits & mask) == knob["pattern"].astype(jnp.uint32)) & fires
    flipped = bits ^ jnp.left_shift(one, knob["flip"].astype(jnp.uint32))
    return jax.lax.bitcast_convert_type(jnp.where(hit, flipped, bits), jnp.float32).astype(a.dtype)


def corrupt_function(jax: Any, kind: str | None, knob: dict[str, Any], fires: Any, name: str, x: Any,
                     y: Any) -> Any:
    """``y = name(x)`` with the transcendental fault applied where it fires."""
    if kind != "transcendental":
        return y
    inside = (x >= knob["lo"]) & (x <= knob["hi"]) & fires & (knob["fn"] == FUNCTIONS.index(name))
    return jax.numpy.where(inside, y * (1 + knob["rel"]), y)


def after(jax: Any, x: Any, carried: Any) -> Any:
    """``x``, made to depend on ``carried`` (plus 0 times one of its elements: the same bits for finite data), so
    that a loop repeating work on ``x`` cannot be folded into one pass."""
    return x + (jax.numpy.zeros((), x.dtype) * jax.numpy.ravel(carried)[0]).astype(x.dtype)


def slowed(jax: Any, kind: str | None, knob: dict[str, Any], fires: Any, work: Any, args: tuple[Any, ...]) -> Any:
    """``work(*args)``, done ``factor`` times over when the slow fault fires (the last answer kept)."""
    if kind != "slow":
        return work(*args)

    def again(_: Any, carried: Any) -> Any:
        floating = jax.numpy.floating
        return work(*jax.tree_util.tree_map(
            lambda a: after(jax, a, carried) if jax.numpy.issubdtype(a.dtype, floating) else a, args))

    first = work(*args)
    repeats = jax.numpy.where(fires, knob["factor"].astype(jax.numpy.int32), 1)
    return jax.lax.fori_loop(1, repeats, again, first)
