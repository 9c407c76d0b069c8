"""Fuzzing every kernel-log input format through the real sources and the collector: no case raises, none hides
the record after it, every line is read or counted as skipped.

Each format gets TPUWATCH_FUZZ_CASES cases (1000 by default) from a fixed seed (TPUWATCH_FUZZ_SEED) so that CI is
repeatable; docs/kernel_log.md gives the command of a longer run.  Cases are the fixture lines of
tests/testdata/kernel_log (real wordings, composed hosts) mutated, plus hostile shapes (deep JSON, numbers Python
refuses, invalid UTF-8, control bytes, over-long lines, broken kmsg headers, stray escapes).  After every case
comes a sentinel record of a test-only rule, and each sentinel must be counted exactly once.  In a text file a line
that starts with white space continues the record above it, so a plain line follows each sentinel: a case that
begins with white space continues that line, not the sentinel.
"""

from __future__ import annotations

import json
import os
import random
import re
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from test_kernel_log_resilience import journal_entry, journal_module, write_journal  # noqa: F401 - a fixture

from tpuwatch.hw.procfs import read_boot_id
from tpuwatch.kernel_log import filesource
from tpuwatch.kernel_log.blocks import Splitter
from tpuwatch.kernel_log.collector import KernelLogCollector
from tpuwatch.kernel_log.filesource import FileSource
from tpuwatch.kernel_log.journal import JournalSource
from tpuwatch.kernel_log.records import MAX_MESSAGE_CHARS, parse_kmsg, parse_line
from tpuwatch.kernel_log.rulefile import load_rules
from tpuwatch.kernel_log.sources import KmsgSource, Source

from conftest import saved_state, write_selftest_rule
from kernellog import drain

SEED = int(os.environ.get("TPUWATCH_FUZZ_SEED", "20261130"))
CASES = int(os.environ.get("TPUWATCH_FUZZ_CASES", "1000"))
DATA = Path(__file__).parent / "testdata" / "kernel_log"
KMSG = "/dev/kmsg"
SENTINEL_PCI = "0000:99:00.0"

FORMATS: dict[str, tuple[str, Callable[[str], str]]] = {
    "dmesg": ("dmesg.txt", lambda text: f"[ 4242.000001] {text}"),
    "dmesg -T": ("dmesg_T.txt", lambda text: f"[Mon Nov 30 04:37:39 2026] {text}"),
    "syslog": ("kern.log", lambda text: f"Nov 30 04:37:39 gpu-host-7 kernel: [ 4242.000001] {text}"),
    "raw kmsg": ("kmsg.txt", lambda text: f"3,99999,4242000001,-;{text}"),
    "journalctl -o json": ("journal.json", lambda text: json.dumps({"MESSAGE": text, "_TRANSPORT": "kernel"})),
}
JUNK = [b"\x00", b"\x01", b"\x1b[31m", b"\x7f", b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\r", b"\t",
        b"\\x0a", b"\\x5c", b"\\xzz", b"\\x", b"{", b"}", b"[", b"]", b'"', b":", b";", b",", b" DEVICE=", b"<3>",
        "\u00e9".encode(), "\u202e".encode(), b"NVRM: Xid (", b"PCI:", b"):", b"\\u0000", b"\\ud800"]


def _mutate(rng: random.Random, line: bytes, pool: list[bytes]) -> bytes:
    """One mutation of ``line``."""
    at = rng.randrange(len(line) + 1)
    choice = rng.randrange(9)
    if choice == 0 and line:  # flip bytes
        data = bytearray(line)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if choice == 1:
        return line[:at] + rng.choice(JUNK) * rng.randint(1, 4) + line[at:]
    if choice == 2:
        return line[:at]
    if choice == 3:  # over-long: past 64 KiB sometimes
        return line[:at] + line[at:at + 64] * rng.choice([10, 1100, 3000]) + line[at:]
    if choice == 4:
        return line[:at] + rng.choice(pool)[at:]
    if choice == 5:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
    if choice == 6:  # deep or odd JSON
        depth = rng.choice([10, 999, 1001, 50_000])
        return rng.choice([b"[" * depth, b'{"MESSAGE": ' + b"[" * depth + b"1" + b"]" * depth + b"}",
                           b'{"MESSAGE": 1' + b"0" * rng.choice([10, 4400, 60_000]) + b"}",
                           b'{"MESSAGE": ' + line[:200].replace(b'"', b"") + b"}", b"[]", b"null", b"1e999",
                           b'{"MESSAGE": [255, 256, -1, 1e9, "x", [1]], "_KERNEL_DEVICE": {"a": 1}}'])
    if choice == 7:  # broken kmsg headers
        digits = b"9" * rng.choice([1, 20, 21, 5000])
        return rng.choice([digits + b",1,2,-;", b"6," + digits + b",2,-;", b"6,1,2", b"-6,1,2,-;", b"6,1,2,-"
                           + b"c" * 300 + b";"]) + line[at:]
    return line.replace(b" ", b"\\x20" if rng.random() < 0.5 else b"\\x0a", rng.randint(1, 3))


def cases(rng: random.Random, templates: list[bytes], count: int) -> list[bytes]:
    """``count`` fuzzed lines (each may hold newlines of its own) from ``templates``."""
    out = []
    for _ in range(count):
        line = rng.choice(templates)
        for _ in range(rng.randint(1, 3)):
            line = _mutate(rng, line, templates)
        out.append(line)
    return out


def _run(source: Source, rules_dir: str) -> dict:  # type: ignore[type-arg]
    """Collect until the source has caught up; the last cycle's samples."""
    # No budget to speak of: a thousand sentinels are a storm, which a collector short of time would pass over.
    collector = KernelLogCollector(source, load_rules([rules_dir]), {SENTINEL_PCI: "sentinel"}.get, 60.0,
                                   deadline=1e9)
    values: dict = {}  # type: ignore[type-arg]
    for _ in range(1000):
        before = values.get(("tpuwatch_kernel_log_records_total", (("source", source.name),)))
        values = {(s.name, s.labels): s.value for s in collector.collect()}
        if source.caught_up and values[("tpuwatch_kernel_log_records_total", (("source", source.name),))] == before:
            return values
    raise AssertionError("the source never caught up")


def _sentinels(values: dict) -> float:  # type: ignore[type-arg]
    return values[("tpuwatch_kernel_events_total", (("device", "sentinel"), ("rule", "selftest"),
                                                    ("severity", "critical")))]


@pytest.mark.parametrize("name", list(FORMATS))
def test_fuzzed_lines_of_every_file_format(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fixture, shape = FORMATS[name]
    rng = random.Random(f"{SEED}-{name}")
    tag = f"tpuwatch-fuzz-{uuid.uuid4().hex[:12]}"
    rules = write_selftest_rule(tmp_path / "rules", tag)
    sentinel = shape(f"{tag}: device {SENTINEL_PCI} failed").encode() + b"\n"
    sentinel += shape(f"{tag}: end of case").encode() + b"\n"  # what a case that starts with white space continues
    fuzzed = cases(rng, (DATA / fixture).read_bytes().splitlines(), CASES)
    for case in fuzzed:  # the pure parsers, on every line of every case
        for line in case.split(b"\n"):
            text = line.decode("utf-8", "replace")
            assert len(parse_line(text).message) <= MAX_MESSAGE_CHARS
            parse_kmsg(text)
    log, state = tmp_path / "kern.log", tmp_path / "file.json"
    log.write_text("")
    monkeypatch.setattr(filesource, "FILE_READ_BYTES", 4096)  # records and over-long lines across many reads
    source = FileSource(str(log), state)
    data = b"".join(case + b"\n" + sentinel for case in fuzzed)
    log.write_bytes(data)
    values = _run(source, rules)
    assert _sentinels(values) == CASES  # nothing hid the record after it
    lines = data.count(b"\n")
    read = values[("tpuwatch_kernel_log_records_total", (("source", "file"),))]
    skipped = sum(values[("tpuwatch_kernel_log_skipped_total", (("reason", r), ("source", "file")))]
                  for r in ("not_text", "too_long", "malformed", "error"))
    assert values[("tpuwatch_kernel_log_skipped_total", (("reason", "backlog"), ("source", "file")))] == 0
    # Every record read or counted: a line that starts with white space continues the record before it (a kmsg
    # record's KEY=VALUE lines, dmesg's indented lines), unless it stands for an over-long line, or one more than
    # 16 would.
    continuations = len(re.findall(rb"\n[ \t]", data.replace(b"\0", b"")))
    assert lines - continuations <= read + skipped <= lines
    assert read + skipped == len(Splitter(start=True).split(data))  # read in pieces, as split whole
    source.commit()
    assert saved_state(state)["offset"] == len(data)


@pytest.mark.usefixtures("journal_module")
def test_fuzzed_journal_entries_in_a_real_journal_file(tmp_path: Path) -> None:
    rng = random.Random(f"{SEED}-journal")
    tag = f"tpuwatch-fuzz-{uuid.uuid4().hex[:12]}"
    rules = write_selftest_rule(tmp_path / "rules", tag)
    messages = [json.loads(line)["MESSAGE"].encode() for line in (DATA / "journal.json").read_text().splitlines()]
    entries, usec, missing = [], 1_764_460_800_000_000, 0
    for case in cases(rng, messages, CASES):
        fields: dict[str, str | bytes] = {"MESSAGE": case[:200_000]}
        if rng.random() < 0.2:
            fields["_KERNEL_DEVICE"] = rng.choice(messages)[:40] + rng.choice(JUNK)
        if rng.random() < 0.05:
            del fields["MESSAGE"]
            missing += 1
        entries.append(journal_entry(fields, usec))
        entries.append(journal_entry({"MESSAGE": f"{tag}: device {SENTINEL_PCI} failed"}, usec + 1))
        usec += 2
    journal = tmp_path / "fuzz.journal"
    write_journal(journal, entries)
    source = JournalSource(tmp_path / "journal.json", str(journal))
    values = _run(source, rules)
    assert _sentinels(values) == CASES
    read = values[("tpuwatch_kernel_log_records_total", (("source", "journal"),))]
    assert read == 2 * CASES - missing
    assert values[("tpuwatch_kernel_log_skipped_total", (("reason", "malformed"), ("source", "journal")))] == missing


@pytest.mark.skipif(not os.access(KMSG, os.R_OK | os.W_OK), reason="needs root and /dev/kmsg")
@pytest.mark.usefixtures("kmsg_flood")
def test_fuzzed_texts_through_the_real_kmsg(tmp_path: Path) -> None:
    """Random bytes (never a line any shipped rule matches: this is the host's kernel log) round-trip the kernel."""
    rng = random.Random(f"{SEED}-kmsg")
    tag = f"tpuwatch-fuzz-{uuid.uuid4().hex[:12]}"
    shipped = load_rules([])
    sentinel = f"{tag}: device {SENTINEL_PCI} failed"
    reader = KmsgSource(KMSG, None, read_boot_id())  # a second reader of the same ring, for the texts themselves
    source = KmsgSource(KMSG, None, read_boot_id())
    collector = KernelLogCollector(source, load_rules([write_selftest_rule(tmp_path / "rules", tag)]),
                                   {SENTINEL_PCI: "sentinel"}.get, 60.0)
    collector.collect()  # this boot's history
    drain(reader)
    written: list[bytes] = []
    seen: list[str] = []
    chunks = 0
    while len(written) < CASES:
        for _ in range(min(50, CASES - len(written))):  # in small chunks: the ring never overruns under the test
            text = bytes(rng.choice([rng.randrange(1, 256), rng.randrange(32, 127)]) for _ in range(rng.randrange(200)))
            text = text.rstrip(b"\n")
            if shipped.match(text.decode("utf-8", "replace")):
                continue
            _write_kmsg(b"<4>" + tag.encode() + b": " + text + b"\n")
            written.append(text)
        _write_kmsg(f"<3>{sentinel}\n".encode())
        chunks += 1
        seen += [r.message for r in drain(reader)
                 if r.message.startswith(f"{tag}: ") and r.message != sentinel]
        values = {(s.name, s.labels): s.value for s in collector.collect()}
    assert _sentinels(values) == chunks
    assert source.lost == reader.lost == 0 and len(seen) == len(written)
    for text, message in zip(written, seen):
        assert not any(ord(c) < 32 and c not in "\t\n" for c in message), message
        decoded = text.decode("utf-8", "replace")
        if decoded == text.decode("utf-8", "ignore") and not any(b < 32 and b not in (9, 10) or b == 127 for b in text):
            assert message == f"{tag}: {decoded}"  # clean text comes back exactly, newlines included


def _write_kmsg(data: bytes) -> None:
    """One record, through its own open: /dev/kmsg rate-limits each open file to 10 writes per 5 s."""
    fd = os.open(KMSG, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
