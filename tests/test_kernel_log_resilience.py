"""Nothing blinds the kernel-log monitoring: hostile lines and positions, a full or read-only disk, a missing file,
no usable source.  Real parts: followed files, real journal files (systemd-journal-remote), /dev/kmsg, a real tmpfs
mounted small and filled, `tpuwatch run`, `tpuwatch check` and `tpuwatch config check` as subprocesses."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tpuwatch.hw.procfs import read_boot_id
from tpuwatch.kernel_log.attribution import device_lookup
from tpuwatch.kernel_log.collector import KernelLogCollector
from tpuwatch.kernel_log.filesource import FileSource
from tpuwatch.kernel_log.journal import JournalSource
from tpuwatch.kernel_log.position import Position
from tpuwatch.kernel_log.records import MAX_MESSAGE_CHARS, Record
from tpuwatch.kernel_log.rulefile import load_rules
from tpuwatch.kernel_log.sources import KmsgSource

from conftest import SIM_FAST, DaemonProcess, require_tool, saved_state, wait_until, write_selftest_rule
from kernellog import records as records_of

JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
KMSG = "/dev/kmsg"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
CRITICAL_XID = ("tpuwatch_kernel_events_total", (("device", ""), ("rule", "nvidia_xid"), ("severity", "critical")))


def _values(samples: list) -> dict:  # type: ignore[type-arg]
    return {(s.name, s.labels): s.value for s in samples}


def _collector(source: FileSource | KmsgSource | JournalSource, rules_dirs: list[str] | None = None
               ) -> KernelLogCollector:
    return KernelLogCollector(source, load_rules(rules_dirs or []), device_lookup(lambda: []), 60.0)


def _append(path: Path, data: str | bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)


# --- journal files made by systemd-journal-remote ------------------------------------------------------------

def journal_entry(fields: dict[str, str | bytes], usec: int) -> bytes:
    """One entry in journal export format; a value with a newline or control byte in the binary form."""
    boot = read_boot_id().replace("-", "")
    out = [f"__REALTIME_TIMESTAMP={usec}\n__MONOTONIC_TIMESTAMP={usec}\n_BOOT_ID={boot}\n".encode()]
    for key, value in {"_TRANSPORT": "kernel", **fields}.items():
        data = value.encode() if isinstance(value, str) else value
        if any(b < 32 and b != 9 for b in data):
            out.append(key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n")
        else:
            out.append(key.encode() + b"=" + data + b"\n")
    return b"".join(out) + b"\n"


def write_journal(path: Path, entries: list[bytes]) -> None:
    """Append export-format entries to a real journal file."""
    tool = require_tool(JOURNAL_REMOTE)
    subprocess.run([tool, "-o", str(path), "-"], input=b"".join(entries), check=True, capture_output=True, timeout=60)


@pytest.fixture
def journal_module() -> object:
    """systemd-python; a skip without it, except in CI."""
    if os.environ.get("TPUWATCH_REQUIRE_TOOLS") == "1":
        import systemd.journal
        return systemd.journal
    return pytest.importorskip("systemd.journal")


# --- no line can switch the monitoring off -------------------------------------------------------------------

HOSTILE_LINES = [
    "[" * 100_000,                                       # RecursionError in json.loads
    '{"MESSAGE": ' + "[" * 50_000 + "]" * 50_000 + "}",  # deep inside a journal entry
    '{"MESSAGE": "x", "n": 1' + "0" * 5000 + "}",        # an int Python refuses to parse
    '{"MESSAGE": 1e999999, "x": -1e999999}',
    '["a", "list"]', "{}", '"just a string"', "null",
    '{"MESSAGE": [1, 2, [3, [4]], "x", 1' + "0" * 400 + ', true]}',
    "9" * 5000 + ",1,2,-;" + XID79.replace("79", "13"),  # a kmsg header with numbers too long for any int
    "6,1,2;missing flags", "6,,,-;empty numbers", "-1,2,3,-;negative",
]


def test_no_line_stops_the_count_and_the_position_moves_past_it(tmp_path: Path) -> None:
    log, state = tmp_path / "kern.log", tmp_path / "file.json"
    log.write_text("")
    collector = _collector(FileSource(str(log), state))
    _append(log, "\n".join(HOSTILE_LINES) + "\n" + XID79 + "\n")
    assert _values(collector.collect())[CRITICAL_XID] == 1
    collector.close()
    assert saved_state(state)["offset"] == log.stat().st_size
    restarted = _collector(FileSource(str(log), state))  # across a restart: nothing again, the next one counted
    assert _values(restarted.collect())[CRITICAL_XID] == 0
    _append(log, XID79 + "\n")
    assert _values(restarted.collect())[CRITICAL_XID] == 1


def test_a_bad_byte_in_a_process_name_does_not_hide_its_xid(tmp_path: Path) -> None:
    # Anyone sets their process's name, and rsyslog writes it raw: before, one invalid UTF-8 or control byte made
    # the whole line "not text", skipped, and the job's own critical Xid unseen.
    log = tmp_path / "kern.log"
    log.write_text("")
    collector = _collector(FileSource(str(log), None))
    _append(log, XID79.replace("name=python3", "name=py\xff\x01thon").encode("latin-1") + b"\n")
    assert _values(collector.collect())[CRITICAL_XID] == 1


def test_a_fifo_or_a_device_at_the_path_is_refused_and_a_file_there_later_is_followed(tmp_path: Path) -> None:
    # A FIFO blocked open() until a writer came (the daemon never started, or its collector thread hung for good
    # when the file was replaced by one); /dev/zero gave endless NULs.
    log = tmp_path / "kern.log"
    os.mkfifo(log)
    started = time.monotonic()
    source = FileSource(str(log), None)
    assert time.monotonic() - started < 5
    assert source.degraded is not None and "FIFO" in source.degraded
    assert "device" in (FileSource("/dev/zero", None).degraded or "")
    collector = _collector(source)
    assert _values(collector.collect())[CRITICAL_XID] == 0
    log.unlink()
    log.write_text(XID79 + "\n")
    assert _values(collector.collect())[CRITICAL_XID] == 1
    assert source.degraded is None
    log.unlink()  # and replaced by a FIFO while followed: refused again, the reading goes on
    os.mkfifo(log)
    assert _values(collector.collect())[CRITICAL_XID] == 1
    assert source.degraded is not None and "FIFO" in source.degraded


def _garbage_states(tmp_path: Path) -> dict[str, bytes]:
    return {"empty": b"", "list": b"[]", "string": b'"x"', "null": b"null", "binary": b"\xff\xfe\x00",
            "deep": b"[" * 100_000, "huge": b" " * 100_000, "int": b"1" + b"0" * 5000,
            "dev-as-string": b'{"dev": "1", "ino": 2, "offset": 0}', "negative-offset": b'{"dev": 1, "ino": 2, '
            b'"offset": -100000000000000000000}', "bool-seq": b'{"boot_id": "b", "seq": true}',
            "huge-offset": b'{"dev": 1, "ino": 2, "offset": 100000000000000000000}',
            "negative-seq": b'{"boot_id": "b", "seq": -1}', "string-seq": b'{"boot_id": "b", "seq": "5"}',
            "cursor-int": b'{"cursor": 5}', "cursor-junk": b'{"cursor": "s=;;x"}'}


def test_file_positions_of_the_wrong_shape_are_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old line\n")
    for name, data in _garbage_states(tmp_path).items():
        state = tmp_path / f"{name}.json"
        state.write_bytes(data)
        caplog.clear()
        source = FileSource(str(log), state)  # starts at the end, as without a position
        _append(log, f"after {name}\n")
        assert [r.message for r in records_of(source.read())] == [f"after {name}"], name
        assert sum("ignoring unusable kernel log position file" in r.message for r in caplog.records) == 1, name
        source.commit()
        assert saved_state(state)["offset"] == log.stat().st_size  # replaced by a good one
        source.close()


def test_a_damaged_digit_of_a_saved_offset_reads_nothing_again(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A position file is sealed: an offset one digit off (still a valid offset) would read old faults again and
    page for them a second time; it is discarded instead, and the source goes on from the end."""
    log, state = tmp_path / "kern.log", tmp_path / "file.json"
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    log.write_text("x" * 99 + "\n" + xid + "y" * (99 - len(xid)) + "\n")  # the Xid at 100, the end at 200
    source = FileSource(str(log), state)
    assert [r.message for r in records_of(source.read())] == []  # a first start begins at the end
    source.commit()
    source.close()
    saved = state.read_text()
    damaged = saved.replace('"offset":200', '"offset":100')  # one digit: the Xid line's start
    assert damaged != saved
    state.write_text(damaged)
    source = FileSource(str(log), state)  # starts at the end, as without a position
    _append(log, "after the restart\n")
    assert [r.message for r in records_of(source.read())] == ["after the restart"]  # not the Xid line again
    assert any("integrity check failed" in r.message for r in caplog.records)


def test_file_offset_beyond_the_end_means_truncated_while_down(tmp_path: Path) -> None:
    log, state = tmp_path / "kern.log", tmp_path / "file.json"
    log.write_text("a\n")
    st = log.stat()
    state.write_text(json.dumps({"path": str(log), "dev": st.st_dev, "ino": st.st_ino, "offset": 1000}))
    assert [r.message for r in records_of(FileSource(str(log), state).read())] == ["a"]


@pytest.mark.skipif(not os.access(KMSG, os.R_OK | os.W_OK), reason="needs root and /dev/kmsg")
@pytest.mark.usefixtures("kmsg_ring")
def test_kmsg_positions_of_the_wrong_shape_or_from_the_future_are_ignored(tmp_path: Path) -> None:
    tag = f"tpuwatch-test-{uuid.uuid4().hex[:12]}"
    with open(KMSG, "w") as kmsg:
        kmsg.write(f"<4>{tag}: written before\n")
    boot = read_boot_id()
    states = {**_garbage_states(tmp_path), "future": json.dumps({"boot_id": boot, "seq": 10**15}).encode(),
              "beyond-u64": json.dumps({"boot_id": boot, "seq": 10**30}).encode()}
    for name, data in states.items():
        state = tmp_path / f"{name}.json"
        state.write_bytes(data)
        source = KmsgSource(KMSG, state, boot)  # no lookback: the whole ring, as on a first start
        messages = [r.message for r in records_of(source.read())]
        assert f"{tag}: written before" in messages, name
        source.commit()
        assert saved_state(state)["seq"] < 10**15
        source.close()


def test_journal_cursors_of_the_wrong_shape_or_unknown_are_ignored(tmp_path: Path, journal_module: object) -> None:
    journal = tmp_path / "k.journal"
    now = int(time.time() * 1e6)
    write_journal(journal, [journal_entry({"MESSAGE": "first"}, now - 10**6)])
    unknown = "s=" + "0" * 32 + ";i=ffffff;b=" + "0" * 32 + ";m=ffffff;t=7fffffffffffff;x=0"
    states = {**_garbage_states(tmp_path), "unknown": json.dumps({"cursor": unknown}).encode()}
    for name, data in states.items():
        state = tmp_path / f"{name}.json"
        state.write_bytes(data)
        source = JournalSource(state, str(journal))
        records_of(source.read())  # no exception, whatever the cursor
        source.commit()
        assert saved_state(state)["cursor"].startswith("s="), name
        source.close()
    restarted = JournalSource(tmp_path / "unknown.json", str(journal))
    write_journal(journal, [journal_entry({"MESSAGE": "next"}, now)])
    assert [r.message for r in records_of(restarted.read())] == ["next"]


def test_journal_messages_keep_their_newlines_and_odd_entries_are_counted(tmp_path: Path,
                                                                          journal_module: object) -> None:
    journal = tmp_path / "k.journal"
    # Driver 570's fell-off-the-bus message as one record over three lines (composed from the wording NVIDIA prints).
    three = ("NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\n"
             "NVRM: fallen off the bus and is not responding to commands.")
    write_journal(journal, [journal_entry({"MESSAGE": three, "_KERNEL_DEVICE": "+pci:0000:b3:00.0"}, 1000),
                            journal_entry({"PRIORITY": "3"}, 1001),
                            journal_entry({"MESSAGE": b"\xff\xfe\x00bin"}, 1002),
                            journal_entry({"MESSAGE": "x" * 100_000}, 1003)])
    source = JournalSource(None, str(journal))
    records = records_of(source.read())
    assert [(r.message, r.kernel_device) for r in records[:2]] == [
        (three, "+pci:0000:b3:00.0"), ("\ufffd\ufffd\x00bin", None)]
    assert records[2].message == "x" * MAX_MESSAGE_CHARS and len(records) == 3
    assert source.skipped["malformed"] == 1


class CountingJournal(JournalSource):
    """The journal source, counting the records it hands out: the clock of the collector's budget."""

    handed_out = 0

    def read(self) -> list[Record]:
        out = super().read()
        self.handed_out += len(out)
        return out


def _journal_storm(tmp_path: Path, journal: Path) -> KernelLogCollector:
    """A collector of ``journal`` whose budget runs on the records it reads (20 us each) and the entries it
    passes over (5 us each: they are still walked), so that it does not depend on this machine's load."""
    source = CountingJournal(tmp_path / "journal.json", str(journal))
    collector = KernelLogCollector(source, load_rules([]), device_lookup(lambda: []), 60.0, deadline=0.2,
                                   timer=lambda: collector.reader.records * 20e-6 + source.skipped["backlog"] * 5e-6)
    return collector


def _caught_up(collector: KernelLogCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    for _ in range(100):
        values = _values(collector.collect())
        if collector.source.caught_up:
            return values
    raise AssertionError("not caught up after 100 cycles")


def test_journal_storm_is_passed_over_and_the_next_record_counted_in_one_cycle(tmp_path: Path,
                                                                               journal_module: object) -> None:
    journal = tmp_path / "k.journal"
    storm = [journal_entry({"MESSAGE": XID79.replace("79", "13")}, 1000 + i) for i in range(20_000)]
    write_journal(journal, [*storm, journal_entry({"MESSAGE": XID79}, 30_000)])
    collector = _journal_storm(tmp_path, journal)
    values = _caught_up(collector)
    read = values[("tpuwatch_kernel_log_records_total", (("source", "journal"),))]
    passed = values[("tpuwatch_kernel_log_skipped_total", (("reason", "backlog"), ("source", "journal")))]
    assert values[CRITICAL_XID] == 1 and passed > 0 and read + passed == 20_001


def test_journal_storm_passed_over_still_yields_a_critical_entry_from_its_middle(tmp_path: Path,
                                                                                 journal_module: object) -> None:
    journal = tmp_path / "k.journal"
    storm = [journal_entry({"MESSAGE": XID79.replace("79", "13").replace("1234", str(i))}, 1000 + i)
             for i in range(20_000)]
    # Composed: another GPU's fall off the bus, tagged by the kernel with its device, inside the storm.
    storm.insert(10_000, journal_entry({"MESSAGE": "NVRM: Xid (PCI:0000:b3:00): 79, pid=7, name=python3, GPU has "
                                                   "fallen off the bus.", "_KERNEL_DEVICE": "+pci:0000:b3:00.0"},
                                       15_000))
    write_journal(journal, storm)
    collector = _journal_storm(tmp_path, journal)
    values = _caught_up(collector)
    read = values[("tpuwatch_kernel_log_records_total", (("source", "journal"),))]
    passed = values[("tpuwatch_kernel_log_skipped_total", (("reason", "backlog"), ("source", "journal")))]
    assert passed > 10_000 and read + passed == 20_001
    assert values[CRITICAL_XID] == 1
    assert [e.pci for e in collector.recent_events() if e.severity == "critical"] == ["0000:b3:00.0"]


def test_journal_without_kernel_messages_is_degraded_until_one_arrives(tmp_path: Path,
                                                                       journal_module: object) -> None:
    journal = tmp_path / "k.journal"
    write_journal(journal, [journal_entry({"_TRANSPORT": "stdout", "MESSAGE": "user space"}, 1000)])
    source = JournalSource(None, str(journal))
    assert source.degraded is not None and "holds no kernel messages" in source.degraded
    write_journal(journal, [journal_entry({"MESSAGE": "kernel"}, 1001)])
    assert [r.message for r in records_of(source.read())] == ["kernel"] and source.degraded is None


# --- a full or read-only disk never blinds the kernel log ----------------------------------------------------

@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB tmpfs, mounted for the test (root only; a failure in CI)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True,
                            text=True)
    if result.returncode != 0:
        if os.environ.get("TPUWATCH_REQUIRE_TOOLS") == "1":
            pytest.fail(f"cannot mount a tmpfs in CI: {result.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> None:
    """Write until the file system is full."""
    with open(directory / "filler", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass


def test_full_disk_counts_every_event_and_saves_once_there_is_room(tmp_path: Path, small_tmpfs: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    log, state = tmp_path / "kern.log", small_tmpfs / "kernel_log" / "file.json"
    log.write_text("")
    collector = _collector(FileSource(str(log), state))
    fill(small_tmpfs)
    for _ in range(20):
        _append(log, XID79 + "\n")
        values = _values(collector.collect())
    assert values[CRITICAL_XID] == 20  # 20 of 20, the disk full all along
    assert values[("tpuwatch_kernel_log_position_save_failures_total", (("source", "file"),))] == 20
    assert sum("not saved (kept in memory, retried at each save)" in r.message for r in caplog.records) == 1
    assert not state.exists() and not state.with_name("file.json.tmp").exists()
    (small_tmpfs / "filler").unlink()
    values = _values(collector.collect())  # nothing new read: the failed save is retried all the same
    assert values[("tpuwatch_kernel_log_position_save_failures_total", (("source", "file"),))] == 20
    assert saved_state(state)["offset"] == log.stat().st_size


def test_read_only_state_directory_counts_every_event(tmp_path: Path, small_tmpfs: Path) -> None:
    log, state = tmp_path / "kern.log", small_tmpfs / "kernel_log" / "file.json"
    log.write_text("")
    collector = _collector(FileSource(str(log), state))
    collector.collect()
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    _append(log, XID79 + "\n")
    values = _values(collector.collect())
    assert values[CRITICAL_XID] == 1
    assert values[("tpuwatch_kernel_log_position_save_failures_total", (("source", "file"),))] == 1


def _scrape(daemon: DaemonProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = requests.get(f"{daemon.url}/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_daemon_on_a_full_disk_counts_the_next_event(start_daemon: Callable[..., DaemonProcess], tmp_path: Path,
                                                     small_tmpfs: Path) -> None:
    tag = f"tpuwatch-test-{uuid.uuid4().hex[:12]}"
    log = tmp_path / "kern.log"
    log.write_text("")
    daemon = start_daemon({**SIM_FAST, "state_dir": str(small_tmpfs / "state"),
                           "kernel_log": {"source": "file", "path": str(log),
                                          "rules_dirs": [write_selftest_rule(tmp_path / "rules", tag)]}})
    daemon.wait_ready()
    fill(small_tmpfs)  # filled while it runs
    _append(log, f"{tag}: device 0000:10:00.0 failed\n")
    counter = ("tpuwatch_kernel_events_total", (("device", "0"), ("rule", "selftest"), ("severity", "critical")))
    wait_until(lambda: _scrape(daemon).get(counter) == 1.0, what="the event to be counted on a full disk")
    failures = ("tpuwatch_kernel_log_position_save_failures_total", (("source", "file"),))
    wait_until(lambda: _scrape(daemon).get(failures, 0) >= 1, timeout=20, what="a failed save of the position")
    assert _scrape(daemon)[("tpuwatch_collector_success", (("collector", "kernel_log"),))] == 1.0
    assert "Traceback" not in daemon.log()


def test_a_kernel_event_is_on_metrics_from_the_cycle_after_it_is_written(
        start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    """The follower reads as lines come and hands what it read to the cycle: an event is on /metrics once the next
    cycle ran, within an interval and a follow period or two of being written (tests/test_kernel_log_handoff.py
    shows that nothing reaches the store before)."""
    tag = f"tpuwatch-test-{uuid.uuid4().hex[:12]}"
    log = tmp_path / "kern.log"
    log.write_text("")
    daemon = start_daemon({**SIM_FAST, "interval": "2s", "collector_timeout": "1s",
                           "kernel_log": {"source": "file", "path": str(log),
                                          "rules_dirs": [write_selftest_rule(tmp_path / "rules", tag)]}})
    daemon.wait_ready()
    zero = ("tpuwatch_kernel_events_total", (("device", ""), ("rule", "selftest"), ("severity", "critical")))
    wait_until(lambda: zero in _scrape(daemon), timeout=20, what="the first cycle's counters")
    _append(log, f"{tag}: device 0000:10:00.0 failed\n")
    counter = ("tpuwatch_kernel_events_total", (("device", "0"), ("rule", "selftest"), ("severity", "critical")))
    wait_until(lambda: _scrape(daemon).get(counter) == 1.0, timeout=10, what="the event on /metrics")


# --- nothing silently unmonitored ----------------------------------------------------------------------------

def test_missing_file_is_degraded_then_followed_once_it_appears(start_daemon: Callable[..., DaemonProcess],
                                                                tmp_path: Path) -> None:
    log = tmp_path / "later" / "kern.log"
    daemon = start_daemon({**SIM_FAST, "kernel_log": {"source": "file", "path": str(log), "rules_dirs": []}})
    daemon.wait_ready()
    health = requests.get(f"{daemon.url}/healthz", timeout=5).json()
    reason = f"kernel log file {log} does not exist (it is followed once it appears)"
    assert health["status"] == "degraded" and health["warnings"] == [f"collector kernel_log degraded: {reason}"]
    assert health["checks"]["collector:kernel_log"]["status"] == "degraded"
    assert f"WARNING tpuwatch.kernel_log.filesource: kernel log: {reason}" in daemon.log()
    log.parent.mkdir()
    log.write_text(XID79 + "\n")  # the file appears: read from its start, like tail -F
    wait_until(lambda: _scrape(daemon).get(CRITICAL_XID) == 1.0, what="the first line of the new file")
    wait_until(lambda: requests.get(f"{daemon.url}/healthz", timeout=5).json()["status"] == "healthy",
               what="the degraded state to clear")


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpuwatch", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_config_check_warns_about_a_missing_file(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"kernel_log: {{source: file, path: {tmp_path}/kern.log}}\n")
    result = _cli("config", "check", "--config", str(config))
    assert result.returncode == 0 and result.stdout == f"{config}: ok\n"
    assert result.stderr == (f"tpuwatch: config warning: kernel_log.path: {tmp_path}/kern.log does not exist (yet): "
                             "it is followed once it appears\n")


def test_no_usable_source_is_a_warning_in_config_check_and_check(tmp_path: Path) -> None:
    # A host without systemd-python: a package of that name that cannot be imported stands for its absence.
    (tmp_path / "shadow" / "systemd").mkdir(parents=True)
    (tmp_path / "shadow" / "systemd" / "__init__.py").write_text("raise ImportError('not installed here')\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"paths: {{dev: {tmp_path}}}\ndevices: {{backend: none}}\ncanary: {{enabled: false}}\n")
    env = {"PYTHONPATH": str(tmp_path / "shadow")}
    reason = (f"no kernel-log source usable (kmsg: cannot open {tmp_path}/kmsg: No such file or directory; "
              "journal: systemd-python is not installed (pip install tpuwatch[systemd]))")
    checked = _cli("config", "check", "--config", str(config), env=env)
    assert checked.returncode == 0
    assert checked.stderr == f"tpuwatch: config warning: kernel_log.source: auto: {reason}\n"
    report = _cli("check", "--json", "--config", str(config), env=env)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["warnings"] == [f"collector kernel_log degraded: {reason}"]
    table = _cli("check", "--config", str(config), env=env)
    assert f"warning: collector kernel_log degraded: {reason}" in table.stdout.splitlines()


def test_failed_saves_are_counted_logged_once_and_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "blocker").write_text("a file where the state directory should be")
    position = Position(tmp_path / "blocker" / "file.json", lambda state: None)
    assert not position.save({"offset": 1}) and not position.save({"offset": 2})
    assert position.failures == 2
    assert sum("not saved (kept in memory, retried at each save)" in r.message for r in caplog.records) == 1
    (tmp_path / "blocker").unlink()
    assert position.save({"offset": 2}) and position.failures == 2
    assert saved_state(tmp_path / "blocker" / "file.json") == {"offset": 2}
