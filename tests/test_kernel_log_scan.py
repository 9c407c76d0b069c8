"""`tpuwatch logscan`: every input format, line numbers, odd input, JSON shape, rule errors, exit codes."""

from __future__ import annotations

import argparse
import io
import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from tpuwatch.config import Config, parse
from tpuwatch.kernel_log import filesource, logscan
from tpuwatch.kernel_log.attribution import Attribution, SysfsResolver
from tpuwatch.kernel_log.blocks import Block
from tpuwatch.kernel_log.events import KernelEvent
from tpuwatch.kernel_log.matcher import StreamMatcher
from tpuwatch.kernel_log.records import MAX_LINE_BYTES, parse_kmsg, parse_record
from tpuwatch.kernel_log.rulefile import load_rules

from kernellog import Scanned, scan

DATA = Path(__file__).parent / "testdata" / "kernel_log"
FORMATS = ["dmesg.txt", "dmesg_T.txt", "kern.log", "kmsg.txt", "journal.json"]
EXPECTED = [  # (line in dmesg.txt, rule, severity, pci, xid)
    (13, "pcie_aer_corrected", "info", "0000:3b:00.0", None),  # its three detail lines are the same message
    (17, "nvidia_xid", "warning", "0000:3b:00.0", 13),
    (18, "edac_corrected", "info", None, None),
    (20, "oom_kill", "warning", None, None),
    (22, "hung_task", "warning", None, None),
    (25, "pci_reset_failed", "critical", "0000:00:05.0", None),
    (26, "tpu_driver_error", "critical", None, None),  # accel0: no sysfs here to reach its PCI address
    (27, "mce", "critical", None, None),  # "Machine check events logged" after it is the same fault
    (29, "soft_lockup", "warning", None, None),
    (30, "nvidia_xid", "critical", "0000:3b:00.0", 79),  # "GPU has fallen off the bus" after it is the same fault
    (32, "cper_fatal", "critical", None, None),
]
RULES = load_rules([])
NO_USER_RULES = parse("kernel_log: {rules_dirs: []}")


def _lookup(pci: str) -> str | None:
    return {"0000:3b:00.0": "3"}.get(pci)


def _scan(data: bytes, lookup: Callable[[str], str | None] | Attribution = lambda pci: None
          ) -> tuple[list[KernelEvent], Scanned]:
    scanned = scan(data, RULES, lookup)
    return scanned.events, scanned


def _logscan(capsys: pytest.CaptureFixture[str], *argv: str, config: Config | None = None) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    logscan.add_arguments(parser)
    code = logscan.run(parser.parse_args(list(argv)), config or NO_USER_RULES)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_gives_the_same_events(name: str) -> None:
    events, stats = _scan((DATA / name).read_bytes())
    assert [(e.rule, e.severity, e.pci, e.xid) for e in events] == [x[1:] for x in EXPECTED]
    assert stats.skipped == 0
    if name != "kmsg.txt":  # kmsg continuation lines shift line numbers
        assert [e.line for e in events] == [x[0] for x in EXPECTED]
        assert stats.lines == 32


def test_kmsg_continuation_attributes_through_sysfs_and_is_not_split_across_blocks(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    device = tmp_path / "devices" / "pci0000:00" / "0000:3b:00.0" / "accel" / "accel0"
    device.mkdir(parents=True)
    (tmp_path / "dev" / "char").mkdir(parents=True)
    (tmp_path / "dev" / "char" / "121:0").symlink_to("../../devices/pci0000:00/0000:3b:00.0/accel/accel0")
    attribution = Attribution(_lookup, SysfsResolver(str(tmp_path)))
    record = (b"3,7,100,-;accel accel0: gasket_reset_nolock: Device reported as dead.\n"
              b" SUBSYSTEM=accel\n DEVICE=c121:0\n")
    filler = b"6,1,1,-;" + b"x" * 60 + b"\n"
    monkeypatch.setattr(filesource, "FILE_READ_BYTES", 256)
    for padding in range(12):  # the record lands across every possible block boundary
        events, stats = _scan(filler * padding + record + filler, attribution)
        assert [(e.line, e.pci, e.device) for e in events] == [(padding + 1, "0000:3b:00.0", "3")]
        assert stats.lines == padding + 4


def test_device_comes_from_the_lookup() -> None:
    events, _ = _scan(b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
                      b"NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus.\n", _lookup)
    assert [e.device for e in events] == ["3", None]


def test_a_few_bad_bytes_hide_no_line_and_junk_or_over_long_lines_are_skipped_and_counted() -> None:
    # Line 2's bad bytes are replaced and it is matched (they could be in a process name anyone sets); line 3
    # is mostly control bytes, lines 4 and 5 are over 64 KiB: skipped.
    xid = b"NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n"
    data = (b"" + xid + b"\xff\xfe not utf-8 NVRM: Xid (PCI:0000:3b:00): 48\n" + b"\x00\x01\x02binary\x7f\n"
            + b"A" * (1 << 20) + b" NVRM: Xid (PCI:0000:3b:00): 48\n" + b"B" * (MAX_LINE_BYTES + 1) + b"\n"
            + "caf\u00e9 ok\r\n".encode() + xid + b"tail without newline " + xid.rstrip())
    events, stats = _scan(data)
    assert [e.line for e in events] == [1, 2, 7, 8]
    assert (stats.lines, stats.skipped) == (8, 3)


def test_nul_runs_a_crash_left_in_the_file_hide_no_line() -> None:
    # Composed: a kern.log cut short by a crash (its tail zero-filled, 2 MiB here), then the next boot's lines
    # written right after the NULs.
    xid = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    events, stats = _scan(b"e1000e: eno1 NIC Link is Up\n" + b"\0" * (2 << 20) + xid + xid)
    assert [e.line for e in events] == [2, 3] and stats.skipped == 0


def test_line_numbers_and_counts_do_not_depend_on_where_blocks_end(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    pieces = [b"[    1.000000] e1000e 0000:00:1f.6 eno1: NIC Link is Up\n",
              b"[    1.000000] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x\n",
              b"[    1.000000] mce: CPU supports 16 MCE banks\n",
              b"6,1,1,-;nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer\n"
              b" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n",
              b"[    1.000000] NVRM: The NVIDIA GPU 0000:b3:00.0\n[    1.000000] NVRM: (PCI ID: 10de:26b5) installed "
              b"in this system has\n[    1.000000] NVRM: fallen off the bus and is not responding to commands.\n"]
    default = filesource.FILE_READ_BYTES
    for _ in range(20):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 60)))
        if rng.random() < 0.5:
            data = data[:-1]  # no newline at the end
        whole, stats = _scan(data)
        assert stats.lines == data.count(b"\n") + (not data.endswith(b"\n"))
        for size in (64, 200, 333):
            monkeypatch.setattr(filesource, "FILE_READ_BYTES", size)
            events, small = _scan(data)
            assert events == whole
            assert (small.lines, small.skipped) == (stats.lines, stats.skipped)
        monkeypatch.setattr(filesource, "FILE_READ_BYTES", default)


def test_huge_line_never_held_whole() -> None:
    class Stream(io.RawIOBase):
        """A 64 MiB line that is generated, not stored, then one Xid line."""

        def __init__(self) -> None:
            self.left = 64 << 20

        def readable(self) -> bool:
            return True

        def read(self, size: int = -1) -> bytes:
            if self.left <= 0:
                data, self.left = (b"\nNVRM: Xid (PCI:0000:3b:00): 48\n", -1) if self.left == 0 else (b"", -1)
                return data
            chunk = min(size, self.left)
            self.left -= chunk
            return b"z" * chunk

    stats = scan(Stream(), RULES)
    assert [e.line for e in stats.events] == [2] and (stats.lines, stats.skipped) == (2, 1)


def test_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.log").write_bytes(b"")
    code, out, _ = _logscan(capsys, str(tmp_path / "empty.log"), "--json")
    assert code == 0
    assert json.loads(out) == {"file": str(tmp_path / "empty.log"), "events": [], "lines": 0, "skipped_lines": 0,
                               "counts": {"critical": 0, "warning": 0, "info": 0}}


def test_logscan_json_follows_the_event_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _logscan(capsys, str(DATA / "dmesg.txt"), "--json")
    assert code == 1 and err == ""  # critical events found
    result = json.loads(out)
    assert result["lines"] == 32 and result["counts"] == {"critical": 5, "warning": 4, "info": 2}
    xid = result["events"][-2]
    assert xid == {"line": 30, "rule": "nvidia_xid", "severity": "critical", "pci": "0000:3b:00.0", "device": None,
                   "xid": 79, "message": "NVRM: Xid (PCI:0000:3b:00): 79, pid=6262, name=python3, GPU has fallen off "
                   "the bus.", "fields": {"pid": "6262", "process": "python3"}}
    assert all(set(e) >= {"line", "rule", "severity", "pci", "device", "message"} for e in result["events"])


def test_logscan_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _logscan(capsys, str(DATA / "dmesg.txt"))
    lines = out.splitlines()
    assert code == 1 and len(lines) == 12
    assert lines[9].split()[:6] == ["30", "critical", "nvidia_xid", "device=-", "pci=0000:3b:00.0", "xid=79"]
    assert lines[-1].endswith("32 lines, 11 events (5 critical, 4 warning, 2 info), 0 lines skipped "
                              "(not text or over 64 KiB)")


def test_logscan_without_critical_events_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "k.log").write_text("INFO: task python3:1 blocked for more than 120 seconds.\n")
    assert _logscan(capsys, str(tmp_path / "k.log"))[0] == 0


def test_logscan_devices_from_the_configured_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "k.log").write_text("vfio-pci 0000:11:00.0: not ready 65535ms after FLR; giving up\n")  # sim chip 1
    config = parse("devices: {backend: sim}\nkernel_log: {rules_dirs: []}")
    _, out, _ = _logscan(capsys, str(tmp_path / "k.log"), "--json", config=config)
    assert json.loads(out)["events"][0]["device"] == "1"


def test_logscan_extra_rules_and_broken_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "k.log").write_text("ice 0000:5e:00.0: NIC Link is Down\n")
    good = tmp_path / "good.yaml"
    good.write_text("rules: [{name: ice_link_down, regex: 'NIC Link is Down', keywords: [Link is Down]}]\n")
    code, out, _ = _logscan(capsys, str(tmp_path / "k.log"), "--rules", str(good), "--json")
    assert code == 0 and [e["rule"] for e in json.loads(out)["events"]] == ["ice_link_down"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: [{name: broken, regex: '(unclosed'}]\n")
    code, out, err = _logscan(capsys, str(tmp_path / "k.log"), "--rules", str(bad))
    assert code == 2 and out == ""
    assert err.startswith(f"tpuwatch: rule error: {bad}: rule 'broken': invalid regex: missing )")
    assert err.count("\n") == 1


def test_logscan_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _logscan(capsys, str(tmp_path / "absent.log"))
    assert (code, out) == (2, "")
    assert err == f"tpuwatch: cannot read {tmp_path / 'absent.log'}: No such file or directory\n"


def test_a_line_flooded_with_keywords_is_looked_at_once_per_keyword(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile input: a line of thousands of keyword finds costs one look at the line, not one per find (each
    look searches back to the line's start), and the fault after it is still found."""
    calls: list[int] = []
    start_of = Block.start_of

    def counted(self: Block, offset: int) -> int:
        calls.append(offset)
        return start_of(self, offset)

    monkeypatch.setattr(Block, "start_of", counted)
    flood = "[    1.000000] " + "BUG" * 5000 + " Oops" * 1000 + "\n"
    data = (flood * 3 + "[    2.000000] BUG: soft lockup - CPU#3 stuck for 23s! [python3:1234]\n").encode()
    assert [e.rule for e in scan(data, RULES).events] == ["soft_lockup"]
    assert len(calls) <= 3 + 1, len(calls)  # each flooded line once, the lockup's line once


@pytest.mark.parametrize("seed", range(10))
def test_a_kmsg_record_read_from_a_block_is_the_one_parse_kmsg_gives(seed: int) -> None:
    """A kmsg record's message and device come from its lines as parse_kmsg reads them (which cuts the record at
    64 KiB: a DEVICE= line past that is not read), escapes and all."""
    rng = random.Random(seed)
    for _ in range(50):
        fill = "x" * rng.choice([0, 10, 30_000, 65_000])
        head = f"{rng.randint(0, 7)},{rng.randint(0, 10**6)},{rng.randint(0, 10**9)},-;NVRM: Xid \\x0a{fill}"
        extra = [" SUBSYSTEM=pci"] + [" X=" + "y" * rng.choice([0, 20_000, 40_000]) for _ in range(rng.randint(0, 3))]
        extra.insert(rng.randint(0, len(extra)), " DEVICE=+pci:0000:3b:00.0")
        text = "\n".join([head, *extra]) + "\n[    1.000000] next\n"
        block = Block(text)
        parsed = parse_kmsg("\n".join([head, *extra]))
        assert parsed is not None and parse_record([head, *extra]) == parsed.record
        assert block.record(0) == parsed.record and text[block.end_of(0):].startswith("[    1.000000]")
        assert len(block) == 2


def test_a_record_feeds_the_matcher_with_the_lines_it_spans() -> None:
    """One record splitter: a line that starts with white space continues the record above it, up to 16 of them."""
    text = "[1.0] first message\n  indented continuation\n" + "6,1,1,-;x\n" + " K=v\n" * 17 + "[2.0] last\n"
    block = Block(text)
    assert [r.message for r in block.records()] == ["first message\nindented continuation", "x", " K=v", "last"]
    assert len(block) == 4
    matcher = StreamMatcher(RULES)
    assert matcher.feed(block) == [] and matcher._index == 4


@pytest.mark.parametrize("size", [32, 50, 64, 4096, 256 << 10])
def test_records_and_lines_do_not_depend_on_where_reads_end(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of more than 16 continuation lines is split into records from its head, and a line is over 64 KiB as
    written (colour codes and all), wherever a read ends."""
    monkeypatch.setattr(filesource, "FILE_READ_BYTES", size)
    xid = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    run = scan(b"[1.0] head\n" + b" x\n" * 20 + b" " + xid + b"\n[2.0] next\n" + b"[3.0] " + xid + b"\n", RULES)
    assert [e.line for e in run.events] == [18, 24] and run.lines == 24  # the 17th continuation line begins one
    coloured = b"[1.0] ok\n[2.0] " + xid + b" " + b"\x1b[31mx" * 12_000 + b"\n[3.0] " + xid + b"\n"
    long = scan(coloured, RULES)
    assert [e.line for e in long.events] == [3] and (long.lines, long.skipped) == (3, 1)  # 72 KiB as written
