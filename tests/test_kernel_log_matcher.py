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
from tpuwatch.kernel_log.rulefile import load_rules
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
    assert [c is None for c in (rules.checks["wedged"], rules.checks["stalled"])] == [True, True]
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
