"""How numbers are shown on the page and in ``tpuwatch top``: one place, so both say the same."""

from __future__ import annotations

import time

GIB = float(1 << 30)
MIB = float(1 << 20)


def gib(value: float | None, digits: int = 1) -> str:
    """Bytes as GiB, "-" when absent."""
    return "-" if value is None else f"{value / GIB:.{digits}f}"


def percent(ratio: float | None) -> str:
    """A ratio as a whole percentage, "-" when absent."""
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def number(value: float | None, digits: int = 1, unit: str = "") -> str:
    """A plain number with ``digits`` decimals and an optional unit, "-" when absent."""
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def duration(seconds: float | None) -> str:
    """A span as its two largest units: "200ms", "45s", "12m 5s", "3h 10m", "2d 4h"; "-" when absent."""
    if seconds is None:
        return "-"
    if 0 < seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    left = max(0, round(seconds))
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size}{unit}")
            left %= size
    return " ".join(parts[:2])


def clock(timestamp: float | None) -> str:
    """Local wall-clock time of a Unix timestamp, "HH:MM:SS"; "-" when absent."""
    return "-" if timestamp is None else time.strftime("%H:%M:%S", time.localtime(timestamp))


def growth(bytes_per_second: float | None) -> str:
    """A memory growth rate as MiB per hour."""
    return "-" if bytes_per_second is None else f"{bytes_per_second * 3600 / MIB:+.0f} MiB/h"
