"""Kernel log rules: YAML files of named regexes, loaded with clear errors, matched behind one keyword prefilter.

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
  the ones before it.  A keyword must be in the message's last line.
- ``follow``: lines the kernel prints after the rule's line as part of the
  same fault, ``{regex, keywords, within, alone, same_device, severity}``.
  Within ``within`` records (1-256, default 16) of the fault's last line, a
  follow line belongs to it and is not another event (nor is any other rule's
  match on that line, unless it is more severe).  Named groups present in both
  must agree; with ``same_device`` (default true) so must the device the kernel
  attributed both lines to.  With ``alone: true`` a follow line whose first line
  was lost (rate limit, ring overrun) is an event of this rule by itself, with
  the follow's ``severity`` (default: the rule's, or ``severity_by``).
- ``hold`` (0-64 records, default 0): the event waits up to ``hold`` records
  (or the end of the read) for its follow lines, through records about other
  things, and ends sooner when the rule's next fault begins; fields such as
  ``pci`` can come from the follow lines (a CPER record's ``device_id:``), and a
  follow line more severe than the waiting event raises its severity.
  ``superseded_by: [rule, ...]`` drops the waiting event when one of those rules
  matches meanwhile about the same device (or it names none), as severe (it reports the fault), and
  an event of the rule within ``hold`` records after one of theirs, likewise.
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
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any

from tpuwatch import yamlfile
from tpuwatch.kernel_log.matcher import StreamMatcher
from tpuwatch.kernel_log.rule import SEVERITIES, Follow, Match, Rule, SeverityBy
from tpuwatch.schema import ConfigError

__all__ = ["SEVERITIES", "SHIPPED_DIR", "Match", "Rule", "RuleError", "RuleSet", "StreamMatcher", "load_rules",
           "parse_rule_file"]

SHIPPED_DIR = Path(__file__).parent / "rules"
MAX_PATTERN_CHARS = 8192
MAX_KEYWORD_CHARS = 256
_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")
_RULE_KEYS = {"name", "regex", "keywords", "severity", "severity_by", "enabled", "description", "lines", "follow",
              "hold", "superseded_by"}
MAX_HOLD, MAX_WITHIN = 64, 256  # records a waiting event waits at most; a follow line may come after its fault
_FOLLOW_KEYS = {"regex", "keywords", "within", "alone", "same_device", "severity"}
# Per keyword: searches of rule (and stand-alone follow) regexes; (rule indexes, search) of other follow regexes;
# the indexes of all those other follow regexes' rules.
Checks = tuple[tuple[Callable[[str], object], ...], tuple[tuple[tuple[int, ...], Callable[[str], object]], ...],
               tuple[int, ...]]
_CHAR_CLASS_RE = re.compile(r"\[\^?\]?[^\]]*\]")


class RuleError(ConfigError):
    """A rule file that cannot be used; ``str()`` names the file, the rule and the reason."""

    def __init__(self, source: str, rule: str | None, reason: str) -> None:
        super().__init__(f"{source}: rule {rule!r}" if rule else source, reason)


class RuleSet:
    """Rules ready to match single messages, streams of records, or to find candidate lines in a block of text."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = list(rules)
        self.max_lines = max((r.lines for r in self.rules), default=1)
        primary: dict[str, set[int]] = {}
        follow: dict[str, set[int]] = {}
        for index, rule in enumerate(self.rules):
            for keyword in rule.keywords:
                primary.setdefault(keyword, set()).add(index)
            for keyword in rule.follow.keywords if rule.follow else ():
                follow.setdefault(keyword, set()).add(index)
        keywords = sorted({*primary, *follow})
        self._dispatch = {k: (frozenset(primary.get(k, ())), frozenset(follow.get(k, ()))) for k in keywords}
        self._partners = {k: _overlapping(k, keywords) for k in keywords}
        self.unkeyed = frozenset(i for i, r in enumerate(self.rules) if not r.keywords)
        self.unkeyed_follow = frozenset(i for i, r in enumerate(self.rules) if r.follow and not r.follow.keywords)
        self.prefilter = re.compile(literal_alternation(keywords)) if keywords else None
        self._multiline = frozenset(i for i, r in enumerate(self.rules) if r.lines > 1)
        multiline_keywords = sorted({k for i in self._multiline for k in self.rules[i].keywords})
        self._multiline_search = re.compile(literal_alternation(multiline_keywords)).search if multiline_keywords \
            else None
        names = {rule.name: i for i, rule in enumerate(self.rules)}
        self.superseded_by = [frozenset(names[n] for n in r.superseded_by if n in names) for r in self.rules]
        self.checks = {k: self._checks({k}) for k in keywords}
        # Keywords a find of this one can hide (they overlap it): their checks count when they are in the line.
        self.partner_checks = {k: tuple((p, self.checks[p]) for p in self._partners[k]) for k in keywords}

    def _checks(self, keywords: set[str]) -> Checks | None:
        """What decides whether a line holding one of ``keywords`` can match anything: the searches of the rule
        regexes (and of the follow regexes that stand alone) those keywords lead to, and of their other follow
        regexes with the rules' indexes (a follow line counts only while its rule has a fault open); None when
        only the parsed record can tell (a rule over several records, a regex that looks outside the message)."""
        searches: dict[str, re.Pattern[str]] = {}
        follows: dict[str, tuple[set[int], Callable[[str], object]]] = {}
        for keyword in keywords:
            primary, follow = self._dispatch[keyword]
            if any(self.rules[i].lines > 1 for i in primary):
                return None
            patterns: list[tuple[int | None, re.Pattern[str]]] = [(None, self.rules[i].regex) for i in primary]
            for i in follow:
                rule_follow = self.rules[i].follow
                assert rule_follow is not None
                patterns.append((None if rule_follow.alone else i, rule_follow.regex))
            for index, pattern in patterns:
                if looks_outside(pattern.pattern):
                    return None
                key = pattern.pattern + str(pattern.flags)
                if index is None:
                    searches[key] = pattern
                else:
                    follows.setdefault(key, (set(), pattern.search))[0].add(index)
        return (_one_search(list(searches.values())),
                tuple((tuple(sorted(i)), search) for i, search in follows.values()),
                tuple(sorted({i for rules, _ in follows.values() for i in rules})))

    def candidates(self, message: str) -> tuple[frozenset[int], frozenset[int]]:
        """Indexes of the rules whose regex (first) and follow regex (second) must be tried on ``message``."""
        primary, follow = self.unkeyed, self.unkeyed_follow
        if self.prefilter is None:
            return primary, follow
        found = {m.group() for m in self.prefilter.finditer(message)}
        if len(found) == 1 and not (primary or follow):  # the common case: one keyword, nothing to add to it
            (keyword,) = found
            if not self._partners[keyword]:
                return self._dispatch[keyword]
        for keyword in list(found):  # a keyword overlapping a found one is not found again: look for it
            if partners := self._partners[keyword]:
                found.update(k for k in partners if k in message)
        for keyword in found:
            rules, follows = self._dispatch[keyword]
            primary = primary | rules
            follow = follow | follows
        return primary, follow

    def wants_context(self, message: str) -> bool:
        """True if a rule whose message spans several records may end in ``message`` (it needs the ones before)."""
        return self._multiline_search is not None and self._multiline_search(message) is not None

    def match(self, message: str) -> list[Match]:
        """Every rule's match on ``message`` alone, in rule order (no cross-record logic: see ``stream``)."""
        if not self.can_match(message):
            return []
        primary, _ = self.candidates(message)
        return [m for i in sorted(primary) if (m := self.rules[i].match(message)) is not None]

    def hits(self, text: str) -> list[int]:
        """Sorted offsets in ``text`` where a line may match: keyword finds and unkeyed regex hits."""
        return [offset for offset, _ in self.keyed_hits(text)]

    def keyed_hits(self, text: str) -> list[tuple[int, str]]:
        """``hits`` with the keyword found at each (``""`` for an unkeyed rule's regex hit), sorted by offset."""
        found = [(m.start(), m.group()) for m in self.prefilter.finditer(text)] if self.prefilter is not None else []
        if self.unkeyed or self.unkeyed_follow:
            for index in self.unkeyed:
                found.extend((m.start(), "") for m in self.rules[index].regex.finditer(text))
            for index in self.unkeyed_follow:
                follow = self.rules[index].follow
                assert follow is not None
                found.extend((m.start(), "") for m in follow.regex.finditer(text))
            found.sort(key=itemgetter(0))
        return found

    def can_match(self, message: str, expects: Callable[[int], bool] | None = None,
                  found: re.Match[str] | None = None) -> bool:
        """False if no rule's regex or follow regex can match ``message`` (a record's whole message, or one raw
        line of the forms ``checks`` hold for): its keywords lead only to regexes that do not match it.  With
        ``expects`` (rule index -> has a fault open), a follow regex counts only for a rule that expects it;
        ``found``: the prefilter's first find in ``message``, when the caller has it."""
        if self.prefilter is None or self.unkeyed or self.unkeyed_follow:
            return True
        search = self.prefilter.search
        if found is None:
            found = search(message)
        while found is not None:
            if self.line_may_match(found.group(), message, expects):
                return True
            found = search(message, found.end())
        return False

    def line_may_match(self, keyword: str, text: str, expects: Callable[[int], bool] | None = None) -> bool:
        """True unless the regexes that ``keyword`` (found in ``text``) and the keywords it may hide lead to all
        fail on ``text`` (see ``can_match``)."""
        tests = self.checks[keyword]
        if tests is None or passes(tests, text, expects):
            return True
        for partner, partner_tests in self.partner_checks[keyword]:
            if partner in text and (partner_tests is None or passes(partner_tests, text, expects)):
                return True
        return False

    def stream(self) -> StreamMatcher:
        """A matcher for one stream of records in order (one log source, one scanned file)."""
        return StreamMatcher(self)


def _one_search(patterns: list[re.Pattern[str]]) -> tuple[Callable[[str], object], ...]:
    """The searches of ``patterns`` as one search where they combine into one regex (group names dropped), so that
    a line is read once; else one search each."""
    if len(patterns) < 2:
        return tuple(p.search for p in patterns)
    parts = []
    for pattern in patterns:
        if pattern.flags & ~re.UNICODE or re.search(r"\(\?P=|\\[1-9]|\(\?[aiLmsux]|\\\(\?P", pattern.pattern):
            return tuple(p.search for p in patterns)  # flags, back references: each on its own
        parts.append("(?:" + re.sub(r"\(\?P<\w+>", "(?:", pattern.pattern) + ")")
    try:
        return (re.compile("|".join(parts)).search,)
    except re.error:
        return tuple(p.search for p in patterns)


def passes(checks: Checks, text: str, expects: Callable[[int], bool] | None = None) -> bool:
    """True if a search of ``checks`` finds ``text`` (a follow search only for a rule that ``expects`` it)."""
    primary, follows, _ = checks
    for test in primary:
        if test(text):
            return True
    for rules, test in follows:
        if (expects is None or any(map(expects, rules))) and test(text):
            return True
    return False


def looks_outside(pattern: str) -> bool:
    """True if ``pattern`` may see past the message's ends (anchors, lookbehind), so that searching a raw line
    holding the message could differ from searching the message."""
    if re.search(r"\\[AZ]", pattern.replace("\\\\", "")):
        return True
    bare = _CHAR_CLASS_RE.sub("", re.sub(r"\\.", "_", pattern))
    return "^" in bare or "$" in bare or "(?<=" in bare or "(?<!" in bare


def _overlapping(keyword: str, keywords: list[str]) -> tuple[str, ...]:
    """The other keywords a match of ``keyword`` can hide from a left-to-right search: those inside it, or starting
    inside it (a suffix of it is their prefix)."""
    suffixes = tuple(keyword[i:] for i in range(1, len(keyword)))
    return tuple(k for k in keywords if k != keyword and (k in keyword or k.startswith(suffixes)))


def literal_alternation(words: list[str]) -> str:
    """A regex matching any of ``words``, factored as a trie so that the engine tries few branches per position."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def build(node: dict[str, Any]) -> str:
        branches = []
        for char, child in sorted(node.items()):
            if not char:
                continue
            run = char
            while len(child) == 1 and "" not in child:  # a run without branches: one literal, no deeper call
                ((more, child),) = child.items()
                run += more
            branches.append(re.escape(run) + build(child))
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return build(trie)


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
    """A rule file's text, read as every YAML file is (bounded, strict UTF-8)."""
    try:
        return yamlfile.read_text(path)
    except ConfigError as exc:
        raise RuleError(exc.path, None, exc.reason) from None


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

    def fail(reason: str) -> RuleError:
        return RuleError(source, name, reason)

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
                _int(item.get("hold", 0), "hold", 0, MAX_HOLD, fail), tuple(superseded))


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
        return re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:  # a{99999999999}, thousands of nested groups
        raise fail(f"invalid {key}: {exc}") from None


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
