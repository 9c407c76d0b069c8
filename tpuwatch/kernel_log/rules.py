"""Kernel log rules matched behind one keyword prefilter: a ``RuleSet`` finds the messages rules may match; a
``matcher.StreamMatcher`` matches a stream of records with them.

All keywords of all rules form one prefilter (``prefilter.Prefilter``), and a
hit dispatches to the rules whose keyword it is; the rule file format and its
loading are in ``rulefile``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from operator import itemgetter

from tpuwatch.kernel_log.prefilter import Prefilter, literal_alternation
from tpuwatch.kernel_log.rule import Match, Rule

# Messages that start afresh: the kernel's banner at boot (start_kernel) and nvidia_init_module()'s at a load of
# the driver; they are among the prefilter's keywords, so that a block's records that hold one are fed.
RESTARTS = ("Linux version ", "VRM: loading NVIDIA UNIX")
RESTART_STARTS = ("Linux version ", "NVRM: loading NVIDIA UNIX")
# Per keyword: searches of rule (and stand-alone follow) regexes; (rule indexes, search) of other follow regexes.
Checks = tuple[tuple[Callable[[str], object], ...], tuple[tuple[tuple[int, ...], Callable[[str], object]], ...]]
# What one message alone gives: each candidate rule's match (None where its regex does not match), in rule order,
# and the follow regexes' matches (``RuleSet.analyse``).
Analysis = tuple[tuple[tuple[int, Match | None], ...], tuple[tuple[int, Match], ...]]
# Rule indexes -> True if one of them has a fault open that follow lines may still belong to.
Expects = Callable[[tuple[int, ...]], bool]
# What keeps a regex out of a combined search: a named or numbered back reference, a conditional on a group number
# (both would count the groups of the regexes before it), an inline flag.
_BY_NUMBER_OR_FLAG = re.compile(r"\(\?P=|\\[1-9]|\(\?\(\d|\(\?[aiLmsux]|\\\(\?P")
# A storm repeats its message: the analyses of the last 256 distinct short messages are kept (under 1 MiB).
MEMO_MESSAGES = 256
MEMO_CHARS = 512


class RuleSet:
    """Rules ready to match single messages, behind one prefilter of all their keywords."""

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
        keywords = sorted({*primary, *follow, *RESTARTS}) if primary or follow else []
        self.dispatch = {k: (frozenset(primary.get(k, ())), frozenset(follow.get(k, ()))) for k in keywords}
        """Keyword -> the rules whose regex (first) and follow regex (second) a message holding it may match."""
        self.prefilter = Prefilter(keywords) if keywords else None
        self._partners = self.prefilter.hides if self.prefilter is not None else {}
        self.unkeyed = frozenset(i for i, r in enumerate(self.rules) if not r.keywords)
        self.unkeyed_follow = frozenset(i for i, r in enumerate(self.rules) if r.follow and not r.follow.keywords)
        self._multiline = frozenset(i for i, r in enumerate(self.rules) if r.lines > 1)
        multiline_keywords = sorted({k for i in self._multiline for k in self.rules[i].keywords})
        self._multiline_search = re.compile(literal_alternation(multiline_keywords)).search if multiline_keywords \
            else None
        names = {rule.name: i for i, rule in enumerate(self.rules)}
        self.superseded_by = [frozenset(names[n] for n in r.superseded_by if n in names) for r in self.rules]
        self.checks = {k: self._checks({k}) for k in keywords}
        # Keywords a find of this one can stand for (``Prefilter.hides``): their checks count when they are in the line.
        self.partner_checks = {k: tuple((p, self.checks[p]) for p in self._partners[k]) for k in keywords}
        self._memo: dict[str, Analysis] = {}

    def _checks(self, keywords: set[str]) -> Checks | None:
        """What decides whether a line holding one of ``keywords`` can match anything: the searches of the rule
        regexes (and of the follow regexes that stand alone) those keywords lead to, and of their other follow
        regexes with the rules' indexes (a follow line counts only while its rule has a fault open); None when
        one message alone cannot tell (a rule over several records, a restart banner).  A check is only ever run on
        a record's message, the text the rules' regexes are searched in (``Rule.match``), so an anchor or a
        lookbehind sees the same ends in both and needs no exception."""
        searches: dict[str, re.Pattern[str]] = {}
        follows: dict[str, tuple[set[int], Callable[[str], object]]] = {}
        for keyword in keywords:
            primary, follow = self.dispatch[keyword]
            if keyword in RESTARTS or any(self.rules[i].lines > 1 for i in primary):
                return None
            patterns: list[tuple[int | None, re.Pattern[str]]] = [(None, self.rules[i].regex) for i in primary]
            for i in follow:
                rule_follow = self.rules[i].follow
                assert rule_follow is not None
                patterns.append((None if rule_follow.alone else i, rule_follow.regex))
            for index, pattern in patterns:
                key = pattern.pattern + str(pattern.flags)
                if index is None:
                    searches[key] = pattern
                else:
                    follows.setdefault(key, (set(), pattern.search))[0].add(index)
        return (_one_search(list(searches.values())),
                tuple((tuple(sorted(i)), search) for i, search in follows.values()))

    def candidates(self, message: str) -> tuple[frozenset[int], frozenset[int]]:
        """Indexes of the rules whose regex (first) and follow regex (second) must be tried on ``message``."""
        primary, follow = self.unkeyed, self.unkeyed_follow
        if self.prefilter is None:
            return primary, follow
        found = self.prefilter.found(message)
        if len(found) == 1 and not (primary or follow):  # the common case: one keyword, nothing to add to it
            (keyword,) = found
            if not self._partners[keyword]:
                return self.dispatch[keyword]
        for keyword in list(found):  # a keyword a found one can stand for is not found again: look for it
            if partners := self._partners[keyword]:
                found.update(k for k in partners if k in message)
        for keyword in found:
            rules, follows = self.dispatch[keyword]
            primary = primary | rules
            follow = follow | follows
        return primary, follow

    def analyse(self, message: str) -> Analysis:
        """Each candidate rule's match on ``message`` alone (None where its regex does not match), in rule order, and
        the matches of the follow regexes; remembered for the last ``MEMO_MESSAGES`` distinct short messages (the
        matches are values, never changed, so they can be shared)."""
        analysis = self._memo.get(message)
        if analysis is None:
            primary, follow = self.candidates(message)
            rules = self.rules
            analysis = (tuple((i, rules[i].match(message)) for i in sorted(primary)),
                        tuple((i, m) for i in sorted(follow) if (m := rules[i].match_follow(message)) is not None))
            if len(message) <= MEMO_CHARS:
                if len(self._memo) >= MEMO_MESSAGES:
                    self._memo.clear()
                self._memo[message] = analysis
        return analysis

    def wants_context(self, message: str) -> bool:
        """True if a rule whose message spans several records may end in ``message`` (it needs the ones before)."""
        return self._multiline_search is not None and self._multiline_search(message) is not None

    def match(self, message: str) -> list[Match]:
        """Every rule's match on ``message`` alone, in rule order (no cross-record logic: see ``matcher``)."""
        if not self.can_match(message):
            return []
        return [m for _, m in self.analyse(message)[0] if m is not None]

    def can_match(self, message: str, expects: Expects | None = None) -> bool:
        """False if no rule's regex or follow regex can match ``message`` (a record's whole message, never a raw
        line): its keywords lead only to regexes that do not match it.  With
        ``expects`` (rule indexes -> one of them has a fault open), a follow regex counts only for rules that expect
        it (``StreamMatcher.expects_any``)."""
        if self.prefilter is None or self.unkeyed or self.unkeyed_follow:
            return True
        line_may_match = self.line_may_match
        for keyword in dict.fromkeys(map(itemgetter(1), self.prefilter.finds(message))):
            if line_may_match(keyword, message, expects):
                return True
        return False

    def line_may_match(self, keyword: str, text: str, expects: Expects | None = None) -> bool:
        """True unless the regexes that ``keyword`` (found in ``text``) and the keywords it may hide lead to all
        fail on ``text`` (see ``can_match``)."""
        tests = self.checks[keyword]
        if tests is None or passes(tests, text, expects):
            return True
        for partner, partner_tests in self.partner_checks[keyword]:
            if partner in text and (partner_tests is None or passes(partner_tests, text, expects)):
                return True
        return False


def _one_search(patterns: list[re.Pattern[str]]) -> tuple[Callable[[str], object], ...]:
    """The searches of ``patterns`` as one search where they combine into one regex (group names dropped), so that
    a line is read once; else one search each (a back reference or a conditional by group number would count the
    groups of the patterns before it)."""
    if len(patterns) < 2:
        return tuple(p.search for p in patterns)
    parts = []
    for pattern in patterns:
        if pattern.flags & ~re.UNICODE or _BY_NUMBER_OR_FLAG.search(pattern.pattern):
            return tuple(p.search for p in patterns)  # flags, groups referred to by number: each on its own
        parts.append("(?:" + re.sub(r"\(\?P<\w+>", "(?:", pattern.pattern) + ")")
    try:
        return (re.compile("|".join(parts)).search,)
    except re.error:
        return tuple(p.search for p in patterns)


def passes(checks: Checks, text: str, expects: Expects | None = None) -> bool:
    """True if a search of ``checks`` finds ``text`` (a follow search only when ``expects`` says one of its rules
    has a fault open)."""
    primary, follows = checks
    for test in primary:
        if test(text):
            return True
    for rules, test in follows:
        if (expects is None or expects(rules)) and test(text):
            return True
    return False

