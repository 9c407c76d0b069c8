"""Storms passed over: a storm's signature, and what the sieve reads and passes over in a block, by counting and line
by line: only the storm's own lines are passed over, whatever is written among them."""

from __future__ import annotations

import io
import random

import pytest

from tpuwatch.kernel_log.blocks import Splitter
from tpuwatch.kernel_log.filesource import StreamSource
from tpuwatch.kernel_log.matcher import StreamMatcher
from tpuwatch.kernel_log.reader import STORM_PERIOD, LogReader
from tpuwatch.kernel_log.records import Record
from tpuwatch.kernel_log.rule import Match
from tpuwatch.kernel_log.rulefile import load_rules
from tpuwatch.kernel_log.sieve import BacklogSieve, Storm

RULES = load_rules([])
XID = "[{t:13.6f}] NVRM: Xid (PCI:0000:{bus}:00): {xid}, pid={pid}, name={name}, Ch {pid:08x}"
AER = ("[{t:13.6f}] pcieport 0000:00:01.0: AER: Correctable error message received from 0000:{bus}:00.0")
HUNG = "[{t:13.6f}] INFO: task {name}:{pid} blocked for more than 120 seconds."
# Composed: lines a storm of chip 0000:10:00's Xid 13 must not hide, each with why.
OTHERS = {
    "worse, same GPU": "[    5.000000] NVRM: Xid (PCI:0000:10:00): 79, pid=1, name=x, GPU has fallen off the bus.",
    "same code, other GPU": "[    5.000000] NVRM: Xid (PCI:0000:11:00): 13, pid=1, name=x, Ch 00000001",
    "other code, same GPU": "[    5.000000] NVRM: Xid (PCI:0000:10:00): 31, pid=1, name=x, Ch 00000001",
    "other rule": "[    5.000000] EDAC MC1: 1 UE memory read error on CPU_SrcID#1_Ha#0_Chan#1_DIMM#0",
    "other rule, storm's text in it": "[    5.000000] INFO: task NVRM: Xid (PCI:0000:10:00): 13,:4242 blocked for "
                                      "more than 120 seconds.",
    "escaped": "4,7,5000000,-;NVRM: Xid (PCI:0000:10:00): 13, pid=1, name=x\\x0aEDAC MC1: 1 UE memory read error",
    "the storm's template twice, another GPU's Xid": "[    5.000000] NVRM: Xid (PCI:0000:11:00): 79, pid=1, "
                                                     "name=NVRM: Xid (PCI:0000:10:00): 13, Ch 1",
}


def _storm_lines(n: int, seed: int = 0, xid: int = 13, bus: str = "10") -> list[str]:
    rng = random.Random(seed)
    return [XID.format(t=i / 1e4, bus=bus, xid=xid, pid=rng.randrange(1, 99999),
                       name=rng.choice(["python3", "job-7", "torchrun", "a b"])) for i in range(n)]


def _learned(lines: list[str]) -> BacklogSieve:
    """A sieve that knows the storms of ``lines`` (their events and the follow lines faults took)."""
    sieve = BacklogSieve(RULES)
    matcher = StreamMatcher(RULES)
    storms: dict[tuple[object, ...], Storm] = {}
    records = Splitter().split(("\n".join(lines) + "\n").encode()).records()
    taken: list[tuple[Match, Record]] = [(m, m.record) for m in matcher.feed(records) if m.record is not None]
    for match, record in [*taken, *matcher.take_absorbed()]:
        storm = sieve.storm(match, record)
        if storm is not None:
            storms.setdefault(sieve.key(match, match.pci), storm)
    sieve.use(storms.values())
    return sieve


def _walk(sieve: BacklogSieve, text: str) -> tuple[list[str], int]:
    """The messages of the records the sieve reads, and how many records went by (no keyword, or passed over)."""
    block = Splitter().split(text.encode())
    walk = sieve.walk(block)
    read: list[str] = []
    went_by = 0
    for item in walk:
        if isinstance(item, int):
            went_by += item
        else:
            read.append(item.message)
    assert went_by + len(read) == len(block)
    return read, went_by


def test_a_storm_is_its_rule_keyword_device_and_severity_values_as_printed() -> None:
    sieve = _learned(_storm_lines(3))
    [storm] = sieve.storms
    assert storm.pieces == ("): 13,", "0000:10:00", "VRM: Xid")
    assert storm.template == "VRM: Xid (PCI:0000:10:00): 13,"
    assert storm.keywords == {"VRM: Xid", "Xid (PCI:"} and not storm.untagged
    tagged = Record("accel accel0: gasket_reset_nolock: Device reported as dead.", "c121:0")
    [match] = StreamMatcher(RULES).feed([tagged])
    tpu = sieve.storm(match, tagged)
    assert tpu is not None and tpu.template is None and " DEVICE=c121:0" in tpu.pieces  # the kernel's tag
    hung = Record("INFO: task python3:4242 blocked for more than 120 seconds.")
    [match] = StreamMatcher(RULES).feed([hung])
    storm_of_no_device = sieve.storm(match, hung)
    assert storm_of_no_device is not None and storm_of_no_device.untagged


@pytest.mark.parametrize("seed", range(20))
def test_only_the_storms_own_lines_are_passed_over(seed: int) -> None:
    """A block of a storm's lines with lines it must not hide at random places (among them, the storm's template
    in another line): every one of those is read; the storm's lines are passed over, counted exactly, by counting
    when nothing else is in the block and line by line when something is."""
    rng = random.Random(seed)
    storm = _storm_lines(3000, seed)
    sieve = _learned(storm[:100])
    chosen = rng.sample(sorted(OTHERS), rng.randrange(0, 4))
    lines = list(storm)
    for name in chosen:
        lines.insert(rng.randrange(len(lines)), OTHERS[name])
    noise = rng.randrange(0, 200)
    for _ in range(noise):
        lines.insert(rng.randrange(len(lines)), "[    6.000000] e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps")
    before = sieve.passed
    read, went_by = _walk(sieve, "\n".join(lines) + "\n")
    assert sieve.passed - before == 3000 and went_by == 3000 + noise
    assert sorted(read) == sorted(Splitter().split(OTHERS[name].encode() + b"\n").records()[0].message
                                  for name in chosen)


def test_a_storm_of_follow_lines_and_storms_of_several_codes_are_passed_over() -> None:
    again = [line.replace(", Ch ", ", Graphics Exception: ESR 0x") for line in _storm_lines(300, xid=13)]
    mixed = [line for pair in zip(_storm_lines(300, xid=13), _storm_lines(300, xid=45)) for line in pair]
    for lines in (again, mixed):
        sieve = _learned(lines[:200])
        read, went_by = _walk(sieve, "\n".join(lines[200:]) + "\n")
        assert read == [] and went_by == len(lines) - 200


def _passed_whole(sieve: BacklogSieve, text: str, monkeypatch: pytest.MonkeyPatch) -> list[int | Record]:
    """What the sieve's walk of ``text`` gives, told by counting: no record is tested on its own."""
    with monkeypatch.context() as patch:
        patch.setattr(BacklogSieve, "passes", lambda *_: pytest.fail("a record was tested on its own"))
        return list(sieve.walk(Splitter().split(text.encode())))


def test_a_storm_whose_lines_hold_a_keyword_after_its_template_is_passed_whole_and_hides_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Xid 79 lines end in "GPU has fallen off the bus.", a keyword of its own: a block of nothing but them goes by
    at once, counted; the same words in another GPU's line (as the driver prints them after an Xid 79) are read."""
    lines = [line.replace(", Ch ", ", GPU has fallen off the bus. ") for line in _storm_lines(400, xid=79)]
    sieve = _learned(lines[:100])
    assert _passed_whole(sieve, "\n".join(lines[100:]) + "\n", monkeypatch) == [300] and sieve.passed == 300
    other_gpu = "[    5.000000] NVRM: GPU 0000:11:00.0: GPU has fallen off the bus."
    twice = "[    5.000000] NVRM: GPU 0000:11:00.0: GPU has fallen off the bus. GPU has fallen off the bus."
    for other in (other_gpu, twice):
        read, went_by = _walk(sieve, "\n".join([*lines[100:250], other, *lines[250:]]) + "\n")
        assert read == [other[len("[    5.000000] "):]] and went_by == 300
    # the count of the words is the lines' when one of the storm's lines lacks them: told by which records hold them
    short = lines[0].split(" GPU has fallen")[0]
    read, went_by = _walk(sieve, "\n".join([*lines[100:250], other_gpu, short, *lines[250:]]) + "\n")
    assert read == [other_gpu[len("[    5.000000] "):]] and went_by == 301


def test_storms_of_several_codes_and_forms_are_passed_whole_and_hide_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's Xid 13s and the ESR lines that report them again, 45s and 79s ("GPU has fallen off the bus.", a
    keyword the others' lines lack): a block of nothing but their lines goes by at once, counted per
    storm; a line of theirs with another storm's keyword in it, or another GPU's, is read."""
    kinds = (_storm_lines(400, 1, xid=13), [line.replace(", Ch ", ", Graphics Exception: ESR 0x")
                                            for line in _storm_lines(400, 2, xid=13)],
             _storm_lines(400, 3, xid=45),
             [line.replace(", Ch ", ", GPU has fallen off the bus. ") for line in _storm_lines(400, 4, xid=79)])
    lines = [line for group in zip(*kinds) for line in group]
    sieve = _learned(lines[:400])
    assert len(sieve.storms) == 3  # an Xid 13 and its ESR lines: two storms of the reader, one signature
    assert _passed_whole(sieve, "\n".join(lines[400:]) + "\n", monkeypatch) == [1200] and sieve.passed == 1200
    assert sorted(sieve.take_counts().values()) == [300, 300, 600]
    for other in ("[    5.000000] NVRM: Xid (PCI:0000:10:00): 45, pid=1, name=x, GPU has fallen off the bus.",
                  "[    5.000000] NVRM: Xid (PCI:0000:11:00): 45, pid=1, name=x, Ch 00000001"):
        read, went_by = _walk(sieve, "\n".join([*lines[400:900], other, *lines[900:]]) + "\n")
        assert read == [other[len("[    5.000000] "):]] and went_by == 1200


# Composed after real AER reports (drivers/pci/pcie/aer.c prints them so): one corrected error of one GPU, in four
# records; the storm's two lines with a keyword share none.
AER_ERROR = ("[{t:13.6f}] pcieport 0000:00:03.0: AER: Corrected error message received from 0000:3b:00.0\n"
             "[{t:13.6f}] nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)\n"
             "[{t:13.6f}] nvidia 0000:3b:00.0:   device [10de:2330] error status/mask=00000001/0000e000\n"
             "[{t:13.6f}] nvidia 0000:3b:00.0:    [ 0] RxErr                  (First)\n")


def test_storms_that_share_no_keyword_are_passed_whole_each_line_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "".join(AER_ERROR.format(t=i / 1e4) for i in range(400))
    lines = text.splitlines()
    sieve = _learned(lines[:800])
    assert len(sieve.storms) == 2 and not set.intersection(*(set(storm.keywords) for storm in sieve.storms))
    assert _passed_whole(sieve, "\n".join(lines[800:]) + "\n", monkeypatch) == [800] and sieve.passed == 400
    both = lines[801] + " " + lines[800]  # one record holding both storms' lines: one line passed over
    assert _passed_whole(sieve, "\n".join([*lines[800:900], both]) + "\n", monkeypatch) == [101]
    assert sieve.passed == 400 + 51
    other = "[    5.000000] nvidia 0000:3c:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"
    read, went_by = _walk(sieve, "\n".join([*lines[800:1000], other, *lines[1000:]]) + "\n")
    assert other[len("[    5.000000] "):] in read and went_by + len(read) == 801
    assert [message for message in read if "Error" in message or "error message" in message] == [
        other[len("[    5.000000] "):]]  # the others: records without a keyword, around it and at the end, as context


def test_a_storm_of_no_device_does_not_hide_a_device_s_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its lines go by at once while no record of the block names a device; one that does (a kmsg DEVICE= tag, a
    dev_printk prefix, amid lines without a keyword too) is read."""
    hung = [HUNG.format(t=i, name="python3", pid=i) for i in range(200)]
    sieve = _learned(hung[:100])
    assert _passed_whole(sieve, "\n".join(hung[100:]) + "\n", monkeypatch) == [100]
    tagged = ("4,9,1,-;INFO: task python3:7 blocked for more than 120 seconds.\n SUBSYSTEM=pci\n"
              " DEVICE=+pci:0000:3b:00.0")
    prefixed = "[    9.000000] nvidia 0000:3b:00.0: INFO: task python3:7 blocked for more than 120 seconds."
    for other in (tagged, prefixed):
        read, went_by = _walk(sieve, "\n".join([*hung[100:150], other, *hung[150:]]) + "\n")
        assert read == [Splitter().split(other.encode() + b"\n").records()[0].message] and went_by == 100
    noise = "[    9.000000] e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps"
    read, went_by = _walk(sieve, "\n".join([*hung[100:150], noise, *hung[150:]]) + "\n")
    assert read == [] and went_by == 101


def test_a_record_longer_than_the_bound_amid_a_storm_is_split_as_the_block_counts_it() -> None:
    """A record of more than MAX_CONTINUATION_LINES lines (the lines past them begin records of their own) does not
    stop the sieve: the storm's lines around it are passed over, another GPU's line is read, and every record is
    read or counted once."""
    lines = _storm_lines(300)
    sieve = _learned(lines[:100])
    long_record = "4,9,1,-;hello\n" + "".join(f" K{i}=v\n" for i in range(20))
    other = OTHERS["same code, other GPU"]
    text = "\n".join(lines[100:200]) + "\n" + long_record + other + "\n" + "\n".join(lines[200:]) + "\n"
    read, went_by = _walk(sieve, text)
    assert read == [Record(other.split("] ", 1)[1]).message] and went_by == 200 + 2


def test_journal_records_of_a_storm_are_passed_over_one_by_one() -> None:
    lines = _storm_lines(300)
    sieve = _learned(lines[:100])
    records = [Record(line.split("] ", 1)[1]) for line in lines[100:]]
    records.insert(50, Record(OTHERS["same code, other GPU"].split("] ", 1)[1]))
    items = list(sieve.each(records))
    assert [item.message for item in items if isinstance(item, Record)] == [records[50].message]
    assert sum(item for item in items if isinstance(item, int)) == 200


def test_storms_are_learned_and_let_go_when_their_lines_stop() -> None:
    """64 lines of one rule, device and severity values within a period make a storm; a period without them lets it
    go (the storms stay bounded, whatever the log did before)."""
    first, second = _storm_lines(3 * STORM_PERIOD, bus="10"), _storm_lines(3 * STORM_PERIOD, bus="11")
    source = StreamSource(io.BytesIO(("\n".join(first + second) + "\n").encode()).read)
    reader = LogReader(source, RULES, lambda pci: None)
    devices = []
    while not source.caught_up:
        reader.read()
        devices.append({storm.pieces[1] for storm in reader.sieve.storms})
    assert {"0000:10:00"} in devices and devices[-1] == {"0000:11:00"}


def test_the_matcher_passes_over_journal_records_of_a_storm_it_is_given() -> None:
    lines = _storm_lines(300)
    sieve = _learned(lines[:100])
    records = [Record(line.split("] ", 1)[1]) for line in lines[100:]]
    records.insert(50, Record(OTHERS["same code, other GPU"].split("] ", 1)[1]))
    stream = StreamMatcher(RULES)
    events = stream.feed(records, sieve) + stream.flush()
    assert [m.record.message for m in events if m.record is not None] == [records[50].message]
    assert stream.feed(records[:3]) != []  # without the sieve they are read


def test_a_sieve_that_knows_no_storm_passes_nothing_over() -> None:
    """Under backlog before any storm is learned, the matcher reads a block and journal records as it would
    without the sieve: every event comes out, nothing is counted as passed over."""
    text = "\n".join([*_storm_lines(40), OTHERS["same code, other GPU"], *_storm_lines(40, bus="11")]) + "\n"
    block = Splitter().split(text.encode())
    records = block.records()
    for batch in (block, records):
        plain = [(m.rule, m.pci, m.severity) for m in StreamMatcher(RULES).feed(batch)]
        sieve = BacklogSieve(RULES)
        sieved = [(m.rule, m.pci, m.severity) for m in StreamMatcher(RULES).feed(batch, sieve)]
        assert sieved == plain and len(plain) == 81 and sieve.passed == 0
