"""Where rule keywords are in a text: every keyword found in one pass of one compiled regex.

Python's ``re`` steps through a text one character at a time and starts a
match attempt wherever a character can begin a keyword; kernel logs are full of
the capitals most keywords begin with (CPU, PCI, ACPI), so the regex enters
each keyword at its *anchor* instead: a position whose character is rare in
kernel logs, from a small set of characters that together cover every keyword
(chosen greedily: first the character that costs least per keyword it covers).
It matches only the anchor character and looks ahead for the rest of the
keyword, then behind for the whole of it, so each find is exact and finds may
overlap; at one anchor position the longest keyword wins, and ``hides`` says
which other keywords it may then stand for.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from operator import itemgetter

# How often each printable ASCII character occurs in everyday kernel log lines, per 100,000 characters: counted
# over the lines of the real logs in tests/testdata/kernel_log/corpus.yaml that give no event.  A character not
# here is rarer than all of them.
PER_100K = {
    ' ': 12833, '0': 9426, 'e': 6069, 'r': 4582, 'a': 3725, ':': 3706, 'i': 3210, 'd': 3132, 'o': 3042, 't': 3041,
    's': 2599, 'c': 2540, 'n': 2502, 'p': 1798, 'm': 1697, '1': 1673, 'l': 1579, 'u': 1509, '_': 1373, 'f': 1353,
    '2': 1084, '.': 1051, 'g': 1037, 'v': 912, 'E': 909, '3': 906, 'C': 894, 'R': 892, '4': 869, 'x': 853, 'h': 839,
    'P': 804, 'b': 802, '6': 724, 'M': 700, '8': 696, '5': 658, 'I': 651, 'k': 611, '-': 610, 'A': 587, 'D': 579,
    'w': 576, 'N': 553, '7': 541, 'y': 540, ']': 533, '[': 532, '=': 523, ',': 519, 'S': 493, '9': 469, 'U': 430,
    ')': 423, '(': 422, 'T': 421, '/': 400, 'G': 365, 'V': 349, 'O': 290, 'H': 285, 'B': 264, 'L': 257, 'F': 230,
    '*': 132, 'q': 129, '+': 124, '>': 105, 'X': 89, '{': 89, '}': 89, 'K': 82, '!': 76, '|': 72, "'": 71, '<': 69,
    'j': 66, 'W': 55, '#': 44, 'z': 42, 'Q': 37, ';': 33, '@': 31, '?': 28, '"': 26, 'Y': 20, 'J': 10, '\\': 4,
    '~': 4, 'Z': 1, '`': 1,
}


class Prefilter:
    """One search for ``keywords`` (see the module docstring).  ``like``: text the searched texts will be mostly
    made of (a storm's lines), whose characters are then avoided as anchors too."""

    def __init__(self, keywords: Iterable[str], like: str = "") -> None:
        self.keywords = tuple(sorted(set(keywords)))
        weights: dict[str, float] = dict(PER_100K)
        for char, n in Counter(like).items():
            weights[char] = weights.get(char, 0.0) + 100_000 * n / len(like)
        self.anchor = _anchors(self.keywords, weights)  # keyword -> the offset of its anchor character in it
        self._names: dict[str, str] = {}
        ends: list[tuple[str, str]] = []
        by_suffix: dict[str, list[str]] = {}
        for keyword in self.keywords:
            by_suffix.setdefault(keyword[self.anchor[keyword]:], []).append(keyword)
        for suffix, same in by_suffix.items():
            leaves = []
            for keyword in sorted(same, key=len, reverse=True):  # the longest first: it is the one reported
                name = f"k{len(self._names)}"
                self._names[name] = keyword
                leaves.append(f"(?<={re.escape(keyword)})(?P<{name}>)" if len(keyword) > len(suffix) else
                              f"(?P<{name}>)")
            ends.append((suffix, leaves[0] if len(leaves) == 1 else "(?:" + "|".join(leaves) + ")"))
        by_first: dict[str, list[tuple[str, str]]] = {}
        for suffix, end in ends:
            by_first.setdefault(suffix[0], []).append((suffix[1:], end))
        self.regex = re.compile("|".join(f"{re.escape(first)}(?={_trie(rest)})"
                                         for first, rest in sorted(by_first.items())) or "(?!)")
        self.search = self.regex.search
        """Truthy when a keyword is in a text: the quick answer for the many texts that hold none."""
        self.hides = {keyword: _hidden(keyword, by_suffix, self.anchor) for keyword in self.keywords}
        """The other keywords a find of each keyword may stand for (where it is found, they were not looked for)."""

    def finds(self, text: str) -> list[tuple[int, str]]:
        """Each keyword found in ``text``, as (offset, keyword), sorted (one per anchor: see ``hides``)."""
        names, anchor = self._names, self.anchor
        return sorted((m.start() - anchor[keyword], keyword) for m in self.regex.finditer(text)
                      if (keyword := names[m.lastgroup]))  # type: ignore[index]

    def found(self, text: str) -> set[str]:
        """The keywords found in ``text`` (each may stand for those it ``hides``)."""
        return set(map(itemgetter(1), self.finds(text)))


def _anchors(keywords: tuple[str, ...], weights: dict[str, float]) -> dict[str, int]:
    """Each keyword's anchor: its rarest character among a set of characters that covers all keywords (``weights``:
    how often a match attempt would start at a character; one not there is rarer than all)."""
    chosen: set[str] = set()
    left = set(keywords)
    while left:
        counts: dict[str, int] = {}
        for keyword in left:
            for char in set(keyword):
                counts[char] = counts.get(char, 0) + 1
        best = min(sorted(counts), key=lambda char: weights.get(char, 0.5) / counts[char])
        chosen.add(best)
        left = {keyword for keyword in left if best not in keyword}
    return {keyword: min((i for i, char in enumerate(keyword) if char in chosen),
                         key=lambda i: (weights.get(keyword[i], 0.5), i)) for keyword in keywords}


def _hidden(keyword: str, by_suffix: dict[str, list[str]], anchor: dict[str, int]) -> tuple[str, ...]:
    """The other keywords a find of ``keyword`` can stand for: found at the same anchor position, a longer match
    (or, for one as long, the one tried first) wins.  Such a keyword's part from its anchor on (``by_suffix``
    keys) begins this one's, and the parts before the anchors agree."""
    suffix, prefix = keyword[anchor[keyword]:], keyword[:anchor[keyword]]
    return tuple(other for end in range(1, len(suffix) + 1) for other in by_suffix.get(suffix[:end], ())
                 if other != keyword and (prefix.endswith(other[:anchor[other]])
                                          or other[:anchor[other]].endswith(prefix)))


def literal_alternation(words: list[str]) -> str:
    """A regex matching any of ``words``, factored as a trie so that the engine tries few branches per position."""
    return _trie([(word, "") for word in words])


def _trie(entries: list[tuple[str, str]]) -> str:
    """A regex for the entries (path, end): each path as a literal, then its end's regex; factored as a trie."""
    root: dict[str, dict] = {}  # type: ignore[type-arg]
    for path, end in entries:
        node = root
        for char in path:
            node = node.setdefault(char, {})
        node.setdefault("", {})[end] = {}

    def build(node: dict[str, dict]) -> str:  # type: ignore[type-arg]
        branches = []
        for char, child in sorted(node.items()):
            if not char:
                continue
            run = char
            while len(child) == 1 and "" not in child:  # a run without branches: one literal, no deeper call
                ((more, child),) = child.items()
                run += more
            branches.append(re.escape(run) + build(child))
        branches.extend(node.get("", ()))
        if not branches:
            return ""
        return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"

    return build(root)
