"""A probe's report parsed and checked, pure: bytes in, a ``Report`` out or ``Refused`` with its reason.

Every field is checked for type, size and range (protocol.py); nothing of a
report is trusted further than that.  JSON nesting is bounded by the size
limit and by refusing anything deeper than a report needs.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from tpuwatch import probewire as protocol
from tpuwatch.canary import spec

_DEVICE = re.compile(r"^\d{1,4}$")
_FINGERPRINT = re.compile(r"^[0-9a-f]{16}$")
_TEXT_MAX = 256
_MAX_DEPTH = 4


class Refused(Exception):
    """A report refused: ``reason`` is one of protocol.REJECTIONS, ``detail`` says what was wrong."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Report:
    """A checked report: the start of a run (as the canary worker's start line) and one result per chip."""

    platform: str
    chip: str
    stack: str
    dtype: str
    scale: float
    named_by: str
    results: tuple[dict[str, Any], ...]
    drill: tuple[str, str] | None

    @property
    def devices(self) -> list[str]:
        """The chips the report names, in its order."""
        return [r["device"] for r in self.results]


def _malformed(detail: str) -> Refused:
    return Refused("malformed", detail)


def _depth(value: Any, level: int = 0) -> int:
    if level > _MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value or len(value) > _TEXT_MAX or not value.isprintable():
        raise _malformed(f"{key}: want a printable string of 1-{_TEXT_MAX} characters")
    return value


def _number(value: Any, key: str, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _malformed(f"{key}: want a finite number >= 0")
    return float(value)


def _result(item: Any, index: int) -> dict[str, Any]:
    where = f"results[{index}]"
    if not isinstance(item, dict):
        raise _malformed(f"{where}: want an object")
    device, fingerprint, finite = item.get("device"), item.get("fingerprint"), item.get("finite")
    if not isinstance(device, str) or not _DEVICE.match(device):
        raise _malformed(f"{where}.device: want a chip number")
    if not isinstance(fingerprint, str) or not _FINGERPRINT.match(fingerprint):
        raise _malformed(f"{where}.fingerprint: want 16 hex digits")
    if not isinstance(finite, bool):
        raise _malformed(f"{where}.finite: want true or false")
    error = _number(item.get("max_abs_error"), f"{where}.max_abs_error", optional=not finite)  # a NaN has none
    return {"device": device, "finite": finite, "max_abs_error": error, "fingerprint": fingerprint,
            "duration_seconds": None}


def parse(data: bytes) -> Report:
    """The report in ``data`` (one JSON line); Refused (oversized, malformed) otherwise."""
    if len(data) > protocol.MAX_REPORT_BYTES:
        raise Refused("oversized", f"{len(data)} bytes, over {protocol.MAX_REPORT_BYTES}")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise _malformed(f"not JSON: {str(exc)[:80]}") from None
    if not isinstance(doc, dict):
        raise _malformed("want a JSON object")
    if _depth(doc) > _MAX_DEPTH:
        raise _malformed(f"nested deeper than {_MAX_DEPTH}")
    if doc.get("version") != protocol.VERSION:
        raise _malformed(f"version: want {protocol.VERSION}")
    if doc.get("model") != spec.MODEL_VERSION:
        raise _malformed(f"model: want {spec.MODEL_VERSION} (this daemon's reference model)")
    if doc.get("dtype") != spec.DTYPE:
        raise _malformed(f"dtype: want {spec.DTYPE}")
    if doc.get("named_by") not in ("env", "ordinal"):
        raise _malformed("named_by: want env or ordinal")
    scale = _number(doc.get("scale"), "scale")
    assert scale is not None
    results = doc.get("results")
    if not isinstance(results, list) or not 0 < len(results) <= protocol.MAX_RESULTS:
        raise _malformed(f"results: want a list of 1-{protocol.MAX_RESULTS} objects")
    checked = tuple(_result(item, i) for i, item in enumerate(results))
    devices = [r["device"] for r in checked]
    if len(set(devices)) != len(devices):
        raise _malformed("results: a chip named twice")
    drill = doc.get("drill")
    if drill is not None:
        if (not isinstance(drill, dict) or drill.get("kind") not in spec.INJECTIONS
                or drill.get("device") not in devices):
            raise _malformed("drill: want null or {kind, device} naming a reported chip")
        drill = (drill["kind"], drill["device"])
    return Report(_text(doc, "platform"), _text(doc, "chip"), _text(doc, "stack"), spec.DTYPE, scale,
                  doc["named_by"], checked, drill)
