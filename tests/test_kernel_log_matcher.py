"""The per-stream matcher: follow lines, lost headers, waiting events, messages over several records, one event per
record, escalation, bounded state, and logscan agreeing with the collector's record-by-record feeding."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tpuwatch.kernel_log import filesource
from tpuwatch.kernel_log import matcher as matcher_module
from tpuwatch.kernel_log.matcher import StreamMatcher
from tpuwatch.kernel_log.records import Record
from tpuwatch.kernel_log.rule import Rule
from tpuwatch.kernel_log.rulefile import load_rules, parse_rule_file
from tpuwatch.kernel_log.rules import RuleSet

from kernellog import feed, scan

RULES = load_rules([])


def _feed(rules: RuleSet, lines: list[str | Record], flush: bool = True) -> list[tuple[int | None, str, str]]:
    return [(m.index, m.rule, m.severity) for m in feed(rules, lines, flush)]


def _rules(tmp_path: Path, text: str) -> RuleSet:
    (tmp_path / "r.yaml").write_text(text)
    return load_rules([str(tmp_path)])


HEADER = "pcieport 0000:00:01.0: AER: Uncorrectable (Non-Fatal) error message received from 0000:3b:00.0"
DETAIL = ("nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, "
          "(Requester ID)")
STATUS = "nvidia 0000:3b:00.0:   device [10de:2330] error status/mask=00004000/00000000"
NOISE = "e1000e 0000:00:1f.6 eno1: NIC Link is Up 1000 Mbps Full Duplex, Flow Control: Rx/Tx"


def test_a_header_and_its_detail_lines_are_one_event() -> None:
    assert _feed(RULES, [HEADER, DETAIL, STATUS, DETAIL]) == [(1, "pcie_aer_uncorrected", "warning")]


def test_a_detail_line_whose_header_was_lost_is_the_event() -> None:
    assert _feed(RULES, [NOISE, DETAIL, STATUS]) == [(2, "pcie_aer_uncorrected", "warning")]
    fatal = DETAIL.replace("(Non-Fatal)", "(Fatal)")
    assert _feed(RULES, [fatal]) == [(1, "pcie_aer_uncorrected", "critical")]


def test_a_detail_line_far_after_its_header_is_another_event() -> None:
    assert _feed(RULES, [HEADER, *[NOISE] * 40, DETAIL]) == [(1, "pcie_aer_uncorrected", "warning"),
                                                             (42, "pcie_aer_uncorrected", "warning")]


def test_a_more_severe_follow_line_is_an_event_of_its_own() -> None:
    fatal = DETAIL.replace("(Non-Fatal)", "(Fatal)")
    assert _feed(RULES, [HEADER, fatal]) == [(1, "pcie_aer_uncorrected", "warning"),
                                             (2, "pcie_aer_uncorrected", "critical")]


def test_same_device_faults_stay_per_chip() -> None:
    lines = ["accel accel0: tpu_common_reinit_reset: Device did not come back from reset.",
             "accel accel1: tpu_common_device_open: Failed to reset device",
             "accel accel0: gasket_reset_nolock: Device reset cb returned -16; aborting reset.",
             "accel accel0: tpu_common_device_open: Failed to reset device"]
    assert _feed(RULES, lines) == [(1, "tpu_driver_error", "critical"), (2, "tpu_driver_error", "critical")]
    tagged = [Record("accel accel0: f: Failed to reset device", "c121:0"),
              Record("accel accel0: f: Failed to reset device", "c121:1")]  # one name, two chips by the kernel's tag
    assert len(_feed(RULES, tagged)) == 2


CPER = ["{7}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 4",
        "{7}[Hardware Error]: event severity: recoverable",
        "{7}[Hardware Error]:  Error 0, type: recoverable",
        "{7}[Hardware Error]:   section_type: PCIe error",
        "{7}[Hardware Error]:   device_id: 0000:00:01.0",
        "{7}[Hardware Error]:   vendor_id: 0x8086, device_id: 0x6f02"]


def test_a_cper_record_waits_for_its_device_id_through_other_records_until_its_hold_ends() -> None:
    stream = StreamMatcher(RULES)
    nmi = "Uhhuh. NMI received for unknown reason 2d on CPU 11."  # interleaved, as real logs have them
    assert [stream.feed([Record(line)]) for line in [*CPER[:4], nmi, nmi, *CPER[4:]]] == [[]] * 8
    assert stream.skip(26) == []  # 32 records after its first line: still within its hold
    [held] = stream.feed([Record("pcieport 0000:00:01.0: AER: aer_status: 0x00004000, aer_mask: 0x00000000")])
    assert (held.rule, held.severity, held.pci, held.index) == ("cper_recoverable", "warning", "0000:00:01.0", 2)
    assert held.record == Record(CPER[1])


def test_events_come_out_in_the_order_of_their_first_lines() -> None:
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus."
    stream = StreamMatcher(RULES)
    assert stream.feed([Record(CPER[1])]) == [] and stream.feed([Record(xid)]) == []  # behind the waiting one
    assert [(m.rule, m.index) for m in stream.flush()] == [("cper_recoverable", 1), ("nvidia_xid", 2)]


def test_a_report_about_another_device_does_not_supersede_a_waiting_event() -> None:
    edac = "EDAC MC3: 1 UE memory read error on CPU_SrcID#1_MC#1_Chan#2_DIMM#0 (channel:2 slot:0 page:0xb757589)"
    assert _feed(RULES, [edac, *CPER]) == [(1, "edac_uncorrected", "critical"), (3, "cper_recoverable", "warning")]
    assert _feed(RULES, [*CPER, edac]) == [(2, "cper_recoverable", "warning"), (7, "edac_uncorrected", "critical")]


def test_a_cper_block_of_another_sequence_number_is_not_this_records() -> None:
    other = [line.replace("{7}", "{8}").replace("recoverable", "corrected") for line in CPER]
    events = _feed(RULES, [*CPER[:3], *other[1:3], CPER[4]])
    assert events == [(2, "cper_recoverable", "warning"), (4, "cper_corrected", "info")]


def test_a_waiting_event_is_dropped_for_the_rule_that_reports_its_fault() -> None:
    memory = ["{3}[Hardware Error]: event severity: corrected", "{3}[Hardware Error]:   section_type: memory error",
              "EDAC MC0: 1 CE Single-bit ECC on unknown memory (node:0 card:0 module:0 page:0x12345 offset:0x0)"]
    assert _feed(RULES, memory) == [(3, "edac_corrected", "info")]
    logged = ["mce: [Hardware Error]: Machine check events logged",
              "mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 4: a600000000020408"]
    assert _feed(RULES, logged) == [(2, "mce", "warning")]
    assert _feed(RULES, logged[::-1]) == [(1, "mce", "warning")]  # a report just before supersedes it too
    assert _feed(RULES, [logged[0], NOISE]) == [(1, "mce_logged", "info")]


XID = "NVRM: Xid (PCI:0000:68:00): 109, pid=1297, name=rustdesk, Ch 00000001, errorString CTX SWITCH TIMEOUT"
INIT_FAILED = "NVRM: GPU 0000:68:00.0: RmInitAdapter failed! (0x25:0xffff:1470)"


def test_a_boot_or_driver_load_starts_afresh() -> None:
    # Just after the Xid, the init failure is that fault's (it waits, and the Xid as severe stands for it) ...
    assert _feed(RULES, [XID, INIT_FAILED]) == [(1, "nvidia_xid", "critical")]
    # ... but not across a boot or a reload of the driver: the GPU that no longer initialises is news.
    for restart in ("Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14))",
                    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.154.05  Thu Dec 28 15:37:48 UTC 2023"):
        assert _feed(RULES, [XID, restart, INIT_FAILED, INIT_FAILED]) == [(1, "nvidia_xid", "critical"),
                                                                           (3, "nvrm_error", "critical")]
        text = "\n".join([XID, NOISE, restart, INIT_FAILED]).encode() + b"\n"  # logscan: only keyword lines fed
        assert [(e.rule, e.line) for e in scan(text, RULES, lambda pci: None).events] == [
            ("nvidia_xid", 1), ("nvrm_error", 4)]


def test_a_waiting_event_comes_out_with_the_record_its_hold_ends_whatever_waits_after_it() -> None:
    logged = "mce: [Hardware Error]: Machine check events logged"  # waits 8 records
    stream = StreamMatcher(RULES)
    given = {}
    for number, line in enumerate([logged, INIT_FAILED, *[NOISE] * 30], start=1):  # INIT_FAILED waits 16
        for match in stream.feed([Record(line)]):
            given[match.rule] = number
    assert given == {"mce_logged": 1 + 8 + 1, "nvrm_error": 2 + 16 + 1}
    stream = StreamMatcher(RULES)
    stream.feed([Record(logged)])
    stream.feed([Record(INIT_FAILED)])
    assert [m.rule for m in stream.skip(7)] == [] and [m.rule for m in stream.skip(1)] == ["mce_logged"]


def test_a_follow_line_belongs_to_its_fault_up_to_within_records_after_it() -> None:
    ue = "EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha0_Chan0_DIMM0 (page:0x1234 offset:0x0 grain:32)"
    within = next(r for r in RULES.rules if r.name == "edac_uncorrected").follow.within  # type: ignore[union-attr]
    assert _feed(RULES, [ue, *[NOISE] * (within - 1), ue]) == [(1, "edac_uncorrected", "critical")]
    assert _feed(RULES, [ue, *[NOISE] * within, ue]) == [(1, "edac_uncorrected", "critical"),
                                                          (within + 2, "edac_uncorrected", "critical")]


def test_a_gpu_gone_takes_its_other_functions_with_it() -> None:
    gone = "NVRM: Xid (PCI:0000:09:00): 79, pid=0, GPU has fallen off the bus."
    usb = "xhci_hcd 0000:09:00.2: Refused to change power state, currently in D3"
    other = "vfio-pci 0000:00:05.0: Refused to change power state, currently in D3"
    assert _feed(RULES, [gone, usb, usb]) == [(1, "nvidia_xid", "critical")]
    # Another device's function is not the GPU's, however close in the log.
    assert _feed(RULES, [gone, other]) == [(1, "nvidia_xid", "critical"), (2, "pci_reset_failed", "warning")]
    assert _feed(RULES, [usb]) == [(1, "pci_reset_failed", "warning")]


SUPERSEDED = r"""
rules:
  - {name: detail, regex: 'DETAIL (?P<sev>\w+)', keywords: [DETAIL], severity: info, hold: 4,
     severity_by: {field: sev, critical: [bad]}, superseded_by: [summary]}
  - {name: summary, regex: 'SUMMARY', keywords: [SUMMARY], severity: warning}
"""


def test_a_waiting_event_is_superseded_only_by_a_report_as_severe(tmp_path: Path) -> None:
    rules = _rules(tmp_path, SUPERSEDED)
    assert _feed(rules, ["DETAIL ok", "SUMMARY"]) == [(2, "summary", "warning")]
    assert _feed(rules, ["SUMMARY", "DETAIL ok"]) == [(1, "summary", "warning")]
    # a worse verdict is never dropped for a milder report, before or after it
    assert _feed(rules, ["DETAIL bad", "SUMMARY"]) == [(1, "detail", "critical"), (2, "summary", "warning")]
    assert _feed(rules, ["SUMMARY", "DETAIL bad"]) == [(1, "summary", "warning"), (2, "detail", "critical")]


def test_waiting_events_come_out_at_the_hold_limit_on_skip_and_on_flush() -> None:
    stream = StreamMatcher(RULES)
    for line in CPER:
        assert stream.feed([Record(line)]) == []
    assert stream.skip(3) == []  # still within its hold of 32 records
    assert [m.rule for m in stream.skip(30)] == ["cper_recoverable"]
    stream = StreamMatcher(RULES)
    stream.feed([Record(CPER[1])])
    assert [m.rule for m in stream.flush()] == ["cper_recoverable"] and stream.flush() == []
    assert stream.skip(0) == []
    long_block = [CPER[1], *[CPER[2]] * 40]
    assert _feed(RULES, long_block, flush=False) == [(1, "cper_recoverable", "warning")]  # released after hold: 32


MULTILINE = ["NVRM: The NVIDIA GPU 0000:b3:00.0", "NVRM: (PCI ID: 10de:26b5) installed in this system has",
             "NVRM: fallen off the bus and is not responding to commands."]


def test_a_message_printed_over_three_records_is_one_event_of_its_first_line() -> None:
    stream = StreamMatcher(RULES)
    out = [m for line in [NOISE, *MULTILINE, NOISE] for m in stream.feed([Record(line)])]
    [match] = out
    assert (match.rule, match.severity, match.pci, match.index) == ("gpu_fell_off_bus", "critical", "0000:b3:00.0", 2)
    assert match.record is not None and match.record.message == "\n".join(MULTILINE)
    assert _feed(RULES, [Record("\n".join(MULTILINE))]) == [(1, "gpu_fell_off_bus", "critical")]
    assert _feed(RULES, [MULTILINE[0], NOISE, MULTILINE[2]]) == []  # not consecutive: not one message


def test_a_single_record_match_never_fires_again_in_a_join() -> None:
    line = "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
    assert _feed(RULES, [line, "NVRM: fallen off the bus and is not responding to commands."]) == [
        (1, "gpu_fell_off_bus", "critical")]


def test_one_event_per_record_the_most_severe(tmp_path: Path) -> None:
    rules = _rules(tmp_path, "rules:\n  - {name: any_nic, regex: 'NIC Link is', keywords: [NIC Link], severity: info}\n"
                             "  - {name: nic_up, regex: 'Link is Up', keywords: [Link is Up], severity: warning}\n")
    assert [m.rule for m in rules.match(NOISE)] == ["any_nic", "nic_up"]  # RuleSet.match lists every rule's match
    assert _feed(rules, [NOISE]) == [(1, "nic_up", "warning")]
    panic = "Kernel panic - not syncing: Fatal machine check"
    assert _feed(RULES, [panic]) == [(1, "mce", "critical")]  # a tie: the rule that claims it as its own line


def test_state_stays_bounded(monkeypatch: object) -> None:
    stream = StreamMatcher(RULES)
    for index in range(500):
        stream.feed([Record(f"accel accel{index}: f: Failed to reset device")])
        stream.feed([Record(f"{{{index}}}[Hardware Error]: event severity: corrected")])
    assert all(len(faults) <= matcher_module.MAX_OPEN_FAULTS for faults in stream._open.values())
    assert len(stream._held) <= matcher_module.MAX_HELD and len(stream._last) <= len(RULES.rules)
    assert stream._context is not None and len(stream._context) == RULES.max_lines - 1  # the last lines - 1 records


def test_reading_blocks_agrees_with_feeding_every_record() -> None:
    pieces = [[HEADER, DETAIL, STATUS], [DETAIL, STATUS], CPER, MULTILINE,
              ["mce: [Hardware Error]: Machine check events logged",
               "mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 4: a600000000020408"],
              ["accel accel0: f: Device did not come back from reset.", "accel accel0: f: Failed to reset device"],
              ["NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
               "NVRM: GPU 0000:02:00.0: GPU has fallen off the bus."]]
    _agree(RULES, pieces, random.Random(7))


# Lines holding a keyword whose regexes do not match them, and follow lines with no fault open: read in blocks,
# they must give the events of feeding every record.
NEAR = ["mce: [Hardware Error]: TSC 2ac997e3063c3 ", "mce: CPU supports 16 MCE banks",
        "{7}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 1",
        "pcieport 0000:00:01.0: AER: aer_status: 0x00004000, aer_mask: 0x00000000",
        "EDAC sbridge MC0: HANDLING MCE MEMORY ERROR", "Process accounting resumed"]


def test_near_misses_read_in_blocks_agree_with_feeding_every_record() -> None:
    pieces = [[line] for line in NEAR] + [CPER, CPER[:1] + CPER[2:], [HEADER, DETAIL], [STATUS, DETAIL],
                                          ["mce: [Hardware Error]: Machine check events logged", NEAR[4]],
                                          ["mce: [Hardware Error]: Machine check events logged", NOISE]]
    _agree(RULES, pieces, random.Random(11))


RESTARTS = ["Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14))",
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.154.05  Thu Dec 28 15:37:48 UTC 2023"]


def test_restarts_between_faults_agree_with_feeding_every_record() -> None:
    """A boot or driver load ends every waiting event and open fault: read in blocks, with the records between
    counted, the events are those of feeding every record."""
    edac = "EDAC MC0: 1 CE Single-bit ECC on unknown memory (node:0 card:0 module:0 page:0x12345 offset:0x0)"
    logged = "mce: [Hardware Error]: Machine check events logged"  # waits; an EDAC report just before stands for it
    corrected = "pcieport 0000:00:01.0: AER: Corrected error message received from 0000:3b:00.0"
    corrected_detail = "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"
    pieces = [[line] for line in RESTARTS] + [[XID], [INIT_FAILED], [XID, RESTARTS[0], INIT_FAILED], CPER,
                                              [HEADER, RESTARTS[1], DETAIL], [DETAIL], MULTILINE, [edac, logged],
                                              [edac, RESTARTS[1], logged], [RESTARTS[0], *MULTILINE],
                                              [MULTILINE[0], RESTARTS[1], *MULTILINE[1:]],
                                              # records between: logscan counts them before it asks whether the
                                              # fault before is still open (16 records: after a restart, the
                                              # detail line is an event of its own)
                                              [corrected, *[NOISE] * 5, RESTARTS[1], corrected_detail],
                                              [corrected, *[NOISE] * 20, RESTARTS[0], corrected_detail],
                                              [HEADER, *[NOISE] * 5, RESTARTS[1], DETAIL],
                                              [edac, *[NOISE] * 3, RESTARTS[1], logged]]
    _agree(RULES, pieces, random.Random(5))
    rng = random.Random(9)
    stream = StreamMatcher(RULES)
    for _ in range(3000):  # the index through which no waiting event's hold runs out stays exact
        if rng.random() < 0.2:
            stream.skip(rng.choice([1, 5, 17, 33, 65, 129]))
        stream.feed([Record(rng.choice([*sum(pieces, []), NOISE]))])
        assert not stream._held or stream._due == min(held.due for held in stream._held)  # exact, not just early


@pytest.mark.parametrize("size", [64, 200, 4096])
def test_blocks_of_any_size_agree_with_feeding_every_record(size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a read's block ends (a record waits for the next one: it may have continuation lines) changes nothing:
    the records, their lines and the events are those of feeding every record."""
    monkeypatch.setattr(filesource, "FILE_READ_BYTES", size)
    _agree(RULES, [[HEADER, DETAIL, STATUS], CPER, MULTILINE, *([line] for line in NEAR[:3])], random.Random(size))


def test_rules_that_look_outside_the_message_are_tried_on_the_parsed_record(tmp_path: Path) -> None:
    rules = _rules(tmp_path, """rules:
  - {name: anchored, keywords: ["wedged"], regex: '^chip wedged$', severity: warning}
  - {name: behind, keywords: ["stalled"], regex: '(?<!not )stalled', severity: info}
""")
    lines = ["chip wedged", "it is not stalled", "queue stalled", "the chip wedged"]
    _agree(rules, [[line] for line in lines], random.Random(3))
    text = "".join(f"[{n:6d}.000000] {line}\n" for n, line in enumerate(lines)).encode()
    assert [e.rule for e in scan(text, rules, lambda pci: None).events] == ["anchored", "behind"]


def _agree(rules: RuleSet, pieces: list[list[str]], rng: random.Random) -> None:
    """Random streams of ``pieces`` between noise: logscan (dmesg, syslog and kmsg forms) and feeding every record
    give the same events on the same lines."""
    for _ in range(30):
        lines: list[str] = []
        for _ in range(8):
            lines += [NOISE] * rng.choice([0, 1, 3, 40]) + list(rng.choice(pieces))
        fed = _feed(rules, lines)
        forms = ["[{n:6d}.000000] {line}\n", "Nov 30 04:37:39 host kernel: [{n:6d}.000000] {line}\n",
                 "6,{n},{n}000,-;{line}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"]
        for form in forms:
            text = "".join(form.format(n=n, line=line) for n, line in enumerate(lines)).encode()
            scanned = [(e.line, e.rule, e.severity)
                       for e in scan(text, rules, lambda pci: None).events]
            if form.startswith("6,"):  # three lines per record
                scanned = [((line - 1) // 3 + 1 if line else line, rule, sev) for line, rule, sev in scanned]
            assert scanned == fed, form


def _only(text: str) -> RuleSet:
    """The rules of one rule file alone, without the shipped ones."""
    return RuleSet([r for r in parse_rule_file(text, "local.yaml") if isinstance(r, Rule)])


# A hang reported without its device, waiting (hold) for the unit's reset lines, which may name it and may be worse.
FROB = _only("""
rules:
  - name: frob_hang
    keywords: ["frob: hang"]
    regex: 'frob: hang code (?P<xid>\\d+)(?: at (?P<pci>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]))?'
    severity: warning
    hold: 4
    follow:
      keywords: ["frob: unit"]
      regex: 'frob: unit(?: at (?P<pci>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]))? (?P<state>reset|dead)'
      within: 4
    severity_by: [{field: state, critical: [dead]}]
  - name: frob_unit
    keywords: ["frob: unit"]
    regex: 'frob: unit(?: at \\S+)? reset'
    severity: warning
""")
PCI = "0000:3b:00.0"


def _given(stream: StreamMatcher, lines: list[str]) -> list[tuple[int | None, str, str, str | None, int | None]]:
    out = [m for line in lines for m in stream.feed([Record(line)])] + stream.flush()
    assert stream.errors == 0 and stream.error is None, stream.error
    return [(m.index, m.rule, m.severity, m.pci, m.xid) for m in out]


def test_a_waiting_event_takes_its_follow_line_with_the_device_it_names() -> None:
    """The reset line is the hang's (no event of its own, not even for frob_unit, which it also matches), names the
    device the hang did not, and is kept among the follow lines taken."""
    stream = StreamMatcher(FROB)
    assert _given(stream, ["frob: hang code 7", f"frob: unit at {PCI} reset"]) == [(1, "frob_hang", "warning", PCI, 7)]
    [event] = feed(FROB, ["frob: hang code 7", "x"])
    assert (event.index, event.record.message) == (1, "frob: hang code 7")  # its own record, not the one after
    assert [(line.rule, record.message) for line, record in stream.take_absorbed()] == [
        ("frob_hang", f"frob: unit at {PCI} reset")]


def test_a_waiting_event_is_as_bad_as_its_worst_line() -> None:
    assert _given(StreamMatcher(FROB), ["frob: hang code 7", "frob: unit dead", "frob: unit reset"]) == [
        (1, "frob_hang", "critical", None, 7)]


def test_a_waiting_event_takes_the_device_of_its_follow_lines_prefix_when_it_named_none() -> None:
    assert _given(StreamMatcher(FROB), ["frob: hang code 7", f"frobdrv {PCI}: frob: unit reset"]) == [
        (1, "frob_hang", "warning", PCI, 7)]
    # Its own prefix named a device (not a PCI address): another record's prefix does not replace it.
    other = _only("""
rules:
  - name: frob_hang
    keywords: ["frob: hang"]
    regex: 'frob: hang code (?P<xid>\\d+)'
    hold: 4
    follow: {keywords: ["frob: unit"], regex: 'frob: unit reset', same_device: false}
""")
    assert _given(StreamMatcher(other), ["frobdrv frob0: frob: hang code 7", f"frobdrv {PCI}: frob: unit reset"]) == [
        (1, "frob_hang", "warning", None, 7)]


def test_a_waiting_event_takes_lines_to_the_end_of_its_hold_and_not_after() -> None:
    noise = ["x"] * 3
    assert _given(StreamMatcher(FROB), ["frob: hang code 7", *noise, f"frob: unit at {PCI} dead"]) == [
        (1, "frob_hang", "critical", PCI, 7)]
    assert _given(StreamMatcher(FROB), ["frob: hang code 7", *noise, "x", f"frob: unit at {PCI} dead"]) == [
        (1, "frob_hang", "warning", None, 7)]


def test_a_waiting_event_is_dropped_when_a_report_within_its_hold_names_its_device() -> None:
    """nvrm_error waits 16 records for nvidia_xid, which reports the same fault better, after it as before it."""
    xid = "NVRM: Xid (PCI:0000:68:00): 79, pid=1, name=x, GPU has fallen off the bus."
    assert _feed(RULES, [INIT_FAILED, xid]) == [(2, "nvidia_xid", "critical")]
    other = "NVRM: Xid (PCI:0000:69:00): 79, pid=1, name=x, GPU has fallen off the bus."
    assert _feed(RULES, [INIT_FAILED, other]) == [(1, "nvrm_error", "critical"), (2, "nvidia_xid", "critical")]
    for gap, dropped in ((15, True), (16, False)):  # the report 16 records after it, or 17
        after = _feed(RULES, [INIT_FAILED, *[NOISE] * gap, xid])
        before = _feed(RULES, [xid, *[NOISE] * gap, INIT_FAILED])
        assert [rule for _, rule, _ in after] == (["nvidia_xid"] if dropped else ["nvrm_error", "nvidia_xid"])
        assert [rule for _, rule, _ in before] == (["nvidia_xid"] if dropped else ["nvidia_xid", "nvrm_error"])
    # A report of another rule in between, after the hold: the same.
    edac = "EDAC MC0: 1 CE Single-bit ECC on unknown memory (node:0 card:0 module:0 page:0x12345 offset:0x0)"
    assert [rule for _, rule, _ in _feed(RULES, [INIT_FAILED, *[NOISE] * 15, edac, xid])] == [
        "nvrm_error", "edac_corrected", "nvidia_xid"]


LINK = _only("""
rules:
  - name: link_flap
    keywords: ["lnk: flap"]
    regex: 'lnk: flap on (?P<pci>\\S+)'
    hold: 4
    superseded_by: [link_down]
  - name: link_down
    keywords: ["lnk: down"]
    regex: 'lnk: down on (?P<pci>\\S+)'
  - name: link_slow
    keywords: ["lnk: slow"]
    regex: 'lnk: slow on (?P<pci>\\S+)'
    hold: 4
    superseded_by: [link_down]
""")


@pytest.mark.parametrize(("flap", "down", "dropped"), [
    ("0000:3b:00.1", "0000:3b:00.1", True), ("0000:3b:00.1", "0000:3b:00.0", True),  # its device's function 0
    ("0000:3b:00.1", "0000:3b:00.2", False), ("0000:3b:00.1", "0000:3c:00.0", False)])
def test_a_waiting_event_is_dropped_for_a_report_on_its_function_or_its_devices_function_0(
        flap: str, down: str, dropped: bool) -> None:
    events = [m.rule for m in feed(LINK, [f"lnk: flap on {flap}", f"lnk: down on {down}"])]
    assert events == (["link_down"] if dropped else ["link_flap", "link_down"])
    events = [m.rule for m in feed(LINK, [f"lnk: flap on {flap}", f"lnk: slow on {flap}", f"lnk: down on {down}"])]
    assert events == (["link_down"] if dropped else ["link_flap", "link_slow", "link_down"])  # both waiting


GADGET = _only("""
rules:
  - name: gadget_fault
    keywords: ["gadget: fault"]
    regex: 'gadget: fault'
    follow: {keywords: ["gdg detail"], regex: 'gdg detail', within: 3}
""")


def test_follow_lines_count_within_records_of_the_last_line_their_fault_took() -> None:
    stream = StreamMatcher(GADGET)
    assert _given(stream, ["gadget: fault", "x", "x", "gdg detail 1", "x", "x", "gdg detail 2", "x", "x", "x",
                           "gdg detail 3"]) == [(1, "gadget_fault", "warning", None, None)]
    assert [record.message for _, record in stream.take_absorbed()] == ["gdg detail 1", "gdg detail 2"]


def test_a_boot_ends_open_faults_in_a_rule_set_without_rules_over_several_records() -> None:
    rules = _only("""
rules:
  - name: widget_fault
    keywords: ["widget: fault"]
    regex: 'widget: fault'
    follow: {keywords: ["wdg detail"], regex: 'wdg detail', alone: true}
""")
    stream = StreamMatcher(rules)
    assert _given(stream, ["widget: fault", "wdg detail", "Linux version 6.1.0", "wdg detail"]) == [
        (1, "widget_fault", "warning", None, None), (4, "widget_fault", "warning", None, None)]


def test_a_waiting_event_takes_no_line_of_another_device() -> None:
    """Its follow regex matches, but the line names another device: not this fault's (same_device, the default)."""
    other = "0000:3c:00.0"
    assert _given(StreamMatcher(FROB), [f"frob: hang code 7 at {PCI}", f"frob: unit at {other} dead"]) == [
        (1, "frob_hang", "warning", PCI, 7)]
    # With same_device: false the line is taken, but the event keeps the device its first line named.
    anywhere = _only("""
rules:
  - name: frob_hang
    keywords: ["frob: hang"]
    regex: 'frob: hang code (?P<xid>\\d+) at (?P<pci>\\S+)'
    hold: 4
    follow: {keywords: ["frob: unit"], regex: 'frob: unit at (?P<pci>\\S+) reset', same_device: false}
""")
    assert _given(StreamMatcher(anywhere), [f"frob: hang code 7 at {PCI}", f"frob: unit at {other} reset"]) == [
        (1, "frob_hang", "warning", PCI, 7)]


def test_a_line_an_open_fault_took_is_still_an_event_where_it_is_worse_or_about_another_device() -> None:
    rules = _only("""
rules:
  - name: gadget_fault
    keywords: ["gadget: fault"]
    regex: 'gadget: fault'
    follow: {keywords: ["gdg detail"], regex: 'gdg detail'}
  - name: gadget_dead
    keywords: ["gdg detail"]
    regex: 'gdg detail: dead'
    severity: critical
  - name: peer_down
    keywords: ["gdg detail"]
    regex: 'gdg detail: peer (?P<pci>\\S+) down'
""")
    assert _given(StreamMatcher(rules), ["gadget: fault", "gdg detail: dead"]) == [
        (1, "gadget_fault", "warning", None, None), (2, "gadget_dead", "critical", None, None)]
    assert _given(StreamMatcher(rules), [f"gdgdrv {PCI}: gadget: fault", f"gdgdrv {PCI}: gdg detail: peer {PCI} down"]
                  ) == [(1, "gadget_fault", "warning", None, None)]  # the same device: that fault again
    assert _given(StreamMatcher(rules), [f"gdgdrv {PCI}: gadget: fault",
                                         f"gdgdrv {PCI}: gdg detail: peer 0000:3c:00.0 down"]) == [
        (1, "gadget_fault", "warning", None, None), (2, "peer_down", "warning", "0000:3c:00.0", None)]


SPLIT = _only("""
rules:
  - name: split_banner
    keywords: ["second half"]
    regex: 'first half\\n(?:middle\\n)?second half'
    lines: 2
  - name: triple
    keywords: ["third part"]
    regex: '(?:one\\n)?two\\nthird part'
    lines: 3
  - name: waiting_split
    keywords: ["end part"]
    regex: 'begin part\\nend part'
    lines: 2
    hold: 2
""")


def test_a_message_over_records_joins_only_adjacent_records_up_to_its_rules_lines() -> None:
    stream = StreamMatcher(SPLIT)
    assert stream.feed([Record("first half")]) == [] and stream.skip(0) == []
    [event] = stream.feed([Record("second half", "+pci:0000:3b:00.0")])
    assert (event.rule, event.index, event.record.message, event.record.kernel_device) == (
        "split_banner", 1, "first half\nsecond half", "+pci:0000:3b:00.0")
    stream = StreamMatcher(SPLIT)
    assert stream.feed([Record("first half")]) == [] and stream.skip(1) == []  # a record went by unread
    assert stream.feed([Record("second half")]) == [] and stream.errors == 0
    # split_banner spans 2 records: not 3, though the stream keeps 2 before each for triple.
    assert _given(StreamMatcher(SPLIT), ["first half", "middle", "second half"]) == []
    assert [(m.index, m.rule) for m in feed(SPLIT, ["x", "two", "third part"])] == [(2, "triple")]
    assert [(m.index, m.rule) for m in feed(SPLIT, ["one", "two", "third part"])] == [(1, "triple")]
    # A rule of one record never spans two (here one without keywords, tried on every record).
    spaced = _only("""
rules:
  - {name: split_banner, keywords: ["second half"], regex: 'first half\\nsecond half', lines: 2}
  - {name: spaced, regex: 'gap here\\s+gap there'}
""")
    assert feed(spaced, ["gap here", "gap there"]) == [] and len(feed(spaced, ["first half", "second half"])) == 1
    [waited] = feed(SPLIT, ["begin part", "end part"])
    assert (waited.index, waited.record.message) == (1, "begin part\nend part")


def test_skipping_records_in_a_rule_set_without_rules_over_several_records_is_counted() -> None:
    stream = StreamMatcher(GADGET)
    assert stream.skip(3) == [] and _given(stream, ["gadget: fault"]) == [(4, "gadget_fault", "warning", None, None)]


def test_an_event_after_a_waiting_event_that_is_dropped_comes_out() -> None:
    """The EDAC report before the mce notice stands for it; the Xid after it waits behind it, then comes out."""
    edac = "EDAC MC0: 1 CE Single-bit ECC on unknown memory (node:0 card:0 module:0 page:0x12345 offset:0x0)"
    logged = "mce: [Hardware Error]: Machine check events logged"
    assert _feed(RULES, [edac, logged, XID, *[NOISE] * 9]) == [(1, "edac_corrected", "info"),
                                                              (3, "nvidia_xid", "critical")]


def test_a_follow_line_finds_its_fault_behind_a_newer_one_of_another_device() -> None:
    rules = _only("""
rules:
  - name: widget_fault
    keywords: ["widget: fault"]
    regex: 'widget: fault'
    follow: {keywords: ["wdg detail"], regex: 'wdg detail', within: 3, alone: true}
""")
    a, b = "wdgdrv 0000:3b:00.0: ", "wdgdrv 0000:3c:00.0: "
    # Another device's detail line is no line of this fault: alone, it is an event of its own.
    assert [m.index for m in feed(rules, [a + "widget: fault", b + "wdg detail"])] == [1, 2]
    assert _given(StreamMatcher(rules), [a + "widget: fault", b + "widget: fault", a + "wdg detail", "x", "x",
                                         a + "wdg detail"]) == [
        (1, "widget_fault", "warning", None, None), (2, "widget_fault", "warning", None, None)]


def test_at_most_max_held_events_wait_the_oldest_comes_out_for_a_new_one() -> None:
    count = matcher_module.MAX_HELD
    rules = _only("rules:\n" + "".join(f"  - {{name: e{n}, keywords: ['zq{n}:'], regex: 'zq{n}: bad', hold: 64}}\n"
                                       for n in range(count + 1)))
    stream = StreamMatcher(rules)
    for n in range(count):
        assert stream.feed([Record(f"zq{n}: bad")]) == []
    assert [(m.index, m.rule) for m in stream.feed([Record(f"zq{count}: bad")])] == [(1, "e0")]
    assert [m.index for m in stream.flush()] == list(range(2, count + 2)) and stream.errors == 0


def test_one_line_can_be_a_line_of_two_waiting_events() -> None:
    """Two rules' follow regexes match the same reset line: each waiting event takes it, and is as bad."""
    rules = _only("""
rules:
  - name: frob_hang
    keywords: ["frob: hang"]
    regex: 'frob: hang'
    hold: 4
    follow: {keywords: ["frob: unit"], regex: 'frob: unit (?P<state>reset|dead)'}
    severity_by: [{field: state, critical: [dead]}]
  - name: frob_stall
    keywords: ["frob: stall"]
    regex: 'frob: stall'
    hold: 4
    follow: {keywords: ["frob: unit"], regex: 'frob: unit (?P<state>reset|dead)'}
    severity_by: [{field: state, critical: [dead]}]
""")
    assert _given(StreamMatcher(rules), ["frob: hang", "frob: stall", "frob: unit dead"]) == [
        (1, "frob_hang", "critical", None, None), (2, "frob_stall", "critical", None, None)]
    # The first one's hold is over at the reset line: it ends, and the second still takes the line.
    assert _given(StreamMatcher(rules), ["frob: hang", "x", "x", "x", "frob: stall", "frob: unit dead"]) == [
        (1, "frob_hang", "warning", None, None), (5, "frob_stall", "critical", None, None)]


def test_a_waiting_event_ends_when_its_rules_next_fault_begins() -> None:
    stream = StreamMatcher(FROB)
    assert stream.feed([Record("frob: hang code 7")]) == []
    assert [(m.index, m.xid) for m in stream.feed([Record("frob: hang code 8")])] == [(1, 7)]
    assert [(m.index, m.xid) for m in stream.flush()] == [(2, 8)] and stream.errors == 0


def test_one_event_per_record_the_worst_then_a_lost_first_line_then_the_first_rule() -> None:
    rules = _only("""
rules:
  - name: zz_first
    keywords: ["zz:"]
    regex: 'zz: (?:same|detail)'
  - name: zz_second
    keywords: ["zz:"]
    regex: 'zz: same'
  - name: zz_fault
    keywords: ["zz: fault"]
    regex: 'zz: fault'
    follow: {keywords: ["zz:"], regex: 'zz: detail', alone: true}
""")
    assert [m.rule for m in feed(rules, ["zz: same"])] == ["zz_first"]
    assert [m.rule for m in feed(rules, ["zz: detail"])] == ["zz_fault"]  # the detail line of a fault not seen


def test_a_text_log_is_read_whole_for_a_rule_without_keywords() -> None:
    rules = _only("rules: [{name: quux_failed, regex: 'quux failed'}]")
    events = scan(b"[    1.0] x\n[    2.0] quux failed\n", rules, lambda pci: None).events
    assert [(e.rule, e.line) for e in events] == [("quux_failed", 2)]


def test_of_lone_detail_lines_of_several_rules_on_one_record_the_first_rule_gives_the_event() -> None:
    rules = _only("""
rules:
  - name: yy_first_fault
    keywords: ["yy: one"]
    regex: 'yy: one'
    follow: {keywords: ["yy:"], regex: 'yy: detail', alone: true}
  - name: yy_second_fault
    keywords: ["yy: two"]
    regex: 'yy: two'
    follow: {keywords: ["yy:"], regex: 'yy: detail', alone: true}
""")
    assert [m.rule for m in feed(rules, ["yy: detail"])] == ["yy_first_fault"]  # one event, in rule order


@pytest.mark.parametrize("lines", [2, 3])
def test_a_message_over_records_ends_in_the_last_of_them(lines: int) -> None:
    # One record's message is one event, also when the rule's regex may take the newline after it (`\s*`) and the
    # next record holds the rule's keyword: a match that ends where that record begins, or in a record before it,
    # is the record before's.
    rules = _only(rf"""
rules:
  - {{name: disk_lost, keywords: ["lost"], regex: 'disk \d+ lost\s*', lines: {lines}}}
""")
    assert _feed(rules, ["x", "disk 3 lost", "link lost"]) == [(2, "disk_lost", "warning")]


def test_a_rule_over_several_records_may_look_behind_into_the_records_before() -> None:
    # A match that lies in the last record alone, found only by looking behind into the ones before, is the event
    # of that record, wherever in it the match starts.
    rules = _only(r"""
rules:
  - {name: after_first, keywords: ["second half"], regex: '(?<=first half\n)second half', lines: 2}
  - {name: tail_after_first, keywords: ["tail"], regex: '(?<=first half\nsecond )tail', lines: 2}
""")
    assert [(m.index, m.rule, m.record.message) for m in feed(rules, ["first half", "second half"])] == [
        (2, "after_first", "second half")]
    assert [(m.index, m.rule, m.record.message) for m in feed(rules, ["first half", "second tail"])] == [
        (2, "tail_after_first", "second tail")]
    assert feed(rules, ["other half", "second half", "second tail"]) == []


# A block's event waits for its detail lines (hold); a port's fault has detail lines of its own, one of which the
# block also prints ("xx: status"), and stands for its lost first line.
BLOCK_AND_PORT = """
rules:
  - name: xx_block
    keywords: ["xx: block"]
    regex: 'xx: block'
    {hold}
    follow: {{keywords: ["xx: status"], regex: 'xx: status'}}
  - name: xx_port
    keywords: ["xx: port"]
    regex: 'xx: port'
    severity: {severity}
    follow:
      {{keywords: ["xx: status", "xx: port detail"], regex: 'xx: (?:status|port detail)(?: peer (?P<pci>\\S+))?',
       within: 2, alone: true}}
"""


def test_a_line_a_waiting_event_takes_is_also_another_open_faults_line() -> None:
    # The status line is the waiting block's and the port fault's: it keeps the port fault open, so the port's
    # detail line two records later is that fault's (within 2 of the status line, 4 of the port's first line).
    rules = _only(BLOCK_AND_PORT.format(hold="hold: 4", severity="warning"))
    assert _given(StreamMatcher(rules), ["xx: port", "xx: block", "xx: status", "x", "xx: port detail"]) == [
        (1, "xx_port", "warning", None, None), (2, "xx_block", "warning", None, None)]


@pytest.mark.parametrize("hold", ["hold: 4", ""])
def test_a_line_another_fault_took_stands_for_no_lost_first_line_unless_worse(hold: str) -> None:
    # The block's status line is the port's detail line too; with no port fault open it would stand for the port
    # fault's lost first line. It is the block's fault (waiting or not) instead, as another rule's match on it would
    # be, unless the port fault is worse.
    rules = _only(BLOCK_AND_PORT.format(hold=hold, severity="warning"))
    assert _given(StreamMatcher(rules), ["xx: block", "xx: status"]) == [(1, "xx_block", "warning", None, None)]
    assert _given(StreamMatcher(rules), ["xx: status"]) == [(1, "xx_port", "warning", None, None)]
    # A status line about another device is that device's port fault's.
    block, status = f"xxdrv {PCI}: xx: block", f"xxdrv {PCI}: xx: status peer"
    assert _given(StreamMatcher(rules), [block, f"{status} {PCI}"]) == [(1, "xx_block", "warning", None, None)]
    assert _given(StreamMatcher(rules), [block, f"{status} 0000:3c:00.0"]) == [
        (1, "xx_block", "warning", None, None), (2, "xx_port", "warning", "0000:3c:00.0", None)]
    worse = _only(BLOCK_AND_PORT.format(hold=hold, severity="critical"))
    assert _given(StreamMatcher(worse), ["xx: block", "xx: status"]) == [
        (1, "xx_block", "warning", None, None), (2, "xx_port", "critical", None, None)]
