"""The config's value syntaxes, read and written: durations (``10s``), sizes (``16GiB``), listen addresses
(``127.0.0.1:9847``); and how a value is quoted in a message (bounded, on one line)."""

from __future__ import annotations

import ipaddress
import math
import re
import reprlib
from typing import Any

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class _ShortRepr(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = 80
        self.maxlevel, self.maxlist, self.maxdict = 2, 4, 4

    def repr_int(self, x: int, level: int) -> str:
        return repr(x) if x.bit_length() <= 128 else f"<an integer of {x.bit_length()} bits>"


_SHORT = _ShortRepr()


def one_line(text: str) -> str:
    """``text`` with control characters (newlines too) written as escapes, so that it prints as one line."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def short(value: Any) -> str:
    """A bounded repr of ``value`` for messages: long strings and big or deep structures are cut with ``...``."""
    return _SHORT.repr(value)


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Parse ``500ms``, ``10s``, ``5m``, ``2h``, ``1d`` (or ``0``) into seconds.

    A number without a unit is refused, as Prometheus refuses it: ``10`` could mean
    seconds or milliseconds.  Only zero needs none.
    """
    match = _DURATION_RE.match(text)
    if not match:
        if re.fullmatch(r"\s*0+(?:\.0+)?\s*", text):
            return 0.0
        if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", text):
            raise ValueError(no_unit(text.strip()))
        raise ValueError(f"invalid duration {short(text)} (use a number and ms, s, m, h or d, like 10s)")
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not math.isfinite(seconds):
        raise ValueError(f"duration {short(text)} is too large")
    return seconds


_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([KMGTP])(i?)B?|B)?\s*")
_SIZE_POWERS = {"K": 1, "M": 2, "G": 3, "T": 4, "P": 5}


def parse_bytes(text: str) -> float:
    """Parse a size into bytes: a number, or one with a unit as people and Kubernetes write them (``16GiB`` and
    ``16Gi`` binary, ``17GB`` and ``17G`` decimal, ``512B``)."""
    match = _SIZE_RE.fullmatch(text)
    if not match:
        raise ValueError(f"invalid size {short(text)} (bytes, or with a unit like 16GiB, 16Gi or 17GB)")
    number, prefix, binary = float(match.group(1)), match.group(2), match.group(3)
    value = number * ((1024 if binary else 1000) ** _SIZE_POWERS[prefix] if prefix else 1)
    if not math.isfinite(value):
        raise ValueError(f"size {short(text)} is too large")
    return value


def no_unit(number: str) -> str:
    """The message for a duration written without a unit (``10``), the number cut to 20 characters."""
    shown = number if len(number) <= 20 else number[:20] + "..."
    return f"{shown} has no unit: write {shown}s (or ms, m, h, d); only 0 needs none"


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of ``seconds`` in the config's duration syntax."""
    for unit in ("d", "h", "m", "s"):
        size = _DURATION_UNITS[unit]
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    millis = seconds * 1000
    return f"{int(millis)}ms" if millis.is_integer() else f"{seconds}s"


def parse_listen_address(text: str) -> tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port`` / ``:port``; the host must be an IP or a name."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port_text):
        raise ValueError(f"invalid listen address {short(text)} (use host:port, like 127.0.0.1:9847)")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"port {port} out of range 1-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"invalid IPv6 address {short(host)} in listen address") from None
    elif host and not re.fullmatch(r"[A-Za-z0-9.-]+", host):
        raise ValueError(f"invalid host {short(host)} in listen address")
    return host, port
