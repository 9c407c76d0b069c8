"""What a storm's backlog may not hide: the lines of it that a critical rule may match.

When a source skips ahead over a backlog (``Source.skip_ahead``), the lines it
passes over go through a ``BacklogSieve`` first.  One compiled search of the
keywords of every rule that can give a critical event (bytes, no decoding)
picks out the lines that may be critical; the source reads those as records
after all, so the fault of a chip that happens in the middle of another's storm
is still reported.  A storm repeats itself: a line whose message (its
timestamp, syslog head and the numbers of its key=value pairs left out) was
picked before in this skip is not picked again, and at most ``limit`` lines are picked per skip; the rest are
passed over, counted as before.  Rules without keywords are not sieved.
"""

from __future__ import annotations

import re

from tpuwatch.kernel_log.rules import RuleSet, literal_alternation

MAX_PICKED = 4096  # lines picked out of one skip: each is read and matched like any other record
# What varies from one repeat of a message to the next: a kmsg head, a syslog head, a [timestamp], and the
# numbers of key=value pairs (pid=, seq=, count=).
_HEAD = re.compile(rb"(?:\d{1,20},\d{1,20},\d{1,20},[^;\n]{0,64};)?(?:[^\n]{0,64}? kernel: )?(?:\[[^\]\n]{0,40}\] ?)?")
_VALUE = re.compile(rb"=(?:0x)?[0-9a-fA-F]{1,20}\b")


class BacklogSieve:
    """Picks the maybe-critical lines out of chunks of a backlog passed over; see the module docstring."""

    def __init__(self, rules: RuleSet, limit: int = MAX_PICKED) -> None:
        words = sorted({keyword for rule in rules.rules if "critical" in rule.severities()
                        for keyword in rule.keywords})
        self._search = re.compile(literal_alternation(words).encode()).search if words else None
        self._limit = limit
        self._seen: set[bytes] = set()
        self.full = False  # the limit was reached in this skip: later lines were passed over unread

    def start(self) -> None:
        """A new skip: forget what was picked before."""
        self._seen.clear()
        self.full = False

    def pick(self, chunk: bytes) -> list[bytes]:
        """The lines of ``chunk`` (whole lines, newline-separated) to read after all, in order."""
        out: list[bytes] = []
        if self._search is None:
            return out
        position = 0
        while not self.full and (found := self._search(chunk, position)) is not None:
            start = chunk.rfind(b"\n", 0, found.start()) + 1
            end = chunk.find(b"\n", found.end())
            end = len(chunk) if end < 0 else end
            position = end + 1
            line = chunk[start:end]
            head = _HEAD.match(line)
            key = _VALUE.sub(b"=", line[head.end():] if head else line)
            if key in self._seen:
                continue
            if len(self._seen) >= self._limit:
                self.full = True
                break
            self._seen.add(key)
            out.append(line)
        return out
