"""What `tpuwatch logscan` does with files that are not plain text: rotated logs compressed with gzip, xz or bzip2
(read as they are), a file cut short or unreadable midway (what came before is reported, exit 2), zstd and binary
journal files (refused with the command that reads them), and binary junk (a warning, not a silent "no events")."""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from test_kernel_log_resilience import journal_entry, write_journal

from tpuwatch.config import parse
from tpuwatch.kernel_log import logscan
from tpuwatch.kernel_log.logscan import _Reading

REPO = Path(__file__).resolve().parent.parent
DMESG = Path(__file__).parent / "testdata" / "kernel_log" / "dmesg.txt"
NO_USER_RULES = parse("kernel_log: {rules_dirs: []}")
COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress, "xz": lzma.compress, "bzip2": bz2.compress}


def _logscan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    logscan.add_arguments(parser)
    code = logscan.run(parser.parse_args(list(argv)), NO_USER_RULES)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("kind", sorted(COMPRESSORS))
def test_a_compressed_log_gives_the_events_of_the_plain_one(kind: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    plain = _logscan(capsys, str(DMESG), "--json")
    packed = tmp_path / f"kern.log.1.{kind}"
    packed.write_bytes(COMPRESSORS[kind](DMESG.read_bytes()))
    code, out, err = _logscan(capsys, str(packed), "--json")
    assert (code, err) == (plain[0], "") and code == 1
    assert json.loads(out)["events"] == json.loads(plain[1])["events"] != []


def test_a_gzip_file_the_command_line_tool_wrote_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    packed = tmp_path / "kern.log.2.gz"
    packed.write_bytes(subprocess.run(["gzip", "-c", str(DMESG)], capture_output=True, check=True).stdout)
    code, out, _ = _logscan(capsys, str(packed))
    assert code == 1 and out.splitlines()[-1].endswith("32 lines, 11 events (5 critical, 4 warning, 2 info), "
                                                      "0 lines skipped (not text or over 64 KiB)")


def test_a_compressed_file_cut_short_reports_what_it_held_and_exits_2(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    healthy = b"".join(b"[%6d.000000] usb 1-1: reset high-speed USB device number %d\n" % (i, i) for i in range(5000))
    fault = b"[ 9999.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    data = gzip.compress(fault + healthy * 4)
    cut = tmp_path / "kern.log.gz"
    cut.write_bytes(data[:len(data) // 2])  # logrotate still writing it, or a copy cut short
    code, out, err = _logscan(capsys, str(cut), "--json")
    result = json.loads(out)  # the JSON document is whole
    assert [e["xid"] for e in result["events"]] == [79] and code == 1  # the critical event still decides
    assert err.startswith(f"tpuwatch: logscan {cut}: the compressed data ends too soon") and err.count("\n") == 1
    cut.write_bytes(gzip.compress(healthy * 4)[:3000])
    code, out, err = _logscan(capsys, str(cut))
    assert code == 2 and "lines: the lines before it were scanned" in err


def test_a_read_error_midway_keeps_what_was_read_before() -> None:
    class Failing:
        """A disk that gives one piece of the file, then EIO."""

        def __init__(self) -> None:
            self.pieces = [b"first ", b"line\nsecond"]

        def read(self, size: int) -> bytes:
            if not self.pieces:
                raise OSError(5, "Input/output error")
            return self.pieces.pop(0)

    reading = _Reading(Failing())  # type: ignore[arg-type]
    assert reading.read(1 << 20) == b"first line\nsecond" and reading.error == "Input/output error"
    assert reading.read(1 << 20) == b""


@pytest.mark.parametrize(("head", "hint"), [
    (b"\x28\xb5\x2f\xfd\x04\x58", "zstd -dc FILE | tpuwatch logscan -"),  # RFC 8878's frame magic number
    (b'{\n\t"__REALTIME_TIMESTAMP" : "1764586345123456",\n', "journalctl -o json` (one entry per line)"),  # pretty
    (b"__CURSOR=s=dad55514fe1d43baa95387052694ae46;i=1\n", "journalctl -o json` (one entry per line)"),  # export
    (b'data: {"__CURSOR":"s=dad55514fe1d43baa95387052694ae46;i=1"}\n\n', "journalctl -o json` (one"),  # json-sse
])
def test_formats_it_cannot_read_are_refused_with_the_command_that_can(head: bytes, hint: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "kern.log.zst"
    path.write_bytes(head + b"\x00" * 64)
    code, out, err = _logscan(capsys, str(path))
    assert (code, out) == (2, "") and hint in err and err.count("\n") == 1


def test_a_binary_journal_file_is_refused_with_the_journalctl_command(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "system.journal"
    write_journal(path, [journal_entry({"MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x"}, 1)])
    code, out, err = _logscan(capsys, str(path))
    assert (code, out) == (2, "")
    assert err == (f"tpuwatch: logscan {path}: a binary journal file: read it with "
                   "`journalctl --file FILE -k -o json | tpuwatch logscan -`\n")


def test_binary_junk_is_said_to_be_no_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "core"
    path.write_bytes(Path("/bin/ls").read_bytes()[:200_000])
    code, out, err = _logscan(capsys, str(path))
    assert code == 0 and out.splitlines()[-1].startswith(f"{path}: ")
    assert err.startswith(f"tpuwatch: logscan {path}: ") and err.endswith("lines are not text: is it a log?\n")


def test_its_standard_error_is_its_own_one_line(tmp_path: Path) -> None:
    """The command, as run: skipped lines are said in its summary and its one line on stderr, no log record."""
    path = tmp_path / "junk.log"
    path.write_bytes(b"usb ok\n\x01\x02\x03\x04\x05\n" + b"A" * (70 << 10) + b"\n")
    done = subprocess.run([sys.executable, "-m", "tpuwatch", "logscan", str(path)], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stderr == (
        f"tpuwatch: logscan {path}: 2 of 3 lines are not text: is it a log?\n"), done.stderr
    assert done.stdout.endswith("3 lines, 0 events, 2 lines skipped (not text or over 64 KiB)\n")


def test_a_last_line_without_newline_that_is_junk_still_counts(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "k.log"
    path.write_bytes(b"usb 1-1: new device\n\x01\x02\x03\x04\x05\x06")
    _, out, _ = _logscan(capsys, str(path), "--json")
    assert (json.loads(out)["lines"], json.loads(out)["skipped_lines"]) == (2, 1)


def _dmesg_json(messages: list[str]) -> str:
    """A `dmesg --json` document laid out as util-linux 2.38.1 writes it (3-space indents, "},{" between
    entries; checked against `dmesg -J` on a Debian 12 host); the messages are composed."""
    entries = [f'         "pri": 4,\n         "time": {5 + i:12.6f},\n         "msg": {json.dumps(m)}\n'
               for i, m in enumerate(messages)]
    return '{\n   "dmesg": [\n      {\n' + "      },{\n".join(entries) + "      }\n   ]\n}\n"


def test_a_dmesg_json_document_is_read_one_message_per_entry(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dmesg.json"
    path.write_text(_dmesg_json([
        "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
        'audit: type=1400 apparmor="DENIED" operation="open" name="/proc/1/\\\\x"',
        "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "NVRM: fallen off the bus and is not responding to commands.",
        "pcieport 0000:00:1c.0: AER: Corrected error received: 0000:02:00.0",
    ]))
    code, out, _ = _logscan(capsys, str(path), "--json")
    result = json.loads(out)
    assert code == 1 and result["lines"] == 25
    assert [(e["line"], e["rule"], e["pci"]) for e in result["events"]] == [
        (10, "nvidia_xid", "0000:3b:00.0"), (18, "gpu_fell_off_bus", "0000:b3:00.0"),
        (22, "pcie_aer_corrected", "0000:02:00.0")]


@pytest.mark.parametrize("kind", sorted(COMPRESSORS))
def test_damaged_compressed_files_never_raise(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Any byte flipped, cut or inserted anywhere in a compressed log: events or one line on stderr, never a
    traceback."""
    rng = random.Random(f"compressed {kind}")
    packed = COMPRESSORS[kind](DMESG.read_bytes())
    path = tmp_path / "kern.log.1"
    for case in range(150):
        data = bytearray(packed)
        at = rng.randrange(len(data))
        action = case % 3
        if action == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif action == 1:
            del data[at:]
        else:
            data[at:at] = rng.randbytes(rng.randint(1, 64))
        path.write_bytes(bytes(data))
        code, out, err = _logscan(capsys, str(path))
        assert code in (0, 1, 2) and err.count("\n") <= 1, (case, err)
        assert "Traceback" not in err
