"""Types of the native keyword matcher (``_keywords.c``)."""

class Automaton:
    """Finds every occurrence of the keywords in one pass."""

    keywords: tuple[str, ...]
    states: int
    vector: bool

    def __init__(self, keywords: tuple[str, ...], entries: tuple[int, ...] | None = None) -> None:
        """``entries``: where the automaton enters each keyword (default 0); any entries give the same finds, and
        those at characters rare in the texts the fewest steps."""
    def finds(self, text: str, start: int = ..., end: int = ..., /) -> list[tuple[int, str]]:
        """Every occurrence of a keyword in ``text[start:end]``, as (offset, keyword), sorted."""
    def search(self, text: str, start: int = ..., end: int = ..., /) -> bool:
        """True if a keyword occurs in ``text[start:end]``."""

def lines(text: str, start: int = ..., end: int = ..., /) -> tuple[int, int]:
    """The newlines in ``text[start:end]`` and the records whose first lines begin there (a line that begins with
    white space continues the one above; the line at ``start`` always begins one)."""

def is_text(data: bytes, /) -> bool:
    """True if ``data`` holds no control byte other than tab, LF and CR, nor DEL."""
