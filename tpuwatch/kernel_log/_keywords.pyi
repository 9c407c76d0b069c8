"""Types of the native keyword matcher (``_keywords.c``)."""

class Automaton:
    """Finds every occurrence of the keywords in one pass."""

    keywords: tuple[str, ...]
    states: int

    def __init__(self, keywords: tuple[str, ...]) -> None: ...
    def finds(self, text: str, start: int = ..., end: int = ..., /) -> list[tuple[int, str]]:
        """Every occurrence of a keyword in ``text[start:end]``, as (offset, keyword), sorted."""
