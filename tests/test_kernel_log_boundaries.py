"""Kernel log rules respect the word boundaries the kernel prints.

- No shipped rule's regex (nor a follow regex that stands alone) matches a benign real line: the lines of the
  corpus snippets that give no event, the corpus lines that hold no keyword of any rule, and the near misses of
  cases.yaml.  "BUG: " inside "EDAC DEBUG: ..." was such a match.
- Keywords inside longer words: for every regex, keyword and known line (the cases' match lines, every corpus
  record) where a match covers an occurrence of the keyword, the line is made again with a word character put
  before the word the keyword begins in (if it begins with a word character) and after the word it ends in (if it
  ends with one).  No match of the regex may then cover the occurrence and begin inside the longer word (at its
  start) or end inside it (at its end).  A match that takes in the whole longer word is no fault: there the pattern
  reads any text, not its literal (arm64's "Internal error: <reason>: <esr> [#1]" around an "Oops", an RCU flavour
  "rcu_\\w+", the hex digits after "0x").
- The edges of each match, likewise: a word character before the word the match begins in, and after the match
  where it ends at the end of a word.

Rule level only: each ``regex`` and ``follow.regex`` is searched directly, without the keyword prefilter (so a
pattern that would match inside a longer word is caught even where the prefilter happens to hide it), and without
the stream matcher.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from tpuwatch.kernel_log.rule import Rule
from tpuwatch.kernel_log.rulefile import load_rules

DATA = Path(__file__).parent / "testdata" / "kernel_log"
CASES: dict[str, Any] = yaml.safe_load((DATA / "cases.yaml").read_text())
SNIPPETS: list[dict[str, Any]] = yaml.safe_load((DATA / "corpus.yaml").read_text())["snippets"]
RULES = load_rules([])
# A word is a run of what Python's re calls \w (Unicode letters, digits, "_"), as for \b: each of these makes one
# longer; a pattern that guards a boundary with an ASCII class instead of \b lets "_" or "é" through.
WORD_CHARACTERS = ("x", "Q", "7", "_", "é")
WORD = re.compile(r"\w")


class Pattern(NamedTuple):
    """One regex of a rule with the keywords that lead to it: the rule's own, or its follow lines'."""

    rule: str
    kind: str  # "regex" or "follow"
    regex: re.Pattern[str]
    keywords: tuple[str, ...]
    lines: int  # how many records the regex may span (``lines`` of the rule; follow lines are one record)
    alone: bool  # a match is an event by itself (the rule's regex, a follow with ``alone: true``)


class Variant(NamedTuple):
    """A line a pattern matches, with a word character put in (at ``inserted``) to make one word longer: the word a
    keyword (or the match) begins in, at its start, or the word it ends in, at its end; ``start``/``end``: where
    that keyword (or the match) now is."""

    pattern: Pattern
    text: str
    inserted: int
    start: int
    end: int
    what: str  # the keyword, or "its first word" / "its last word" of the match
    side: str  # "start" (the character is before the word) or "end" (after it)


def _patterns(rules: list[Rule]) -> list[Pattern]:
    out = []
    for rule in rules:
        out.append(Pattern(rule.name, "regex", rule.regex, rule.keywords, rule.lines, True))
        if rule.follow is not None:
            out.append(Pattern(rule.name, "follow", rule.follow.regex, rule.follow.keywords, 1, rule.follow.alone))
    return out


PATTERNS = _patterns(RULES.rules)


def records(snippet: dict[str, Any]) -> list[str]:
    """A corpus snippet's records: a line starting with "↳" continues the record above (one printk, newlines)."""
    out: list[str] = []
    for line in snippet["log"].rstrip("\n").split("\n"):
        if line.startswith("↳"):
            out[-1] += "\n" + line[1:]
        else:
            out.append(line)
    return out


def windows(lines: list[str], span: int) -> Iterator[str]:
    """Each record, and each record joined with up to ``span - 1`` records before it (as a rule over several
    records is also tried on the record joined with the ones before it)."""
    for end in range(len(lines)):
        for size in range(1, min(span, end + 1) + 1):
            yield "\n".join(lines[end + 1 - size:end + 1])


ALL_KEYWORDS = {k for p in PATTERNS for k in p.keywords}
# Benign real lines: every record of a snippet that must give no event, and every record of the others that holds no
# keyword of any rule (no rule is ever tried on it, so it is no event nor a line of one).
QUIET_SNIPPETS = [s for s in SNIPPETS if not s["events"]]
KEYWORDLESS = [(s["source"], r) for s in SNIPPETS if s["events"] for r in records(s)
               if not any(k in r for k in ALL_KEYWORDS)]
NEAR_MISSES = [(rule, line) for rule, cases in CASES.items() for line in cases["near_miss"]]


def _found(pattern: Pattern, text: str) -> str | None:
    found = pattern.regex.search(text)
    return None if found is None else f"{pattern.rule} {pattern.kind} matches {found.group()!r} in {text!r}"


@pytest.mark.parametrize("snippet", QUIET_SNIPPETS, ids=[s["source"] for s in QUIET_SNIPPETS])
def test_no_rule_matches_a_line_of_a_snippet_without_events(snippet: dict[str, Any]) -> None:
    lines = records(snippet)
    found = [f for p in PATTERNS if p.alone for text in windows(lines, p.lines) if (f := _found(p, text))]
    assert found == []


def test_no_rule_matches_a_real_line_that_holds_no_keyword() -> None:
    found = [f"{source}: {f}" for source, line in KEYWORDLESS for p in PATTERNS if p.alone if (f := _found(p, line))]
    assert found == []
    assert len(KEYWORDLESS) > 1000  # most lines of the corpus are the benign neighbours of a fault


@pytest.mark.parametrize(("rule", "line"), NEAR_MISSES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(NEAR_MISSES)])
def test_no_rule_regex_matches_a_near_miss_even_past_the_prefilter(rule: str, line: str) -> None:
    assert [f for p in PATTERNS if p.alone if (f := _found(p, line))] == []


def _known_lines() -> list[str]:
    """Every line known to match a rule: the cases' match lines and every corpus record (with the records before it,
    for rules over several records); a pattern gives variants only of the lines it matches."""
    lines = [case["line"] for cases in CASES.values() for case in cases["match"]]
    span = max(p.lines for p in PATTERNS)
    for snippet in SNIPPETS:
        lines.extend(windows(records(snippet), span))
    return list(dict.fromkeys(lines))


KNOWN_LINES = _known_lines()


def covering(regex: re.Pattern[str], text: str, start: int, end: int, first: int = 0) -> Iterator[re.Match[str]]:
    """The matches of ``regex`` in ``text`` that begin at ``first`` or later, at ``start`` at the latest, and cover
    ``text[start:end]``: the one ``search`` gives from each such position (lookbehinds and \\b see the whole
    text)."""
    position = first
    while (found := regex.search(text, position)) is not None and found.start() <= start:
        if found.end() >= end:
            yield found
        position = found.start() + 1


def _occurrences(text: str, keyword: str) -> Iterator[int]:
    position = text.find(keyword)
    while position >= 0:
        yield position
        position = text.find(keyword, position + 1)


def _word_start(text: str, index: int) -> int:
    while index > 0 and WORD.match(text[index - 1]):
        index -= 1
    return index


def _word_end(text: str, index: int) -> int:
    while index < len(text) and WORD.match(text[index]):
        index += 1
    return index


def _longer(variant: Variant) -> tuple[str, str, str, int, int, int, str]:
    return (variant.pattern.rule, variant.pattern.kind, variant.text, variant.inserted, variant.start, variant.end,
            variant.side)


def keyword_variants(patterns: list[Pattern], lines: list[str]) -> list[Variant]:
    """For every pattern, keyword and line where a match of the pattern covers an occurrence of the keyword: the
    line with a word character put before the word the keyword begins in (when it begins with one) and after the
    word it ends in (when it ends with one)."""
    out: dict[tuple[str, str, str, int, int, int, str], Variant] = {}
    for pattern in patterns:
        for line in lines:
            if pattern.regex.search(line) is None:
                continue
            for keyword in pattern.keywords:
                for start in _occurrences(line, keyword):
                    end = start + len(keyword)
                    if next(covering(pattern.regex, line, start, end), None) is None:
                        continue
                    for char in WORD_CHARACTERS:
                        made: list[Variant] = []
                        if WORD.match(keyword[0]):
                            at = _word_start(line, start)
                            made.append(Variant(pattern, line[:at] + char + line[at:], at, start + 1, end + 1,
                                                keyword, "start"))
                        if WORD.match(keyword[-1]):
                            at = _word_end(line, end)
                            made.append(Variant(pattern, line[:at] + char + line[at:], at, start, end, keyword, "end"))
                        for variant in made:
                            out.setdefault(_longer(variant), variant)
    return list(out.values())


def edge_variants(patterns: list[Pattern], lines: list[str]) -> list[Variant]:
    """For every pattern and line it matches (the match ``search`` gives): the line with a word character put
    before the word the match begins in (when it begins with one) and after the match when it ends with a word
    character at the end of a word (a match that stops inside a word, such as a reason cut at its most
    characters, is left alone)."""
    out: dict[tuple[str, str, str, int, int, int, str], Variant] = {}
    for pattern in patterns:
        for line in lines:
            found = pattern.regex.search(line)
            if found is None or found.end() == found.start():
                continue
            start, end = found.span()
            for char in WORD_CHARACTERS:
                made: list[Variant] = []
                if WORD.match(line[start]):
                    at = _word_start(line, start)
                    made.append(Variant(pattern, line[:at] + char + line[at:], at, start + 1, start + 1,
                                        "its first word", "start"))
                if WORD.match(line[end - 1]) and _word_end(line, end) == end:
                    made.append(Variant(pattern, line[:end] + char + line[end:], end, start, end, "its last word",
                                        "end"))
                for variant in made:
                    out.setdefault(_longer(variant), variant)
    return list(out.values())


KEYWORD_VARIANTS = keyword_variants(PATTERNS, KNOWN_LINES)
EDGE_VARIANTS = edge_variants(PATTERNS, KNOWN_LINES)


def matched_inside_a_word(variant: Variant) -> str | None:
    """What is wrong with a variant, or None: a match of its pattern that covers the keyword (or the match that was
    there) and begins inside the word made longer at its start, or ends inside the word made longer at its end.  A
    match that takes in the whole longer word is no fault: the pattern reads any text there (arm64's "Internal
    error: <reason>: <esr> [#1]", an RCU flavour "rcu_\\w+", the hex digits after "0x")."""
    if variant.side == "start":
        matches = covering(variant.pattern.regex, variant.text, variant.start, variant.end, variant.inserted + 1)
    else:
        matches = (m for m in covering(variant.pattern.regex, variant.text, variant.start, variant.end)
                   if m.end() <= variant.inserted)
    found = next(matches, None)
    if found is None:
        return None
    return (f"{variant.pattern.rule} {variant.pattern.kind}: {variant.what!r} matched inside a longer word "
            f"(made longer at its {variant.side}): {found.group()!r} in {variant.text!r}")


@pytest.mark.parametrize("pattern", PATTERNS, ids=[f"{p.rule}-{p.kind}" for p in PATTERNS])
def test_a_keyword_inside_a_longer_word_is_not_matched(pattern: Pattern) -> None:
    mine = [v for v in KEYWORD_VARIANTS if v.pattern is pattern]
    assert [problem for v in mine if (problem := matched_inside_a_word(v))] == []


@pytest.mark.parametrize("pattern", PATTERNS, ids=[f"{p.rule}-{p.kind}" for p in PATTERNS])
def test_a_match_neither_begins_nor_ends_inside_a_longer_word(pattern: Pattern) -> None:
    mine = [v for v in EDGE_VARIANTS if v.pattern is pattern]
    assert [problem for v in mine if (problem := matched_inside_a_word(v))] == []


def test_every_rule_is_checked_on_longer_words() -> None:
    """Every regex and follow regex gives variants of its match's edges, and all but four of its keywords: EDAC's
    " CE " and " UE " begin and end with a space, and mce_logged's follow keywords lead to a decoder's lines whose
    "EDAC sbridge MC1: " head is all its regex takes.  The variants are many."""
    every = {(p.rule, p.kind) for p in PATTERNS}
    no_keyword_inside = {("edac_corrected", "regex"), ("edac_uncorrected", "regex"), ("edac_uncorrected", "follow"),
                         ("mce_logged", "follow")}
    assert {(v.pattern.rule, v.pattern.kind) for v in KEYWORD_VARIANTS} == every - no_keyword_inside
    assert {(v.pattern.rule, v.pattern.kind) for v in EDGE_VARIANTS} == every
    assert len(KEYWORD_VARIANTS) >= 40000 and len(EDGE_VARIANTS) >= 10000


def test_the_checks_catch_the_defects_they_are_for() -> None:
    """The checks fail on patterns with the defect, at either end of a word, and pass the same patterns with the
    boundary; a pattern that reads any text where the longer word is passes too."""
    line = "BUG: unable to handle page fault for address: 0000000000001234"
    loose = Pattern("oops", "regex", re.compile(r"BUG: [a-z]"), ("BUG",), 1, True)
    ascii_only = Pattern("oops", "regex", re.compile(r"(?<![A-Za-z0-9])BUG: [a-z]"), ("BUG",), 1, True)
    bounded = Pattern("oops", "regex", re.compile(r"\bBUG: [a-z]"), ("BUG",), 1, True)
    assert _found(loose, "EDAC DEBUG: edac_create_csrow_object: device csrow0 created") is not None
    assert all(matched_inside_a_word(v) for v in keyword_variants([loose], [line]) if v.side == "start")
    assert {v.text[0] for v in keyword_variants([ascii_only], [line]) if matched_inside_a_word(v)} == {"_", "é"}
    assert [v for v in keyword_variants([bounded], [line]) if matched_inside_a_word(v)] == []
    tail = "NVRM: GPU at 0000:01:00.0 has fallen off the bus."
    open_end = Pattern("gone", "regex", re.compile(r"fallen off the bus"), ("fallen off the bus",), 1, True)
    closed_end = Pattern("gone", "regex", re.compile(r"\bfallen off the bus\b"), ("fallen off the bus",), 1, True)
    assert all(matched_inside_a_word(v) for v in keyword_variants([open_end], [tail]) if v.side == "end")
    assert all(matched_inside_a_word(v) for v in edge_variants([open_end], [tail]) if v.side == "end")
    assert [v for v in [*keyword_variants([closed_end], [tail]), *edge_variants([closed_end], [tail])]
            if matched_inside_a_word(v)] == []
    # A keyword a pattern spans with any text, not as its literal, may sit inside a longer word.
    spanning = Pattern("oops", "regex", re.compile(r"\bInternal error[^\[\n]{0,100}: [0-9a-f]{1,16} \[#\d+\]"),
                       ("Oops",), 1, True)
    found = keyword_variants([spanning], ["Internal error: Oops: 0000000096000005 [#2] PREEMPT SMP"])
    assert len(found) == 2 * len(WORD_CHARACTERS) and [v for v in found if matched_inside_a_word(v)] == []
