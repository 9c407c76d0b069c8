"""The previous boot's crash: pstore records as the kernel writes them, the journal's previous boot in a real
journal file made by systemd-journal-remote, once per boot, within a bounded time."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from tpuwatch.alerting.rules import CompiledRule, default_rules_text, parse_rules, tracks
from tpuwatch.alerting.tracker import Tracker
from tpuwatch.kernel_log import lastboot
from tpuwatch.kernel_log.lastboot import PreviousBootCollector, parse_record, pstore_crashes, record_crash
from tpuwatch.kernel_log.rulefile import load_rules
from tpuwatch.kernel_log.rules import RuleSet
from tpuwatch.samples import Sample

from conftest import require_tool, run_cli, saved_state, wait_until

PSTORE = Path(__file__).parent / "testdata" / "kernel_log" / "pstore"
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
THIS_BOOT = "4f3c2b1a0e9d8c7b6a5f4e3d2c1b0a99"
NOW = time.time()


def test_the_dump_header_and_the_crash_lines_are_read_from_literal_records() -> None:
    text = "Oops#2 Part3\n<4>[   12.5][    C0] first\n<1>[   13.0] BUG: unable to handle page fault for address\n"
    assert parse_record(text) == ("Oops", 2, 3, ["first", "BUG: unable to handle page fault for address"])
    assert parse_record("not a pstore record\n") is None
    crash = record_crash(text, "dmesg-ramoops-4", None)
    assert crash is not None
    assert (crash.kind, crash.lines) == ("oops", ("BUG: unable to handle page fault for address",))
    assert record_crash("Shutdown#1 Part1\n<5>[ 1.0] reboot: Restarting system\n", "x", None) is None, "clean"
    # A shutdown dump whose lines show a panic is a crash all the same.
    crash = record_crash("Emergency#1 Part1\n<0>[ 1.0] Kernel panic - not syncing: hung_task: blocked tasks\n", "x",
                         None)
    assert crash is not None and crash.kind == "panic"


@pytest.mark.parametrize("line,kind", [
    ("Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000009", "panic"),
    ("Kernel panic - not syncing: Timeout: Not all CPUs entered broadcast exception handler", "mce"),
    ("mce: [Hardware Error]: Machine check: Processor context corrupt", "mce"),
    ("[Hardware Error]: System Fatal error.", "mce"),
    ("{3}[Hardware Error]: event severity: fatal", "hardware_error"),
    ("divide error: 0000 [#1] SMP NOPTI", "oops"),
    ("Internal error: Oops: 0000000096000005 [#1] PREEMPT SMP", "oops"),
    ("kernel BUG at mm/slub.c:4053!", "oops"),
    ("BUG: unable to handle page fault for address: ffffffffffffff80", "oops"),
    # What the kernel carries on after is no crash: a corrected or recovered machine check, a BUG report that is
    # no oops, a process's own fault.
    ("mce: [Hardware Error]: CPU 1: Machine Check Exception: 5 Bank 8: 8c00004000010090", None),
    ("[Hardware Error]: Uncorrected, software restartable error.", None),
    ("BUG: scheduling while atomic: swapper/0/0/0x00000002", None),
    ("traps: python3[4242] general protection fault ip:7f3a2b1c sp:7ffd1e2f error:0 in libc.so.6", None),
    ("{4}[Hardware Error]: event severity: recoverable", None),
])
def test_a_line_is_a_crash_line_as_the_shipped_rules_say(line: str, kind: str | None) -> None:
    found = lastboot.crash_lines(["systemd[1]: Started Session 4.", line, "CPU: 3 PID: 1 Comm: init"])
    if kind is None:
        assert found is None
    else:
        assert found is not None and (found[0], found[1][0]) == (kind, line)


def test_the_crash_kinds_come_from_the_rule_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """lastboot holds no patterns of its own: what a rule's ``crash`` says is what it finds."""
    rules = load_rules([])
    panic = next(r for r in rules.rules if r.name == "kernel_panic")
    assert panic.crash is not None
    changed = dataclasses.replace(panic, crash=dataclasses.replace(panic.crash, kind="oops"))
    monkeypatch.setattr(lastboot, "shipped_rules", lambda: RuleSet([changed if r is panic else r for r in rules.rules]))
    assert lastboot.crash_lines(["Kernel panic - not syncing: sysrq triggered crash"]) == (
        "oops", ("Kernel panic - not syncing: sysrq triggered crash",))
    monkeypatch.setattr(lastboot, "shipped_rules", lambda: RuleSet([r for r in rules.rules if r is not panic]))
    assert lastboot.crash_lines(["Kernel panic - not syncing: sysrq triggered crash"]) is None


def _pstore(tmp_path: Path, *fixtures: str) -> Path:
    root = tmp_path / "sys" / "fs" / "pstore"
    root.mkdir(parents=True, exist_ok=True)
    for name in fixtures:
        for record in (PSTORE / name).iterdir():
            shutil.copyfile(record, root / record.name)
            os.utime(root / record.name, (NOW - 120, NOW - 120))
    return root


def test_a_panic_over_two_efi_records_is_one_crash_with_part1s_lines(tmp_path: Path) -> None:
    (crash,) = pstore_crashes(_pstore(tmp_path, "efi"), None, NOW - 60)
    assert (crash.kind, crash.source) == ("panic", "pstore")
    assert crash.lines[:2] == ("Kernel panic - not syncing: sysrq triggered crash",
                               "CPU: 1 PID: 2536 Comm: sh Not tainted 5.4.73-10450-g5f72588ca054 #1")
    assert crash.where == "pstore dmesg-efi-172172172101001, Panic#1 Part1"
    assert crash.message().splitlines()[0] == ("the previous boot ended in a kernel panic (pstore "
                                               "dmesg-efi-172172172101001, Panic#1 Part1)")


def test_each_kind_of_crash_is_named(tmp_path: Path) -> None:
    kinds = sorted((c.kind, c.lines[0]) for c in pstore_crashes(
        _pstore(tmp_path, "ramoops", "mce", "shutdown"), None, NOW - 60))
    # An Oops that ended in a panic is a panic (its first lines are the Oops's); a panic a machine check caused
    # is a machine check.
    assert kinds == [("mce", "mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 7: be00000000800400"),
                     ("panic", "BUG: kernel NULL pointer dereference, address: 0000000000000008")]


def test_old_and_compressed_records_are_passed_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _pstore(tmp_path, "ramoops")
    os.utime(root / "dmesg-ramoops-0", (NOW - 10 * 86400, NOW - 10 * 86400))  # a crash of ten days ago
    (root / "dmesg-efi-99.enc.z").write_bytes(b"x\x9c\x03\x00\x00\x00\x00\x01")
    with caplog.at_level(logging.WARNING):
        assert pstore_crashes(root, None, NOW - 60) == []
    assert any("dmesg-efi-99.enc.z is compressed" in r.getMessage() for r in caplog.records)


def test_systemd_pstores_archive_is_read(tmp_path: Path) -> None:
    archive = tmp_path / "var" / "lib" / "systemd" / "pstore" / "172172172101001" / "001"
    archive.mkdir(parents=True)
    shutil.copyfile(PSTORE / "efi" / "dmesg-efi-172172172101001", archive / "dmesg.txt")
    empty = tmp_path / "sys" / "fs" / "pstore"
    empty.mkdir(parents=True)
    (crash,) = pstore_crashes(empty, tmp_path / "var" / "lib" / "systemd" / "pstore", NOW - 60)
    assert crash.kind == "panic" and crash.where.startswith("pstore dmesg.txt")


def _collector(pstore: Path, boot: str, state: Path | None, **kwargs: object) -> PreviousBootCollector:
    return PreviousBootCollector(pstore, None, None, boot, state, journal_enabled=False, boot_time=NOW - 60,
                                 wait=5.0, **kwargs)  # type: ignore[arg-type]


def _values(samples: list[Sample]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, s.labels): s.value for s in samples}


EVENTS = ("tpuwatch_kernel_events_total", (("device", ""), ("rule", "previous_boot_panic"), ("severity", "critical")))
CRASH = ("tpuwatch_previous_boot_crash", (("kind", "panic"), ("source", "pstore")))


def test_a_crash_is_reported_once_per_boot_and_a_record_nobody_cleared_never_again(tmp_path: Path) -> None:
    pstore = _pstore(tmp_path, "efi")
    state = tmp_path / "state" / "kernel_log" / "previous_boot.json"
    first = _collector(pstore, THIS_BOOT, state)
    assert _values(first.collect()) == {CRASH: 1, EVENTS: 1}
    (event,) = first.recent_events()
    assert (event.rule, event.severity, event.fields) == ("previous_boot_panic", "critical",
                                                          {"kind": "panic", "source": "pstore"})
    assert "Kernel panic - not syncing: sysrq triggered crash" in event.message
    assert saved_state(state)["boot_id"] == THIS_BOOT
    # tpuwatch restarted, same boot: the crash is still shown, not reported again.
    again = _collector(pstore, THIS_BOOT, state)
    assert _values(again.collect()) == {CRASH: 1, EVENTS: 0} and again.recent_events() == []
    # The next boot finds the same records (nobody cleared pstore): not a new crash.
    next_boot = _collector(pstore, "00112233445566778899aabbccddeeff", state)
    assert _values(next_boot.collect())[EVENTS] == 0
    # A crash of that boot leaves a new record: reported at the boot after.
    _pstore(tmp_path, "ramoops")
    later = _collector(pstore, "ffeeddccbbaa99887766554433221100", state)
    assert _values(later.collect())[EVENTS] == 1
    assert later.recent_events()[0].fields["kind"] == "panic"


def test_a_crash_raises_the_critical_kernel_alert(tmp_path: Path) -> None:
    samples = _collector(_pstore(tmp_path, "mce"), THIS_BOOT, None).collect()
    rules = [CompiledRule(r) for r in parse_rules(default_rules_text(), "built-in")
             if r.alert == "KernelHardwareErrorCritical"]
    tracker = Tracker()
    tracker.observe(samples, tracks(r.rule for r in rules), 1e9)
    fired = [c for r in rules for c in r.evaluate(samples, tracker, 1e9, {"host": "h"})]
    assert [(c.labels["rule"], c.value) for c in fired] == [("previous_boot_panic", 1)]


def test_a_hung_read_never_delays_start_or_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    monkeypatch.setattr(lastboot, "read_crashes", lambda *args: release.wait(30) and [])
    monkeypatch.setattr(lastboot, "READ_DEADLINE_S", 0.0)
    collector = PreviousBootCollector(tmp_path, None, None, THIS_BOOT, None, journal_enabled=False)  # returns at once
    assert _values(collector.collect()) == {EVENTS: 0}, "nothing yet, and no wait: wait is 0 by default"
    assert collector.degraded == "reading pstore and the journal took over 0s: not looked at"
    release.set()
    wait_until(lambda: collector._call.done.is_set(), what="the read to end")
    assert _values(collector.collect()) == {EVENTS: 0} and collector.degraded is None


def _export(boot: str, messages: list[str], first_usec: int, transport: str = "kernel") -> str:
    entries = []
    for i, message in enumerate(messages):
        fields = {"__REALTIME_TIMESTAMP": str(first_usec + i * 1_000_000), "__MONOTONIC_TIMESTAMP": str(1 + i),
                  "_BOOT_ID": boot, "_TRANSPORT": transport, "PRIORITY": "3", "MESSAGE": message}
        entries.append("".join(f"{k}={v}\n" for k, v in fields.items()))
    return "\n".join(entries) + "\n"


def _journal(path: Path, boots: list[tuple[str, list[str], int]]) -> None:
    tool = require_tool(JOURNAL_REMOTE)
    for boot, messages, first in boots:
        subprocess.run([tool, "-o", str(path), "-"], input=_export(boot, messages, first), text=True, check=True,
                       capture_output=True, timeout=30)


@pytest.mark.parametrize("ending,expected", [
    (["NVRM: loading NVIDIA UNIX x86_64 Kernel Module", "BUG: kernel NULL pointer dereference, address: 8",
      "Oops: 0000 [#1] SMP NOPTI", "RIP: 0010:kfree+0x5d/0x250"], ("oops", "BUG: kernel NULL pointer dereference")),
    (["systemd-shutdown[1]: Syncing filesystems and block devices.", "reboot: Restarting system"], None),
])
def test_the_journals_previous_boot_is_read_from_a_real_journal_file(tmp_path: Path, ending: list[str],
                                                                     expected: tuple[str, str] | None) -> None:
    pytest.importorskip("systemd.journal")
    previous, current = uuid.uuid4().hex, uuid.uuid4().hex
    start = 1_764_460_800_000_000
    journal = tmp_path / "system.journal"
    # An Oops hours before the end is not the end: only the last WINDOW_S count.
    _journal(journal, [(previous, ["Oops: 0000 [#1] long ago", "Linux version 5.15.0"], start),
                       (previous, ending, start + 6 * 3600 * 1_000_000),
                       (current, ["Linux version 5.15.0 (the next boot)"], start + 7 * 3600 * 1_000_000)])
    found = lastboot.journal_crash(str(journal), current)
    if expected is None:
        assert found is None
        return
    assert found is not None and (found.kind, found.source) == ("oops", "journal")
    assert found.lines[0].startswith(expected[1]) and found.where == f"journal, boot {uuid.UUID(previous)}"
    assert lastboot.journal_crash(str(journal), previous) is None, "the first boot has none before it"


def test_check_warns_of_the_previous_boots_panic(tmp_path: Path) -> None:
    _pstore(tmp_path, "efi")
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"paths": {"sysfs": str(tmp_path / "sys")}, "devices": {"backend": "none"},
                                "state_dir": str(tmp_path / "state"), "canary": {"enabled": False},
                                "kernel_log": {"source": "none", "pstore_archive": None}}))
    result = run_cli("check", "--json", "--config", str(path))
    report = json.loads(result.stdout)
    assert [w for w in report["warnings"] if "previous boot" in w] == [
        "the previous boot ended in a kernel panic (pstore dmesg-efi-172172172101001, Panic#1 Part1): "
        "Kernel panic - not syncing: sysrq triggered crash | CPU: 1 PID: 2536 Comm: sh Not tainted "
        "5.4.73-10450-g5f72588ca054 #1"]
    assert [e["rule"] for e in report["kernel_events"]] == ["previous_boot_panic"]
    assert not (tmp_path / "state").exists(), "check writes no state"
