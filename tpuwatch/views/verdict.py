"""A chip's verdict (ok, warning, critical) and its reasons, from judgements made elsewhere, never new ones.

* ``tpuwatch check``'s problems for the chip (tpuwatch.health.device_problems, and the critical kernel events
  of tpuwatch.kernel_log.collector.event_problems): critical, as they make ``check`` exit 1;
* the chip's firing alerts, at their rule's severity; pending ones are listed but change nothing yet;
* the canary's latest verdict on the chip: a wrong result is critical; an unconfirmed deviation (suspect), a
  slow chip and a run that errored are warnings;
* the leak detector's finding on the chip's memory, at its severity (critical near exhaustion).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from tpuwatch.analysis.leak import LeakState
from tpuwatch.canary.judge import DeviceOutcome
from tpuwatch.devices.base import DeviceReading
from tpuwatch.health import device_problems
from tpuwatch.kernel_log.collector import event_problems
from tpuwatch.kernel_log.events import KernelEvent
from tpuwatch.units import duration, growth

LEVELS = ("ok", "warning", "critical")
_ORDER = {"critical": 0, "warning": 1, "pending": 2}
# device_problems names the chip first ("device 1 (v5e, pci 0000:11:00.0): ..."); a chip's own row need not.
_WHERE = re.compile(r"^device \S+ \([^)]*\):? ")


def _reason(severity: str, source: str, text: str) -> dict[str, str]:
    return {"severity": severity, "source": source, "text": text}


def chip_verdict(reading: DeviceReading, alerts: Iterable[dict[str, Any]], events: Iterable[KernelEvent],
                 canary: DeviceOutcome | None, leak: LeakState | None) -> dict[str, Any]:
    """``{"status": "ok"|"warning"|"critical", "reasons": [{"severity", "source", "text"}]}``, worst first.

    ``alerts`` and ``events`` may hold other chips' too: only this chip's count.
    """
    reasons = [_reason("critical", "check", _WHERE.sub("", problem)) for problem in device_problems([reading])]
    reasons += [_reason("critical", "kernel", problem)
                for problem in event_problems(e for e in events if e.device == reading.device)]
    for alert in alerts:
        labels = alert.get("labels", {})
        if labels.get("device") != reading.device:
            continue
        name, summary = labels.get("alertname", "?"), alert.get("annotations", {}).get("summary", "")
        if alert.get("state") == "firing":
            severity = "critical" if labels.get("severity") == "critical" else "warning"
            reasons.append(_reason(severity, "alert", f"{name}: {summary}" if summary else name))
        else:
            reasons.append(_reason("pending", "alert", f"{name} pending: {summary}" if summary else f"{name} pending"))
    if canary is not None and canary.status == "fail":
        reasons.append(_reason("critical", "canary", f"canary: wrong result ({canary.reason or canary.check})"))
    elif canary is not None and canary.status == "suspect":
        reasons.append(_reason("warning", "canary", f"canary: deviated once, its re-runs did not confirm it "
                                                    f"({canary.reason or canary.check})"))
    elif canary is not None and canary.status == "slow":
        reasons.append(_reason("warning", "canary", f"canary: right but slow ({canary.reason})"))
    elif canary is not None and canary.status == "error":
        reasons.append(_reason("warning", "canary", f"canary: run failed ({canary.reason or 'no reason given'})"))
    if leak is not None and leak.firing:
        eta = f", full in {duration(leak.eta)}" if leak.eta is not None else ""
        reasons.append(_reason("critical" if leak.severity == "critical" else "warning", "leak",
                               f"memory leak suspected: {growth(leak.slope)}{eta}"))
    reasons.sort(key=lambda r: _ORDER[r["severity"]])
    return {"status": worst(r["severity"] for r in reasons), "reasons": reasons}


def worst(severities: Iterable[str]) -> str:
    """The worst of verdict levels or reason severities ("pending" counts as ok)."""
    found = set(severities)
    return next((level for level in reversed(LEVELS) if level in found), "ok")
