"""The keyword prefilter: one regex that finds each keyword exactly, entered at rare characters, and says which
keywords a find can stand for."""

from __future__ import annotations

import random

import pytest

from tpuwatch.kernel_log.prefilter import PER_100K, Prefilter
from tpuwatch.kernel_log.rulefile import load_rules

SHIPPED = load_rules([])
SHIPPED_KEYWORDS = sorted(SHIPPED.prefilter.keywords) if SHIPPED.prefilter is not None else []


def _occurrences(text: str, keyword: str) -> list[int]:
    out, at = [], text.find(keyword)
    while at >= 0:
        out.append(at)
        at = text.find(keyword, at + 1)
    return out


def _check(prefilter: Prefilter, text: str) -> None:
    """Every find is a keyword where it says; every keyword in the text is found or stood for by a find there."""
    finds = prefilter.finds(text)
    assert finds == sorted(finds)
    for offset, keyword in finds:
        assert text.startswith(keyword, offset), (text, offset, keyword)
    found = prefilter.found(text)
    assert found == {keyword for _, keyword in finds}
    assert bool(prefilter.search(text)) is bool(finds)
    for keyword in prefilter.keywords:
        for offset in _occurrences(text, keyword):
            assert (offset, keyword) in finds or any(
                keyword in prefilter.hides[other] for _, other in finds), (text, keyword, offset)


@pytest.mark.parametrize("seed", range(40))
def test_finds_are_exact_and_miss_no_keyword(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "abAB :x" if seed % 2 else "ab \xe9\u20ac\U0001f600"  # texts and keywords of 1-, 2- and 4-byte str
    keywords = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(12)})
    like = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))  # anchors chosen around other text
    for prefilter in (Prefilter(keywords), Prefilter(keywords, like)):
        for _ in range(30):
            pieces = [rng.choice(keywords) if rng.random() < 0.5 else rng.choice(alphabet) for _ in range(12)]
            _check(prefilter, "".join(pieces))


def test_shipped_keywords_are_found_in_lines_that_hold_several() -> None:
    prefilter = Prefilter(SHIPPED_KEYWORDS)
    rng = random.Random(7)
    for _ in range(300):
        chosen = rng.sample(SHIPPED_KEYWORDS, 3)
        text = " ".join(keyword[: rng.randint(1, len(keyword))] if rng.random() < 0.3 else keyword
                        for keyword in chosen)
        _check(prefilter, f"[ 1.5] {text} [ 2.0] {''.join(chosen)}\n")


def test_overlapping_keywords_are_each_found() -> None:
    prefilter = Prefilter(["BUG", "BUG: soft lockup", "Oops", "is NOT usable", "NOT usable"])
    text = "BUG: soft lockup - CPU#3 stuck; Oops: GPU 0 is NOT usable"
    assert prefilter.finds(text) == [(0, "BUG: soft lockup"), (32, "Oops"), (44, "is NOT usable")]
    assert "BUG" in prefilter.hides["BUG: soft lockup"] and "NOT usable" in prefilter.hides["is NOT usable"]
    assert prefilter.finds("BUG: scheduling while atomic") == [(0, "BUG")]
    assert prefilter.finds("x NOT usable") == [(2, "NOT usable")]
    assert prefilter.search("x NOT usable") and prefilter.search("Oops") and not prefilter.search("NOT usabl")
    assert Prefilter([]).finds(text) == []


def test_texts_of_every_string_width_and_keywords_beyond_latin_1() -> None:
    """A block with a replaced bad byte (U+FFFD) or an emoji is a 2- or 4-byte str; keywords may be any text."""
    prefilter = Prefilter(["Xid", "temp \u2192 hot", "caf\xe9", "\U0001f525 fire"])
    for filler in ("", "\ufffd", "\U0001f600"):
        text = f"{filler}NVRM: Xid 79 caf\xe9 temp \u2192 hot {filler}\U0001f525 fire Xi"
        _check(prefilter, text)
        assert prefilter.found(text) == set(prefilter.keywords)
        assert prefilter.finds(f"{filler}temp \u2190 hot caf\xe8") == []


def test_keywords_are_not_entered_at_the_commonest_characters_of_kernel_logs() -> None:
    """A regex match attempt starts at each character that can begin a find: none of them should be common."""
    prefilter = Prefilter(SHIPPED_KEYWORDS)
    entered = {keyword[prefilter.anchor[keyword]] for keyword in prefilter.keywords}
    commonest = set(sorted(PER_100K, key=PER_100K.__getitem__, reverse=True)[:24])
    assert not entered & commonest, sorted(entered & commonest)
    first = {keyword[0] for keyword in prefilter.keywords}  # where a plain alternation starts its attempts
    assert sum(PER_100K.get(char, 0) for char in entered) < 0.6 * sum(PER_100K.get(char, 0) for char in first)


def test_a_keyword_of_regex_syntax_is_a_literal() -> None:
    prefilter = Prefilter(["x.y", "(?", "\\d", "a+"])
    assert prefilter.finds("xzy x.y (? \\d 5 aa+") == [(4, "x.y"), (8, "(?"), (11, "\\d"), (17, "a+")]


def test_keywords_are_entered_away_from_the_characters_of_the_text_like_which_is_searched() -> None:
    """Searching a storm's lines for every other keyword: anchors avoid the characters those lines are made of."""
    storm = "NVRM: Xid (PCI:0000:10:00): 31, pid=4242, name=job-7, Ch 00000008, intr 10000000. MMU Fault: ENGINE " \
            "GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f27_a2f48000. Fault is of type FAULT_PDE ACCESS_TYPE_READ"
    others = [keyword for keyword in SHIPPED_KEYWORDS if keyword not in storm]
    plain, like = Prefilter(others), Prefilter(others, storm)
    attempts = [sum(map(storm.count, {keyword[prefilter.anchor[keyword]] for keyword in others}))
                for prefilter in (plain, like)]  # where in the line the search starts a match attempt
    assert attempts[1] < 0.8 * attempts[0], attempts
    for text in (storm, "[ 1.0] " + " ".join(others)):
        assert like.finds(text) == plain.finds(text)
