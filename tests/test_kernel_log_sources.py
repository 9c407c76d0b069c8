"""Kernel log sources on real parts: /dev/kmsg, a journal file made by systemd-journal-remote, followed files."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tpuwatch.config import parse
from tpuwatch.hw.procfs import read_boot_id
from tpuwatch.kernel_log import filesource, sources
from tpuwatch.kernel_log import journal as journal_source
from tpuwatch.kernel_log.filesource import FileSource
from tpuwatch.kernel_log.journal import JournalSource
from tpuwatch.kernel_log.opening import open_source
from tpuwatch.kernel_log.records import KmsgRecord, Record, parse_kmsg
from tpuwatch.kernel_log.sources import KmsgSource, SequenceTracker
from tpuwatch.schema import ConfigError

from conftest import require_tool, saved_state, wait_until
from kernellog import drain
from kernellog import records as records_of

KMSG = "/dev/kmsg"
pytestmark = pytest.mark.usefixtures("kmsg_ring")  # records wait in the host's ring: no flood meanwhile
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"


def _messages(records: list) -> list[str]:  # type: ignore[type-arg]
    return [r.message for r in records]


def _read_all(source: FileSource) -> list[Record]:
    """Every record the source has now, however many reads that takes."""
    out = records_of(source.read())
    while not source.caught_up:
        out += records_of(source.read())
    return out


# --- /dev/kmsg ---------------------------------------------------------------

needs_kmsg = pytest.mark.skipif(not (os.access(KMSG, os.R_OK | os.W_OK)), reason="needs root and /dev/kmsg")


def _write_kmsg(text: str) -> None:
    with open(KMSG, "w") as handle:
        handle.write(text)


def _read_tagged(source: KmsgSource, tag: str) -> list[str]:
    return [m for m in _messages(drain(source)) if m.startswith(tag)]


@needs_kmsg
def test_kmsg_reads_new_records_and_resumes_after_restart_without_duplicates_or_gaps(tmp_path: Path) -> None:
    tag = f"tpuwatch-test-{uuid.uuid4().hex[:12]}"
    state = tmp_path / "kmsg.json"
    boot = read_boot_id()
    first = KmsgSource(KMSG, state, boot)
    _write_kmsg(f"<4>{tag}: one\n")
    _write_kmsg(f"<4>{tag}: two\n")
    assert _read_tagged(first, tag) == [f"{tag}: one", f"{tag}: two"]
    first.commit()
    _write_kmsg(f"<4>{tag}: three\n")  # written while "tpuwatch is down"
    first.close()
    saved = saved_state(state)
    assert saved["boot_id"] == boot and isinstance(saved["seq"], int)

    second = KmsgSource(KMSG, state, boot)
    _write_kmsg(f"<4>{tag}: four\n")
    assert _read_tagged(second, tag) == [f"{tag}: three", f"{tag}: four"]
    # Nothing of ours again (no duplicate); other tests may write their own records to the host's /dev/kmsg meanwhile.
    assert [r for r in records_of(second.read()) if r.message.startswith(tag)] == [] and second.lost == 0
    second.close()


def _write_kmsg_record(text: str) -> KmsgRecord:
    """Write a record; the record as the ring holds it (its sequence number and timestamp), read back."""
    fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.lseek(fd, 0, os.SEEK_END)
        _write_kmsg(text)
        while True:
            record = parse_kmsg(os.read(fd, 8192).decode("utf-8", "replace"))
            if record is not None and record.record.message == text[3:].rstrip("\n"):
                return record
    finally:
        os.close(fd)


def _write_kmsg_at(text: str) -> int:
    """Write a record; its kmsg timestamp (microseconds), read back from the ring."""
    return _write_kmsg_record(text).usec


@needs_kmsg
def test_kmsg_first_start_reads_back_only_the_lookback(tmp_path: Path) -> None:
    tag = f"tpuwatch-test-{uuid.uuid4().hex[:12]}"
    before = _write_kmsg_at(f"<4>{tag}: before\n")
    # Half a second apart, the cutoff between them: far wider than the time from here to the source reading the
    # clock, or than the difference between printk's clock and CLOCK_MONOTONIC (under a millisecond here).
    wait_until(lambda: time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6 > before + 500_000, what="half a second")
    _write_kmsg(f"<4>{tag}: after\n")
    cutoff = (before + 250_000) / 1e6
    state = tmp_path / "kmsg.json"
    first = KmsgSource(KMSG, state, read_boot_id(), lookback=time.clock_gettime(time.CLOCK_MONOTONIC) - cutoff)
    assert _read_tagged(first, tag) == [f"{tag}: after"]
    first.commit()
    first.close()
    # With a saved position the lookback plays no part; without a lookback the whole boot is read.
    _write_kmsg(f"<4>{tag}: while down\n")
    resumed = KmsgSource(KMSG, state, read_boot_id(), lookback=0.0)
    assert _read_tagged(resumed, tag) == [f"{tag}: while down"]
    resumed.close()
    whole = KmsgSource(KMSG, None, read_boot_id())
    everything = [f"{tag}: before", f"{tag}: after", f"{tag}: while down"]
    got = _read_tagged(whole, tag)
    whole.close()
    if _oldest_usec() > before:  # other tests write to the host's ring too: it has since passed over "before"
        assert got in (everything, everything[1:])
    else:
        assert got == everything


def _oldest_usec() -> int:
    """The kmsg timestamp of the oldest record the ring holds now."""
    fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                record = parse_kmsg(os.read(fd, 8192).decode("utf-8", "replace"))
            except BrokenPipeError:  # overwritten while we opened it: the next read gives the oldest left
                continue
            if record is not None:
                return record.usec
    finally:
        os.close(fd)


@needs_kmsg
def test_kmsg_state_of_another_boot_is_ignored(tmp_path: Path) -> None:
    state = tmp_path / "kmsg.json"
    state.write_text(json.dumps({"boot_id": "another-boot", "seq": 10**12}))
    tag = f"tpuwatch-test-{uuid.uuid4().hex[:12]}"
    _write_kmsg(f"<4>{tag}: after reboot\n")
    source = KmsgSource(KMSG, state, read_boot_id())
    assert _read_tagged(source, tag) == [f"{tag}: after reboot"]
    source.close()


@needs_kmsg
def test_kmsg_is_read_by_a_thread_of_its_own_into_a_bounded_queue(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Started, the source reads the ring as records come, whether or not anyone asks for them; past its bound it
    stops reading (the kernel keeps the rest in its ring) and goes on once records are handed out: none of the
    test's is lost."""
    monkeypatch.setattr(sources, "KMSG_QUEUE_BYTES", 400)
    tag = f"tpuwatch-test-{uuid.uuid4().hex[:12]}"
    # Read from a record of its own on, as from a saved position: a first start would read the lookback's records
    # too, and another test may have written hundreds of KiB to the ring in the second before (the fuzz test, whose
    # flood this test once spent its 10 s draining 400 bytes at a time).
    start = _write_kmsg_record(f"<4>{tag}: start\n")
    (tmp_path / "kmsg.json").write_text(json.dumps({"boot_id": read_boot_id(), "seq": start.seq}))
    source = KmsgSource(KMSG, tmp_path / "kmsg.json", read_boot_id())
    source.start()
    try:
        thread = source._thread
        assert thread is not None and thread.is_alive() and thread.name == "kernel-log-kmsg"
        for i in range(30):
            _write_kmsg(f"<4>{tag}: record {i:02d}\n")
        wait_until(lambda: source._queued > 0 and not source._room.is_set(), what="the reader filling its queue")
        assert source._queued <= 400 + sources.KMSG_READ_BYTES  # it stopped at its bound
        got: list[str] = []
        wait_until(lambda: got.extend(m for m in _messages(records_of(source.read())) if m.startswith(tag))
                   or len(got) == 30, what="every record, as the queue drains")
        # Ours all came, in order. The host's ring is shared (tests running beside this one write long records to
        # it): while the reader waits, the ring may overwrite others' records, which ``lost`` counts.
        assert got == [f"{tag}: record {i:02d}" for i in range(30)]
    finally:
        source.close()
    assert not thread.is_alive()


def test_kmsg_sequence_gaps_count_as_lost_and_old_records_are_skipped() -> None:
    tracker = SequenceTracker(last=10)
    accepted = [seq for seq in (9, 10, 11, 12, 15, 16, 20) if tracker.accept(seq)]
    assert accepted == [11, 12, 15, 16, 20] and tracker.lost == 2 + 3
    fresh = SequenceTracker(last=None)
    assert fresh.accept(500) and fresh.lost == 0


def test_missing_kmsg_is_a_clear_error_when_chosen_and_skipped_by_auto(tmp_path: Path) -> None:
    explicit = parse(f"state_dir: {tmp_path}\nkernel_log: {{source: kmsg, path: {tmp_path}/nokmsg}}")
    with pytest.raises(ConfigError, match=f"kernel_log.source: kmsg: cannot open {tmp_path}/nokmsg: No such file"):
        open_source(explicit)
    auto = parse(f"state_dir: {tmp_path}\npaths: {{dev: {tmp_path}}}")
    source, note = open_source(auto)
    assert f"kmsg: cannot open {tmp_path}/kmsg" in note
    assert source is not None
    if source.name == "none":  # no systemd-python either: a source that reads nothing and says why
        assert source.degraded == f"no kernel-log source usable (kmsg: cannot open {tmp_path}/kmsg: No such file " \
            "or directory; journal: systemd-python is not installed (pip install tpuwatch[systemd]))"
    else:
        assert source.name == "journal"


# --- the journal ------------------------------------------------------------

def _export(messages: list[str], first_usec: int, device: str | None = None) -> str:
    boot = read_boot_id().replace("-", "")
    entries = []
    for i, message in enumerate(messages):
        fields = {"__REALTIME_TIMESTAMP": str(first_usec + i), "__MONOTONIC_TIMESTAMP": str(first_usec + i),
                  "_BOOT_ID": boot, "_TRANSPORT": "kernel", "PRIORITY": "3", "SYSLOG_IDENTIFIER": "kernel",
                  "MESSAGE": message}
        if device:
            fields["_KERNEL_DEVICE"] = device
        entries.append("".join(f"{k}={v}\n" for k, v in fields.items()))
    entries.append(f"__REALTIME_TIMESTAMP={first_usec + len(messages)}\n__MONOTONIC_TIMESTAMP=1\n_BOOT_ID={boot}\n"
                   "_TRANSPORT=stdout\nMESSAGE=NVRM: Xid (PCI:0000:3b:00): 79 from a user process, not the kernel\n")
    return "\n".join(entries) + "\n"


def _append_journal(path: Path, messages: list[str], first_usec: int, device: str | None = None) -> None:
    tool = require_tool(JOURNAL_REMOTE)
    subprocess.run([tool, "-o", str(path), "-"], input=_export(messages, first_usec, device), text=True,
                   check=True, capture_output=True, timeout=30)


@pytest.fixture
def journal_module() -> object:
    """systemd-python; a skip without it, except in CI."""
    if os.environ.get("TPUWATCH_REQUIRE_TOOLS") == "1":
        import systemd.journal
        return systemd.journal
    return pytest.importorskip("systemd.journal")


def test_journal_kernel_entries_cursor_restart_and_appends(tmp_path: Path, journal_module: object,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_source, "JOURNAL_BATCH", 2)  # a read gives two entries: the third waits for the next
    journal = tmp_path / "kernel.journal"
    state = tmp_path / "journal.json"
    _append_journal(journal, ["NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
                              "hello", "EDAC MC0: 1 UE memory read error"], 1_764_460_800_000_000,
                    device="+pci:0000:3b:00.0")
    first = JournalSource(state, str(journal))
    records = records_of(first.read())
    assert _messages(records) == ["NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
                                  "hello"]
    assert records[0].kernel_device == "+pci:0000:3b:00.0"
    first.commit()
    first.close()
    assert "cursor" in saved_state(state)

    second = JournalSource(state, str(journal))
    assert _messages(records_of(second.read())) == ["EDAC MC0: 1 UE memory read error"]  # no user-space entry
    assert records_of(second.read()) == []
    _append_journal(journal, ["INFO: task python3:7 blocked for more than 120 seconds."], 1_764_460_900_000_000)
    assert _messages(records_of(second.read())) == ["INFO: task python3:7 blocked for more than 120 seconds."]
    second.commit()
    second.close()

    third = JournalSource(state, str(journal))
    assert records_of(third.read()) == []
    third.close()


def test_journal_first_start_reads_back_only_the_lookback(tmp_path: Path, journal_module: object) -> None:
    journal = tmp_path / "kernel.journal"
    now_usec = int(time.time() * 1e6)
    _append_journal(journal, ["old: two hours ago"], now_usec - 7200 * 10**6)
    _append_journal(journal, ["new: a minute ago"], now_usec - 60 * 10**6)
    first = JournalSource(tmp_path / "journal.json", str(journal), lookback=300.0)
    assert _messages(records_of(first.read())) == ["new: a minute ago"]
    first.close()
    whole = JournalSource(None, str(journal))
    assert _messages(records_of(whole.read())) == ["old: two hours ago", "new: a minute ago"]
    whole.close()


def test_journal_directory_picks_up_a_new_file(tmp_path: Path, journal_module: object) -> None:
    state = tmp_path / "journal.json"
    (tmp_path / "j").mkdir()
    _append_journal(tmp_path / "j" / "a.journal", ["first"], 1_764_460_800_000_000)
    source = JournalSource(state, str(tmp_path / "j"))
    assert _messages(records_of(source.read())) == ["first"]
    source.commit()
    source.close()
    _append_journal(tmp_path / "j" / "b.journal", ["second"], 1_764_460_900_000_000)
    restarted = JournalSource(state, str(tmp_path / "j"))
    assert _messages(records_of(restarted.read())) == ["second"]
    restarted.close()


# --- a followed file ---------------------------------------------------------

def _append(path: Path, text: str | bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(text.encode() if isinstance(text, str) else text)


def _followed_empty_file(tmp_path: Path) -> tuple[Path, Path, FileSource]:
    """An empty kern.log, its state file, and a FileSource following it."""
    log, state = tmp_path / "kern.log", tmp_path / "file.json"
    log.write_text("")
    return log, state, FileSource(str(log), state)


def test_file_starts_at_the_end_then_follows_complete_lines(tmp_path: Path) -> None:
    log, state = tmp_path / "kern.log", tmp_path / "file.json"
    _append(log, "old line before tpuwatch started\n")
    source = FileSource(str(log), state)
    assert records_of(source.read()) == []
    _append(log, "Nov 30 04:37:39 host kernel: [ 1.5] one\nNov 30 04:37:39 host kernel: [ 1.6] tw")
    assert _messages(records_of(source.read())) == ["one"]
    _append(log, "o\n")
    assert _messages(records_of(source.read())) == ["two"]


def test_file_restart_without_duplicates_or_gaps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filesource, "FILE_READ_BYTES", 35)  # five lines a read; the last may have continuation lines
    log, state, source = _followed_empty_file(tmp_path)
    _append(log, "".join(f"line {i}\n" for i in range(10)))
    assert _messages(records_of(source.read())) == [f"line {i}" for i in range(4)]
    source.commit()
    source.close()
    _append(log, "line 10\n")
    restarted = FileSource(str(log), state)
    assert _messages(_read_all(restarted)) == [f"line {i}" for i in range(4, 11)]


def test_file_rotation_by_rename_reads_the_old_file_to_its_end(tmp_path: Path) -> None:
    log, state, source = _followed_empty_file(tmp_path)
    _append(log, "a\n")
    assert _messages(records_of(source.read())) == ["a"]
    _append(log, "b\nc-without-newline")  # written just before the rotation
    os.rename(log, tmp_path / "kern.log.1")
    assert _messages(records_of(source.read())) == ["b"]  # the path is gone for a moment: keep the old file
    log.write_text("d\n")
    assert _messages(records_of(source.read())) == ["c-without-newline"]  # the old file's last line
    assert _messages(records_of(source.read())) == ["d"]
    _append(log, "e\n")
    assert _messages(records_of(source.read())) == ["e"]


def test_file_rotated_while_down_resumes_in_the_rotated_file(tmp_path: Path) -> None:
    log, state, source = _followed_empty_file(tmp_path)
    _append(log, "a\n")
    assert _messages(records_of(source.read())) == ["a"]
    source.commit()
    source.close()
    _append(log, "b\n")
    os.rename(log, tmp_path / "kern.log.1")
    log.write_text("c\n")
    restarted = FileSource(str(log), state)
    assert _messages(records_of(restarted.read())) == ["b"] and not restarted.caught_up
    assert _messages(records_of(restarted.read())) == ["c"] and restarted.caught_up


def test_file_truncated_in_place_is_read_from_the_start(tmp_path: Path) -> None:
    log, state, source = _followed_empty_file(tmp_path)
    _append(log, "a long first line\n")
    assert _messages(records_of(source.read())) == ["a long first line"]
    log.write_text("x\n")  # copytruncate, then a short write
    assert _messages(records_of(source.read())) == ["x"]


def test_file_skips_binary_and_overlong_lines_and_keeps_kmsg_devices(tmp_path: Path) -> None:
    log, state, source = _followed_empty_file(tmp_path)
    _append(log, b"\xff\xfe\n" + b"x" * (3 << 20) + b"\n" + b"4,9,1,-;AER: Corrected error received: id=0018\n"
            b" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\nlast\n")
    records = _read_all(source)
    assert [(r.message, r.kernel_device) for r in records] == [
        ("AER: Corrected error received: id=0018", "+pci:0000:3b:00.0"), ("last", None)]
    assert (source.skipped["not_text"], source.skipped["too_long"]) == (1, 1)


def test_position_files_are_replaced_atomically(tmp_path: Path) -> None:
    log, state = tmp_path / "kern.log", tmp_path / "state" / "file.json"
    log.write_text("")
    source = FileSource(str(log), state)
    _append(log, "a\n")
    records_of(source.read())
    source.commit()
    saved = saved_state(state)
    assert saved == {"path": str(log), "dev": log.stat().st_dev, "ino": log.stat().st_ino, "offset": 2}
    assert sorted(p.name for p in state.parent.iterdir()) == ["file.json"]


def test_journal_chosen_in_config_reads_the_given_journal(tmp_path: Path, journal_module: object) -> None:
    journal = tmp_path / "k.journal"
    _append_journal(journal, ["EDAC MC0: 1 UE memory read error"], int(time.time() * 1e6) - 10**7)  # in the lookback
    config = parse(f"state_dir: {tmp_path}/state\nkernel_log: {{source: journal, path: {journal}}}")
    source, note = open_source(config)
    assert source is not None and note == f"kernel log: reading the journal's kernel messages in {journal}"
    assert _messages(records_of(source.read())) == ["EDAC MC0: 1 UE memory read error"]
    source.commit()
    assert (tmp_path / "state" / "kernel_log" / "journal.json").exists()


# --- what a record carries, and what a file holds -----------------------------------------------------------

@needs_kmsg
def test_kmsg_escapes_are_decoded_newlines_included(tmp_path: Path) -> None:
    tag = f"tpuwatch-test-{uuid.uuid4().hex[:12]}"
    source = KmsgSource(KMSG, None, read_boot_id())
    records_of(source.read())
    with open(KMSG, "wb") as kmsg:  # the kernel escapes all but printable ASCII as \xNN (dev-kmsg ABI)
        kmsg.write(f"<4>{tag}: line one\nline two \\ back caf\u00e9\ttab \x01 \x7f end\n".encode())
    [record] = [r for r in records_of(source.read()) if r.message.startswith(tag)]
    assert record.message == f"{tag}: line one\nline two \\ back caf\u00e9\ttab \\x01 \\x7f end"
    source.close()


def test_kmsg_device_and_text_escapes_in_raw_records() -> None:
    parsed = parse_kmsg("3,7,9,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: fallen off the bus\\x5cx0a\n"
                        " SUBSYSTEM=pci\n DEVICE=+pci:0000:b3:00.0\\x01\n")
    assert parsed is not None
    assert parsed.record.message == "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: fallen off the bus\\x0a"
    assert parsed.record.kernel_device == "+pci:0000:b3:00.0\\x01"


@pytest.mark.parametrize("raw", ["9" * 30 + ",1,2,-;x", "6,1,2;no flags", "6,,,-;x", "-1,2,3,-;x", "6,1,2,-",
                                 "", ";", "6,1,2," + "-" * 1000 + ";x", "\ufffd,1,2,-;x"])
def test_kmsg_records_with_bad_headers_are_refused(raw: str) -> None:
    assert parse_kmsg(raw) is None


def test_a_crash_s_zero_filled_tail_of_any_length_hides_no_line(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(b"")
    source = FileSource(str(log), tmp_path / "file.json")
    assert records_of(source.read()) == []
    xid = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    with open(log, "ab") as out:  # composed: the tail the crash left unwritten, then the next boot's lines
        out.write(b"before\n" + b"\0" * (2 << 20) + xid + xid)
    records = [r for _ in range(20) for r in records_of(source.read())]
    assert [r.message[:13] for r in records] == ["before", "NVRM: Xid (PC", "NVRM: Xid (PC"]
    assert source.skipped["too_long"] == 0


def test_a_symbolic_link_that_leads_nowhere_is_named_as_such(tmp_path: Path) -> None:
    loop, dangling = tmp_path / "loop.log", tmp_path / "dangling.log"
    loop.symlink_to(loop)
    dangling.symlink_to(tmp_path / "gone.log")
    assert FileSource(str(loop), tmp_path / "a.json").degraded == (
        f"kernel log file {loop} is a loop of symbolic links (it is followed once it appears)")
    assert FileSource(str(dangling), tmp_path / "b.json").degraded == (
        f"kernel log file {dangling} is a symbolic link to {tmp_path}/gone.log, which does not exist (it is followed "
        "once it appears)")
    (tmp_path / "gone.log").write_text("first\n")
    source = FileSource(str(dangling), tmp_path / "c.json")
    assert source.degraded is None and _messages(records_of(source.read())) == []  # existed at start: read from its end


def test_file_that_does_not_exist_yet_is_degraded_then_followed_from_its_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "kern.log"
    source = FileSource(str(log), tmp_path / "file.json")
    assert source.degraded == f"kernel log file {log} does not exist (it is followed once it appears)"
    assert records_of(source.read()) == [] and source.caught_up
    assert any("does not exist" in r.message and r.levelname == "WARNING" for r in caplog.records)
    log.write_text("first\n")
    assert _messages(records_of(source.read())) == ["first"] and source.degraded is None
    log.unlink()  # deleted, not renamed, then made again: tail -F follows the new file
    assert records_of(source.read()) == []
    assert records_of(source.read()) == [] and source.degraded is not None  # missing at two reads in a row
    log.write_text("second\n")
    assert _messages(records_of(source.read())) == ["second"] and source.degraded is None


def test_file_lines_indented_like_dmesg_continuations_continue_their_record(tmp_path: Path) -> None:
    """One splitter for every reader: a line that starts with white space continues the record above it, as dmesg
    indents the later lines of a record with newlines and /dev/kmsg writes its `` KEY=VALUE`` lines."""
    log, state, source = _followed_empty_file(tmp_path)
    _append(log, "[  717.260938] NVRM: The NVIDIA GPU 0000:b3:00.0\n               NVRM: fallen off the bus\n"
                 "4,9,1,-;AER: x\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n just indented, no key\n"
                 "[1.0] first message\n  indented continuation\n")
    assert [(r.message, r.kernel_device) for r in records_of(source.read())] == [
        ("NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: fallen off the bus", None), ("AER: x", "+pci:0000:3b:00.0"),
        ("first message\nindented continuation", None)]


def test_file_kmsg_record_split_by_a_read_block_keeps_its_device(tmp_path: Path) -> None:
    from tpuwatch.kernel_log.filesource import FILE_READ_BYTES
    log, state, source = _followed_empty_file(tmp_path)
    record = "4,9,1,-;AER: Corrected error received: 0000:3b:00.0\n"
    filler = "x" * 99 + "\n"
    lines = (FILE_READ_BYTES - len(record)) // len(filler)
    padding = "y" * (FILE_READ_BYTES - len(record) - lines * len(filler) - 1) + "\n"
    _append(log, filler * lines + padding + record + " DEVICE=+pci:0000:3b:00.0\n")
    records = []
    while batch := records_of(source.read()):
        records.extend(batch)
    assert (records[-1].message, records[-1].kernel_device) == (
        "AER: Corrected error received: 0000:3b:00.0", "+pci:0000:3b:00.0")
    assert len(records) == lines + 2


def test_file_nul_padding_left_by_a_crash_is_dropped(tmp_path: Path) -> None:
    log, state, source = _followed_empty_file(tmp_path)
    _append(log, b"\0" * 5000 + b"Nov 30 04:37:39 host kernel: [ 1.5] NVRM: Xid (PCI:0000:3b:00): 79\n")
    assert _messages(records_of(source.read())) == ["NVRM: Xid (PCI:0000:3b:00): 79"]
