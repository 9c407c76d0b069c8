"""Kernel events and storm aggregation: repeats of one rule on one device inside a window become one event."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tpuwatch.hw.recovery import XID_RECOVERY_ACTION, action_name, xid154_action
from tpuwatch.kernel_log.attribution import Attribution, as_attribution
from tpuwatch.kernel_log.records import Record
from tpuwatch.kernel_log.rule import Match

MAX_STORM_KEYS = 1024


@dataclass(frozen=True)
class KernelEvent:
    """A hardware or host error seen in the kernel log, attributed to a device where possible.

    ``count`` is how many occurrences this event stands for (more than 1 for a
    storm summary); ``line`` is the 1-based line for logscan, else None.
    """

    rule: str
    severity: str
    message: str
    pci: str | None = None
    device: str | None = None
    xid: int | None = None
    fields: dict[str, str] = field(default_factory=dict)
    line: int | None = None
    count: int = 1
    time: float | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """What storm aggregation groups by: the rule, the device (else the PCI address) and the severity, so that
        a worse event never folds into a storm of milder ones (a GPU's Xid 79 amid its Xid 13s)."""
        return self.rule, self.device or self.pci or "", self.severity

    def to_json(self) -> dict[str, Any]:
        """The kernel event object of ``logscan --json`` (docs/kernel_log.md), plus extracted fields and the count."""
        out: dict[str, Any] = {"line": self.line, "rule": self.rule, "severity": self.severity, "pci": self.pci,
                               "device": self.device}
        if self.xid is not None:
            out["xid"] = self.xid
        out["message"] = self.message
        if self.fields:
            out["fields"] = self.fields
        if self.count != 1:
            out["count"] = self.count
        if self.time is not None:
            out["time"] = self.time
        return out


def make_event(match: Match, record: Record, device_for_pci: Attribution | Callable[[str], str | int | None],
               line: int | None = None, when: float | None = None) -> KernelEvent:
    """The event for a rule match on ``record`` (or on the record the match carries: a joined or waiting one).

    The PCI address is the rule's own field first, else the device the kernel
    tagged the record with, else the message's ``driver device:`` prefix (both
    through sysfs when ``device_for_pci`` is an Attribution with a resolver);
    the chip is ``device_for_pci(pci)``.
    """
    source = match.record or record
    attribution = as_attribution(device_for_pci)
    pci = match.pci or attribution.pci_of(source)
    return KernelEvent(match.rule, match.severity, source.message, pci, attribution(pci) if pci else None,
                       match.xid, nvidia_fields(match, source.message), line, 1, when)


def nvidia_fields(match: Match, message: str) -> dict[str, str]:
    """The match's fields, with an Xid line's MIG instance as a number ("05" -> "5") and an Xid 154 line's
    recovery action in the words of ``tpuwatch_device_recovery_action`` (``recovery_action``)."""
    fields = match.fields
    if "gpu_instance" in fields:
        fields = {**fields, "gpu_instance": str(int(fields["gpu_instance"]))}
    if XID_RECOVERY_ACTION in (match.xid, int(fields.get("followup", 0))):
        action = xid154_action(message)
        if action is not None:
            fields = {**fields, "recovery_action": action_name(action)}
    return fields


@dataclass
class _Window:
    started: float
    repeats: int = 0
    last: KernelEvent | None = None


class StormFilter:
    """Passes the first event of a (rule, device, severity) at once and folds repeats inside ``window`` seconds.

    When a window with repeats ends, one summary event carries their count.
    At most ``max_keys`` windows are open; beyond that the oldest is closed
    early, so memory stays bounded whatever the log holds.
    """

    def __init__(self, window: float, max_keys: int = MAX_STORM_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self._max_keys = max_keys
        self._clock = clock
        self._open: dict[tuple[str, str, str], _Window] = {}

    def offer(self, event: KernelEvent) -> list[KernelEvent]:
        """The events to hand on now for ``event``: itself, nothing (folded), or a closed summary first."""
        now = self._clock()
        key = event.key
        current = self._open.get(key)
        if current is not None and now - current.started < self._window:
            current.repeats += 1
            current.last = event
            return []
        out = []
        if current is not None:
            out.extend(self._close(key))
        elif len(self._open) >= self._max_keys:
            out.extend(self._close(next(iter(self._open))))
        self._open[key] = _Window(now)
        out.append(event)
        return out

    def flush(self, force: bool = False) -> list[KernelEvent]:
        """Summaries of the windows that have ended (all of them with ``force``)."""
        now = self._clock()
        ended = [k for k, w in self._open.items() if force or now - w.started >= self._window]
        return [summary for key in ended for summary in self._close(key)]

    def _close(self, key: tuple[str, str, str]) -> list[KernelEvent]:
        window = self._open.pop(key)
        if window.repeats == 0 or window.last is None:
            return []
        return [replace(window.last, count=window.repeats,
                        message=f"{window.last.message} (repeated {window.repeats} times)")]
