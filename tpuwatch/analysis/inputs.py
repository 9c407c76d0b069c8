"""Recorded series for ``tpuwatch analyze``: parse CSV and Prometheus query_range JSON (pure, no I/O).

Every problem raises ``InputError`` with a one-line message naming where it is.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any

CSV_HEADER = ["timestamp", "value", "capacity"]


class InputError(ValueError):
    """Recorded data that cannot be analysed; ``str()`` is one line."""


@dataclass
class Series:
    """One series: its labels, strictly increasing unix times, values, and capacities where known."""

    labels: dict[str, str]
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    capacities: list[float | None] = field(default_factory=list)

    def append(self, timestamp: float, value: float, capacity: float | None, where: str) -> None:
        """Add a point; raise InputError unless the time is after the previous one and the value usable."""
        for name, number in (("timestamp", timestamp), ("value", value), ("capacity", capacity)):
            if number is not None and not math.isfinite(number):
                raise InputError(f"{where}: {name} is {number}, not a finite number")
        if value < 0:
            raise InputError(f"{where}: value {value:g} is negative")
        if capacity is not None and capacity <= 0:
            raise InputError(f"{where}: capacity {capacity:g} is not positive")
        if self.times and timestamp <= self.times[-1]:
            kind = "duplicate" if timestamp == self.times[-1] else "unsorted"
            raise InputError(f"{where}: {kind} timestamp {timestamp:g} (previous {self.times[-1]:g}); "
                             "timestamps must strictly increase")
        self.times.append(timestamp)
        self.values.append(value)
        self.capacities.append(capacity)


def _number(text: str, what: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{where}: {what} {text.strip()!r} is not a number") from None


def parse_csv(text: str, source: str) -> Series:
    """``timestamp,value[,capacity]`` rows (unix seconds, bytes); an optional header row of those names."""
    series = Series(labels={"source": source})
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        where = f"{source}: line {number}"
        cells = [cell.strip() for cell in row]
        if not cells or cells == [""]:
            continue
        if number == 1 and cells == CSV_HEADER[:len(cells)] and len(cells) >= 2:
            continue
        if len(cells) not in (2, 3):
            raise InputError(f"{where}: expected timestamp,value[,capacity], got {len(cells)} column(s)")
        capacity = _number(cells[2], "capacity", where) if len(cells) == 3 and cells[2] else None
        series.append(_number(cells[0], "timestamp", where), _number(cells[1], "value", where), capacity, where)
    if not series.times:
        raise InputError(f"{source}: no data rows (expected timestamp,value[,capacity])")
    return series


def parse_prometheus(text: str, source: str) -> list[Series]:
    """A Prometheus ``/api/v1/query_range`` response: one Series per result, labelled as Prometheus does."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    series = series_from_response(document, source)
    if not series:
        raise InputError(f"{source}: the query result holds no samples")
    return series


def series_from_response(document: Any, source: str) -> list[Series]:
    """Series of a decoded query_range response; raise InputError on an error status or a bad shape."""
    if not isinstance(document, dict) or "status" not in document:
        raise InputError(f"{source}: not a Prometheus API response (no \"status\")")
    if document["status"] != "success":
        raise InputError(f"{source}: Prometheus error: {document.get('errorType', 'error')}: "
                         f"{document.get('error', 'no message')}")
    data = document.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        kind = data.get("resultType") if isinstance(data, dict) else None
        raise InputError(f"{source}: expected a range query result (resultType matrix), got {kind or 'none'}")
    out = []
    for result in data["result"]:
        labels = result.get("metric") if isinstance(result, dict) else None
        points = result.get("values") if isinstance(result, dict) else None
        if not isinstance(labels, dict) or not isinstance(points, list):
            raise InputError(f"{source}: a result lacks \"metric\" or \"values\"")
        series = Series(labels={str(k): str(v) for k, v in labels.items()})
        name = _selector(series.labels)
        for index, point in enumerate(points):
            where = f"{source}: series {name} point {index + 1}"
            if not isinstance(point, list) or len(point) != 2:
                raise InputError(f"{where}: expected [time, \"value\"]")
            series.append(_number(str(point[0]), "time", where), _number(str(point[1]), "value", where), None,
                          where)
        if series.times:
            out.append(series)
    return out


def _selector(labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{labels.get('__name__', '')}{{{inner}}}"


def describe(labels: dict[str, str]) -> str:
    """Labels as a PromQL-style selector (``name{a="1"}``), or the CSV source."""
    return labels["source"] if set(labels) == {"source"} else _selector(labels)
