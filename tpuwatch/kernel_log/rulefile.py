"""Kernel log rule files: YAML files of named regexes, loaded into a ``RuleSet`` with clear errors.

A rule file is ``rules: [...]`` where each rule has:

- ``name`` (the ``rule`` label), ``regex`` (Python syntax, searched in the message),
- ``keywords``: literal strings, one of which every matching message contains; a
  message with none of them is never tried against the regex.  All keywords of
  all rules form one prefilter, and a hit dispatches to the rules whose keyword
  it is.  Without keywords the regex itself is tried on every message (slow).
- ``severity`` (critical, warning, info) and optionally ``severity_by``: one
  mapping or a list of them, tried in order, the first that decides wins:
  ``{field: GROUP, critical: [...], warning: [...], info: [...]}`` picks the
  severity from the value of a named group (how Xids are classed by code), and
  ``{field: GROUP, bits: {critical: [61, 57], warning: [61]}}`` reads the group
  as a hex number and gives the first severity whose listed bits are all set
  (how machine-check status words are read),
- ``lines`` (1-8, default 1): the message may be printed over up to this many
  consecutive records (one per line, as ``dmesg -r`` and syslog files write a
  multi-line message); the regex is then also tried on the record joined with
  the ones before it, and a match must end in the record (a lookbehind may read
  the ones before).  A keyword must be in the message's last line.
- ``follow``: lines the kernel prints after the rule's line as part of the
  same fault, ``{regex, keywords, within, alone, same_device, severity}``.
  Within ``within`` records (1-256, default 16) of the fault's last line, a
  follow line belongs to it and is not another event (nor is any other rule's
  match on that line, unless it is more severe).  Named groups present in both
  must agree; with ``same_device`` (default true) so must the device the kernel
  attributed both lines to.  With ``alone: true`` a follow line whose first line
  was lost (rate limit, ring overrun) is an event of this rule by itself, with
  the follow's ``severity`` (default: the rule's, or ``severity_by``), unless
  the line is another rule's open fault's line and not more severe.
- ``hold`` (0-64 records, default 0): the event waits up to ``hold`` records
  (or the end of the read) for its follow lines, through records about other
  things, and ends sooner when the rule's next fault begins; fields such as
  ``pci`` can come from the follow lines (a CPER record's ``device_id:``), and a
  follow line more severe than the waiting event raises its severity.
  ``superseded_by: [rule, ...]`` drops the waiting event when one of those rules
  matches meanwhile about the same device (or it names none), as severe (it reports the fault), and
  an event of the rule within ``hold`` records after one of theirs, likewise.
- ``crash: {kind, severity, field, pattern}``: a match of the rule among the
  previous boot's last lines (pstore, the journal) means that boot ended in a
  crash of ``kind`` (``mce``, ``hardware_error``, ``panic``, ``oops``), when
  it is at least as severe as ``severity`` (default: any) and, with
  ``field`` (a named group), that group's value starts with a match of
  ``pattern`` (``lastboot``, which reads the shipped rules only).
- ``enabled`` (default true), ``description``.

Named groups are the extracted fields; ``pci`` is normalised to
``dddd:bb:dd.f`` (``pci_id``, a PCIe requester ID such as AER's ``id=00e5``,
becomes one too, in domain ``pci_domain``) and ``xid`` is an integer.  One
record gives at most one event: the most severe match.  Rules load from the
shipped directory first, then from user paths; a user rule with a shipped
rule's name replaces it (or removes it with ``enabled: false``).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from tpuwatch import yamlfile
from tpuwatch.kernel_log.rule import CRASH_KINDS, SEVERITIES, CrashSign, Follow, Rule, SeverityBy
from tpuwatch.kernel_log.rules import RuleSet
from tpuwatch.schema import ConfigError

SHIPPED_DIR = Path(__file__).parent / "rules"
MAX_PATTERN_CHARS = 8192
MAX_KEYWORD_CHARS = 256
_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")
_RULE_KEYS = {"name", "regex", "keywords", "severity", "severity_by", "enabled", "description", "lines", "follow",
              "hold", "superseded_by", "crash"}
MAX_HOLD, MAX_WITHIN = 64, 256  # records a waiting event waits at most; a follow line may come after its fault
_FOLLOW_KEYS = {"regex", "keywords", "within", "alone", "same_device", "severity"}


class RuleError(ConfigError):
    """A rule file that cannot be used; ``str()`` names the file, the rule and the reason."""

    def __init__(self, filename: str, rule: str | None, reason: str) -> None:
        super().__init__(f"{filename}: rule {rule!r}" if rule else filename, reason)


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


def _add(rules: dict[str, Rule | None], parsed: list[Rule | str], filename: str, shipped: bool) -> None:
    for item in parsed:
        name = item if isinstance(item, str) else item.name
        if shipped and name in rules:
            raise RuleError(filename, name, "duplicate of a shipped rule")
        rules[name] = None if isinstance(item, str) else item


def _read(path: Path) -> str:
    """A rule file's text, read as every YAML file is (bounded, strict UTF-8)."""
    try:
        return yamlfile.read_text(path)
    except ConfigError as exc:
        raise RuleError(exc.path, None, exc.reason) from None


def parse_rule_file(text: str, filename: str) -> list[Rule | str]:
    """Rules in one YAML file; a disabled rule comes back as its bare name."""
    try:
        data = yamlfile.load(text, filename)
    except ConfigError as exc:
        raise RuleError(exc.path, None, exc.reason) from None
    if not isinstance(data, dict) or set(data) != {"rules"} or not isinstance(data["rules"], list):
        raise RuleError(filename, None, "expected a mapping with one key, rules: a list of rules")
    out: list[Rule | str] = []
    names: set[str] = set()
    for index, item in enumerate(data["rules"]):
        rule = _parse_rule(item, filename, index)
        name = rule if isinstance(rule, str) else rule.name
        if name in names:
            raise RuleError(filename, name, "defined twice in this file")
        names.add(name)
        out.append(rule)
    return out


def _parse_rule(item: Any, filename: str, index: int) -> Rule | str:
    if not isinstance(item, dict):
        raise RuleError(filename, f"#{index + 1}", "a rule must be a mapping")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise RuleError(filename, f"#{index + 1}", "name must be lower_case letters, digits and _")

    def fail(reason: str) -> RuleError:
        return RuleError(filename, name, reason)

    _known(item, _RULE_KEYS, "", fail)
    if item.get("enabled", True) is False:
        return name
    if not isinstance(item.get("enabled", True), bool):
        raise fail("enabled must be true or false")
    regex = _regex(item.get("regex"), "regex", fail)
    severity = _severity(item.get("severity", "warning"), "severity", fail)
    follow = _parse_follow(item.get("follow"), fail)
    groups = {*regex.groupindex, *(follow.regex.groupindex if follow is not None else ())}
    severity_by = _parse_severity_by(item.get("severity_by"), groups, fail)
    superseded = item.get("superseded_by", [])
    if not isinstance(superseded, list) or not all(isinstance(s, str) and _NAME_RE.fullmatch(s) for s in superseded):
        raise fail("superseded_by must be a list of rule names")
    return Rule(name, regex, severity, _keywords(item.get("keywords", []), "keywords", fail), severity_by,
                _int(item.get("lines", 1), "lines", 1, 8, fail), follow,
                _int(item.get("hold", 0), "hold", 0, MAX_HOLD, fail), tuple(superseded),
                _parse_crash(item.get("crash"), groups, fail))


def _known(item: dict[str, Any], keys: set[str], prefix: str, fail: Any) -> None:
    for key in item:  # in the file's order; a YAML key may be null, a number or a date, not only a string
        if key not in keys:
            raise fail(f"unknown key {prefix}{str(key)[:64]!r} (known: {', '.join(sorted(keys))})")


def _regex(pattern: Any, key: str, fail: Any) -> re.Pattern[str]:
    if not isinstance(pattern, str) or not pattern:
        raise fail(f"{key} is required (a string)")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise fail(f"{key} is longer than {MAX_PATTERN_CHARS} characters")
    try:
        with warnings.catch_warnings():  # "Possible nested set": a regex whose meaning a later Python may change
            warnings.simplefilter("error", FutureWarning)
            return re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:  # a{99999999999}, thousands of nested groups
        raise fail(f"invalid {key}: {exc}") from None
    except FutureWarning as exc:
        raise fail(f"ambiguous {key}: {exc} (escape the character: \\[ inside a set)") from None


def _severity(value: Any, key: str, fail: Any) -> str:
    if value not in SEVERITIES:
        raise fail(f"{key} must be one of {', '.join(SEVERITIES)}, not {value!r}")
    return str(value)


def _keywords(value: Any, key: str, fail: Any) -> tuple[str, ...]:
    if (not isinstance(value, list) or len(value) > 64
            or not all(isinstance(k, str) and 0 < len(k) <= MAX_KEYWORD_CHARS for k in value)):
        raise fail(f"{key} must be a list of non-empty strings (at most 64, of at most {MAX_KEYWORD_CHARS} "
                   "characters)")
    return tuple(value)


def _int(value: Any, key: str, low: int, high: int, fail: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise fail(f"{key} must be a whole number from {low} to {high}")
    return value


def _bool(value: Any, key: str, fail: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(f"{key} must be true or false")
    return value


def _parse_follow(value: Any, fail: Any) -> Follow | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise fail("follow must be a mapping with regex and optional keywords, within, alone, same_device, severity")
    _known(value, _FOLLOW_KEYS, "follow.", fail)
    severity = value.get("severity")
    return Follow(_regex(value.get("regex"), "follow.regex", fail),
                  _keywords(value.get("keywords", []), "follow.keywords", fail),
                  _int(value.get("within", 16), "follow.within", 1, MAX_WITHIN, fail),
                  _bool(value.get("alone", False), "follow.alone", fail),
                  _bool(value.get("same_device", True), "follow.same_device", fail),
                  None if severity is None else _severity(severity, "follow.severity", fail))


def _parse_crash(value: Any, groups: set[str], fail: Any) -> CrashSign | None:
    if value is None:
        return None
    if (not isinstance(value, dict) or not set(value) <= {"kind", "severity", "field", "pattern"}
            or value.get("kind") not in CRASH_KINDS or ("field" in value) != ("pattern" in value)):
        raise fail(f"crash must be a mapping with kind (one of {', '.join(CRASH_KINDS)}), optional severity, and "
                   "field with pattern together")
    field = value.get("field")
    if field is not None and field not in groups:
        raise fail(f"crash.field {field!r} is not a named group of the regex or follow.regex")
    return CrashSign(value["kind"], _severity(value.get("severity", "info"), "crash.severity", fail), field,
                     None if field is None else _regex(value["pattern"], "crash.pattern", fail))


def _parse_severity_by(value: Any, groups: set[str], fail: Any) -> tuple[SeverityBy, ...]:
    if value is None:
        return ()
    entries = value if isinstance(value, list) else [value]
    out = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("field"), str):
            raise fail("severity_by must be a mapping (or a list of them) with field: GROUP and severity lists")
        group = entry["field"]
        if group not in groups:
            raise fail(f"severity_by.field {group!r} is not a named group of the regex or follow.regex")
        if "bits" in entry:
            out.append(SeverityBy(group, bits=_parse_bits(entry, fail)))
            continue
        mapping: dict[str, str] = {}
        for severity, values in entry.items():
            if severity == "field":
                continue
            if severity not in SEVERITIES or not isinstance(values, list):
                raise fail(f"severity_by: {severity!r} is not a severity with a list of values")
            for v in values:
                if str(v) in mapping:
                    raise fail(f"severity_by: value {v!r} listed twice")
                mapping[str(v)] = severity
        out.append(SeverityBy(group, mapping))
    return tuple(out)


def _parse_bits(entry: dict[str, Any], fail: Any) -> tuple[tuple[str, int], ...]:
    bits = entry["bits"]
    if set(entry) != {"field", "bits"} or not isinstance(bits, dict) or not set(bits) <= set(SEVERITIES):
        raise fail("severity_by.bits must map severities to lists of bit numbers (0-63), with nothing beside field")
    out = []
    for severity in SEVERITIES:
        numbers = bits.get(severity)
        if numbers is None:
            continue
        if not isinstance(numbers, list) or not numbers or not all(
                isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 64 for n in numbers):
            raise fail("severity_by.bits must map severities to lists of bit numbers (0-63)")
        out.append((severity, sum(1 << n for n in set(numbers))))
    return tuple(out)
