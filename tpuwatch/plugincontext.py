"""What a plugin's build is handed beside the config: the parts built before it that it may use."""

from __future__ import annotations

from dataclasses import dataclass

from tpuwatch.canary.collector import CanaryCollector
from tpuwatch.devices.inventory import Board
from tpuwatch.pods import PodLookup


@dataclass(frozen=True)
class Context:
    """The cycle's inventory board, the canary's book (None when neither it nor a plugin keeps one, and in
    one-shot commands), the pod lookup (None without the host source) and whether state may be saved."""

    inventory: Board
    canary: CanaryCollector | None = None
    pods: PodLookup | None = None
    persist: bool = True
