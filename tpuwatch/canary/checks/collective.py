"""The interconnect: an all-gather and an all-reduce across the idle chips of the host, over integer-valued
float32 data whose exact answer is known (every sum stays below 2^24, so any order gives the same bits).

Chip i contributes (i + 1) x v with v a fixed ramp.  Every chip receives
every contribution (all-gather) and their sum (all-reduce).  A contribution
wrong on every receiver names the chip that sent it; one wrong on a single
receiver names that receiver's link; a sum wrong where the gathered blocks
are right names the receiver.  It needs two idle chips or more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

NAME = "collective"
LENGTH = 4096


def contributions(n: int) -> np.ndarray:
    """What each of ``n`` chips sends: (n, LENGTH) float32 integers."""
    ramp = (np.arange(LENGTH) % 251 + 1).astype(np.float32)
    return np.stack([(i + 1) * ramp for i in range(n)])


def program(jax: Any, kind: str | None, fault_index: int | None) -> Callable[..., Any]:
    """The per-chip program for jax.pmap over axis "chips": (gathered (n, LENGTH), summed (LENGTH,))."""
    jnp = jax.numpy

    def run(fires: Any, knob: dict[str, Any], x: Any) -> Any:
        if kind == "collective" and fault_index is not None:
            hit = (jax.lax.axis_index("chips") == fault_index) & fires
            at = knob["index"].astype(jnp.int32) % LENGTH
            x = jnp.where(hit, x.at[at].add(knob["add"]), x)
        return jax.lax.all_gather(x, "chips"), jax.lax.psum(x, "chips")

    return run


def blame(gathered: np.ndarray, summed: np.ndarray) -> dict[int, str]:
    """Chip index -> what it did wrong, from every receiver's answer ((n, n, LENGTH) and (n, LENGTH))."""
    n = gathered.shape[0]
    sent = contributions(n)
    wrong_block = np.array([[not np.array_equal(gathered[r, j], sent[j]) for j in range(n)] for r in range(n)])
    wrong_sum = np.array([not np.array_equal(summed[r], sent.sum(axis=0)) for r in range(n)])
    out: dict[int, str] = {}
    for j in range(n):
        if wrong_block[:, j].all():
            out[j] = "its contribution to the all-gather arrived wrong on every chip"
    for r in range(n):
        if r in out:
            continue
        links = [j for j in range(n) if wrong_block[r, j] and j not in out]
        if links:
            out[r] = f"received wrong data from chip(s) {', '.join(map(str, links))} (link or receiver)"
        elif wrong_sum[r] and not any(wrong_block[:, j].all() for j in range(n)):
            out[r] = "its all-reduce answer is wrong while the gathered contributions are right"
    return out
