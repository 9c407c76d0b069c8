"""Recorded series for ``tpuwatch analyze``: CSV rows and Prometheus query_range JSON (pure, no I/O).

Points are produced one at a time, so a file of any length is replayed in
constant memory.  Every problem raises ``InputError`` with a one-line message
naming where it is.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

# A reading: unix time, value, capacity where known.
Point = tuple[float, float, float | None]

CSV_COLUMNS = "timestamp,value[,capacity]"


class InputError(ValueError):
    """Recorded data that cannot be analysed; ``str()`` is one line."""


class PointChecker:
    """Checks the points of one series in order: finite numbers, values not negative, times strictly rising."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = -math.inf  # the previous point's time

    def check(self, timestamp: float, value: float, capacity: float | None, where: str) -> Point:
        """The point if it is usable; InputError naming ``where`` if not."""
        if self.last < timestamp < math.inf and 0 <= value < math.inf and (
                capacity is None or 0 < capacity < math.inf):
            self.last = timestamp
            return timestamp, value, capacity
        for name, number in (("timestamp", timestamp), ("value", value), ("capacity", capacity)):
            if number is not None and not math.isfinite(number):
                raise InputError(f"{where}: {name} is {number}, not a finite number")
        if value < 0:
            raise InputError(f"{where}: value {value:g} is negative")
        if capacity is not None and capacity <= 0:
            raise InputError(f"{where}: capacity {capacity:g} is not positive")
        if timestamp <= self.last:
            kind = "duplicate" if timestamp == self.last else "unsorted"
            raise InputError(f"{where}: {kind} timestamp {timestamp:g} (previous {self.last:g}); "
                             "timestamps must strictly increase")
        self.last = timestamp
        return timestamp, value, capacity


def _number(text: str, what: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{where}: {what} {text.strip()!r} is not a number") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def csv_points(lines: Iterable[str], source: str) -> Iterator[Point]:
    """The points of ``timestamp,value[,capacity]`` rows (unix seconds, bytes), lazily.

    A first row whose cells are not numbers is a header, whatever its names
    (``timestamp,value``, ``time,bytes``, ...).  Blank lines are skipped.
    """
    checker = PointChecker()
    rows = 0
    inf = math.inf
    for number, line in enumerate(lines, start=1):
        cells = next(csv.reader([line])) if '"' in line else line.split(",")
        try:  # the common case, checked inline: everything else takes the slow path below
            timestamp, value = float(cells[0]), float(cells[1])
            capacity = float(cells[2]) if len(cells) == 3 and cells[2].strip() else None
        except (ValueError, IndexError):
            pass
        else:
            if len(cells) <= 3 and checker.last < timestamp < inf and 0 <= value < inf and (
                    capacity is None or 0 < capacity < inf):
                checker.last = timestamp
                rows += 1
                yield timestamp, value, capacity
                continue
        if len(cells) == 1 and not cells[0].strip():
            continue
        where = f"{source}: line {number}"
        if len(cells) not in (2, 3):
            raise InputError(f"{where}: expected {CSV_COLUMNS}, got {len(cells)} column(s)")
        if rows == 0 and not any(_is_number(cell) for cell in cells):
            rows = -1  # the header: the next row is the first data row
            continue
        rows = max(rows, 0) + 1
        capacity = _number(cells[2], "capacity", where) if len(cells) == 3 and cells[2].strip() else None
        yield checker.check(_number(cells[0], "timestamp", where), _number(cells[1], "value", where), capacity,
                            where)
    if rows <= 0:
        raise InputError(f"{source}: no data rows (expected {CSV_COLUMNS})")


def parse_prometheus(text: str, source: str) -> list[tuple[dict[str, str], Iterator[Point]]]:
    """A Prometheus ``/api/v1/query_range`` response: (labels, points) per result, labelled as Prometheus does."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except RecursionError:
        raise InputError(f"{source}: not a Prometheus API response (nested too deep)") from None
    series = results(document, source)
    if not series:
        raise InputError(f"{source}: the query result holds no samples")
    return series


def results(document: Any, source: str) -> list[tuple[dict[str, str], Iterator[Point]]]:
    """(labels, points) of each non-empty series of a decoded query_range response; InputError on an error
    status or a bad shape.  The points are checked as they are read."""
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
        if points:
            named = {str(k): str(v) for k, v in labels.items()}
            out.append((named, _matrix_points(points, f"{source}: series {_selector(named)}")))
    return out


def _matrix_points(points: list[Any], where: str) -> Iterator[Point]:
    checker = PointChecker()
    for index, point in enumerate(points, start=1):
        at = f"{where} point {index}"
        if not isinstance(point, list) or len(point) != 2:
            raise InputError(f"{at}: expected [time, \"value\"]")
        yield checker.check(_number(str(point[0]), "time", at), _number(str(point[1]), "value", at), None, at)


def _selector(labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{labels.get('__name__', '')}{{{inner}}}"


def describe(labels: dict[str, str]) -> str:
    """Labels as a PromQL-style selector (``name{a="1"}``), or the CSV source."""
    return labels["source"] if set(labels) == {"source"} else _selector(labels)
