"""How quantities are shown to people (status page, top, check): one place, so that all say the same.

Every quantity carries its unit ("11.1/16.0 GiB", "77%", "61.5 °C", "145 W", "12m 5s", "450ms"), and an absent one
is "-", never 0.  Durations are written as the config takes them (no space: "200ms", "45s"), other units after a
space.
"""

from __future__ import annotations

import math
import time
from typing import Any

GIB = float(1 << 30)
MIB = float(1 << 20)


def number(value: float | None, digits: int = 1) -> str:
    """A plain number (a count) with ``digits`` decimals, "-" when absent."""
    return "-" if value is None else f"{value:.{digits}f}"


def gib(value: float | None, digits: int = 1) -> str:
    """Bytes as GiB: "11.1 GiB"; "-" when absent."""
    return "-" if value is None else f"{value / GIB:.{digits}f} GiB"


def gib_of(used: float | None, total: float | None) -> str:
    """Bytes in use of a total: "11.1/16.0 GiB", "-/16.0 GiB" when only the total is known; "-" when neither is."""
    if used is None and total is None:
        return "-"
    return "/".join("-" if v is None else f"{v / GIB:.1f}" for v in (used, total)) + " GiB"


def percent(ratio: float | None) -> str:
    """A ratio as a whole percentage: "77%"; "-" when absent."""
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def celsius(value: float | None, digits: int = 1) -> str:
    """A temperature with at most ``digits`` decimals, none when they are zero: "96 °C", "84.6 °C"; "-" when absent.

    Not rounded to whole degrees: 84.6 °C is under the 85 °C limit, and reads so."""
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + " °C"


def watts(value: float | None) -> str:
    """Power in whole watts: "145 W"; "-" when absent."""
    return "-" if value is None else f"{value:.0f} W"


def ecc(corrected: float | None, uncorrected: float | None) -> str:
    """ECC error counts, corrected/uncorrected: "3/0"; "-" when neither is known."""
    if corrected is None and uncorrected is None:
        return "-"
    return f"{number(corrected, 0)}/{number(uncorrected, 0)}"


def reading_texts(reading: dict[str, Any]) -> dict[str, str]:
    """A chip's reading (the status document's ``reading``) as the chip tables show it, by column: memory,
    utilization, temperature, power and ECC."""
    return {"memory": gib_of(reading["memory_used_bytes"], reading["memory_total_bytes"]),
            "utilization": percent(reading["utilization_ratio"]),
            "temperature": celsius(reading["temperature_celsius"]),
            "power": watts(reading["power_watts"]),
            "ecc": ecc(reading["ecc_corrected_total"], reading["ecc_uncorrected_total"])}


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


def latency(seconds: float | None) -> str:
    """How long one run took, finer than ``duration``: "0.4ms", "450ms", "1.23s"; "-" when absent."""
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:.1f}ms" if ms < 9.95 else f"{ms:.0f}ms" if ms < 999.5 else f"{seconds:.2f}s"


def clock(timestamp: float | None) -> str:
    """Local wall-clock time of a Unix timestamp, "HH:MM:SS"; "-" when absent."""
    return "-" if timestamp is None else time.strftime("%H:%M:%S", time.localtime(timestamp))


def growth(bytes_per_second: float | None) -> str:
    """A memory growth rate as MiB per hour: "+120 MiB/h"."""
    return "-" if bytes_per_second is None else f"{bytes_per_second * 3600 / MIB:+.0f} MiB/h"


def from_now(when: float, now: float) -> str:
    """``in 13h 20m``, ``in 4m``, ``in under a minute``; ``started 2h 5m ago`` once past."""
    seconds = when - now
    if not math.isfinite(seconds):
        return "-"
    minutes = math.floor(abs(seconds) / 60)
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    words = " ".join(f"{n}{u}" for n, u in ((days, "d"), (hours, "h"), (mins, "m")) if n) or "under a minute"
    return f"in {words}" if seconds >= 0 else f"started {words} ago"


# How a canary verdict was measured (the ``path`` label), in words.
PATH_WORDS = {"scheduled": "the scheduled canary", "job": "a job's probe"}
