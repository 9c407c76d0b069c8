"""Did the boot before this one end in a crash?  pstore records and the journal's previous boot, read once.

At start a thread of its own (never the start-up's, never a cycle's) reads:

- pstore, where the kernel kept its last messages through the crash: ``paths.sysfs``/fs/pstore, files
  named ``dmesg-<backend>-<id>`` (``dmesg-efi-…``, ``dmesg-ramoops-N``, ``dmesg-erst-…``; fs/pstore/inode.c
  ``pstore_mkfile``: ``.enc.z`` when the kernel could not decompress one), and where systemd-pstore moved
  them (``kernel_log.pstore_archive``, ``dmesg-*`` and ``dmesg.txt`` files).  Each record opens with the
  dump's header, ``Panic#1 Part1`` (reason, dump count, part; fs/pstore/platform.c ``pstore_dump``); Part1
  holds the newest lines, in syslog form (``<0>[  246.088355] Kernel panic - not syncing: ...``).
- the journal's previous boot (systemd-python; the boot whose last entry precedes this boot's first): its
  kernel messages of the last ``WINDOW_S`` before its last entry.

A panic, an Oops, a fatal machine check or a fatal hardware error there becomes one critical
``previous_boot_panic`` event with its first lines, once per boot.  The lines are classed by the shipped
kernel-log rules, the same that read the live log: each rule that can tell how a boot ended says so
(``crash`` in its rule file: ``kernel_panic``, ``kernel_oops``, ``mce`` when fatal, ``cper_fatal``).  The
boot reported and the records seen the boot reported and the records seen
are kept in ``state_dir``/kernel_log/previous_boot.json, so neither a restart of tpuwatch nor a pstore
record nobody cleared reports it again.  Records older than ``MAX_RECORD_AGE_S`` before this boot began
are an older crash's.  Everything read is bounded (files, bytes, entries) and so is the time waited.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuwatch.hw.deadline import Call
from tpuwatch.kernel_log.events import KernelEvent
from tpuwatch.kernel_log.position import Position
from tpuwatch.kernel_log.records import MAX_MESSAGE_CHARS
from tpuwatch.kernel_log.rule import CRASH_KINDS
from tpuwatch.kernel_log.rulefile import load_rules
from tpuwatch.kernel_log.rules import RuleSet
from tpuwatch.samples import Sample, sample

log = logging.getLogger(__name__)

RULE = "previous_boot_panic"
MAX_FILES = 64
MAX_FILE_BYTES = 256 * 1024
MAX_WALK = 512  # directory entries looked at in the archive
MAX_JOURNAL_ENTRIES = 5000
WINDOW_S = 600.0
MAX_RECORD_AGE_S = 86400.0
READ_DEADLINE_S = 30.0
FIRST_LINES = 8
MAX_REMEMBERED = 64

_HEADER_RE = re.compile(r"(Panic|Oops|Emergency|Shutdown|Restart|Halt|Poweroff|Unknown)#(\d{1,9}) Part(\d{1,9})")
_PREFIX_RE = re.compile(r"<\d{1,3}>(?:\[\s*\d+\.\d+\])?(?:\[\s*[CT]\d+\])?\s?")
CRASH_REASONS = {"Panic": "panic", "Oops": "oops"}


@dataclass(frozen=True)
class Crash:
    """A crash found: its kind, where (pstore, journal), what identifies it, its first lines, when."""

    kind: str
    source: str
    identity: str
    lines: tuple[str, ...]
    where: str
    time: float | None = None

    def message(self) -> str:
        """The event message: what and where, then the first lines."""
        head = f"the previous boot ended in a kernel {self.kind.replace('_', ' ')} ({self.where})"
        return "\n".join((head, *self.lines))[:MAX_MESSAGE_CHARS]


def strip_prefix(line: str) -> str:
    """A pstore line without its ``<level>[timestamp][caller]`` prefix."""
    match = _PREFIX_RE.match(line)
    return line[match.end():] if match else line


@functools.cache
def shipped_rules() -> RuleSet:
    """The shipped kernel-log rules, loaded once, when a previous boot's lines are first classed (in the reading
    thread, never at start-up)."""
    return load_rules([])


def crash_lines(lines: list[str]) -> tuple[str, tuple[str, ...]] | None:
    """(kind, the first crash line and up to FIRST_LINES - 1 after it), or None when the lines show no crash.

    A line is a crash line when a shipped rule's match on it names a crash kind (``Rule.crash_kind``); of the
    kinds found, the most telling (``CRASH_KINDS``' order) is the crash's.
    """
    rules = shipped_rules()
    by_name = {rule.name: rule for rule in rules.rules}
    kinds: set[str] = set()
    first = None
    for index, line in enumerate(lines):
        for match in rules.match(line):
            kind = by_name[match.rule].crash_kind(match)
            if kind is not None:
                kinds.add(kind)
                first = index if first is None else first
    if first is None:
        return None
    kind = next(kind for kind in CRASH_KINDS if kind in kinds)
    return kind, tuple(line[:256] for line in lines[first:first + FIRST_LINES])


def parse_record(text: str) -> tuple[str, int, int, list[str]] | None:
    """(reason, dump count, part, lines) of a pstore dmesg record, or None without the header."""
    head, _, body = text.partition("\n")
    match = _HEADER_RE.fullmatch(head.strip())
    if match is None:
        return None
    return match[1], int(match[2]), int(match[3]), [strip_prefix(line) for line in body.splitlines()]


def record_crash(text: str, where: str, mtime: float | None) -> Crash | None:
    """The crash a record shows: a Panic or Oops dump, or another dump whose lines show one."""
    parsed = parse_record(text)
    if parsed is None:
        return None
    reason, count, part, lines = parsed
    found = crash_lines(lines)
    if found is None and reason not in CRASH_REASONS:
        return None
    kind, first = found if found is not None else (CRASH_REASONS[reason], tuple(lines[-FIRST_LINES:]))
    identity = hashlib.sha256(text[:4096].encode("utf-8", "replace")).hexdigest()[:32]
    return Crash(kind, "pstore", identity, first, f"pstore {where}, {reason}#{count} Part{part}", mtime)


def pstore_files(pstore: Path, archive: Path | None) -> Iterator[Path]:
    """dmesg records under the pstore mount and the systemd-pstore archive, at most MAX_FILES."""
    found = 0
    roots = [(pstore, 0), *([(archive, 3)] if archive is not None else [])]
    walked = 0
    for root, depth in roots:
        stack = [(root, 0)]
        while stack and found < MAX_FILES and walked < MAX_WALK:
            directory, level = stack.pop()
            try:
                entries = sorted(os.scandir(directory), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries[:MAX_WALK]:
                walked += 1
                if entry.is_dir(follow_symlinks=False) and level < depth:
                    stack.append((Path(entry.path), level + 1))
                elif entry.is_file(follow_symlinks=False) and (entry.name.startswith("dmesg-")
                                                               or entry.name == "dmesg.txt"):
                    found += 1
                    yield Path(entry.path)
                    if found >= MAX_FILES:
                        return


def pstore_crashes(pstore: Path, archive: Path | None, boot_time: float) -> list[Crash]:
    """Crashes in pstore records written no earlier than MAX_RECORD_AGE_S before this boot began.

    Of a dump split over several records the one with the lowest part (Part1: the newest lines) stands for it.
    """
    best: dict[tuple[str, str], tuple[int, Crash]] = {}
    for path in pstore_files(pstore, archive):
        if path.name.endswith(".enc.z"):
            log.warning("previous boot: %s is compressed (the kernel could not decompress it): not read", path)
            continue
        try:
            stat = path.stat()
            with open(path, "rb") as handle:
                text = handle.read(MAX_FILE_BYTES).decode("utf-8", "replace")
        except OSError as exc:
            log.warning("previous boot: cannot read %s: %s", path, exc.strerror)
            continue
        mtime = stat.st_mtime if stat.st_mtime > 0 else None
        if mtime is not None and mtime < boot_time - MAX_RECORD_AGE_S:
            continue
        crash = record_crash(text, path.name, mtime)
        parsed = parse_record(text)
        if crash is None or parsed is None:
            continue
        key = (str(path.parent), f"{parsed[0]}#{parsed[1]}")
        if key not in best or parsed[2] < best[key][0]:
            best[key] = (parsed[2], crash)
    return [crash for _, crash in best.values()]


def journal_crash(path: str | None, boot_id: str) -> Crash | None:
    """A crash among the previous boot's last kernel messages in the journal (None: none, or no journal)."""
    try:
        from systemd import journal
    except ImportError:
        return None
    reader = _open(journal, path)
    try:
        return _previous_boot_crash(reader, boot_id)
    finally:
        reader.close()


def _open(journal: Any, path: str | None) -> Any:
    if path is None:
        return journal.Reader()
    return journal.Reader(path=path) if os.path.isdir(path) else journal.Reader(files=[path])


def _previous_boot_crash(reader: Any, boot_id: str) -> Crash | None:
    reader.this_boot(boot_id)
    reader.seek_head()
    first = reader.get_next()
    if not first:
        return None
    reader.flush_matches()
    reader.seek_realtime(first["__REALTIME_TIMESTAMP"])
    previous = None
    for _ in range(1000):  # entries of this boot with the same timestamp come first
        entry = reader.get_previous()
        if not entry:
            return None
        if str(entry.get("_BOOT_ID", "")).replace("-", "") != boot_id.replace("-", ""):
            previous = entry
            break
    if previous is None:
        return None
    last = previous["__REALTIME_TIMESTAMP"].timestamp()
    previous_boot = previous["_BOOT_ID"]  # a UUID: this_boot() matches its hex form, as the journal keeps it
    reader.flush_matches()
    reader.this_boot(previous_boot)
    reader.add_match(_TRANSPORT="kernel")
    reader.seek_tail()
    lines: list[str] = []
    for _ in range(MAX_JOURNAL_ENTRIES):
        entry = reader.get_previous()
        if not entry or entry["__REALTIME_TIMESTAMP"].timestamp() < last - WINDOW_S:
            break
        lines.append(str(entry.get("MESSAGE", ""))[:MAX_MESSAGE_CHARS])
    lines.reverse()
    found = crash_lines(lines)
    if found is None:
        return None
    return Crash(found[0], "journal", f"journal:{getattr(previous_boot, 'hex', previous_boot)}", found[1],
                 f"journal, boot {previous_boot}", last)


def read_crashes(pstore: Path, archive: Path | None, journal_enabled: bool, journal: str | None, boot_id: str,
                 boot_time: float) -> list[Crash]:
    """Every crash pstore and (when enabled) the journal's previous boot show."""
    crashes = pstore_crashes(pstore, archive, boot_time)
    if journal_enabled:
        try:
            found = journal_crash(journal, boot_id)
        except Exception as exc:  # noqa: BLE001 - a broken journal must not hide what pstore holds
            log.warning("previous boot: the journal could not be read: %s: %s", type(exc).__name__, exc)
            found = None
        crashes += [found] if found is not None else []
    return crashes


def _state_check(state: dict[str, Any]) -> str | None:
    if not isinstance(state.get("boot_id"), str) or len(state["boot_id"]) > 64:
        return "boot_id is not a boot id"
    seen = state.get("seen")
    if not isinstance(seen, list) or len(seen) > MAX_REMEMBERED or not all(
            isinstance(s, str) and len(s) <= 128 for s in seen):
        return "seen is not a list of record identities"
    return None


class PreviousBootCollector:
    """The ``previous_boot`` source: reports the previous boot's crash once, exports what it found.

    Samples: ``tpuwatch_previous_boot_crash{kind,source}`` (1 per crash found) and
    ``tpuwatch_kernel_events_total{rule="previous_boot_panic",severity="critical",device=""}`` (1 on the
    start that reported it this boot, else 0).  ``recent_events()`` holds the event for /healthz and
    ``tpuwatch check``.
    """

    name = "previous_boot"

    def __init__(self, pstore: Path, archive: Path | None, journal: str | None, boot_id: str,
                 state_file: Path | None, journal_enabled: bool = True, boot_time: float | None = None,
                 wait: float = 0.0) -> None:
        self.boot_id = boot_id
        self.wait = wait  # how long one collect() may wait for the reading (a share of the collector deadline)
        self._position = Position(state_file, _state_check)
        saved = self._position.load()
        self._seen: list[str] = list(saved["seen"]) if saved else []
        self._reported_this_boot = saved is not None and saved["boot_id"] == boot_id
        self._crashes: list[Crash] | None = None
        self._events: list[KernelEvent] = []
        self._counted = 0
        self._problem: str | None = None
        started = boot_time if boot_time is not None else _boot_time()
        self._call = Call("previous-boot", lambda: read_crashes(pstore, archive, journal_enabled, journal, boot_id,
                                                                started))
        self._deadline = time.monotonic() + READ_DEADLINE_S

    @property
    def degraded(self) -> str | None:
        """Why the previous boot could not be looked at, or None."""
        return self._problem

    def collect(self) -> list[Sample]:
        """Take the reading once it is done (waiting ``wait`` at most), report a new crash once, return the
        samples."""
        if self._crashes is None:
            self._take()
        out = [sample("tpuwatch_previous_boot_crash", 1, kind=c.kind, source=c.source) for c in self._crashes or ()]
        return [*out, sample("tpuwatch_kernel_events_total", self._counted, rule=RULE, severity="critical",
                             device="")]

    def _take(self) -> None:
        if not self._call.wait(time.monotonic() + self.wait):
            if time.monotonic() > self._deadline and self._problem is None:
                self._problem = f"reading pstore and the journal took over {READ_DEADLINE_S:.0f}s: not looked at"
                log.warning("previous boot: %s", self._problem)
            return
        if self._call.error is not None:
            self._problem = f"reading the previous boot failed: {type(self._call.error).__name__}: {self._call.error}"
            log.warning("previous boot: %s", self._problem)
            self._crashes = []
            return
        self._problem = None
        self._crashes = list(self._call.result)
        new = [c for c in self._crashes if c.identity not in self._seen]
        if new and not self._reported_this_boot:
            crash = new[0]
            self._events = [KernelEvent(RULE, "critical", crash.message(), fields={"kind": crash.kind,
                                                                                   "source": crash.source},
                                        time=crash.time)]
            self._counted = 1
            log.error("kernel event %s (critical): %s", RULE, crash.message().replace("\n", " | ")[:1000])
        elif not self._crashes:
            log.info("previous boot: no crash found in pstore or the journal")
        self._seen = ([c.identity for c in self._crashes] + [s for s in self._seen if s not in
                                                             {c.identity for c in self._crashes}])[:MAX_REMEMBERED]
        self._position.save({"boot_id": self.boot_id, "seen": self._seen})

    def recent_events(self) -> list[KernelEvent]:
        """The previous_boot_panic event reported at this start (none when none, or already reported)."""
        return list(self._events)


def _boot_time() -> float:
    """When this boot began (wall clock), from the monotonic clock's start."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
