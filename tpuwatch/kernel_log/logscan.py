"""``tpuwatch logscan FILE [--rules PATH] [--json]``: run the kernel log rules over a file.

The file is read as the daemon reads a followed file, from its start: the
same splitter, the same matcher, the same events (``reader.LogReader`` over a
``filesource.StreamSource``).  Exit 0 when no critical event was found, 1 when one was, 2 for a usage,
config or rule file error or a file that cannot be read to its end (one line
on stderr).  Rotated logs compressed with gzip, xz or bzip2 are read as they
are; a zstd file, a binary journal file and the journal's multi-line forms
(json-pretty, json-sse, export) are refused with the command that gives a form it reads.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import io
import json
import lzma
import os
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO, TextIO

from tpuwatch.config import Config
from tpuwatch.devices import select_backend
from tpuwatch.kernel_log.attribution import Attribution, SysfsResolver, device_lookup
from tpuwatch.kernel_log.events import KernelEvent
from tpuwatch.kernel_log.filesource import StreamSource
from tpuwatch.kernel_log.reader import LogReader
from tpuwatch.kernel_log.rule import SEVERITIES
from tpuwatch.kernel_log.rulefile import load_rules
from tpuwatch.kernel_log.rules import RuleSet
from tpuwatch.schema import ConfigError

EXIT_OK, EXIT_CRITICAL, EXIT_USAGE = 0, 1, 2
# glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP_BYTES = 32 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The logscan options."""
    parser.add_argument("file", metavar="FILE", help="kernel log: dmesg text (with or without [seconds], -T or -H "
                        "timestamps), syslog, raw /dev/kmsg records, or journalctl -o json lines; - for stdin")
    parser.add_argument("--rules", metavar="PATH", action="append", default=[],
                        help="extra rule file or directory, on top of the shipped rules and "
                             "kernel_log.rules_dirs (repeatable; a rule named like a shipped one replaces it)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace, config: Config) -> int:
    """Scan ``args.file`` and print one line (or JSON object) per event and a summary."""
    try:
        rules = load_rules(config.kernel_log.rules_dirs, required=args.rules)
    except ConfigError as exc:
        print(f"tpuwatch: rule error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        raw = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
    except OSError as exc:
        print(f"tpuwatch: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    _keep_freed_memory()
    with raw:
        stream = _Reading(raw)
        refused = stream.refused()
        if refused:
            print(f"tpuwatch: logscan {args.file}: {refused}", file=sys.stderr)
            return EXIT_USAGE
        stats = Scan(stream, rules, _chip_lookup(config))
        events = stats.events()
        try:
            (_write_json if args.json else _write_text)(events, stats, args.file, sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:  # the reader went away (`| head`): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if stream.error:
        print(f"tpuwatch: logscan {args.file}: {stream.error} after {stats.lines} lines: the lines before it were "
              "scanned", file=sys.stderr)
    elif stats.skipped and 2 * stats.skipped >= stats.lines:
        print(f"tpuwatch: logscan {args.file}: {stats.skipped} of {stats.lines} lines are not text: is it a log?",
              file=sys.stderr)
    if stats.severities["critical"]:
        return EXIT_CRITICAL
    return EXIT_USAGE if stream.error else EXIT_OK


class Scan:
    """One file read from its start through the daemon's path; ``lines``, ``skipped`` and ``severities`` grow as
    ``events()`` is consumed."""

    def __init__(self, stream: _Reading, rules: RuleSet, attribution: Attribution) -> None:
        self._source = StreamSource(stream.read)
        self._reader = LogReader(self._source, rules, attribution, line_numbers=True)
        self.severities: Counter[str] = Counter()

    @property
    def lines(self) -> int:
        """Lines read."""
        return self._source.lines

    @property
    def skipped(self) -> int:
        """Lines that were no records (binary junk, over 64 KiB)."""
        return self._source.skipped["not_text"] + self._source.skipped["too_long"]

    def events(self) -> Iterator[KernelEvent]:
        """Every event, in order, as the file is read."""
        while True:
            for event in self._reader.read():
                self.severities[event.severity] += 1
                yield event
            if self._source.caught_up:
                for event in self._reader.finish():
                    self.severities[event.severity] += 1
                    yield event
                return


# The first bytes of compressed and binary files (each format's magic number).
_DECOMPRESS: tuple[tuple[bytes, Callable[[Any], Any]], ...] = (
    (b"\x1f\x8b", lambda raw: gzip.GzipFile(fileobj=raw)), (b"\xfd7zXZ\x00", lzma.LZMAFile), (b"BZh", bz2.BZ2File))
_JSON_LINES = "`journalctl -o json` (one entry per line)"
_REFUSE = ((b"\x28\xb5\x2f\xfd", "a zstd file: read it with `zstd -dc FILE | tpuwatch logscan -`"),
           (b"LPKSHHRH",
            "a binary journal file: read it with `journalctl --file FILE -k -o json | tpuwatch logscan -`"),
           (b'{\n\t"', f"journalctl -o json-pretty output, an entry over many lines: write it with {_JSON_LINES}"),
           (b"__CURSOR=", f"journalctl -o export output, an entry over many lines: write it with {_JSON_LINES}"),
           (b"data: {", f"journalctl -o json-sse output, an entry and a blank line: write it with {_JSON_LINES}"))


class _Reading:
    """The file's bytes, decompressed when its first bytes say it is compressed; a read error or damaged
    compressed data ends the data (``error`` says what), so that what was read before is still scanned and
    reported."""

    def __init__(self, raw: BinaryIO) -> None:
        self._stream: BinaryIO = raw
        self.error: str | None = None
        try:
            self._head = raw.peek(16)[:16] if isinstance(raw, io.BufferedReader) else b""
        except OSError as exc:
            self._head, self.error = b"", _reason(exc)
        opener = next((opener for magic, opener in _DECOMPRESS if self._head.startswith(magic)), None)
        if opener is not None:
            self._stream = opener(raw)

    def refused(self) -> str | None:
        """Why the file is not scanned at all, or None."""
        return next((why for magic, why in _REFUSE if self._head.startswith(magic)), None)

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes, fewer only at the end of the data."""
        if self.error is not None:
            return b""
        chunks, got = [], 0
        read = getattr(self._stream, "read1", self._stream.read)  # one piece at a time: an error loses none
        try:
            while got < size and (chunk := read(size - got)):
                chunks.append(chunk)
                got += len(chunk)
        except (OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
            self.error = _reason(exc)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "the compressed data ends too soon (a file still being written, or cut short)"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"damaged compressed data ({exc})"


def _keep_freed_memory() -> None:
    """Have glibc keep the memory of freed buffers for the next block of the file.  By default each 1 MiB
    buffer is mapped on its own and unmapped when freed, and faulting it in again for the next block costs
    about a twentieth of a scan.  Only this short-lived command does this; elsewhere than glibc nothing changes."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES)
        libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES)
    except (OSError, AttributeError):
        pass


def _chip_lookup(config: Config) -> Attribution:
    """PCI address -> chip index of this host's device backend (nothing found without one), and this host's
    sysfs (``paths.sysfs``) for the kernel's device tags: a log from another host gets this host's chips."""
    backend, _ = select_backend(config)
    readings = backend.read() if backend is not None else []
    return Attribution(device_lookup(lambda: readings), SysfsResolver(config.paths.sysfs))


def _write_text(events: Iterable[KernelEvent], stats: Scan, name: str, out: TextIO) -> None:
    for e in events:
        xid = f" xid={e.xid}" if e.xid is not None else ""
        count = f" x{e.count}" if e.count != 1 else ""
        out.write(f"{e.line:>7}  {e.severity:<8}  {e.rule:<20}  device={e.device or '-'}  pci={e.pci or '-'}"
                  f"{xid}{count}  {e.message}\n")
    total = sum(stats.severities.values())
    by = ", ".join(f"{stats.severities[s]} {s}" for s in SEVERITIES if stats.severities[s])
    out.write(f"{name}: {stats.lines} lines, {total} events{f' ({by})' if by else ''}, "
              f"{stats.skipped} lines skipped (not text or over 64 KiB)\n")


def _write_json(events: Iterable[KernelEvent], stats: Scan, name: str, out: TextIO) -> None:
    """One JSON document, written as the scan goes so memory does not grow with the file."""
    out.write(f'{{"file": {json.dumps(name)}, "events": [')
    out.writelines(("," if index else "") + "\n  " + json.dumps(event.to_json()) for index, event in enumerate(events))
    counts = {s: stats.severities[s] for s in SEVERITIES}
    out.write(f'\n], "lines": {stats.lines}, "skipped_lines": {stats.skipped}, "counts": {json.dumps(counts)}}}\n')
