"""From tpuwatch's alerts to the node conditions on its Node: pure, tested on literal data.

A condition is True while a problem is present, as node-problem-detector's are.  It turns True as soon as
one of its alerts fires, and turns False only once none has fired for its hold time (``clear_after``), so
that a flapping fault does not flap the scheduler.  On start the book adopts what the Node already
carries: a True condition stays True (held as if its fault had just been seen) instead of being reset.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tpuwatch.config import Config
from tpuwatch.kubernetes.plugin import ConditionAlertConfig, KubernetesConfig, NodeConditionConfig
from tpuwatch.plugins import PLUGINS

MESSAGE_MAX = 1024
# A reason or message change with the status unchanged is patched at most this often (NPD's resync period).
RESYNC_S = 10.0


def _sources(*pairs: tuple[str, str] | tuple[str, str, str]) -> list[ConditionAlertConfig]:
    return [ConditionAlertConfig(alert=p[0], reason=p[1], severity=p[2] if len(p) > 2 else None)  # type: ignore[arg-type]
            for p in pairs]


# The one place that says which alert makes which condition.  An alert has one name whichever path raised it
# (tpuwatch's built-in rules, tpuwatch/alerting/rules/default.yaml, or the fleet's Prometheus rules,
# alerts/*.rules.yml; docs/alerting.md's table holds both to it).  Order is priority: the condition's reason is
# that of the first source that fires.
DEFAULT_CONDITIONS: list[NodeConditionConfig] = [
    NodeConditionConfig("AcceleratorHardwareProblem", _sources(
        ("AcceleratorLost", "ChipLost"),
        ("AcceleratorsMissing", "ChipsMissing"),
        ("AcceleratorEccUncorrectable", "EccUncorrectable"),
        ("KernelHardwareErrorCritical", "KernelHardwareError"),
        ("AcceleratorTemperatureHigh", "TemperatureCritical", "critical"))),
    NodeConditionConfig("AcceleratorComputeProblem", _sources(
        ("CanaryWrongResult", "CanaryWrongResult"), ("CanaryFleetOutlier", "CanaryFleetOutlier"))),
    NodeConditionConfig("AcceleratorMemoryProblem", _sources(
        ("AcceleratorMemoryExhaustionSoon", "MemoryExhaustionSoon"))),
    NodeConditionConfig("AcceleratorProgressProblem", _sources(("AcceleratorHung", "CoreHung"))),
]


def offered(config: Config) -> list[NodeConditionConfig]:
    """The conditions the registered plugins offer (``Condition``) and ``config`` turns on with their key."""
    return [NodeConditionConfig(c.type, _sources(*c.alerts)) for p in PLUGINS for c in p.conditions
            if getattr(config.sections[p.name], c.opt_in)]


def condition_table(section: KubernetesConfig,
                    plugins: Sequence[NodeConditionConfig] = ()) -> list[NodeConditionConfig]:
    """The conditions ``section`` asks for: its own list, or the default table; then those the plugins offer
    and the config turns on (``offered``), unless the list names them already."""
    table = section.conditions or DEFAULT_CONDITIONS
    return [*table, *(c for c in plugins if all(t.type != c.type for t in table))]


def healthy_reason(condition: str) -> str:
    """The reason of a False condition: ``AcceleratorHardwareProblem`` -> ``AcceleratorHardwareHealthy``."""
    return condition.removesuffix("Problem") + "Healthy" if condition.endswith("Problem") else "No" + condition


@dataclass(frozen=True)
class Fault:
    """One firing alert that raises a condition."""

    condition: str
    reason: str
    alertname: str
    fingerprint: str
    device: str
    pci: str | None
    value: float
    rank: int  # the source's place in the condition's list: lower wins the reason


def parse_time(text: str | None) -> float | None:
    """RFC 3339 (``2024-05-01T10:00:00Z``, with or without fractions) as Unix time; None if absent or bad."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def format_time(timestamp: float) -> str:
    """Unix time as metav1.Time: RFC 3339 in UTC, whole seconds."""
    return datetime.fromtimestamp(math.floor(timestamp), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def faults(alerts: Iterable[dict[str, Any]], pci_by_device: dict[str, str],
           table: list[NodeConditionConfig]) -> list[Fault]:
    """The firing alerts (as ``/api/alerts`` lists them) that raise a condition of ``table``."""
    out = []
    for alert in alerts:
        if alert.get("state") != "firing":
            continue
        labels = alert.get("labels") or {}
        for condition in table:
            for rank, source in enumerate(condition.sources):
                if source.alert == labels.get("alertname") and source.severity in (None, labels.get("severity")):
                    device = str(labels.get("device", ""))
                    out.append(Fault(condition.type, source.reason, source.alert, str(alert.get("fingerprint", "")),
                                     device, labels.get("pci") or pci_by_device.get(device),
                                     float(alert.get("value") or 0.0), rank))
                    break
    return out


def message(found: list[Fault]) -> str:
    """``EccUncorrectable on chip 3 (PCI 0000:13:00.0); ChipLost on chip 5 (PCI 0000:15:00.0)``, bounded."""
    by_reason: dict[str, list[str]] = {}
    for fault in sorted(found, key=lambda f: (f.rank, f.device)):
        where = f"chip {fault.device}" if fault.device else "the host"
        if fault.pci:
            where += f" (PCI {fault.pci})"
        places = by_reason.setdefault(fault.reason, [])
        if where not in places:
            places.append(where)
    parts = [f"{reason} on {', '.join(places)}" for reason, places in by_reason.items()]
    text = "; ".join(parts)
    if len(text) > MESSAGE_MAX:
        text = text[:MESSAGE_MAX - 20].rsplit(" ", 1)[0] + " ... (truncated)"
    return text


@dataclass
class ConditionState:
    """What tpuwatch holds one condition to be."""

    type: str
    status: bool = False
    reason: str = ""
    message: str = ""
    transition: float = 0.0
    last_fault: float | None = None
    devices: tuple[str, ...] = ()

    def to_api(self, heartbeat: float) -> dict[str, str]:
        """The NodeCondition object (core/v1) for a status patch."""
        return {"type": self.type, "status": "True" if self.status else "False", "reason": self.reason,
                "message": self.message, "lastTransitionTime": format_time(self.transition),
                "lastHeartbeatTime": format_time(heartbeat)}


class ConditionBook:
    """The conditions of one node: updated from each cycle's faults, adopted from the Node at start."""

    def __init__(self, table: list[NodeConditionConfig], clear_after: float, now: float) -> None:
        self.table = table
        self.clear_after = {c.type: c.clear_after if c.clear_after is not None else clear_after for c in table}
        self.states = {c.type: ConditionState(c.type, False, healthy_reason(c.type), _healthy_message(c), now)
                       for c in table}
        self._seen_fault = {c.type: False for c in table}

    def update(self, found: list[Fault], now: float, release: bool = False) -> list[str]:
        """Apply one cycle's faults; ``release`` clears a fault-free condition at once (an operator's ack).

        Returns the types whose status changed.
        """
        changed = []
        for condition in self.table:
            state = self.states[condition.type]
            mine = [f for f in found if f.condition == condition.type]
            if mine:
                self._seen_fault[condition.type] = True
                best = min(mine, key=lambda f: f.rank)
                if not state.status:
                    state.status, state.transition = True, now
                    changed.append(condition.type)
                state.reason, state.message, state.last_fault = best.reason, message(mine), now
                state.devices = tuple(sorted({f.device for f in mine if f.device}))
            elif state.status and (release or now - (state.last_fault or now) >= self.clear_after[condition.type]):
                state.status, state.transition = False, now
                state.reason, state.message, state.devices = healthy_reason(condition.type), _healthy_message(
                    condition), ()
                changed.append(condition.type)
        return changed

    def adopt(self, node_conditions: Iterable[dict[str, Any]], now: float) -> None:
        """Take over the conditions the Node already carries (after a restart) instead of resetting them."""
        on_node = {c.get("type"): c for c in node_conditions if isinstance(c, dict)}
        for condition in self.table:
            existing = on_node.get(condition.type)
            if existing is None:
                continue
            state = self.states[condition.type]
            node_true = existing.get("status") == "True"
            since = parse_time(existing.get("lastTransitionTime"))
            if node_true and not state.status and not self._seen_fault[condition.type]:
                state.status, state.last_fault = True, now  # held: it clears after clear_after if the fault is gone
                state.reason = str(existing.get("reason") or condition.sources[0].reason)
                state.message = str(existing.get("message") or "")
                state.transition = since if since is not None else now
            elif node_true == state.status and since is not None:
                state.transition = min(state.transition, since)

    def api_conditions(self, heartbeat: float) -> list[dict[str, str]]:
        """Every condition as a core/v1 NodeCondition."""
        return [self.states[c.type].to_api(heartbeat) for c in self.table]


def _healthy_message(condition: NodeConditionConfig) -> str:
    alerts = sorted({s.alert for s in condition.sources})
    return f"tpuwatch sees none of: {', '.join(alerts)}"[:MESSAGE_MAX]


class PatchGate:
    """When to patch the node's conditions: at once on a status change, a reason or message change at most
    every ``RESYNC_S``, and a heartbeat every ``heartbeat`` seconds otherwise."""

    def __init__(self, heartbeat: float) -> None:
        self.heartbeat = heartbeat
        self.written: dict[str, tuple[str, str, str, str]] | None = None
        self.written_at = -math.inf

    def due(self, book: ConditionBook, now: float) -> bool:
        """True if a patch should be sent now."""
        current = _fingerprint(book)
        if self.written is None:
            return True
        if any(current[t][0] != self.written.get(t, ("",))[0] for t in current):
            return True
        if current != self.written:
            return now - self.written_at >= RESYNC_S
        return now - self.written_at >= self.heartbeat

    def sent(self, book: ConditionBook, now: float) -> None:
        """Record a successful patch."""
        self.written, self.written_at = _fingerprint(book), now


def _fingerprint(book: ConditionBook) -> dict[str, tuple[str, str, str, str]]:
    return {t: ("True" if s.status else "False", s.reason, s.message, format_time(s.transition))
            for t, s in book.states.items()}
