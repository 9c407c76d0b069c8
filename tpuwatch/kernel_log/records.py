"""Pure parsing of one kernel log record: kmsg records, dmesg and syslog lines, journal JSON.

Nothing here does I/O.  A record of any supported format becomes a ``Record``:
the kernel's message text with timestamps and prefixes removed, plus the device
the kernel attached to it (kmsg ``DEVICE=``, journal ``_KERNEL_DEVICE``).
Every step is bounded: a message is cut at ``MAX_MESSAGE_CHARS``, header
numbers at 20 digits, and JSON that is too deep, holds a number Python refuses
or is not an object falls back to plain text; nothing raises on any input.
Text logs reach these parsers through the one record splitter (``blocks.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpuwatch.kernel_log.formats import (
    KMSG_HEAD_RE,
    MAX_LINE_BYTES,
    MAX_MESSAGE_CHARS,
    kmsg_message,
    line_message,
)

# Why a record was skipped (the ``reason`` label of tpuwatch_kernel_log_skipped_total).
SKIP_REASONS = ("not_text", "too_long", "malformed", "error", "backlog")

_PCI_RE = re.compile(
    r"(?:(?:0000)?(?P<domain>[0-9a-fA-F]{1,4}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<slot>[0-9a-fA-F]{2})(?:\.(?P<fn>[0-7]))?")

@dataclass(frozen=True, slots=True)
class Record:
    """One kernel message: its text, the device the kernel attributed it to, if any, and the number of the line it
    begins on in a text log (None elsewhere)."""

    message: str
    kernel_device: str | None = None
    line: int | None = None


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One /dev/kmsg record with its sequence number and timestamp (microseconds on the monotonic clock)."""

    seq: int
    priority: int
    record: Record
    usec: int = 0


def normalise_pci(text: str) -> str | None:
    """``dddd:bb:dd.f`` for a PCI address written as NVRM, AER or sysfs do; None if it is not one.

    ``PCI:0000:3b:00`` and ``0000:3b:00`` (NVIDIA's bus:device form) mean function 0;
    a missing domain means 0000.
    """
    match = _PCI_RE.fullmatch(text.removeprefix("PCI:").strip())
    if match is None:
        return None
    domain = int(match["domain"] or "0", 16)
    return f"{domain:04x}:{match['bus'].lower()}:{match['slot'].lower()}.{match['fn'] or '0'}"


def pci_of_kernel_device(value: str | None) -> str | None:
    """The PCI address in a kmsg ``DEVICE=``/journal ``_KERNEL_DEVICE`` value like ``+pci:0000:3b:00.0``."""
    if value is None or not value.startswith("+pci:"):
        return None
    return normalise_pci(value[len("+pci:"):])


def parse_kmsg(raw: str) -> KmsgRecord | None:
    """A raw /dev/kmsg record (header line plus `` KEY=VALUE`` continuation lines), or None if malformed."""
    head, _, rest = raw[:MAX_LINE_BYTES].partition("\n")
    match = KMSG_HEAD_RE.match(head)
    if match is None:
        return None
    return KmsgRecord(int(match[2]), int(match[1]) & 7, _kmsg_record(head, match, rest.split("\n")), int(match[3]))


def _kmsg_record(head: str, match: re.Match[str], continuation_lines: list[str], line: int | None = None) -> Record:
    """The record of a /dev/kmsg header line that ``KMSG_HEAD_RE`` matched (``match``) and its continuation lines."""
    return Record(*kmsg_message(head, match, continuation_lines), line)


def parse_line(line: str) -> Record:
    """The record in one line of dmesg text, syslog, raw kmsg or ``journalctl -o json`` output."""
    return Record(*line_message(line))


def parse_record(lines: list[str], line: int | None = None) -> Record:
    """The record of a head line and its continuation lines: a raw kmsg record's `` KEY=VALUE`` lines give its
    device; the indented lines of other formats are its message's later lines."""
    head = lines[0]
    kmsg = KMSG_HEAD_RE.match(head)
    if kmsg is not None:
        if sum(map(len, lines)) + len(lines) - 1 > MAX_LINE_BYTES:  # cut as parse_kmsg cuts a record
            lines = "\n".join(lines)[:MAX_LINE_BYTES].split("\n")
        return _kmsg_record(head, kmsg, lines[1:], line)
    record = parse_line(head)
    if len(lines) > 1:
        message = "\n".join([record.message, *(extra.strip() for extra in lines[1:])])
        return Record(message[:MAX_MESSAGE_CHARS * 2], record.kernel_device, line)
    return record if line is None else Record(record.message, record.kernel_device, line)
