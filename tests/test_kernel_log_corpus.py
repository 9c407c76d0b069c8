"""Real kernel log lines (testdata/kernel_log/corpus.yaml) in every form tpuwatch reads: recall, false positives,
one event per fault, PCI attribution and Xid, as logscan sees the file and as the collector sees the records."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_kernel_log_resilience import journal_entry, write_journal

from tpuwatch.kernel_log.attribution import Attribution, SysfsResolver, prefix_device
from tpuwatch.kernel_log.blocks import Splitter
from tpuwatch.kernel_log.collector import MAX_RECENT_EVENTS, KernelLogCollector
from tpuwatch.kernel_log.events import KernelEvent, make_event
from tpuwatch.kernel_log.filesource import FileSource
from tpuwatch.kernel_log.matcher import StreamMatcher
from tpuwatch.kernel_log.records import Record, parse_kmsg, parse_line
from tpuwatch.kernel_log.rulefile import load_rules

from conftest import require_tool
from kernellog import scan

DATA = Path(__file__).parent / "testdata" / "kernel_log"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from kernel_log import generate  # noqa: E402  # the benchmark logs' generator

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
    events = scan(data, RULES, attribution).events
    found = [(starts.index(e.line) + 1 if e.line in starts else -(e.line or 0), e.rule, e.severity, e.pci, e.xid)
             for e in events]
    assert found == _expected(snippet)


@pytest.mark.parametrize("options", sorted(DMESG_OPTIONS))
@pytest.mark.parametrize("snippet", SNIPPETS, ids=IDS)
def test_logscan_reads_every_form_util_linux_dmesg_prints(snippet: dict[str, Any], options: str, tmp_path: Path,
                                                          attribution: Attribution) -> None:
    data, starts = _dmesg_render(_records(snippet), DMESG_OPTIONS[options], tmp_path)
    events = scan(data, RULES, attribution).events
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
    events = scan(data, RULES, attribution).events
    found = [(starts.index(e.line) + 1 if e.line in starts else -(e.line or 0), e.rule, e.severity, e.pci, e.xid)
             for e in events]
    assert found == _expected(SNIPPETS[index])


@pytest.mark.parametrize("snippet", SNIPPETS, ids=IDS)
def test_the_collectors_records_give_the_same_events(snippet: dict[str, Any], attribution: Attribution) -> None:
    stream = StreamMatcher(RULES)
    found = []
    for message in _records(snippet):
        device = _device(message)
        record = Record(message, device[1] if device else None)
        found += [make_event(m, record, attribution) for m in stream.feed([record])]
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


# --- logscan is the daemon's path ----------------------------------------------------------------------------

def _pieces(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` in pieces of random sizes, as a writer appends a log: each piece ends with a whole record after which
    no event waits, or partway into the first line of the next record (that line waits at the end of the file for
    the rest of it).

    Whole records, and never while an event waits: at the end of the file the daemon reads the lines there are
    and lets out the events that wait for later records (a CPER block's device_id, the report that stands for
    "Machine check events logged").  A piece that ended between a record's first line and its continuation
    lines, or while an event waits, is a file the daemon rightly reads otherwise than the whole log: no
    difference between logscan and the daemon."""
    block = Splitter(start=True).split(data)
    text = block.text
    assert text == data.decode()  # the test logs are text: a record's characters map back to its bytes
    matcher = StreamMatcher(RULES)
    pieces: list[bytes] = []
    most = min(4096, max(64, len(data) // 16))  # a small log in a dozen pieces or more
    begin, offset, start, size = 0, 0, 0, rng.randint(1, most)
    while start < len(text):
        end = block.end_of(start)
        matcher.feed([block.record(start)])
        offset += len(text[start:end].encode())
        start = end
        if start < len(text) and offset - begin >= size and not (matcher._held or matcher._later):
            cut = offset
            if rng.random() < 0.5:  # into the next record's first line, its newline not yet written
                newline = text.find("\n", start)
                cut += rng.randint(1, max(1, len(text[start:newline if newline >= 0 else None].encode())))
            pieces.append(data[begin:cut])
            begin, size = cut, rng.randint(1, most)
    return [*pieces, data[begin:]]


def _followed(data: bytes, tmp_path: Path, attribution: Attribution, rng: random.Random) -> tuple[
        list[tuple[Any, ...]], dict[tuple[str, str], float]]:
    """The events and counts of the daemon's collector following a file that starts empty and that ``data`` is then
    appended to (``_pieces``), a collection after each piece: its events from ``recent_events()``, its counts from
    ``collect()``.  Storm folding is off (a window of 0 s folds nothing: a repeat folds only within the window),
    and so is its time limit (each collection reads to the end of the file, and no storm is passed over)."""
    log = tmp_path / "followed.log"
    log.write_bytes(b"")
    source = FileSource(str(log), None)
    collector = KernelLogCollector(source, RULES, attribution, storm_window=0.0, deadline=1e9)
    events: list[KernelEvent] = []
    counts: dict[tuple[str, str], float] = {}
    for piece in _pieces(data, rng):
        with open(log, "ab") as out:
            out.write(piece)
        before = sum(counts.values())
        counts = {}
        for s in collector.collect():
            if s.name == "tpuwatch_kernel_events_total" and s.value:
                key = (dict(s.labels)["rule"], dict(s.labels)["severity"])
                counts[key] = counts.get(key, 0) + s.value
        new = int(sum(counts.values()) - before)
        assert source.caught_up and 0 <= new <= MAX_RECENT_EVENTS  # every event of the piece is among the recent
        events += collector.recent_events()[-new:] if new else []
    collector.close()
    assert source.skipped["backlog"] == 0 and all(e.count == 1 for e in events)  # nothing passed over or folded
    return [(e.rule, e.severity, e.pci, e.xid, e.message) for e in events], counts


def _logscan(data: bytes, attribution: Attribution) -> tuple[list[tuple[Any, ...]], dict[tuple[str, str], float]]:
    events = scan(data, RULES, attribution).events
    counts: dict[tuple[str, str], float] = {}
    for e in events:
        counts[(e.rule, e.severity)] = counts.get((e.rule, e.severity), 0) + 1
    return [(e.rule, e.severity, e.pci, e.xid, e.message) for e in events], counts


TESTDATA_LOGS = ["dmesg.txt", "dmesg_T.txt", "kern.log", "kmsg.txt", "journal.json",
                 *(str(p.relative_to(DATA)) for p in sorted((DATA / "pstore").rglob("dmesg*")))]


@pytest.mark.parametrize("name", TESTDATA_LOGS)
def test_logscan_gives_the_daemons_events_on_every_test_log(name: str, tmp_path: Path,
                                                            attribution: Attribution) -> None:
    data = (DATA / name).read_bytes()
    for seed in range(3):
        assert _followed(data, tmp_path, attribution, random.Random(seed)) == _logscan(data, attribution)


# Events that wait for the records after them, a record a line: a CPER block's device_id, the machine-check summary
# that stands for "Machine check events logged", the init failure an Xid just before stands for.
WAITING = [["{7}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 4",
            "{7}[Hardware Error]: event severity: recoverable", "{7}[Hardware Error]:  Error 0, type: recoverable",
            "{7}[Hardware Error]:   section_type: PCIe error", "{7}[Hardware Error]:   device_id: 0000:00:01.0"],
           ["mce: [Hardware Error]: Machine check events logged",
            "mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 4: a600000000020408"],
           ["NVRM: Xid (PCI:0000:68:00): 109, pid=1297, name=rustdesk, Ch 00000001, errorString CTX SWITCH TIMEOUT",
            "NVRM: GPU 0000:68:00.0: RmInitAdapter failed! (0x25:0xffff:1470)"],
           ["e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex, Flow Control: Rx/Tx"]]


def test_logscan_gives_the_daemons_events_where_events_wait_for_later_records(tmp_path: Path,
                                                                              attribution: Attribution) -> None:
    rng = random.Random(4)
    lines = [line for _ in range(100) for line in rng.choice(WAITING)]
    data = "".join(f"[{number:12.6f}] {line}\n" for number, line in enumerate(lines)).encode()
    for seed in range(3):
        daemon, logscan = _followed(data, tmp_path, attribution, random.Random(seed)), _logscan(data, attribution)
        assert daemon == logscan and ("cper_recoverable", "0000:00:01.0") in {(e[0], e[2]) for e in daemon[0]}


@pytest.mark.parametrize("form", FORMS)
def test_logscan_gives_the_daemons_events_on_the_whole_corpus(form: str, tmp_path: Path,
                                                              attribution: Attribution) -> None:
    records = [record for snippet in SNIPPETS for record in _records(snippet)]
    _skip_unless_kmsg_decodes(records, form)
    data, _ = _render(records, form)
    daemon, logscan = _followed(data, tmp_path, attribution, random.Random(1)), _logscan(data, attribution)
    assert daemon == logscan and len(logscan[0]) > 200


@pytest.mark.parametrize("dense", [False, True], ids=["busy", "keyword-dense"])
def test_logscan_gives_the_daemons_events_on_the_benchmark_logs(dense: bool, tmp_path: Path,
                                                                attribution: Attribution) -> None:
    """The benchmark's generator (benchmarks/kernel_log.py, which checks the same on its 1,000,000-line logs), at a
    size a test can read."""
    path = tmp_path / "generated.log"
    generate(path, 40_000, 1, dense)
    data = path.read_bytes()
    daemon, logscan = _followed(data, tmp_path, attribution, random.Random(2)), _logscan(data, attribution)
    assert daemon == logscan and len(logscan[0]) > 300
