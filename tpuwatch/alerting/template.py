"""Annotation templates: fields filled from an alert, and optional parts that vanish when a field in them is empty.

Fields are ``{{ $labels.NAME }}``, ``{{ $value }}`` (optionally ``| number|percent|duration|bytes|fromnow``; a
label with a filter is read as a number, ``{{ $labels.start | fromnow }}`` reads ``in 13h 20m``), and two
that name where an alert is from whatever labels it has: ``{{ $chip }}``, ``chip 3 (0000:13:00.0)`` (``chip 3``
without a ``pci`` label, nothing without a ``device``), and ``{{ $process }}``, ``process 4101 (python3) in pod
ml/trainer-0`` (as much as its ``pid``, ``command``, ``namespace`` and ``pod`` labels say; nothing without a pid).
``[[ ... ]]`` marks an optional part, left out whole when a field directly in it is empty (a part nested in
it decides for itself), so ``Leak[[ on {{ $chip }}]][[ in pod {{ $labels.pod }}]]`` reads ``Leak on chip 0``
without a pod and ``Leak`` without either.  The text is then tidied: runs of blanks become one space, empty
parentheses go, no blank stays before ``,.;:)`` or after ``(``, and no separator ends or starts the text.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

from tpuwatch.units import from_now


def human_duration(seconds: float) -> str:
    """Like Prometheus's humanizeDuration: ``1d 2h 0m 5s`` from the largest unit down; under 1 s, NaN and Inf
    as they are (``0.25s``, ``nans``), negative as ``0s``."""
    if not math.isfinite(seconds) or seconds < 1:
        return f"{seconds:.3g}s" if not math.isfinite(seconds) or seconds > 0 else "0s"
    rest = round(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        count, rest = divmod(rest, size)
        if count or parts:
            parts.append(f"{count}{unit}")
    return " ".join([*parts, f"{rest}s"])


FILTERS: dict[str, Callable[[float], str]] = {
    "number": lambda v: f"{v:.4g}",
    "percent": lambda v: f"{v * 100:.1f}%",
    "duration": human_duration,
    "bytes": lambda v: f"{v / 2**30:.2f} GiB",
    "fromnow": lambda v: from_now(v, time.time()),  # a Unix time: "in 13h 20m", "started 5m ago"
}
KNOWN_FIELDS = "{{ $labels.NAME }}, {{ $value }}, {{ $chip }}, {{ $process }}"
_TOKEN_RE = re.compile(r"\[\[|\]\]|\{\{.*?\}\}|\{\{")
_FIELD_RE = re.compile(r"\{\{\s*\$(?:labels\.(?P<label>\w+)|(?P<name>value|chip|process))\s*"
                       r"(?:\|\s*(?P<filter>\w+)\s*)?\}\}")
_BLANKS_RE = re.compile(r"\s+")
_EMPTY_PARENS_RE = re.compile(r"\s*\(\s*\)")
_BLANK_BEFORE_RE = re.compile(r"\s+(?=[,.;:)])")
_BLANK_AFTER_RE = re.compile(r"(?<=\()\s+")
_SEPARATORS = " ,;:"


class TemplateError(ValueError):
    """A template that cannot be parsed; the message is one line."""


@dataclass(frozen=True)
class _Field:
    kind: str  # label, value, chip or process
    argument: str  # the label's name, or the value's filter
    filter: str | None = None  # a label's filter: its value read as a number

    def fill(self, labels: Mapping[str, str], value: float) -> str:
        if self.kind == "label":
            text = labels.get(self.argument, "")
            if self.filter is None or not text:
                return text
            try:
                return FILTERS[self.filter](float(text))
            except ValueError:
                return ""
        if self.kind == "value":
            return FILTERS[self.argument](value)
        return _PLACES[self.kind].render(labels, value)


_Part: TypeAlias = "str | _Field | tuple[_Part, ...]"  # a tuple: an optional part


class Template:
    """A parsed template; TemplateError for an unknown field or filter, or unbalanced ``[[ ]]``."""

    def __init__(self, text: str) -> None:
        stack: list[list[_Part]] = [[]]
        at = 0
        for match in _TOKEN_RE.finditer(text):
            stack[-1].append(text[at:match.start()])
            at = match.end()
            token = match.group()
            if token == "[[":
                stack.append([])
            elif token == "]]":
                if len(stack) == 1:
                    raise TemplateError("']]' without its '[['")
                part = tuple(stack.pop())
                stack[-1].append(part)
            else:
                stack[-1].append(_parse_field(token))
        if len(stack) > 1:
            raise TemplateError("'[[' without its ']]'")
        stack[0].append(text[at:])
        self._parts = tuple(stack[0])

    def render(self, labels: Mapping[str, str], value: float) -> str:
        """The text for an alert with these labels and value, tidied."""
        text, _ = _fill(self._parts, labels, value)
        text = _BLANK_AFTER_RE.sub("", _BLANK_BEFORE_RE.sub("", _EMPTY_PARENS_RE.sub("", _BLANKS_RE.sub(" ", text))))
        return text.strip(_SEPARATORS)


def _parse_field(token: str) -> _Field:
    match = _FIELD_RE.fullmatch(token)
    if match is None:
        raise TemplateError(f"unknown template field {token[:40]!r} (known: {KNOWN_FIELDS})")
    filter_ = match.group("filter") or "number"
    if filter_ not in FILTERS:
        raise TemplateError(f"unknown filter {filter_!r} (known: {', '.join(FILTERS)})")
    if match.group("label"):
        return _Field("label", match.group("label"), match.group("filter"))
    return _Field(match.group("name"), filter_)


def _fill(parts: tuple[_Part, ...], labels: Mapping[str, str], value: float) -> tuple[str, bool]:
    """The parts' text, and whether every field among them (not in a nested optional part) was filled."""
    out: list[str] = []
    whole = True
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, _Field):
            text = part.fill(labels, value)
            whole = whole and text != ""
            out.append(text)
        else:
            text, complete = _fill(part, labels, value)
            if complete:
                out.append(text)
    return "".join(out), whole


_PLACES = {"chip": Template("[[chip {{ $labels.device }}[[ ({{ $labels.pci }})]]]]"),
           "process": Template("[[process {{ $labels.pid }}[[ ({{ $labels.command }})]]"
                               "[[ in pod [[{{ $labels.namespace }}/]]{{ $labels.pod }}]]]]")}


def render(template: str, labels: Mapping[str, str], value: float) -> str:
    """Parse and render ``template`` in one go; TemplateError when it cannot be parsed."""
    return Template(template).render(labels, value)
