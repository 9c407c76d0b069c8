"""What a storm's backlog may not hide: the lines of it that a critical rule may match.

When a source skips ahead over a backlog (``Source.skip_ahead``), the chunks it
passes over go through a ``BacklogSieve`` first.  One compiled search of the
keywords of every rule that can give a critical event (bytes, no decoding)
tells whether a chunk may hold such a line; if so, its lines are told apart by
their message (the timestamp, syslog or kmsg head and the numbers of key=value
pairs left out, all in C over the whole chunk), and each message a critical
keyword is in is picked once per skip: a storm repeats one message, so another
chip's fault in its middle stands out.  The source reads the picked lines as
records after all.  At most ``limit`` lines are picked per skip, and only while
its ``in_time()`` holds, so that the skip still reaches the newest records in
time; past either, the rest is passed over unsieved (``full``, ``unsieved``).
Rules without keywords are not sieved.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tpuwatch.kernel_log.prefilter import literal_alternation
from tpuwatch.kernel_log.records import KMSG_HEAD
from tpuwatch.kernel_log.rules import RuleSet

MAX_PICKED = 4096  # lines picked out of one skip: each is read and matched like any other record
# What varies from one repeat of a message to the next: a kmsg head, a syslog head, a [timestamp] (each right
# after the newline before the line), and the numbers of key=value pairs (pid=, seq=, count=).
_HEADS = re.compile(rb"\n(?:%s)?(?:[^\n]{0,64}? kernel: )?(?:\[[^\]\n]{0,40}\] ?)?" % KMSG_HEAD.encode())
_VALUES = re.compile(rb"=(?:0x)?[0-9a-fA-F]{1,20}\b")


def _always() -> bool:
    return True


class BacklogSieve:
    """Picks the maybe-critical lines out of chunks of a backlog passed over; see the module docstring."""

    def __init__(self, rules: RuleSet, limit: int = MAX_PICKED) -> None:
        words = sorted({keyword for rule in rules.rules if "critical" in rule.severities()
                        for keyword in rule.keywords})
        self._search = re.compile(literal_alternation(words).encode()).search if words else None
        self._limit = limit
        self._seen: set[bytes] = set()
        self._in_time: Callable[[], bool] = _always
        self.full = False  # the limit was reached in this skip
        self.unsieved = False  # its time ran out in this skip

    def start(self, in_time: Callable[[], bool] = _always) -> None:
        """A new skip, sieved while ``in_time()``: forget what was picked before."""
        self._seen.clear()
        self._in_time = in_time
        self.full = self.unsieved = False

    @property
    def active(self) -> bool:
        """True while this skip's lines are still sieved (neither ``full`` nor out of time)."""
        if not (self.full or self.unsieved) and not self._in_time():
            self.unsieved = True
        return not (self.full or self.unsieved)

    def pick(self, chunk: bytes) -> list[bytes]:
        """The lines of ``chunk`` (whole lines, newline-separated) to read after all, in order."""
        search = self._search
        if search is None or not self.active or search(chunk) is None:
            return []
        lines = chunk.split(b"\n")
        keys = _VALUES.sub(b"=", _HEADS.sub(b"\n", b"\n" + chunk)).split(b"\n")[1:]  # one per line
        picked: list[int] = []
        for key, index in dict(zip(keys, range(len(keys)))).items():  # each message once (its last line)
            if key in self._seen or search(key) is None:
                continue
            if len(self._seen) >= self._limit:
                self.full = True
                break
            self._seen.add(key)
            picked.append(index)
        return [lines[index] for index in sorted(picked)]
