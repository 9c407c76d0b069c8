"""The keyword prefilter, both implementations: the native automaton finds every occurrence; the regex finds each
exactly, entered at rare characters, and says which keywords a find can stand for."""

from __future__ import annotations

import logging
import os
import platform
import random
import subprocess
import sys

import pytest

from tpuwatch.kernel_log import prefilter as prefilter_module
from tpuwatch.kernel_log.prefilter import PER_100K, Prefilter
from tpuwatch.kernel_log.rulefile import load_rules

SHIPPED = load_rules([])
SHIPPED_KEYWORDS = sorted(SHIPPED.prefilter.keywords) if SHIPPED.prefilter is not None else []
BUILT = prefilter_module.Automaton is not None
IMPLEMENTATIONS = [pytest.param(True, id="native", marks=pytest.mark.skipif(not BUILT, reason="not built")),
                   pytest.param(False, id="regex")]


def _occurrences(text: str, keyword: str) -> list[int]:
    out, at = [], text.find(keyword)
    while at >= 0:
        out.append(at)
        at = text.find(keyword, at + 1)
    return out


def _check(prefilter: Prefilter, text: str) -> None:
    """Every find is a keyword where it says; every keyword in the text is found (natively: each occurrence is a
    find) or stood for by a find there."""
    finds = prefilter.finds(text)
    assert finds == sorted(finds)
    for offset, keyword in finds:
        assert text.startswith(keyword, offset), (text, offset, keyword)
    found = prefilter.found(text)
    assert found == {keyword for _, keyword in finds}
    assert bool(prefilter.search(text)) is bool(finds)
    if prefilter.native:
        assert finds == sorted((at, k) for k in prefilter.keywords for at in _occurrences(text, k))
    for keyword in prefilter.keywords:
        for offset in _occurrences(text, keyword):
            assert (offset, keyword) in finds or any(
                keyword in prefilter.hides[other] for _, other in finds), (text, keyword, offset)


def test_the_native_matcher_is_built_where_the_tests_run_in_ci() -> None:
    """CI builds it (setup.py build_ext); without it every native test below would be skipped unseen."""
    if os.environ.get("TPUWATCH_REQUIRE_TOOLS") == "1":
        assert BUILT, "tpuwatch/kernel_log/_keywords.c is not built: run python setup.py build_ext --inplace"
    assert Prefilter(["x"]).native is BUILT and not Prefilter(["x"], native=False).native


@pytest.mark.parametrize("native", IMPLEMENTATIONS)
@pytest.mark.parametrize("seed", range(40))
def test_finds_are_exact_and_miss_no_keyword(seed: int, native: bool) -> None:
    rng = random.Random(seed)
    alphabet = "abAB :x" if seed % 2 else "ab \xe9\u20ac\U0001f600"  # texts and keywords of 1-, 2- and 4-byte str
    keywords = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(12)})
    prefilter = Prefilter(keywords, native=native)
    assert prefilter.native is native
    entered = prefilter_module.Automaton(tuple(keywords), tuple(rng.randrange(len(k)) for k in keywords)) if native \
        else None
    for _ in range(30):
        pieces = [rng.choice(keywords) if rng.random() < 0.5 else rng.choice(alphabet) for _ in range(12)]
        text = "".join(pieces)
        _check(prefilter, text)
        if entered is not None:  # entered anywhere (of 1-, 2- and 4-byte text), the same finds
            assert entered.finds(text) == prefilter.finds(text)
        if native:  # a slice: the occurrences wholly inside it, at their offsets in the whole text
            start, end = sorted((rng.randrange(len(text) + 1), rng.randrange(len(text) + 1)))
            inside = [(at, k) for at, k in prefilter.finds(text) if start <= at and at + len(k) <= end]
            assert prefilter.finds(text, start, end) == inside  # type: ignore[call-arg]
            assert bool(prefilter.search(text, start, end)) is bool(inside)  # type: ignore[call-arg]


@pytest.mark.parametrize("native", IMPLEMENTATIONS)
def test_shipped_keywords_are_found_in_lines_that_hold_several(native: bool) -> None:
    prefilter = Prefilter(SHIPPED_KEYWORDS, native=native)
    rng = random.Random(7)
    for _ in range(300):
        chosen = rng.sample(SHIPPED_KEYWORDS, 3)
        text = " ".join(keyword[: rng.randint(1, len(keyword))] if rng.random() < 0.3 else keyword
                        for keyword in chosen)
        _check(prefilter, f"[ 1.5] {text} [ 2.0] {''.join(chosen)}\n")


@pytest.mark.parametrize("native", IMPLEMENTATIONS)
def test_overlapping_keywords_are_each_found(native: bool) -> None:
    prefilter = Prefilter(["BUG", "BUG: soft lockup", "Oops", "is NOT usable", "NOT usable"], native=native)
    text = "BUG: soft lockup - CPU#3 stuck; Oops: GPU 0 is NOT usable"
    if native:
        assert prefilter.finds(text) == [(0, "BUG"), (0, "BUG: soft lockup"), (32, "Oops"), (44, "is NOT usable"),
                                         (47, "NOT usable")]
    else:
        assert prefilter.finds(text) == [(0, "BUG: soft lockup"), (32, "Oops"), (44, "is NOT usable")]
        assert "BUG" in prefilter.hides["BUG: soft lockup"] and "NOT usable" in prefilter.hides["is NOT usable"]
    assert prefilter.finds("BUG: scheduling while atomic") == [(0, "BUG")]
    assert prefilter.finds("x NOT usable") == [(2, "NOT usable")]
    assert prefilter.search("x NOT usable") and prefilter.search("Oops") and not prefilter.search("NOT usabl")
    assert Prefilter([], native=native).finds(text) == []


@pytest.mark.parametrize("native", IMPLEMENTATIONS)
def test_texts_of_every_string_width_and_keywords_beyond_latin_1(native: bool) -> None:
    """A block with a replaced bad byte (U+FFFD) or an emoji is a 2- or 4-byte str; keywords may be any text."""
    prefilter = Prefilter(["Xid", "temp \u2192 hot", "caf\xe9", "\U0001f525 fire"], native=native)
    for filler in ("", "\ufffd", "\U0001f600"):
        text = f"{filler}NVRM: Xid 79 caf\xe9 temp \u2192 hot {filler}\U0001f525 fire Xi"
        _check(prefilter, text)
        assert prefilter.found(text) == set(prefilter.keywords)
        assert prefilter.finds(f"{filler}temp \u2190 hot caf\xe8") == []


@pytest.mark.skipif(not BUILT, reason="not built")
@pytest.mark.parametrize("seed", range(30))
def test_the_native_matcher_skips_sixteen_characters_at_a_time_exactly(seed: int) -> None:
    """1-byte texts are skipped 16 characters at a time where the CPU can (by the nibbles of the characters that begin
    a keyword; past eight high nibbles, by a superset of them): every occurrence is still found, at every offset
    from a 16-character boundary and in the tail shorter than 16, with characters that share a keyword's nibbles
    around it."""
    rng = random.Random(seed)
    latin = [chr(c) for c in range(1, 256)]
    alphabet = rng.sample(latin, rng.choice((3, 8, 40, 120)))
    keywords = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(10)})
    automaton = prefilter_module.Automaton(tuple(keywords))
    entered = prefilter_module.Automaton(tuple(keywords), tuple(rng.randrange(len(k)) for k in keywords))
    for _ in range(20):
        text = "".join(rng.choice(alphabet if rng.random() < 0.3 else latin) for _ in range(rng.randint(0, 300)))
        expected = sorted((at, k) for k in keywords for at in _occurrences(text, k))
        assert automaton.finds(text) == expected and entered.finds(text) == expected
        assert automaton.search(text) is bool(expected) and entered.search(text) is bool(expected)
        start, end = sorted((rng.randrange(len(text) + 1), rng.randrange(len(text) + 1)))
        assert automaton.finds(text, start, end) == [(at, k) for at, k in expected
                                                    if start <= at and at + len(k) <= end]
    keyword = rng.choice(keywords)
    for offset in range(40):
        for length in (offset + len(keyword), offset + len(keyword) + 1, 64):
            text = "".join(rng.choice(latin) for _ in range(offset)) + keyword
            text = (text + "".join(rng.choice(latin) for _ in range(64)))[:max(length, offset + len(keyword))]
            assert automaton.finds(text) == sorted((at, k) for k in keywords for at in _occurrences(text, k))


_SCALAR_FUZZ = """
import random, sys
from tpuwatch.kernel_log._keywords import Automaton
assert not Automaton(("x",)).vector
rng = random.Random(int(sys.argv[1]))
latin = [chr(c) for c in range(1, 256)]
for _ in range(300):
    alphabet = rng.sample(latin, rng.choice((3, 8, 40)))
    keywords = tuple(sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(8)}))
    automaton = Automaton(keywords, tuple(rng.randrange(len(k)) for k in keywords))
    text = "".join(rng.choice(alphabet if rng.random() < 0.4 else latin) for _ in range(rng.randint(0, 200)))
    expected = sorted((at, k) for k in keywords for at in range(len(text)) if text.startswith(k, at))
    assert automaton.finds(text) == expected, (keywords, text)
print("ok")
"""


@pytest.mark.skipif(not BUILT, reason="not built")
def test_the_one_character_at_a_time_skip_finds_the_same_and_the_environment_can_choose_it() -> None:
    """Where the CPU cannot skip 16 characters at a time (arm64, an x86-64 without SSSE3), or TPUWATCH_KEYWORDS_SCALAR
    is set, 1-byte texts are skipped one character at a time, with the same finds."""
    assert prefilter_module.Automaton(("x",)).vector is (platform.machine() in ("x86_64", "AMD64"))
    for seed in (1, 2):
        done = subprocess.run([sys.executable, "-c", _SCALAR_FUZZ, str(seed)], capture_output=True, text=True,
                              env={**os.environ, "TPUWATCH_KEYWORDS_SCALAR": "1"}, timeout=120, check=False)
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.skipif(not BUILT, reason="not built")
def test_a_keyword_entered_past_its_start_is_found_with_the_characters_before_its_entry() -> None:
    """The automaton holds each keyword from its entry on (the prefilter's anchor: a character rare in logs) and
    compares the characters before it where that part is found, inside the slice scanned; keywords whose parts are
    one are each found."""
    automaton = prefilter_module.Automaton((" CE ", "  UE", "x"), (1, 2, 0))
    text = "mce: CPU supports 9 MCE banks; EDAC MC0: 1 CE memory; EDAC MC1:   UE x"
    assert automaton.finds(text) == [(42, " CE "), (64, "  UE"), (69, "x")]
    assert not automaton.search("9 MCE banks") and automaton.search("MC0: CE x") and automaton.search(" CE ")
    assert automaton.finds(" CE ", 1) == [] and automaton.finds("a CE b", 1) == [(1, " CE ")]
    assert automaton.finds("  CE  ") == [(1, " CE ")] and automaton.finds(" UE") == [] and not automaton.search(" UE")
    keywords = ("CE ", " CE ", "  CE ", "  ", "AER: Device recovery failed", "AER: device recovery failed")
    both = prefilter_module.Automaton(keywords, (0, 1, 2, 1, 7, 7))
    assert both.finds("MCE  CE x  ") == [(1, "CE "), (3, "  CE "), (3, "  "), (4, " CE "), (5, "CE "), (9, "  ")]
    assert both.finds("   ") == [(0, "  "), (1, "  ")]
    assert both.finds("AER: device recovery failed; AER: Device recovery failed") == [
        (0, "AER: device recovery failed"), (29, "AER: Device recovery failed")]
    assert prefilter_module.Automaton(("ab", "ab"), (1, 0)).finds("xab") == [(1, "ab")]  # a repeat: found once
    for entries in ((1,), (0, 0, 0, 0), (-1, 0, 0), (0, 0, 1), (2, 0, 0), ("1", 0, 0)):
        with pytest.raises((ValueError, TypeError)):
            prefilter_module.Automaton(("ab", "c", "d"), entries)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        prefilter_module.Automaton(("ab",), [0])  # type: ignore[arg-type]


@pytest.mark.skipif(not BUILT, reason="not built")
def test_the_native_matcher_takes_a_slice_and_long_texts() -> None:
    automaton = prefilter_module.Automaton(("ab", "b"))
    assert automaton.finds("abab", 1) == [(1, "b"), (2, "ab"), (3, "b")]
    assert automaton.finds("abab", 0, 3) == [(0, "ab"), (1, "b")] and automaton.finds("abab", 3, 1) == []
    assert automaton.finds("abab", -5, 99) == automaton.finds("abab")
    assert automaton.search("abab", 1, 2) and not automaton.search("abab", 0, 1) and not automaton.search("abab", 3, 1)
    text = "x" * 200_000 + "ab" + "\ufffd"  # long enough to be scanned with the GIL released; 2 bytes a character
    assert automaton.finds(text) == [(200_000, "ab"), (200_001, "b")]
    assert automaton.search(text) and not automaton.search(text, 0, 200_000)


@pytest.mark.skipif(not BUILT, reason="not built")
def test_the_native_matcher_refuses_what_it_cannot_build_and_the_prefilter_takes_the_regex(
        caplog: pytest.LogCaptureFixture) -> None:
    automaton_type = prefilter_module.Automaton
    with pytest.raises(TypeError):
        automaton_type(("ok", ""))
    with pytest.raises(TypeError):
        automaton_type(["a list"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        automaton_type(("x",)).finds(b"bytes")  # type: ignore[arg-type]
    automaton = automaton_type(("x",))
    with pytest.raises(TypeError):
        automaton.__init__(("y",))  # type: ignore[misc]  # its tables may be in use by a scan in another thread
    assert automaton.finds("xy") == [(0, "x")]
    huge = [chr(0x100 + i) * 64 for i in range(600)]  # 600 distinct characters x 38,400 states: too big a table
    with pytest.raises(ValueError):
        automaton_type(tuple(huge))
    with caplog.at_level(logging.WARNING, "tpuwatch.kernel_log.prefilter"):
        prefilter = Prefilter(huge)
    assert not prefilter.native and prefilter.finds("x" + huge[5]) == [(1, huge[5])]
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["kernel log"]
    assert "600 keywords (38400 characters) are too many for the native keyword matcher" in caplog.text


def test_keywords_are_not_entered_at_the_commonest_characters_of_kernel_logs() -> None:
    """A regex match attempt starts at each character that can begin a find: none of them should be common."""
    prefilter = Prefilter(SHIPPED_KEYWORDS, native=False)
    entered = {keyword[prefilter.anchor[keyword]] for keyword in prefilter.keywords}
    commonest = set(sorted(PER_100K, key=PER_100K.__getitem__, reverse=True)[:24])
    assert not entered & commonest, sorted(entered & commonest)
    first = {keyword[0] for keyword in prefilter.keywords}  # where a plain alternation starts its attempts
    assert sum(PER_100K.get(char, 0) for char in entered) < 0.6 * sum(PER_100K.get(char, 0) for char in first)


@pytest.mark.parametrize("native", IMPLEMENTATIONS)
def test_a_keyword_of_regex_syntax_is_a_literal(native: bool) -> None:
    prefilter = Prefilter(["x.y", "(?", "\\d", "a+"], native=native)
    assert prefilter.finds("xzy x.y (? \\d 5 aa+") == [(4, "x.y"), (8, "(?"), (11, "\\d"), (17, "a+")]
