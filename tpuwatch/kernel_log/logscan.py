"""``tpuwatch logscan FILE [--rules PATH] [--json]``: run the kernel log rules over a file.

Exit 0 when no critical event was found, 1 when one was, 2 for a usage,
config or rule file error (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from typing import TextIO

from tpuwatch.config import Config
from tpuwatch.devices import select_backend
from tpuwatch.kernel_log.attribution import Attribution, SysfsResolver, device_lookup
from tpuwatch.kernel_log.events import KernelEvent
from tpuwatch.kernel_log.rules import SEVERITIES, load_rules
from tpuwatch.kernel_log.scan import ScanStats, scan
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
        stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
    except OSError as exc:
        print(f"tpuwatch: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    _keep_freed_memory()
    stats = ScanStats()
    with stream:
        events = scan(stream, rules, _chip_lookup(config), stats)
        try:
            (_write_json if args.json else _write_text)(events, stats, args.file, sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:  # the reader went away (`| head`): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError as exc:
            print(f"tpuwatch: logscan {args.file}: {exc.strerror}", file=sys.stderr)
            return EXIT_USAGE
    return EXIT_CRITICAL if stats.severities["critical"] else EXIT_OK


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


def _write_text(events: Iterable[KernelEvent], stats: ScanStats, name: str, out: TextIO) -> None:
    for e in events:
        xid = f" xid={e.xid}" if e.xid is not None else ""
        count = f" x{e.count}" if e.count != 1 else ""
        out.write(f"{e.line:>7}  {e.severity:<8}  {e.rule:<20}  device={e.device or '-'}  pci={e.pci or '-'}"
                  f"{xid}{count}  {e.message}\n")
    total = sum(stats.severities.values())
    by = ", ".join(f"{stats.severities[s]} {s}" for s in SEVERITIES if stats.severities[s])
    out.write(f"{name}: {stats.lines} lines, {total} events{f' ({by})' if by else ''}, "
              f"{stats.skipped} lines skipped (not text or over 64 KiB)\n")


def _write_json(events: Iterable[KernelEvent], stats: ScanStats, name: str, out: TextIO) -> None:
    """One JSON document, written as the scan goes so memory does not grow with the file."""
    out.write(f'{{"file": {json.dumps(name)}, "events": [')
    out.writelines(("," if index else "") + "\n  " + json.dumps(event.to_json()) for index, event in enumerate(events))
    counts = {s: stats.severities[s] for s in SEVERITIES}
    out.write(f'\n], "lines": {stats.lines}, "skipped_lines": {stats.skipped}, "counts": {json.dumps(counts)}}}\n')
