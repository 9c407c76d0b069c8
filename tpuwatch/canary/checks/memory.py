"""Memory at rest: a pattern written to the chip's memory at the start of a run, left there while the other
checks run, and checked at the end.

The pattern is an integer hash of each word's index, computed on the chip
both times, so no bulk transfer is needed; the host recomputes a slice of it
with numpy to check the chip's hash itself.  Its size is
``canary.memory_bytes``, bounded by ``canary.memory_share`` of the memory
free on the chip when the run starts (device.memory_stats(); the host's free
memory on a CPU device).  It only ever runs on idle chips: the scheduled
canary never opens a held one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

NAME = "memory"
SLICE = 1024  # words the host checks itself
_MUL, _MIX = 0x9E3779B1, 0x85EBCA6B


def pattern(index: np.ndarray, seed: int) -> np.ndarray:
    """The hash of each word's index (numpy, uint32): what the chip must hold."""
    x = (index.astype(np.uint32) * np.uint32(_MUL) + np.uint32(seed)).astype(np.uint32)
    x ^= x >> np.uint32(16)
    x = (x * np.uint32(_MIX)).astype(np.uint32)
    return x ^ (x >> np.uint32(13))


def programs(jax: Any, words: int, seed: int, kind: str | None
             ) -> tuple[Callable[[], Any], Callable[..., Any], Callable[..., Any]]:
    """(write, rest, check): write the pattern; what happens to it at rest (the memory fault); check it,
    answering (bad words, the first bad index or -1, the host-checked slice)."""
    jnp = jax.numpy

    def make() -> Any:
        i = jnp.arange(words, dtype=jnp.uint32)
        x = i * jnp.uint32(_MUL) + jnp.uint32(seed)
        x = x ^ (x >> 16)
        x = x * jnp.uint32(_MIX)
        return x ^ (x >> 13)

    def rest(fires: Any, knob: dict[str, Any], buffer: Any) -> Any:
        if kind != "memory":
            return buffer
        at = (knob["index"] * words).astype(jnp.int32)
        flip = jnp.left_shift(jnp.uint32(1), knob["flip"].astype(jnp.uint32))
        return jnp.where(fires, buffer.at[at].set(buffer[at] ^ flip), buffer)

    def check(buffer: Any) -> Any:
        bad = buffer != make()
        first = jnp.where(bad.any(), jnp.argmax(bad), -1)
        return bad.sum(), first, buffer[:SLICE]

    return make, rest, check


def words_for(device: Any, memory_bytes: int, share: float) -> int:
    """How many 4-byte words to keep at rest on ``device``: memory_bytes, at most ``share`` of its free memory."""
    stats = None
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - a backend without memory stats (CPU): use the host's free memory
        stats = None
    if stats and stats.get("bytes_limit"):
        free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    else:
        import os

        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(SLICE, int(min(memory_bytes, share * free)) // 4)


def judge(bad: int, first: int, head: np.ndarray, seed: int) -> dict[str, Any]:
    """The check's result: a failure names the bad words; the slice is checked against numpy's pattern."""
    expected = pattern(np.arange(len(head)), seed)
    host_bad = int((head != expected).sum())
    wrong = int(bad) + host_bad
    return {"finite": True, "max_abs_error": float(wrong), "error_ratio": float("inf") if wrong else 0.0,
            "fingerprint": f"{int(bad):08x}{(int(first) & 0xFFFFFFFF):08x}",
            "note": f"{int(bad)} word(s) changed at rest, first at word {int(first)}" if wrong else None}
