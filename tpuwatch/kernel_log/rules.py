"""Kernel log rules: YAML files of named regexes, loaded with clear errors, matched with a keyword prefilter.

A rule file is ``rules: [...]`` where each rule has:

- ``name`` (the ``rule`` label), ``regex`` (Python syntax, searched in the message),
- ``keywords``: literal strings, one of which every matching line contains; a
  line with none of them is never tried against the regex (the prefilter that
  keeps scanning fast).  Without keywords the regex itself scans every line.
- ``severity`` (critical, warning, info) and optionally ``severity_by``:
  ``{field: GROUP, critical: [...], warning: [...], info: [...]}`` picks the
  severity from the value of a named group (how Xids are classed by code),
- ``enabled`` (default true).

Named groups are the extracted fields; ``pci`` is normalised to
``dddd:bb:dd.f`` and ``xid`` is an integer.  Rules load from the shipped
directory first, then from user paths; a user rule with a shipped rule's name
replaces it (or removes it with ``enabled: false``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuwatch import yamlfile
from tpuwatch.kernel_log.records import Record, normalise_pci
from tpuwatch.schema import ConfigError

SHIPPED_DIR = Path(__file__).parent / "rules"
SEVERITIES = ("critical", "warning", "info")
_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")
_RULE_KEYS = {"name", "regex", "keywords", "severity", "severity_by", "enabled", "description"}


class RuleError(ConfigError):
    """A rule file that cannot be used; ``str()`` names the file, the rule and the reason."""

    def __init__(self, source: str, rule: str | None, reason: str) -> None:
        super().__init__(f"{source}: rule {rule!r}" if rule else source, reason)


@dataclass(frozen=True)
class Match:
    """What one rule found in one message."""

    rule: str
    severity: str
    pci: str | None
    xid: int | None
    fields: dict[str, str]


@dataclass(frozen=True)
class Rule:
    """One compiled rule."""

    name: str
    regex: re.Pattern[str]
    severity: str
    keywords: tuple[str, ...] = ()
    severity_field: str | None = None
    severity_by: dict[str, str] = field(default_factory=dict)

    def severities(self) -> list[str]:
        """Every severity this rule can give, in SEVERITIES order."""
        possible = {self.severity, *self.severity_by.values()}
        return [s for s in SEVERITIES if s in possible]

    def match(self, message: str) -> Match | None:
        """The rule's verdict on one message, or None."""
        found = self.regex.search(message)
        if found is None:
            return None
        fields = {k: v for k, v in found.groupdict().items() if v is not None}
        severity = self.severity
        if self.severity_field is not None and self.severity_field in fields:
            severity = self.severity_by.get(fields[self.severity_field], severity)
        pci = normalise_pci(fields.pop("pci")) if "pci" in fields else None
        xid = int(fields.pop("xid")) if fields.get("xid", "").isdigit() else None
        return Match(self.name, severity, pci, xid, fields)


class RuleSet:
    """Rules ready to match single messages or to find candidate lines in a block of text."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = list(rules)
        self._keywords = sorted({k for rule in self.rules for k in rule.keywords})
        self._unkeyed = [rule for rule in self.rules if not rule.keywords]

    def match(self, message: str) -> list[Match]:
        """Every rule's match on ``message``, in rule order; a rule is tried only if a keyword is present."""
        found = []
        for rule in self.rules:
            if rule.keywords and not any(k in message for k in rule.keywords):
                continue
            match = rule.match(message)
            if match is not None:
                found.append(match)
        return found

    def hits(self, text: str) -> list[int]:
        """Sorted offsets in ``text`` where a line may match: keyword finds and unkeyed regex hits."""
        found: list[int] = []
        for keyword in self._keywords:
            at = text.find(keyword)
            while at >= 0:
                found.append(at)
                at = text.find(keyword, at + 1)
        for rule in self._unkeyed:
            found.extend(m.start() for m in rule.regex.finditer(text))
        found.sort()
        return found

    def stream(self) -> StreamMatcher:
        """A matcher for one stream of records in order (one log source, one scanned file)."""
        return StreamMatcher(self)


class StreamMatcher:
    """Matches the records of one stream in order; may keep a little state between records.

    ``feed(record)`` gives the matches the record completes.  One stream, one
    matcher: records of different sources must not share one.
    """

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules

    def feed(self, record: Record) -> list[Match]:
        """The matches for the next record of the stream."""
        return self.rules.match(record.message)


def load_rules(paths: list[str], required: list[str] | None = None) -> RuleSet:
    """The shipped rules, then every *.yaml/*.yml in each path (a file or a directory), in order.

    A missing path in ``paths`` is skipped (a rules directory nobody made); one in
    ``required`` (given on the command line) is an error.  Raises RuleError on any problem.
    """
    rules: dict[str, Rule | None] = {}
    for file in sorted(SHIPPED_DIR.glob("*.yaml")):
        _add(rules, parse_rule_file(_read(file), str(file)), str(file), shipped=True)
    must_exist = set(required or [])
    for path in map(Path, [*paths, *(required or [])]):
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        elif path.exists() or str(path) in must_exist:
            files = [path]
        else:
            continue
        for file in files:
            _add(rules, parse_rule_file(_read(file), str(file)), str(file), shipped=False)
    return RuleSet([r for r in rules.values() if r is not None])


def _add(rules: dict[str, Rule | None], parsed: list[Rule | str], source: str, shipped: bool) -> None:
    for item in parsed:
        name = item if isinstance(item, str) else item.name
        if shipped and name in rules:
            raise RuleError(source, name, "duplicate of a shipped rule")
        rules[name] = None if isinstance(item, str) else item


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(str(path), None, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None


def parse_rule_file(text: str, source: str) -> list[Rule | str]:
    """Rules in one YAML file; a disabled rule comes back as its bare name."""
    try:
        data = yamlfile.load(text, source)
    except ConfigError as exc:
        raise RuleError(exc.path, None, exc.reason) from None
    if not isinstance(data, dict) or set(data) != {"rules"} or not isinstance(data["rules"], list):
        raise RuleError(source, None, "expected a mapping with one key, rules: a list of rules")
    out: list[Rule | str] = []
    names: set[str] = set()
    for index, item in enumerate(data["rules"]):
        rule = _parse_rule(item, source, index)
        name = rule if isinstance(rule, str) else rule.name
        if name in names:
            raise RuleError(source, name, "defined twice in this file")
        names.add(name)
        out.append(rule)
    return out


def _parse_rule(item: Any, source: str, index: int) -> Rule | str:
    if not isinstance(item, dict):
        raise RuleError(source, f"#{index + 1}", "a rule must be a mapping")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise RuleError(source, f"#{index + 1}", "name must be lower_case letters, digits and _")
    unknown = sorted(set(item) - _RULE_KEYS)
    if unknown:
        raise RuleError(source, name, f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_RULE_KEYS))})")
    if item.get("enabled", True) is False:
        return name
    if not isinstance(item.get("enabled", True), bool):
        raise RuleError(source, name, "enabled must be true or false")
    pattern = item.get("regex")
    if not isinstance(pattern, str) or not pattern:
        raise RuleError(source, name, "regex is required (a string)")
    try:
        regex = re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:  # a{99999999999}, thousands of nested groups
        raise RuleError(source, name, f"invalid regex: {exc}") from None
    severity = item.get("severity", "warning")
    if severity not in SEVERITIES:
        raise RuleError(source, name, f"severity must be one of {', '.join(SEVERITIES)}, not {severity!r}")
    keywords = item.get("keywords", [])
    if not isinstance(keywords, list) or not all(isinstance(k, str) and k for k in keywords):
        raise RuleError(source, name, "keywords must be a list of non-empty strings")
    severity_field, severity_by = _parse_severity_by(item.get("severity_by"), regex, source, name)
    return Rule(name, regex, severity, tuple(keywords), severity_field, severity_by)


def _parse_severity_by(value: Any, regex: re.Pattern[str], source: str,
                       name: str) -> tuple[str | None, dict[str, str]]:
    if value is None:
        return None, {}
    if not isinstance(value, dict) or not isinstance(value.get("field"), str):
        raise RuleError(source, name, "severity_by must be a mapping with field: GROUP and severity lists")
    group = value["field"]
    if group not in regex.groupindex:
        raise RuleError(source, name, f"severity_by.field {group!r} is not a named group of the regex")
    mapping: dict[str, str] = {}
    for severity, values in value.items():
        if severity == "field":
            continue
        if severity not in SEVERITIES or not isinstance(values, list):
            raise RuleError(source, name, f"severity_by: {severity!r} is not a severity with a list of values")
        for v in values:
            if str(v) in mapping:
                raise RuleError(source, name, f"severity_by: value {v!r} listed twice")
            mapping[str(v)] = severity
    return group, mapping
