"""What the kernel log's follower read, waiting for the next sampling cycle to take it.

The follower (a thread of its own) never writes into the store: it puts what
it read here, and the collector's ``collect()``, inside the cycle, takes it
all at once and turns it into samples and recent events.  Every occurrence is
tallied by its counter's labels, so the counts stay exact whatever comes
between two cycles (the tallies are as many as the counters' series); the
events themselves (the first of a storm, its summary, every event outside
one) wait in a queue of at most ``MAX_PENDING_EVENTS``, the newest kept: an
event pushed out before a cycle took it is still counted, but neither logged
nor listed among the recent events, and is counted in ``dropped``.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from tpuwatch.kernel_log.events import KernelEvent

MAX_PENDING_EVENTS = 256  # events waiting for the next cycle; past it the oldest is dropped (and counted)

EventKey = tuple[str, str, str, str]  # rule, severity, device ("" unattributed), MIG instance ("" none)
ActionKey = tuple[str, str]  # device, recovery action (Xid 154 lines)


@dataclass
class Taken:
    """What accumulated since the last ``take()``: occurrences by labels, the events in order, the events
    dropped."""

    counts: Counter[EventKey] = field(default_factory=Counter)
    actions: Counter[ActionKey] = field(default_factory=Counter)
    events: list[KernelEvent] = field(default_factory=list)
    dropped: int = 0


class Handoff:
    """The bounded meeting place of the follower (``put``) and the cycle (``take``); see the module docstring."""

    def __init__(self, capacity: int = MAX_PENDING_EVENTS) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[EventKey] = Counter()
        self._actions: Counter[ActionKey] = Counter()
        self._events: deque[KernelEvent] = deque(maxlen=capacity)
        self._dropped = 0

    def put(self, occurred: Iterable[KernelEvent], events: Iterable[KernelEvent]) -> None:
        """Tally every event that ``occurred`` (each one occurrence) and queue ``events`` (storm aggregation's
        output) for the cycle."""
        with self._lock:
            for event in occurred:
                device = event.device or ""
                self._counts[(event.rule, event.severity, device, event.fields.get("gpu_instance", ""))] += 1
                if "recovery_action" in event.fields:
                    self._actions[(device, event.fields["recovery_action"])] += 1
            for event in events:
                if len(self._events) == self._events.maxlen:
                    self._dropped += 1
                self._events.append(event)

    def take(self) -> Taken:
        """Everything put since the last call, leaving the handoff empty."""
        with self._lock:
            taken = Taken(self._counts, self._actions, list(self._events), self._dropped)
            self._counts, self._actions, self._dropped = Counter(), Counter(), 0
            self._events.clear()
        return taken
