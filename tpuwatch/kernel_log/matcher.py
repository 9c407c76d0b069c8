"""Matching one stream of kernel records in order, with a little bounded state between records.

The cross-record forms of real logs live here: a message printed over several
records (``lines``), the detail lines of one fault that must not count again
and that stand for it when its first line was lost (``follow``), and an event
that waits for the lines after it (``hold``, a CPER block's ``device_id:``).
State is a few records deep: at most ``MAX_OPEN_FAULTS`` open faults per rule,
``MAX_HELD`` waiting events and the events behind them, the last ``lines - 1`` records.
A boot or a reload of the NVIDIA driver (``rules.RESTARTS``) ends it all: what
came before can neither absorb nor stand for what comes after.

Every reader of the kernel log (the daemon's sources, ``tpuwatch logscan``,
``tpuwatch check``) feeds its records through ``StreamMatcher.feed``; a text
log comes as ``Block``s, whose records without a keyword are counted, not
parsed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import replace

from tpuwatch.kernel_log.attribution import device_key, pci_of_key, prefix_device
from tpuwatch.kernel_log.blocks import Block
from tpuwatch.kernel_log.records import Record
from tpuwatch.kernel_log.rule import RANK, Match
from tpuwatch.kernel_log.rules import RESTART_STARTS, RuleSet
from tpuwatch.kernel_log.sieve import BacklogSieve

MAX_OPEN_FAULTS = 32
MAX_HELD = 64


class _Fault:
    """A fault seen recently: what its later lines must agree with."""

    __slots__ = ("rule", "key", "fields", "rank", "last", "held")

    def __init__(self, rule: int, key: str | None, match: Match, index: int) -> None:
        self.rule = rule
        self.key = key
        self.fields = match.fields
        self.rank = RANK[match.severity]
        self.last = index
        self.held: _Held | None = None


class _Held:
    """An event waiting for the lines after it; ``reported``: (rank, pci) of the events of rules that supersede
    it seen just before it (it is dropped if one of them is as severe and names the same device, or it names
    none); ``device``: the PCI function the message's own prefix names ("vfio-pci 0000:00:05.0: ..."); ``due``:
    the last index its hold covers."""

    __slots__ = ("rule", "match", "record", "index", "reported", "device", "due")

    def __init__(self, rule: int, match: Match, record: Record, index: int,
                 reported: list[tuple[int, str | None]], device: str | None, hold: int) -> None:
        self.rule = rule
        self.match = match
        self.record = record
        self.index = index
        self.reported = reported
        self.device = device
        self.due = index + hold

    def superseded(self, rank: int, pci: str | None) -> bool:
        """True if a report of this rank and device stands for this event: the same device or, for a report on
        function 0, another function of that device (a GPU gone takes its USB and audio functions with it); an
        event that names no device is any device's."""
        own = self.match.pci or self.device
        return rank >= RANK[self.match.severity] and (own is None or pci == own or _sibling(pci, own))


class StreamMatcher:
    """Matches the records of one stream in order; one stream, one matcher.

    ``feed(batch)`` gives the matches the records complete (at most one for
    each record itself, plus any waiting events they end), in the order of
    their first records: a match after a waiting event comes out with or after
    it; each match carries its record and the record's index in the stream.
    ``skip(n)`` tells it that ``n`` records went by unread (passed over in a
    backlog); ``flush()`` gives everything still waiting, at the end of a read
    or of the stream.
    """

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules
        self._rules = rules.rules
        self._always = bool(rules.unkeyed or rules.unkeyed_follow)
        self._can_match = rules.can_match
        self._search = rules.prefilter.search if rules.prefilter is not None else _nothing
        self._finds = rules.prefilter.finds if rules.prefilter is not None else _no_finds
        self._index = 0
        self._within = [rule.follow.within if rule.follow else -1 for rule in self._rules]
        self._context: deque[Record] | None = deque(maxlen=rules.max_lines - 1) if rules.max_lines > 1 else None
        self._open: dict[int, deque[_Fault]] = {}
        self._held: list[_Held] = []
        self._due = 0  # the last index through which no waiting event's hold runs out
        self._later: list[Match] = []  # matches after a waiting event, given out once it ends
        self._latest: dict[int, int] = {}  # rule -> the last record any of its open faults took
        self._last: dict[int, tuple[int, int, str | None]] = {}  # rule -> (index, rank, pci) of its last event
        self._absorbed: list[tuple[Match, Record]] = []
        self.errors = 0  # records whose matching failed (passed over)
        self.error: Exception | None = None  # the last such failure

    def feed(self, batch: Block | Sequence[Record], passing: BacklogSieve | None = None) -> list[Match]:
        """The matches the next records of the stream complete: a ``Block`` of a text log, or records.  With
        ``passing``, the lines of the storms it knows are passed over unread (``BacklogSieve``)."""
        out: list[Match] = []
        sieve = passing if passing is not None and passing.storms and not self._always else None
        items: Iterable[int | Record]
        if isinstance(batch, Block):
            items = sieve.walk(batch) if sieve is not None else batch.walk(
                None if self._always else self._finds, self.rules.max_lines - 1, self.rules.wants_context)
        else:
            items = sieve.each(batch) if sieve is not None else batch
        for item in items:
            if isinstance(item, int):
                out += self.skip(item)
                continue
            try:
                out += self._feed_one(item)
            except Exception as exc:  # noqa: BLE001 - no record may stop the stream: counted, passed over
                self.errors += 1
                self.error = exc
        return out

    def _feed_one(self, record: Record) -> list[Match]:
        """The matches for the next record of the stream."""
        self._index += 1
        message = record.message
        if self._always or (self._search(message) and self._can_match(message, self.expects_any)):
            out = self._match(record)
        elif self._held and self._index > self._due:  # a record no rule can take: a waiting event's hold runs out
            out = self._expired()
        else:  # nothing waits, or no hold runs out yet (what waits behind an event keeps waiting): nothing to give
            out = None
        if self._context is not None:
            self._context.append(record)
        if out is None:
            return []
        return self._in_order(out) if self._held or self._later else out

    def expects_any(self, rules: tuple[int, ...]) -> bool:
        """True if one of ``rules`` has a fault open that its follow lines may still belong to (an upper bound: the
        records the caller has not told about yet do not count); quick when none of them has had a fault since the
        last restart."""
        latest = self._latest
        if latest.keys().isdisjoint(rules):
            return False
        for rule in rules:
            if rule in latest and self._index - latest[rule] <= self._within[rule]:
                return True
        return False

    def skip(self, count: int) -> list[Match]:
        """``count`` records that contain no keyword went by: waiting events whose ``hold`` they pass end."""
        if count <= 0:
            return []
        self._index += count
        if self._context is not None:
            self._context.clear()
        return self._in_order(self._expired()) if self._held and self._index > self._due else []

    def _wait(self, held: _Held) -> None:
        """``held`` waits.  ``_due`` stays the smallest ``due`` of the waiting events: until the index passes it, a
        record no rule takes changes nothing, and ``_in_order`` has nothing to give (what waits behind an event
        keeps waiting)."""
        self._held.append(held)
        self._due = min(self._due, held.due) if len(self._held) > 1 else held.due

    def _unwait(self, held: _Held) -> None:
        """``held`` waits no more (``_wait``)."""
        self._held.remove(held)
        if held.due == self._due:
            self._due = min((other.due for other in self._held), default=0)

    def _expired(self) -> list[Match]:
        """The waiting events whose ``hold`` is over, let go."""
        out: list[Match] = []
        for held in [h for h in self._held if self._index > h.due]:
            self._let_go(held, out)
        return out

    def flush(self) -> list[Match]:
        """Every waiting event, now (the end of a read, or of the stream)."""
        out: list[Match] = []
        for held in list(self._held):
            self._let_go(held, out)
        return self._in_order(out)

    def _in_order(self, out: list[Match]) -> list[Match]:
        """Matches in the order of their first records: those after a still-waiting event wait behind it."""
        if not out and not self._later:
            return out
        later = self._later + out
        if self._held:
            first = min(held.index for held in self._held)
            self._later = [m for m in later if (m.index or 0) > first]
            later = [m for m in later if (m.index or 0) <= first]
        else:
            self._later = []
        return sorted(later, key=lambda m: m.index or 0)

    def _match(self, record: Record) -> list[Match]:
        index, message, rules = self._index, record.message, self._rules
        if message.startswith(RESTART_STARTS):
            return self._restart()
        primary, follows = self.rules.analyse(message)
        matches: list[tuple[int, Match]] = []
        for i, found in primary:
            if found is None and rules[i].lines > 1:
                found = self._joined(i, record)
            if found is not None:
                matches.append((i, found))
        out: list[Match] = []
        if not (follows or self._held):
            if not matches:
                return out
            if len(matches) == 1:  # the common case: one rule matches, no fault to belong to
                i, found = matches[0]
                self._emit(i, found, record, device_key(record) if rules[i].follow else None, index, out)
                return out
        record_key = device_key(record) if matches or follows or self._held else None
        absorbed: list[tuple[str | None, int]] = []
        taken = self._held_follows(follows, dict(matches), record, record_key, out, absorbed) if self._held else set()
        alone: list[tuple[int, Match]] = []
        for i, found in follows:
            if i in taken:
                continue
            key = found.pci or record_key
            fault = self._fault(i, found, key, index)
            if fault is not None and RANK[found.severity] <= fault.rank:
                self._took(fault, found, record, index)
                absorbed.append((fault.key, fault.rank))
            elif rules[i].follow.alone:  # type: ignore[union-attr]
                alone.append((i, found))
        options = [(RANK[m.severity], False, -i, i, m) for i, m in matches
                   if not _covered(m.pci or record_key, RANK[m.severity], absorbed)]
        options += [(RANK[m.severity], True, -i, i, m) for i, m in alone  # a lost first line, unless the line is
                    if not _covered(m.pci or record_key, RANK[m.severity], absorbed)]  # another fault's, as severe
        if options:
            _, _, _, i, chosen = options[0] if len(options) == 1 else max(options, key=lambda o: o[:3])
            self._emit(i, chosen, record, record_key, index, out)
        return out

    def _held_follows(self, follows: tuple[tuple[int, Match], ...], primaries: dict[int, Match], record: Record,
                      record_key: str | None, out: list[Match], absorbed: list[tuple[str | None, int]]) -> set[int]:
        """Waiting events are superseded (dropped: a rule that reports the fault matched this record, as severe,
        about the same device), take this record as one of their lines, keep waiting through a record of
        something else, or end (released: their ``hold`` is over, or their rule's next fault began).
        ``primaries``: rule -> its match on this record."""
        taken: set[int] = set()
        index = self._index
        for held in list(self._held):
            if index - held.index > self._rules[held.rule].hold:  # its hold ended with the record before this one
                self._let_go(held, out)
                continue
            if any(held.superseded(RANK[m.severity], m.pci) for j in self.rules.superseded_by[held.rule]
                   if (m := primaries.get(j)) is not None):
                self._unwait(held)
                continue
            line = next((m for i, m in follows if i == held.rule), None)
            fault = self._fault(held.rule, line, line.pci or record_key, index) if line is not None else None
            if line is not None and fault is not None and fault.held is held:
                self._took(fault, line, record, index)
                pci = line.pci or (pci_of_key(record_key) if fault.key is None else None)
                if held.match.pci is None and pci is not None:  # the first line named no device, this one does
                    held.match = replace(held.match, pci=pci)
                if RANK[line.severity] > fault.rank:  # a worse line of the same fault: the one event is that bad
                    held.match = replace(held.match, severity=line.severity)
                    fault.rank = RANK[line.severity]
                absorbed.append((fault.key, max(fault.rank, RANK[line.severity])))
                taken.add(held.rule)
                continue
            if held.rule in primaries:
                self._let_go(held, out)
        return taken

    def _emit(self, i: int, match: Match, record: Record, record_key: str | None, index: int,
              out: list[Match]) -> None:
        rule = self._rules[i]
        start = match.index if match.index is not None else index
        match = Match(match.rule, match.severity, match.pci, match.xid, match.fields, match.record or record, start)
        fault = _Fault(i, match.pci or record_key, match, index) if rule.follow is not None else None
        self._last[i] = (index, RANK[match.severity], match.pci)
        if rule.hold:
            reported = [(last[1], last[2]) for j in self.rules.superseded_by[i]
                        if (last := self._last.get(j)) is not None and last[0] >= index - rule.hold]
            prefix = prefix_device(record.message)  # the message's own prefix: a DEVICE= tag names more than that
            held = _Held(i, match, match.record or record, start, reported,
                         pci_of_key(prefix[1]) if prefix is not None else None, rule.hold)
            if len(self._held) >= MAX_HELD:
                self._let_go(self._held[0], out)
            self._wait(held)
            if fault is not None:
                fault.held = held
        else:
            out.append(match)
        if fault is not None:
            faults = self._open.get(i)
            if faults is None:
                faults = self._open[i] = deque(maxlen=MAX_OPEN_FAULTS)
            faults.append(fault)
            self._fault_took(i, index)

    def _took(self, fault: _Fault, line: Match, record: Record, index: int) -> None:
        """``fault`` takes the record at ``index``: ``line`` is one of its follow lines, no event of its own (kept in
        ``absorbed`` until ``take_absorbed``: a storm of them is a storm all the same)."""
        fault.last = index
        self._fault_took(fault.rule, index)
        self._absorbed.append((line, record))

    def take_absorbed(self) -> list[tuple[Match, Record]]:
        """The follow lines faults took since the last call, each with its record."""
        taken, self._absorbed = self._absorbed, []
        return taken

    def _fault_took(self, rule: int, index: int) -> None:
        """A fault of ``rule`` took record ``index``: its follow lines count for ``within`` records more."""
        self._latest[rule] = index

    def _fault(self, i: int, line: Match | None, key: str | None, index: int) -> _Fault | None:
        """The latest open fault of rule ``i`` that ``line`` can belong to."""
        follow = self._rules[i].follow
        if line is None or follow is None:
            return None
        for fault in reversed(self._open.get(i, ())):
            if index - fault.last > follow.within:
                continue
            if follow.same_device and fault.key and key and fault.key != key:
                continue
            if all(fault.fields.get(name, value) == value for name, value in line.fields.items()):
                return fault
        return None

    def _restart(self) -> list[Match]:
        """A boot or driver load: every waiting event ends, and no fault or report stays open."""
        out: list[Match] = []
        for held in list(self._held):
            self._let_go(held, out)
        self._open.clear()
        self._latest.clear()
        self._last.clear()
        if self._context is not None:
            self._context.clear()
        return out

    def _joined(self, i: int, record: Record) -> Match | None:
        """Rule ``i`` on this record joined with the ones before it: a match that ends in it (one that ends before it
        was the records before's; one that lies in it alone and did not match it alone looks behind into them)."""
        rule = self._rules[i]
        assert self._context is not None
        parts = [*list(self._context)[-(rule.lines - 1):], record]
        if len(parts) == 1:
            return None
        text = "\n".join(part.message for part in parts)
        starts = [0]
        for part in parts[:-1]:
            starts.append(starts[-1] + len(part.message) + 1)
        for found in rule.regex.finditer(text):
            if starts[-1] < found.end():
                first = max(k for k, at in enumerate(starts) if at <= found.start())
                joined = Record(text[starts[first]:], record.kernel_device, parts[first].line)
                match = rule.verdict(found, rule.severity)
                return replace(match, record=joined, index=self._index - (len(parts) - 1 - first))
        return None

    def _let_go(self, held: _Held, out: list[Match]) -> None:
        """The waiting event ends: its match, unless a report just before it stands for it."""
        self._unwait(held)
        if not any(held.superseded(rank, pci) for rank, pci in held.reported):
            match = held.match
            out.append(Match(match.rule, match.severity, match.pci, match.xid, match.fields, held.record, held.index))


def _sibling(pci: str | None, own: str) -> bool:
    """True if ``pci`` is function 0 of the device ``own`` is another function of ("0000:09:00.0", "0000:09:00.3")."""
    return pci is not None and pci.endswith(".0") and own[:-1] == pci[:-1]


def _nothing(message: str) -> None:
    """The prefilter of a rule set without keywords."""
    return None


def _no_finds(text: str) -> list[tuple[int, str]]:
    """The finds of a rule set without keywords."""
    return []


def _covered(key: str | None, rank: int, absorbed: list[tuple[str | None, int]]) -> bool:
    """True if a match on a line that belongs to an open fault is that fault again (not more severe)."""
    return any(rank <= fault_rank and (not fault_key or not key or fault_key == key)
               for fault_key, fault_rank in absorbed)
