"""Matching one stream of kernel records in order, with a little bounded state between records.

The cross-record forms of real logs live here: a message printed over several
records (``lines``), the detail lines of one fault that must not count again
and that stand for it when its first line was lost (``follow``), and an event
that waits for the lines after it (``hold``, a CPER block's ``device_id:``).
State is a few records deep: at most ``MAX_OPEN_FAULTS`` open faults per rule,
``MAX_HELD`` waiting events and the events behind them, the last ``lines - 1`` messages.
A boot or a reload of the NVIDIA driver (``RESTARTS``) ends it all: what came
before can neither absorb nor stand for what comes after.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING

from tpuwatch.kernel_log.attribution import device_key, pci_of_key, prefix_device
from tpuwatch.kernel_log.records import Record
from tpuwatch.kernel_log.rule import RANK, Match

if TYPE_CHECKING:
    from tpuwatch.kernel_log.rules import RuleSet

MAX_OPEN_FAULTS = 32
MAX_HELD = 64
# Messages that start afresh: the kernel's banner at boot (start_kernel) and nvidia_init_module()'s at a load of
# the driver; they are among the prefilter's keywords, so that logscan feeds them.
RESTARTS = ("Linux version ", "VRM: loading NVIDIA UNIX")
_RESTART_STARTS = ("Linux version ", "NVRM: loading NVIDIA UNIX")


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

    ``feed(record)`` gives the matches the record completes (at most one for
    the record itself, plus any waiting events it ends), in the order of their
    first records: a match after a waiting event comes out with or after it;
    ``skip(n)`` tells it that ``n`` records matching no keyword went by unfed;
    ``flush()`` gives everything still waiting, at the end of a read or of the
    stream.
    """

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules
        self._rules = rules.rules
        self._always = bool(rules.unkeyed or rules.unkeyed_follow)
        self._can_match = rules.can_match
        self._search = rules.prefilter.search if rules.prefilter is not None else _nothing
        self._index = 0
        # Per rule, how far back its last event still counts (the longest hold of the rules it supersedes: _emit)
        # and its faults (its follow's within); _until: the last index at which something remembered does.
        self._looks_back = [-1] * len(self._rules)
        for i, rule in enumerate(self._rules):
            for j in rules.superseded_by[i]:
                self._looks_back[j] = max(self._looks_back[j], rule.hold)
        self._within = [rule.follow.within if rule.follow else -1 for rule in self._rules]
        self._until = -1
        self._context: deque[str] | None = deque(maxlen=rules.max_lines - 1) if rules.max_lines > 1 else None
        self._open: dict[int, deque[_Fault]] = {}
        self._held: list[_Held] = []
        self._due = 0  # the last index through which no waiting event's hold runs out
        self._later: list[Match] = []  # matches after a waiting event, given out once it ends
        self._latest: dict[int, int] = {}  # rule -> the last record any of its open faults took
        self._last: dict[int, tuple[int, int, str | None]] = {}  # rule -> (index, rank, pci) of its last event

    def feed(self, record: Record) -> list[Match]:
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
            self._context.append(message)
        if out is None:
            return []
        return self._in_order(out) if self._held or self._later else out

    def feed_found(self, record: Record) -> list[Match]:
        """``feed`` for a record already known to hold a keyword whose regexes may match (logscan's hits): the
        same matches, without looking again."""
        self._index += 1
        out = self._match(record)
        if self._context is not None:
            self._context.append(record.message)
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

    def fresh(self, pending: int = 0) -> bool:
        """True if a restart now, after ``pending`` more records without keywords, would change nothing but the
        context: no event since the last restart (so nothing waits and no fault is open: each starts with an
        event, which ``_emit`` remembers), or nothing waits and every event and fault remembered is further back
        than any rule looks (its ``hold``, its follow's ``within``), so that no later record can meet it."""
        return not (self._held or self._later) and self._until < self._index + pending

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
        if message.startswith(_RESTART_STARTS):
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
        taken = self._held_follows(follows, dict(matches), record_key, index, out, absorbed) if self._held else set()
        alone: list[tuple[int, Match]] = []
        for i, found in follows:
            if i in taken:
                continue
            key = found.pci or record_key
            fault = self._fault(i, found, key, index)
            if fault is not None and RANK[found.severity] <= fault.rank:
                fault.last = index
                self._fault_took(fault.rule, index)
                absorbed.append((fault.key, fault.rank))
            elif rules[i].follow.alone:  # type: ignore[union-attr]
                alone.append((i, found))
        options = [(RANK[m.severity], False, -i, i, m) for i, m in matches
                   if not _covered(m.pci or record_key, RANK[m.severity], absorbed)]
        options += [(RANK[m.severity], True, -i, i, m) for i, m in alone]
        if options:
            _, _, _, i, chosen = options[0] if len(options) == 1 else max(options, key=lambda o: o[:3])
            self._emit(i, chosen, record, record_key, index, out)
        return out

    def _held_follows(self, follows: tuple[tuple[int, Match], ...], primaries: dict[int, Match], record_key: str | None,
                      index: int, out: list[Match], absorbed: list[tuple[str | None, int]]) -> set[int]:
        """Waiting events are superseded (dropped: a rule that reports the fault matched this record, as severe,
        about the same device), take this record as one of their lines, keep waiting through a record of
        something else, or end (released: their ``hold`` is over, or their rule's next fault began).
        ``primaries``: rule -> its match on this record."""
        taken: set[int] = set()
        for held in list(self._held):
            rule = self._rules[held.rule]
            if any(held.superseded(RANK[m.severity], m.pci) for j in self.rules.superseded_by[held.rule]
                   if (m := primaries.get(j)) is not None):
                self._unwait(held)
                continue
            line = next((m for i, m in follows if i == held.rule), None)
            fault = self._fault(held.rule, line, line.pci or record_key, index) if line is not None else None
            if line is not None and fault is not None and fault.held is held and index - held.index <= rule.hold:
                fault.last = index
                self._fault_took(fault.rule, index)
                pci = line.pci or (pci_of_key(record_key) if fault.key is None else None)
                if held.match.pci is None and pci is not None:  # the first line named no device, this one does
                    held.match = replace(held.match, pci=pci)
                if RANK[line.severity] > fault.rank:  # a worse line of the same fault: the one event is that bad
                    held.match = replace(held.match, severity=line.severity)
                    fault.rank = RANK[line.severity]
                absorbed.append((fault.key, max(fault.rank, RANK[line.severity])))
                taken.add(held.rule)
                continue
            if index - held.index > rule.hold or held.rule in primaries:
                self._let_go(held, out)
        return taken

    def _emit(self, i: int, match: Match, record: Record, record_key: str | None, index: int,
              out: list[Match]) -> None:
        rule = self._rules[i]
        start = match.index if match.index is not None else index
        match = Match(match.rule, match.severity, match.pci, match.xid, match.fields, match.record or record, start)
        fault = _Fault(i, match.pci or record_key, match, index) if rule.follow is not None else None
        self._last[i] = (index, RANK[match.severity], match.pci)
        self._until = max(self._until, index + self._looks_back[i])
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

    def _fault_took(self, rule: int, index: int) -> None:
        """A fault of ``rule`` took record ``index``: its follow lines count for ``within`` records more."""
        self._latest[rule] = index
        self._until = max(self._until, index + self._within[rule])

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
        self._until = -1
        if self._context is not None:
            self._context.clear()
        return out

    def _joined(self, i: int, record: Record) -> Match | None:
        """Rule ``i`` on this record joined with the ones before it: a match that starts before it and ends in it."""
        rule = self._rules[i]
        assert self._context is not None
        previous = list(self._context)[-(rule.lines - 1):]
        if not previous:
            return None
        text = "\n".join([*previous, record.message])
        start = len(text) - len(record.message)
        for found in rule.regex.finditer(text):
            if found.start() < start < found.end():
                first = text.rfind("\n", 0, found.start()) + 1
                joined = Record(text[first:], record.kernel_device)
                match = rule.verdict(found, rule.severity)
                return replace(match, record=joined, index=self._index - text.count("\n", first))
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


def _covered(key: str | None, rank: int, absorbed: list[tuple[str | None, int]]) -> bool:
    """True if a match on a line that belongs to an open fault is that fault again (not more severe)."""
    return any(rank <= fault_rank and (not fault_key or not key or fault_key == key)
               for fault_key, fault_rank in absorbed)
