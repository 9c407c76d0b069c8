"""Which chip each of the job's local JAX devices is, as the daemon names chips (pure; no jax import).

The daemon names chips by their index on the host (``/dev/accelN``,
``/dev/nvidiaN``).  A job sees them through the environment that chose them:
``TPU_VISIBLE_CHIPS`` on TPU, ``CUDA_VISIBLE_DEVICES`` (or ROCm's
``HIP_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES``) on GPUs, as numbers.  When
no such list applies (all chips, or GPUs named by UUID, or a container that
renumbers them) the job's devices are named by their order, ``"ordinal"``, and
the daemon maps them onto the chips the process holds.  ``TPUWATCH_PROBE_CHIPS``
("2,3") overrides both.

On chips with two devices (TPU v2, v3, 7x: ``core_on_chip`` 0 and 1) the
probe runs on core 0 of each chip.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

OVERRIDE_ENV = "TPUWATCH_PROBE_CHIPS"
_VISIBLE = {"tpu": ("TPU_VISIBLE_CHIPS",), "gpu": ("CUDA_VISIBLE_DEVICES",), "cuda": ("CUDA_VISIBLE_DEVICES",),
            "rocm": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")}


def _numbers(text: str | None) -> list[str] | None:
    """"0,2" -> ["0", "2"]; None for anything that is not a list of chip numbers."""
    if not text:
        return None
    parts = [p.strip() for p in text.split(",")]
    return parts if all(p.isdigit() and len(p) <= 4 for p in parts) else None


def name_devices(devices: Sequence[Any], environ: Mapping[str, str]) -> tuple[list[tuple[str, Any]], str]:
    """(chip name, device) for one device per chip, in the job's order, and how they were named (env, ordinal)."""
    chosen = sorted((d for d in devices if getattr(d, "core_on_chip", 0) == 0), key=lambda d: d.id)
    platform = chosen[0].platform if chosen else ""
    listed = _numbers(environ.get(OVERRIDE_ENV))
    for var in () if listed else _VISIBLE.get(platform, ()):
        listed = _numbers(environ.get(var))
        if listed:
            break
    if listed is not None and len(listed) == len(chosen):
        return list(zip(listed, chosen)), "env"
    return [(str(i), d) for i, d in enumerate(chosen)], "ordinal"
