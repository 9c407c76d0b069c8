"""What a storm may not hide: each storm's signature, and the test that passes its own lines over unread.

A storm is one rule on one device, at one severity, repeating.  When the
kernel log comes faster than tpuwatch may spend on it, the storm's own lines
are passed over (counted, ``reason="backlog"``) and every other line is still
read and matched (``StreamMatcher.feed`` with a sieve walks a block with
``BacklogSieve.walk``).  A record is a storm's line, and passed over, only when

- every keyword in it is one the storm's lines hold (so no other rule's keyword),
- it holds the rule's own keyword where the storm's match holds it,
- it names the storm's device as the storm's lines print it (the rule's ``pci``
  field, the kernel's ``DEVICE=`` tag, or the ``dev_printk`` prefix; a storm
  of no device: no tag and no prefix),
- it holds the values the rule's severity comes from (``severity_by``) as the
  storm's lines print them, so a worse line of the same rule and device (an
  Xid 79 amid the same GPU's Xid 13s) is read;
- every keyword the storms hold lies, in it, within the storm's *template*
  (its line's text from the first of those pieces to the last, ``VRM: Xid
  (PCI:0000:10:00): 13,``): the storm's text written into another line (a
  process name) does not make it one.

So another rule's line, another device's, or a worse one is never passed over,
however many distinct lines the storm has and whatever their severity.  A
record with an escape that parsing decodes (a kmsg ``\\xNN``, JSON) is always
read.  Rules without keywords leave nothing to pass over.

A block is walked as every block is (``Block.walk``, its records as the block
counts them), over the keywords no storm's lines hold; the sieve is what the
walk asks whether a record holding only the storms' keywords is passed over
(``held``, ``passes``).  That costs two searches of the block's text and a few
substring tests per storm line: the storms' records are never parsed.  A block
of nothing but the storms' lines (and lines without keywords) is told by
counting, with no test per record.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat

from tpuwatch.kernel_log.attribution import names_a_device, printed_prefix
from tpuwatch.kernel_log.blocks import Block
from tpuwatch.kernel_log.prefilter import Prefilter
from tpuwatch.kernel_log.records import Record
from tpuwatch.kernel_log.rule import Match
from tpuwatch.kernel_log.rules import RuleSet

MAX_STORMS = 16
_SEVERITY_CONTEXT = 3  # characters before a severity value kept with it: "): 13," not "13" (pid=1342)
_TAG = " DEVICE="
_MAX_SEARCHES = 32  # the searches built for sets of storms, kept to be used again


@dataclass(frozen=True)
class Storm:
    """What every line of one storm holds (see the module docstring)."""

    keywords: frozenset[str]
    pieces: tuple[str, ...]
    untagged: bool  # a storm of no device: its lines carry no DEVICE= tag and no dev_printk prefix
    template: str | None = None  # the text of its line from the first piece to the last, or None (a DEVICE= tag)
    times: tuple[tuple[str, int], ...] = ()  # each keyword of its line, and how often its line holds it
    line: str = field(default="", compare=False)  # the line it was learned from


class BacklogSieve:
    """The storms being passed over, and the test of a record against them; ``passed`` counts the records passed."""

    def __init__(self, rules: RuleSet) -> None:
        self._ruleset = rules
        self._rules = {rule.name: rule for rule in rules.rules}
        prefilter = rules.prefilter
        self._keywords = prefilter.keywords if prefilter is not None else ()
        self._finds = prefilter.finds if prefilter is not None else None
        self._hides = prefilter.hides if prefilter is not None else {}
        self.usable = prefilter is not None and not (rules.unkeyed or rules.unkeyed_follow)
        self.storms: tuple[Storm, ...] = ()
        self.passed = 0
        self._counts: dict[Storm, int] = {}  # lines passed over per storm, before the storms in use now
        self._tally: list[int] = []  # lines passed over per storm in use now (self.storms' order)
        # Each storm; the keywords its lines do not hold; each keyword the storms hold, and how often its template
        # holds it (a line of it holds a keyword only within its template).
        self._tests: tuple[tuple[int, Storm, tuple[str, ...], tuple[tuple[str, int], ...]], ...] = ()
        self._others: Prefilter | None = None  # the keywords no storm's lines hold
        self._held: Prefilter | None = None  # the keywords the storms' lines hold
        self._searches: dict[tuple[Storm, ...], tuple[Prefilter, Prefilter]] = {}  # the two, kept
        self._whole: _Whole | None = None  # how a block of nothing but the storms' lines is told (see _whole_block)

    def use(self, storms: Iterable[Storm]) -> None:
        """Pass over the lines of these storms (at most MAX_STORMS) from now on."""
        chosen = tuple(dict.fromkeys(storms))[:MAX_STORMS] if self.usable else ()  # two keys' lines may look alike
        if chosen == self.storms and self._others is not None:
            return
        self._fold()
        self.storms = chosen
        self._tally = [0] * len(chosen)
        held = sorted({keyword for storm in self.storms for keyword in storm.keywords})
        self._tests = tuple((at, storm, tuple(k for k in held if k not in storm.keywords),
                             tuple((k, n) for k in held if storm.template and (n := storm.template.count(k))))
                            for at, storm in enumerate(self.storms))
        if len(self._searches) >= _MAX_SEARCHES:
            self._searches.clear()
        self._others, self._held = self._searches.setdefault(self.storms, (  # anchored where their lines are not
            Prefilter((k for k in self._keywords if k not in held), "\n".join(storm.line for storm in self.storms)),
            Prefilter(held)))
        self._whole = _Whole.of(self.storms, held)

    def key(self, match: Match, pci: str | None) -> tuple[object, ...]:
        """What lines of one storm share: the rule, the device, the severity and the values it comes from (an Xid 13
        storm and an Xid 31 storm of one GPU are two storms, as their lines hold different values)."""
        rule = self._rules.get(match.rule)
        values = tuple(match.xid if by.field == "xid" else match.fields.get(by.field)
                       for by in (rule.severity_by if rule is not None else ()))
        return match.rule, pci or "", match.severity, values

    def storm(self, match: Match, record: Record) -> Storm | None:
        """The signature of the storm ``match`` on ``record`` is a line of (an event's, or a follow line a fault
        took), or None when its text cannot tell its lines from others' (its device came from another line)."""
        rule = self._rules.get(match.rule)
        if rule is None:
            return None
        message = record.message
        found = rule.regex.search(message) or (rule.follow.regex.search(message) if rule.follow else None)
        if found is None:
            return None
        own = [k for k in (*rule.keywords, *(rule.follow.keywords if rule.follow else ())) if k in found[0]]
        if not own:
            return None
        pieces: list[tuple[int, int]] = []  # spans of what tells one storm from another first (refused at once)
        groups = found.groupdict()
        for by in rule.severity_by:
            if groups.get(by.field) is not None:
                start, end = found.span(by.field)
                pieces.append((max(0, start - _SEVERITY_CONTEXT), min(len(message), end + 1)))
        named = next((name for name in ("pci", "pci_id") if groups.get(name) is not None), None)
        if match.pci is not None and named is None:
            return None  # the device came from a line after it
        tag = None
        if named is not None:
            pieces.append(found.span(named))
        elif record.kernel_device:
            tag = _TAG + record.kernel_device
        elif (prefix := printed_prefix(message)) is not None:
            pieces.append((0, len(prefix)))
        pieces.extend((found.start() + found[0].find(k), found.start() + found[0].find(k) + len(k))
                      for k in dict.fromkeys(own))
        texts = tuple(message[start:end] for start, end in pieces) + ((tag,) if tag else ())
        template = None if tag else message[min(s for s, _ in pieces):max(e for _, e in pieces)]
        untagged = named is None and not record.kernel_device and printed_prefix(message) is None
        times = tuple((k, message.count(k)) for k in self._keywords if k in message)
        return Storm(frozenset(k for k, _ in times), texts, untagged, template, times, message)

    def take_counts(self) -> dict[Storm, int]:
        """The lines passed over per storm since the last call."""
        self._fold()
        counts, self._counts = self._counts, {}
        return counts

    def each(self, records: Sequence[Record]) -> Iterator[int | Record]:
        """``records`` (read whole: journal entries), the storms' passed over (one each, as ``1``)."""
        assert self._finds is not None  # usable
        held = {keyword for storm in self.storms for keyword in storm.keywords}
        for record in records:
            keywords = {keyword for _, keyword in self._finds(record.message)}
            for keyword in list(keywords):  # and those a find stands for (Prefilter.hides)
                keywords.update(other for other in self._hides.get(keyword, ()) if other in record.message)
            raw = record.message if record.kernel_device is None else \
                f"{record.message}\n{_TAG}{record.kernel_device}"
            yield 1 if keywords and keywords <= held and self.passes(raw) else record

    def walk(self, block: Block) -> Iterator[int | Record]:
        """The records of ``block`` to read, and between them how many went by that hold no keyword or are a
        storm's line (passed over, counted in ``passed``), as ``StreamMatcher`` takes them: ``Block.walk`` over the
        keywords no storm's lines hold, passing over the storms' lines (``held``, ``passes``); a block that holds
        no such keyword goes by at once when its records are nothing but the storms' lines (``_whole_block``)."""
        assert self._others is not None  # storms are in use
        text = block.text
        reads = self._others.finds(text)
        if not reads and "\\" not in text and self._whole_block(text, block.raws()):
            return iter((len(block),))
        return block.walk(lambda _: reads, self._ruleset.max_lines - 1, self._ruleset.wants_context, self)

    def held(self, text: str) -> list[int]:
        """Where the keywords the storms' lines hold are in ``text`` (``Passing.held``)."""
        assert self._held is not None  # storms are in use
        return [offset for offset, _ in self._held.finds(text)]

    def _whole_block(self, text: str, records: list[str]) -> bool:
        """True if every record of ``text`` (which holds no escape and no keyword but the storms') that holds a
        keyword is a storm's line, told by counting (``_Whole``).  They are passed over and counted, and nothing else
        in the block needs reading."""
        whole = self._whole
        if whole is None:
            return False
        if whole.untagged and (_TAG in text or names_a_device(text)):
            return False  # a storm of no device, and a record that names one
        counts = [text.count(template) for template in whole.templates]
        if any(text.count(keyword) != sum(map(operator.mul, counts, times)) for keyword, times in whole.times):
            return False
        holds: dict[int, list[bool]] = {}  # per template, whether each record holds it

        def templated(ats: Iterable[int]) -> list[bool]:
            """Whether each record holds one of these templates."""
            for at in ats:
                if at not in holds:
                    holds[at] = list(map(operator.contains, records, repeat(whole.templates[at])))
            return list(map(any, zip(*(holds[at] for at in ats))))

        for keyword, holders in whole.outside:
            if any(map(operator.gt, map(operator.contains, records, repeat(keyword)), templated(holders))):
                return False
        self.passed += sum(map(operator.contains, records, repeat(whole.common))) if whole.common is not None else \
            sum(templated(range(len(whole.templates))))
        for index, at in enumerate(whole.of_storm):
            self._tally[index] += counts[at]
        return True

    def passes(self, raw: str) -> bool:
        """True if ``raw`` (a record's text, which holds no keyword no storm holds) is a storm's line: counted, passed
        over (``Passing.passes``).  With a template, the keywords in it occur in the line only within the template's
        occurrences: the storm's text written inside another line (a process name) does not make it one."""
        holds = raw.__contains__
        for index, storm, foreign, within in self._tests:
            if not all(map(holds, storm.pieces)) or any(map(holds, foreign)) or (
                    storm.untagged and (_TAG in raw or names_a_device(raw))):
                continue
            if within:
                assert storm.template is not None  # templates are what ``within`` counts in
                times = raw.count(storm.template)
                if not times or any(raw.count(keyword) != times * count for keyword, count in within):
                    continue
            self.passed += 1
            self._tally[index] += 1
            return True
        return False

    def _fold(self) -> None:
        """Move the lines passed over per storm in use into ``_counts``."""
        for storm, count in zip(self.storms, self._tally):
            if count:
                self._counts[storm] = self._counts.get(storm, 0) + count
        self._tally = [0] * len(self.storms)


@dataclass(frozen=True)
class _Whole:
    """How a block that holds no keyword but the storms' is told to be nothing but their lines, by counting.

    Every storm has a template; a keyword ``common`` to all of them, if there is one, counts their lines (a record
    holding it is one of them), else the records holding a template do; with a storm of no device among them, no
    record of the block names a device.  Each keyword lies, in the lines that hold it, either only within their
    templates (then every occurrence in the block lies in an occurrence of a template, the counts tell) or only
    outside them ("GPU has fallen off the bus." after an Xid 79's template: ``outside``, then every record holding it
    also holds one of their templates); either way its count is the sum, over the templates, of their occurrences
    times the keyword's in their lines.
    """

    common: str | None
    templates: tuple[str, ...]  # distinct: storms of one template (an Xid's events and its follow lines) count once
    of_storm: tuple[int, ...]  # each storm's template
    times: tuple[tuple[str, tuple[int, ...]], ...]  # each keyword, and how often a line of each template holds it
    outside: tuple[tuple[str, tuple[int, ...]], ...]  # each keyword outside templates, and the templates it follows
    untagged: bool  # a storm of no device: no record may name one

    @classmethod
    def of(cls, storms: Sequence[Storm], held: Sequence[str]) -> _Whole | None:
        """The plan for these storms, or None when their lines must be told one by one."""
        if not storms or not all(storm.template for storm in storms):
            return None
        lines: dict[str, dict[str, int]] = {}  # each template, and the keywords of its lines
        for storm in storms:
            if lines.setdefault(storm.template or "", dict(storm.times)) != dict(storm.times):
                return None
        templates = tuple(lines)
        common = set.intersection(*(set(storm.pieces) for storm in storms)) & set(held)
        times = tuple((keyword, tuple(lines[template].get(keyword, 0) for template in templates)) for keyword in held)
        outside = []
        for keyword, counts in times:
            within = [template.count(keyword) for template in templates]
            if not any(within):
                outside.append((keyword, tuple(at for at, n in enumerate(counts) if n)))
            elif within != list(counts):
                return None  # within the template in some lines, outside it in others
        return cls(min(common) if common else None, templates,
                   tuple(map(templates.index, (storm.template for storm in storms))), times, tuple(outside),
                   any(storm.untagged for storm in storms))
