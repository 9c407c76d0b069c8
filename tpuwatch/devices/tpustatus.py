"""libtpu's runtime status (``GetTpuRuntimeStatus``), parsed: pure functions over the answer, no I/O.

The answer (tpu-info 0.14.2's ``proto/tpu_metric_service.proto`` and ``tpu_telemetry.proto``) maps each
global core id to a ``CurrentCoreStateSummary``: the core's identity (``core_id.chip_id``, its type and
index on the chip), one ``SequencerInfo`` per sequencer (``pc``, ``program_id``, ``run_id``, ...), the
programs queued for the core (``queued_program_info``) and an optional ``error_message``.  tpu-info reads
it the same way (cloud-accelerator-diagnostics ``tpu_info/metrics.py`` ``get_tpuz_info``: cores in key
order, chip from ``core_id.chip_id``, ``error_message`` only when the field is set).  The answer has no
state enum, and no public document says what its fields look like on a hung core (tpuwatch.devices.hang).

Chips are numbered as the metrics answers number them (tpuwatch.devices.runtime): by the rank of the
runtime's chip id among those the address answers.  TPU7x answers per device, two per chip, as its
metrics do (tpu-info's duty-cycle table shows ``device_id // devices_per_chip``): where every chip id of
such an answer holds a single TensorCore, ``per_device`` ids make one chip (unverified on hardware: should
its status name physical chips, each then holds both TensorCores and is taken as one chip).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuwatch.devices.progress import ChipStatus, Position
from tpuwatch.devices.runtime import MalformedMetric

MAX_CORES = 1024          # cores in one answer; more is not libtpu's shape
MAX_SEQUENCERS = 64       # sequencers per core
MAX_QUEUED = 1 << 16      # queued programs counted per core
MESSAGE_MAX = 300         # characters kept of an error message
TENSOR_CORE = 1           # TpuCoreTypeProto.TPU_CORE_TYPE_TENSOR_CORE

@dataclass(frozen=True)
class CoreStatus:
    """One core of the answer."""

    core: int                       # global core id (the map key)
    chip: int                       # core_id.chip_id (the key when the answer names no chip)
    tensor_core: bool
    positions: tuple[Position, ...]
    queued: int
    error: str | None


def parse_status(response: Any) -> list[CoreStatus]:
    """The cores of one GetTpuRuntimeStatusResponse, in core id order; MalformedMetric if it is not libtpu's."""
    states = response.core_states
    if len(states) > MAX_CORES:
        raise MalformedMetric(f"{len(states)} cores (at most {MAX_CORES} expected)")
    cores = []
    for key in sorted(states):
        summary = states[key]
        ident = summary.core_id
        chip = ident.chip_id if ident.HasField("chip_id") else key
        if key < 0 or chip < 0:
            raise MalformedMetric(f"core {key} on chip {chip}")
        if len(summary.sequencer_info) > MAX_SEQUENCERS:
            raise MalformedMetric(f"core {key} has {len(summary.sequencer_info)} sequencers")
        positions = tuple((key, s.sequencer_type, s.sequencer_index, s.pc, s.program_id, s.run_id)
                          for s in summary.sequencer_info)
        error = summary.error_message if summary.HasField("error_message") else None
        cores.append(CoreStatus(key, chip, ident.core_on_chip.type in (0, TENSOR_CORE), positions,
                                min(len(summary.queued_program_info), MAX_QUEUED), _one_line(error)))
    return cores


def _one_line(message: str | None) -> str | None:
    if message is None or not message.strip():
        return None
    text = " ".join(message.split())
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX - 3] + "..."


def fold_status(cores: list[CoreStatus], per_device: int = 1) -> dict[int, ChipStatus]:
    """Chip slot (0, 1, ... by rank of chip id) -> the status of its cores; ``per_device`` chip ids per chip
    where the runtime answers per device (TPU7x) and each id holds one TensorCore."""
    ids = sorted({c.chip for c in cores})
    tensor_cores: dict[int, int] = {}
    for core in cores:
        tensor_cores[core.chip] = tensor_cores.get(core.chip, 0) + core.tensor_core
    per = per_device if per_device > 1 and all(n <= 1 for n in tensor_cores.values()) else 1
    slot_of = {chip: rank // per for rank, chip in enumerate(ids)}
    grouped: dict[int, list[CoreStatus]] = {}
    for core in cores:
        grouped.setdefault(slot_of[core.chip], []).append(core)
    return {slot: ChipStatus(tuple(p for c in found for p in c.positions), sum(c.queued for c in found),
                             tuple((c.core, c.error) for c in found if c.error))
            for slot, found in sorted(grouped.items())}

