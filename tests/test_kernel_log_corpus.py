"""Real kernel log lines (testdata/kernel_log/corpus.yaml) in every form tpuwatch reads: recall, false positives,
one event per fault, PCI attribution and Xid, as logscan sees the file and as the collector sees the records."""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_kernel_log_resilience import journal_entry, write_journal

from tpuwatch.kernel_log.attribution import Attribution, SysfsResolver, prefix_device
from tpuwatch.kernel_log.events import make_event
from tpuwatch.kernel_log.records import Record, parse_kmsg, parse_line
from tpuwatch.kernel_log.rulefile import load_rules
from tpuwatch.kernel_log.scan import ScanStats, scan

from conftest import require_tool

DATA = Path(__file__).parent / "testdata" / "kernel_log"
SNIPPETS: list[dict[str, Any]] = yaml.safe_load((DATA / "corpus.yaml").read_text())["snippets"]
RULES = load_rules([])
FORMS = ["dmesg", "dmesg_T", "dmesg_H", "syslog", "short_full", "short_monotonic", "short_unix", "kmsg", "journal"]
_PROBE = parse_kmsg("6,1,0,-;a\\x0ab")
KMSG_DECODES = _PROBE is not None and _PROBE.record.message == "a\nb"
IDS = [f"{i}:{s['source'].rsplit('/', 3)[-3]}" for i, s in enumerate(SNIPPETS)]
Expected = tuple[int, str, str, str | None, int | None]


def _records(snippet: dict[str, Any]) -> list[str]:
    records: list[str] = []
    for line in snippet["log"].rstrip("\n").split("\n"):
        if line.startswith("↳"):
            records[-1] += "\n" + line[1:]
        else:
            records.append(line)
    return records


def _device(message: str) -> tuple[str, str] | None:
    """The SUBSYSTEM and DEVICE the kernel tags a dev_printk record with, from its prefix."""
    prefix = prefix_device(message)
    if prefix is None:
        return None
    driver, device = prefix
    if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", device):
        return "pci", f"+pci:{device}"
    if driver == "accel" and device.startswith("accel"):
        return "accel", f"c121:{device[5:]}"
    return None


def _render(records: list[str], form: str) -> tuple[bytes, list[int]]:
    """The records as one file of ``form``, and the 1-based line each record starts on."""
    out: list[str] = []
    starts: list[int] = []
    for number, message in enumerate(records):
        starts.append(len(out) + 1)
        seconds = 3600 + number * 0.0123
        lines = message.split("\n")
        if form in ("dmesg", "dmesg_T", "dmesg_H") or form.startswith("short_"):
            stamp = {"dmesg": f"[{seconds:12.6f}] ",
                     "dmesg_T": f"[Mon Nov 30 04:{number // 60 % 60:02d}:{number % 60:02d} 2026] ",
                     "dmesg_H": "[Nov30 04:37] " if number == 0 else "[  +0.012300] ",  # the time, then deltas
                     # journalctl -k -o short-full, short-monotonic, short-unix
                     "short_full": f"Mon 2026-11-30 04:37:{number % 60:02d} UTC tpu-host kernel: ",
                     "short_monotonic": f"[{seconds:12.6f}] tpu-host kernel: ",
                     "short_unix": f"{1764477000 + seconds:.6f} tpu-host kernel: "}[form]
            out.append(stamp + lines[0])
            out.extend(" " * len(stamp) + rest for rest in lines[1:])  # both indent a record's next lines
        elif form == "syslog":
            out.extend(f"Nov 30 04:37:{number % 60:02d} tpu-host kernel: [{seconds:12.6f}] {line}" for line in lines)
        elif form == "kmsg":
            escaped = "".join(f"\\x{ord(c):02x}" if c == "\n" or c == "\\" or ord(c) < 32 and c != "\t" else c
                              for c in message)
            out.append(f"4,{100 + number},{int(seconds * 1e6)},-;{escaped}")
            device = _device(message)
            if device:
                out.extend([f" SUBSYSTEM={device[0]}", f" DEVICE={device[1]}"])
        else:
            entry: dict[str, Any] = {"__REALTIME_TIMESTAMP": str(int(1764460800e6 + seconds * 1e6)),
                                     "_TRANSPORT": "kernel", "PRIORITY": "4", "MESSAGE": message}
            device = _device(message)
            if device:
                entry.update(_KERNEL_SUBSYSTEM=device[0], _KERNEL_DEVICE=device[1])
            out.append(json.dumps(entry, ensure_ascii=False))
    return ("\n".join(out) + "\n").encode(), starts


# util-linux's own dmesg renders a file of "<prio>[seconds] message" records (dmesg -F) in its other output forms.
DMESG_OPTIONS = {"color": ["--color=always"], "iso": ["--time-format=iso"], "ctime_x": ["-T", "-x"],
                 "reltime_color": ["-H", "--color=always", "--nopager"], "delta": ["--time-format=delta"]}


def _dmesg_render(records: list[str], options: list[str], tmp_path: Path) -> tuple[bytes, list[int]]:
    """The records as util-linux dmesg prints them with ``options`` (each line of a record its own record, as
    syslog writes them), and the 1-based line each record starts on."""
    source = tmp_path / "ring.txt"
    lines: list[str] = []
    starts: list[int] = []
    for number, message in enumerate(records):
        starts.append(len(lines) + 1)
        lines.extend(f"<4>[{3600 + number * 0.0123:12.6f}] {line}" for line in message.split("\n"))
    source.write_text("\n".join(lines) + "\n")
    out = subprocess.run([require_tool("dmesg"), "-F", str(source), *options], capture_output=True, check=True,
                         timeout=30, env={"LC_ALL": "C.UTF-8", "TZ": "UTC"}).stdout
    assert out.count(b"\n") == len(lines)
    return out, starts


# journalctl's own output modes, of a real journal file (systemd-journal-remote) holding the records as kernel
# entries and, last, a line a user logged that says what a kernel line would: never an event, in any mode that
# can tell (all but cat).
JOURNALCTL_MODES = ["short", "short-full", "short-iso", "short-iso-precise", "short-precise", "short-monotonic",
                    "short-unix", "short-delta", "with-unit", "json", "json-seq", "cat"]
_INJECTED = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."


@pytest.fixture(scope="module")
def journals(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Snippet index -> its journal file, made on first use."""
    return {}


def _journal(index: int, records: list[str], journals: dict[int, Path], root: Path) -> Path:
    if index not in journals:
        entries = []
        for number, message in enumerate(records):
            device = _device(message)
            fields = {"MESSAGE": message, "SYSLOG_IDENTIFIER": "kernel", "_HOSTNAME": "tpu-host", "PRIORITY": "4"}
            if device:
                fields.update(_KERNEL_SUBSYSTEM=device[0], _KERNEL_DEVICE=device[1])
            entries.append(journal_entry(fields, 1764460800_000000 + number * 12300))  # type: ignore[arg-type]
        entries.append(journal_entry({"MESSAGE": _INJECTED, "_TRANSPORT": "syslog", "SYSLOG_IDENTIFIER": "root",
                                      "_PID": "4242", "_HOSTNAME": "tpu-host", "PRIORITY": "4"},
                                     1764460800_000000 + len(records) * 12300))
        journals[index] = root / f"snippet{index}.journal"
        write_journal(journals[index], entries)
    return journals[index]


@pytest.fixture(scope="module")
def attribution(tmp_path_factory: pytest.TempPathFactory) -> Attribution:
    """A sysfs where accelN is the TPU chip on 0000:00:0(4+N).0, and the lookup that names chips by PCI address."""
    root = tmp_path_factory.mktemp("sys")
    for index in range(8):
        pci = f"0000:00:{4 + index:02x}.0"
        (root / "devices" / "pci0000:00" / pci / "accel" / f"accel{index}").mkdir(parents=True)
        for link in (root / "class" / "accel" / f"accel{index}", root / "dev" / "char" / f"121:{index}"):
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(f"../../devices/pci0000:00/{pci}/accel/accel{index}")
    return Attribution(lambda pci: None, SysfsResolver(str(root)))


def _expected(snippet: dict[str, Any]) -> list[Expected]:
    return [(e["at"], e["rule"], e["severity"], e.get("pci"), e.get("xid")) for e in snippet["events"]]


def _skip_unless_kmsg_decodes(records: list[str], form: str) -> None:
    if form == "kmsg" and not KMSG_DECODES and any("\n" in r or "\\" in r for r in records):
        pytest.skip("records.py does not decode /dev/kmsg's \\xNN escapes yet")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("snippet", SNIPPETS, ids=IDS)
def test_logscan_finds_each_fault_once_in_every_form(snippet: dict[str, Any], form: str,
                                                      attribution: Attribution) -> None:
    records = _records(snippet)
    _skip_unless_kmsg_decodes(records, form)
    data, starts = _render(records, form)
    events = list(scan(io.BytesIO(data), RULES, attribution, ScanStats()))
    found = [(starts.index(e.line) + 1 if e.line in starts else -(e.line or 0), e.rule, e.severity, e.pci, e.xid)
             for e in events]
    assert found == _expected(snippet)


@pytest.mark.parametrize("options", sorted(DMESG_OPTIONS))
@pytest.mark.parametrize("snippet", SNIPPETS, ids=IDS)
def test_logscan_reads_every_form_util_linux_dmesg_prints(snippet: dict[str, Any], options: str, tmp_path: Path,
                                                          attribution: Attribution) -> None:
    data, starts = _dmesg_render(_records(snippet), DMESG_OPTIONS[options], tmp_path)
    events = list(scan(io.BytesIO(data), RULES, attribution, ScanStats()))
    found = [(starts.index(e.line) + 1 if e.line in starts else -(e.line or 0), e.rule, e.severity, e.pci, e.xid)
             for e in events]
    assert found == _expected(snippet)


@pytest.mark.parametrize("mode", JOURNALCTL_MODES)
@pytest.mark.parametrize("index", range(len(SNIPPETS)), ids=IDS)
def test_logscan_reads_every_form_journalctl_prints(index: int, mode: str, journals: dict[int, Path],
                                                   tmp_path_factory: pytest.TempPathFactory,
                                                   attribution: Attribution) -> None:
    records = _records(SNIPPETS[index])
    journal = _journal(index, records, journals, tmp_path_factory.getbasetemp())
    data = subprocess.run([require_tool("journalctl"), "--file", str(journal), "-o", mode, "--no-pager"],
                          capture_output=True, check=True, timeout=30,
                          env={"LC_ALL": "C.UTF-8", "TZ": "UTC", "SYSTEMD_COLORS": "0"}).stdout
    if mode == "cat":  # no head tells the user's line from the kernel's
        data = data[:data.rindex(_INJECTED.encode())]
    starts = [1]
    for message in records:
        starts.append(starts[-1] + (1 if mode.startswith("json") else message.count("\n") + 1))
    events = list(scan(io.BytesIO(data), RULES, attribution, ScanStats()))
    found = [(starts.index(e.line) + 1 if e.line in starts else -(e.line or 0), e.rule, e.severity, e.pci, e.xid)
             for e in events]
    assert found == _expected(SNIPPETS[index])


@pytest.mark.parametrize("snippet", SNIPPETS, ids=IDS)
def test_the_collectors_records_give_the_same_events(snippet: dict[str, Any], attribution: Attribution) -> None:
    stream = RULES.stream()
    found = []
    for message in _records(snippet):
        device = _device(message)
        record = Record(message, device[1] if device else None)
        found += [make_event(m, record, attribution) for m in stream.feed(record)]
    found += [make_event(m, Record(""), attribution) for m in stream.flush()]
    assert [(e.rule, e.severity, e.pci, e.xid) for e in found] == [x[1:] for x in _expected(snippet)]


def test_the_corpus_is_large_real_and_varied() -> None:
    lines = sum(len(s["log"].rstrip("\n").split("\n")) for s in SNIPPETS)
    real = [s for s in SNIPPETS if not s.get("composed")]
    assert lines >= 300 and len(real) >= 0.8 * len(SNIPPETS)
    assert all(s["source"].startswith("https://") or s.get("composed") for s in SNIPPETS)
    benign = lines - sum(len(s["events"]) for s in SNIPPETS)
    assert benign >= 2 * sum(len(s["events"]) for s in SNIPPETS)  # plenty of neighbours that must match nothing
    assert {e["rule"] for s in SNIPPETS for e in s["events"]} >= {r.name for r in RULES.rules} - {"cper_fatal"}
    assert all(parse_line(line).message == line for s in SNIPPETS for line in _records(s) if "\n" not in line)
