"""One compiled kernel-log rule and what it finds in one message (see rulefile.py for the file format)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import lru_cache

from tpuwatch.kernel_log.records import Record, normalise_pci

# Messages name the same few devices over and over: normalise each address once.
normalise = lru_cache(maxsize=4096)(normalise_pci)

SEVERITIES = ("critical", "warning", "info")
RANK = {"critical": 2, "warning": 1, "info": 0}
# How a boot can end in a crash, most telling first: a panic a machine check caused is a machine check.
CRASH_KINDS = ("mce", "hardware_error", "panic", "oops")


@dataclass(slots=True)
class Match:
    """What one rule found in one message (a value: never changed once made, copied with ``replace``).

    ``record`` is the record the match stands for when it is not simply the
    one just fed (a message joined from several records, an event that waited
    for the lines after it); ``index`` is that record's position in its stream.
    """

    rule: str
    severity: str
    pci: str | None
    xid: int | None
    fields: dict[str, str]
    record: Record | None = None
    index: int | None = None


@dataclass(frozen=True)
class SeverityBy:
    """Severity from the value of one named group: listed values, or bits of a hex number."""

    field: str
    values: dict[str, str] = dataclass_field(default_factory=dict)
    bits: tuple[tuple[str, int], ...] = ()  # (severity, mask), in SEVERITIES order: all bits of mask set

    def decide(self, fields: dict[str, str]) -> str | None:
        """The severity this entry gives, or None when its field is absent or unlisted."""
        value = fields.get(self.field)
        if value is None:
            return None
        if self.bits:
            try:
                number = int(value, 16)
            except ValueError:
                return None
            return next((severity for severity, mask in self.bits if number & mask == mask), None)
        return self.values.get(value)


@dataclass(frozen=True)
class Follow:
    """Lines the kernel prints after a rule's line as part of the same fault (AER detail lines, a CPER block)."""

    regex: re.Pattern[str]
    keywords: tuple[str, ...] = ()
    within: int = 16
    alone: bool = False
    same_device: bool = True
    severity: str | None = None


@dataclass(frozen=True)
class CrashSign:
    """What a rule's match among a boot's last lines says of how the boot ended: a crash of ``kind`` (one of
    CRASH_KINDS) when the match is at least as severe as ``severity`` and, with ``field``, that named group's
    value starts with a match of ``pattern``."""

    kind: str
    severity: str = "info"
    field: str | None = None
    pattern: re.Pattern[str] | None = None

    def says(self, match: Match) -> bool:
        """True if ``match`` (of the rule this sign is of) shows the crash."""
        if RANK[match.severity] < RANK[self.severity]:
            return False
        if self.field is None or self.pattern is None:
            return True
        value = match.fields.get(self.field)
        return value is not None and self.pattern.match(value) is not None


@dataclass(frozen=True)
class Rule:
    """One compiled rule."""

    name: str
    regex: re.Pattern[str]
    severity: str
    keywords: tuple[str, ...] = ()
    severity_by: tuple[SeverityBy, ...] = ()
    lines: int = 1
    follow: Follow | None = None
    hold: int = 0
    superseded_by: tuple[str, ...] = ()
    crash: CrashSign | None = None

    def crash_kind(self, match: Match) -> str | None:
        """The crash kind this rule's ``match`` stands for in a boot's last lines, or None (``crash``)."""
        return self.crash.kind if self.crash is not None and self.crash.says(match) else None

    def severities(self) -> list[str]:
        """Every severity this rule can give, in SEVERITIES order."""
        possible = {self.severity, *(s for by in self.severity_by for s in (*by.values.values(), *dict(by.bits)))}
        if self.follow is not None and self.follow.severity:
            possible.add(self.follow.severity)
        return [s for s in SEVERITIES if s in possible]

    def match(self, message: str) -> Match | None:
        """The rule's verdict on one message, or None."""
        found = self.regex.search(message)
        return None if found is None else self.verdict(found, self.severity)

    def match_follow(self, message: str) -> Match | None:
        """The message as a follow-up line of this rule's fault, or None."""
        if self.follow is None:
            return None
        found = self.follow.regex.search(message)
        return None if found is None else self.verdict(found, self.follow.severity or self.severity)

    def verdict(self, found: re.Match[str], default: str) -> Match:
        """The match for a regex hit: severity from ``severity_by`` (first entry that decides), fields normalised."""
        fields = found.groupdict()
        if None in fields.values():
            fields = {k: v for k, v in fields.items() if v is not None}
        severity = default
        for by in self.severity_by:
            decided = by.decide(fields)
            if decided is not None:
                severity = decided
                break
        pci = _pci(fields) if fields else None
        xid = int(fields.pop("xid")) if fields.get("xid", "").isdigit() else None
        return Match(self.name, severity, pci, xid, fields)


def _pci(fields: dict[str, str]) -> str | None:
    """``pci`` normalised, else ``pci_id`` (a PCIe requester ID, bus<<8 | devfn) in domain ``pci_domain``."""
    domain = fields.pop("pci_domain", "0000")
    requester = fields.pop("pci_id", None)
    if "pci" in fields:
        return normalise(fields.pop("pci"))
    if requester is None:
        return None
    number = int(requester, 16)
    return normalise(f"{domain}:{number >> 8:02x}:{(number >> 3) & 0x1f:02x}.{number & 7}")
