"""Kernel log rules and record parsing: every shipped rule on real-format lines, near misses, rule file errors."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuwatch.kernel_log import formats
from tpuwatch.kernel_log import rules as rules_module
from tpuwatch.kernel_log.events import make_event
from tpuwatch.kernel_log.matcher import StreamMatcher
from tpuwatch.kernel_log.prefilter import literal_alternation
from tpuwatch.kernel_log.records import Record, normalise_pci, parse_kmsg, parse_line, pci_of_kernel_device
from tpuwatch.kernel_log.rule import Rule
from tpuwatch.kernel_log.rulefile import SHIPPED_DIR, RuleError, load_rules, parse_rule_file
from tpuwatch.kernel_log.rules import RuleSet

from kernellog import feed, scan

DATA = Path(__file__).parent / "testdata" / "kernel_log"
CASES: dict[str, Any] = yaml.safe_load((DATA / "cases.yaml").read_text())
# The rule names docs/kernel_log.md promises (the logscan JSON contract), and the rest of the shipped set.
DOCUMENTED_RULES = {"nvidia_xid", "gpu_fell_off_bus", "pcie_aer_corrected", "pcie_aer_uncorrected", "edac_corrected",
                "edac_uncorrected", "mce", "cper_fatal", "tpu_driver_error", "oom_kill", "hung_task", "soft_lockup"}
SHIPPED_RULES = DOCUMENTED_RULES | {"nvrm_error", "pci_reset_failed", "mce_logged", "cper_recoverable",
                                    "cper_corrected", "memory_failure", "hard_lockup", "rcu_stall", "workqueue_lockup",
                                    "kernel_panic", "kernel_oops", "amdgpu_error", "amdgpu_smu_error",
                                    "nvswitch_sxid", "habanalabs_error", "cpu_thermal_throttle", "nmi_error"}
RULES = load_rules([])

MATCHES = [(rule, case) for rule, cases in CASES.items() for case in cases["match"]]
NEAR_MISSES = [(rule, line) for rule, cases in CASES.items() for line in cases["near_miss"]]


def test_shipped_rules_are_the_design_categories_and_more_each_with_fixtures() -> None:
    assert {r.name for r in RULES.rules} == SHIPPED_RULES
    assert set(CASES) == SHIPPED_RULES
    assert all(CASES[name]["match"] and CASES[name]["near_miss"] for name in SHIPPED_RULES)


@pytest.mark.parametrize(("rule", "case"), MATCHES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(MATCHES)])
@pytest.mark.parametrize("prefix", ["", "[ 3605.442181] ", "[Mon Nov 30 04:37:39 2026] ",
                                    "Nov 30 04:37:39 gpu-host-7 kernel: [ 3605.442181] ", "4,812,3605442181,-;"])
def test_every_shipped_rule_matches_its_lines_in_every_format(rule: str, case: dict[str, Any], prefix: str) -> None:
    record = parse_line(prefix + case["line"])
    assert record.message == case["line"]
    [match] = RULES.match(record.message)
    event = make_event(match, record, lambda pci: None)
    assert (event.rule, event.severity, event.pci, event.xid) == (rule, case["severity"], case.get("pci"),
                                                                  case.get("xid"))
    stream = StreamMatcher(RULES)
    assert [m.rule for m in [*stream.feed([record]), *stream.flush()]] == [rule]


@pytest.mark.parametrize(("rule", "line"), NEAR_MISSES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(NEAR_MISSES)])
def test_near_misses_match_no_rule(rule: str, line: str) -> None:
    assert RULES.match(line) == []
    stream = StreamMatcher(RULES)
    assert stream.feed([Record(line)]) + stream.flush() == []


def test_every_rule_keyword_prefilter_admits_all_its_fixture_lines() -> None:
    for rule, case in MATCHES:
        text = "noise line\n" + case["line"] + "\nmore noise\n"
        assert RULES.prefilter is not None
        hits = [offset for offset, _ in RULES.prefilter.finds(text)]
        assert any(11 <= h < 11 + len(case["line"]) for h in hits), (rule, case["line"])


def test_xid_fields_are_extracted() -> None:
    [match] = RULES.match("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.")
    assert match.xid == 79 and match.fields == {"pid": "1234", "process": "python3"}


@pytest.mark.parametrize(("text", "expected"), [
    ("PCI:0000:3b:00", "0000:3b:00.0"), ("0000:03:00", "0000:03:00.0"), ("0000:B3:00.1", "0000:b3:00.1"),
    ("3b:00.0", "0000:3b:00.0"), ("10000:3b:00.0", None), ("not a pci", None), ("0000:3b:00.9", None)])
def test_normalise_pci(text: str, expected: str | None) -> None:
    assert normalise_pci(text) == expected


def test_kernel_device_attribution_only_for_pci() -> None:
    assert pci_of_kernel_device("+pci:0000:3B:00.0") == "0000:3b:00.0"
    assert pci_of_kernel_device("c245:0") is None
    assert pci_of_kernel_device(None) is None


def test_kmsg_record_with_continuation_lines() -> None:
    raw = ("4,812,3605442181,-,caller=T1;pcieport 0000:00:03.0: AER: Corrected error received: id=0018\n"
           " SUBSYSTEM=pci\n DEVICE=+pci:0000:00:03.0\n")
    parsed = parse_kmsg(raw)
    assert parsed is not None
    assert (parsed.seq, parsed.priority) == (812, 4)
    assert parsed.record == Record("pcieport 0000:00:03.0: AER: Corrected error received: id=0018",
                                   "+pci:0000:00:03.0")
    assert parse_kmsg("not a record") is None


@pytest.mark.parametrize(("line", "message", "device"), [
    ('{"MESSAGE": "EDAC MC0: 1 UE x", "_KERNEL_DEVICE": "+pci:0000:00:05.0"}', "EDAC MC0: 1 UE x",
     "+pci:0000:00:05.0"),
    ('{"MESSAGE": [69, 68, 65, 67, 255], "_TRANSPORT": "kernel"}', "EDAC\ufffd", None),
    ('{"MESSAGE": null}', '{"MESSAGE": null}', None),
    ("{not json", "{not json", None),
    ("<4>[    1.500000] hello", "hello", None),
    ("kern  :warn  : [Mon Nov 30 04:37:39 2026] hello", "hello", None),
    ("2026-11-30T04:37:39.123456+00:00 host kernel: [    1.5] hello", "hello", None),
    ("plain text", "plain text", None),
    # Lines some other program logged are not the kernel's, whatever they say (any user can run logger):
    ("Nov 30 04:37:39 vm job[4242]: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
     "", None),
    ("2026-11-30T04:37:39.123456+00:00 host logger: Out of memory: Killed process 1 (x)", "", None),
    ('{"MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79", "_TRANSPORT": "syslog"}', "", None),
    ("Nov 30 04:37:39 vm kernel: NVRM: Xid (PCI:0000:3b:00): 79", "NVRM: Xid (PCI:0000:3b:00): 79", None),
    ("<4>Nov 30 04:37:39 vm job[42]: NVRM: Xid (PCI:0000:3b:00): 79", "", None),
    ("Nov 30 04:37:39 job[42]: NVRM: Xid (PCI:0000:3b:00): 79", "", None),
    # journalctl -o short-precise: the time with microseconds
    ("Aug 10 15:36:05.123456 gpu-node-a root[4242]: NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
     "", None),
    ("Aug 10 15:36:05.123456 gpu-node-a kernel: NVRM: Xid (PCI:0000:01:00): 79", "NVRM: Xid (PCI:0000:01:00): 79",
     None),
    # every journalctl -o short-* head: short-full and with-unit, short-monotonic and short-delta, short-unix,
    # short-iso with a space, and zones written as names or offsets
    ("Mon 2026-11-30 04:37:39 UTC gpu-node-a root[4242]: NVRM: Xid (PCI:0000:01:00): 79", "", None),
    ("Mon 2026-11-30 04:37:39.123456 CEST gpu-node-a root[4242]: NVRM: Xid (PCI:0000:01:00): 79", "", None),
    ("Mon 2026-11-30 04:37:39 +0530 gpu-node-a root[4242]: NVRM: Xid (PCI:0000:01:00): 79", "", None),
    ("[  123.456789] gpu-node-a root[4242]: NVRM: Xid (PCI:0000:01:00): 79", "", None),
    ("[  123.456789 <    0.000123>] gpu-node-a root[4242]: NVRM: Xid (PCI:0000:01:00): 79", "", None),
    ("1764477459.123456 gpu-node-a root[4242]: NVRM: Xid (PCI:0000:01:00): 79", "", None),
    ("1764477459.123456 root[4242]: NVRM: Xid (PCI:0000:01:00): 79", "", None),
    ("2026-11-30 04:37:39.123 gpu-node-a root[4242]: NVRM: Xid (PCI:0000:01:00): 79", "", None),
    ("Mon 2026-11-30 04:37:39 UTC gpu-node-a kernel: NVRM: Xid (PCI:0000:01:00): 79",
     "NVRM: Xid (PCI:0000:01:00): 79", None),
    ("[  123.456789] gpu-node-a kernel: NVRM: Xid (PCI:0000:01:00): 79", "NVRM: Xid (PCI:0000:01:00): 79", None),
    ("[  123.456789 <    0.000123>] kernel: NVRM: Xid (PCI:0000:01:00): 79", "NVRM: Xid (PCI:0000:01:00): 79",
     None),
    ("1764477459.123456 gpu-node-a kernel: NVRM: Xid (PCI:0000:01:00): 79", "NVRM: Xid (PCI:0000:01:00): 79", None),
    ("2026-11-30 04:37:39.123 gpu-node-a kernel: NVRM: Xid (PCI:0000:01:00): 79", "NVRM: Xid (PCI:0000:01:00): 79",
     None),
    # dmesg --time-format iso (a comma before the microseconds) and delta, and the printk caller after the time
    ("2026-12-01T10:52:25,123456+00:00 NVRM: Xid (PCI:0000:01:00): 79", "NVRM: Xid (PCI:0000:01:00): 79", None),
    ("[<    0.000123>] NVRM: Xid (PCI:0000:01:00): 79", "NVRM: Xid (PCI:0000:01:00): 79", None),
    ("[    5.123456][  T123] accel accel0: f: Device reported as dead.", "accel accel0: f: Device reported as dead.",
     None),
    ("[Tue Dec  1 10:52:25 2026] [    C3] NVRM: Xid (PCI:0000:01:00): 79", "NVRM: Xid (PCI:0000:01:00): 79", None),
    # heads found in real pastes: the caller after the syslog tag, a console logger's wall clock before the kernel
    # time, dmesg -T and journalctl in other languages, Incus OS, talosctl dmesg, a bare "kernel: "
    ("2026-02-10T16:15:01.001815+01:00 lisa kernel: [T45426] mce: [Hardware Error]: Machine check events logged",
     "mce: [Hardware Error]: Machine check events logged", None),
    ("2026-02-10T16:15:01.001815+01:00 lisa kernel: [    C0] smca_should_log_poll_error: 1",
     "smca_should_log_poll_error: 1", None),
    ("[2023-06-22 21:55:31.352446][5975153.878190] EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0",
     "EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0", None),
    ("[Do Mär 26 07:38:49 2020] {2}[Hardware Error]: event severity: corrected",
     "{2}[Hardware Error]: event severity: corrected", None),
    ("фев 12 00:48:02 kernel: pcieport 0000:00:1c.5: AER: Corrected error received: 0000:00:1c.5",
     "pcieport 0000:00:1c.5: AER: Corrected error received: 0000:00:1c.5", None),
    ("фев 12 00:48:02 host root[4242]: NVRM: Xid (PCI:0000:01:00): 79", "", None),
    ("04 Aug, 14:03:32 fd183fd0-4585-374f-986e-a8595f986d1d kernel: rcu: INFO: rcu_preempt detected stalls",
     "rcu: INFO: rcu_preempt detected stalls", None),
    ("192.168.11.119: kern: warning: [2026-04-22T21:25:20.505406921Z]: NVRM: Xid (PCI:0000:48:00): 62, 00002740",
     "NVRM: Xid (PCI:0000:48:00): 62, 00002740", None),
    ("192.168.11.119: kern:     err: [2026-04-22T21:25:20.466440686Z]: NVRM: The NVIDIA GPU 0000:5d:00.0",
     "NVRM: The NVIDIA GPU 0000:5d:00.0", None),
    ("kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001",
     "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001", None),
    # dmesg's own lines of the same shape as a monotonic head with a host stay the kernel's
    ("[    5.123456] usb 1-1: new high-speed USB device number 2", "usb 1-1: new high-speed USB device number 2", None),
    ("[    5.123456] NVRM: Xid (PCI:0000:01:00): 79", "NVRM: Xid (PCI:0000:01:00): 79", None),
    ("[    5.123456] systemd[1]: Started Journal Service.", "systemd[1]: Started Journal Service.", None),
    # ... and the kernel's own lines in every syslog form stay: no hostname (journalctl --no-hostname), kernel[0]
    ("Nov 30 04:37:39 kernel: NVRM: Xid (PCI:0000:3b:00): 79", "NVRM: Xid (PCI:0000:3b:00): 79", None),
    ("2025-11-30T04:37:39+0000 kernel: NVRM: Xid (PCI:0000:3b:00): 79", "NVRM: Xid (PCI:0000:3b:00): 79", None),
    ("Nov 30 04:37:39 host kernel[0]: NVRM: Xid (PCI:0000:3b:00): 79", "NVRM: Xid (PCI:0000:3b:00): 79", None),
])
def test_parse_line_formats(line: str, message: str, device: str | None) -> None:
    assert parse_line(line) == Record(message, device)


@pytest.mark.parametrize("seed", range(20))
def test_the_quick_test_for_another_programs_line_never_says_no_where_the_regex_says_yes(seed: int) -> None:
    """parse_line skips the regex for lines of another program where ``_maybe_other_program`` says it cannot
    match: lines starting with "[" that lack "]: " (dmesg's)."""
    rng = random.Random(seed)
    pieces = ["[", "]", "]: ", ": ", " ", "  123.456789", " <    0.000123>", "5", ".", "host", "gpu-node-a",
              "root", "job[42]", "[4242]", "kernel", "kernel: ", "kernel[0]: ", "NVRM: Xid", "<4>", "Nov 30 04:37:39",
              "x", "\t"]
    lines = ["[  123.456789] gpu-node-a root[4242]: NVRM: Xid (PCI:0000:01:00): 79",
             "[  123.456789 <    0.000123>] gpu-node-a root[4242]: NVRM: Xid (PCI:0000:01:00): 79",
             *(line for path in DATA.glob("*.txt") for line in path.read_text().splitlines())]
    assert sum(1 for line in lines[:2] if formats.OTHER_PROGRAM_RE.match(line)) == 2
    for _ in range(2000):
        lines.append("[" + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 9))))
    for line in lines:
        assert formats.maybe_other_program(line) or not formats.OTHER_PROGRAM_RE.match(line), line


def _rule_file(tmp_path: Path, text: str, name: str = "local.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "reason"), [
    ("rules: [{name: bad, regex: 'Xid (', severity: warning}]", "rule 'bad': invalid regex: missing )"),
    ("rules: [{name: big, regex: 'a{99999999999}'}]", "rule 'big': invalid regex: the repetition number is too large"),
    ("rules: [{name: deep, regex: '" + "(" * 1000 + ")" * 1000 + "'}]",
     "rule 'deep': invalid regex: maximum recursion"),
    ("rules: [{name: set, regex: '[[a]'}]", "rule 'set': ambiguous regex: Possible nested set at position 1"),
    ("rules: [{name: bad, regex: x, severity: urgent}]", "rule 'bad': severity must be one of"),
    ("rules: [{name: bad, regex: x, colour: red}]", "rule 'bad': unknown key 'colour'"),
    ("rules: [{name: bad}]", "rule 'bad': regex is required"),
    ("rules: [{name: Bad-Name, regex: x}]", "rule '#1': name must be"),
    ("rules: [{name: bad, regex: x, keywords: [1]}]", "rule 'bad': keywords must be a list of non-empty strings"),
    ("rules: [{name: bad, regex: '(?P<xid>\\d+)', severity_by: {field: code, critical: [1]}}]",
     "rule 'bad': severity_by.field 'code' is not a named group"),
    ("rules: [{name: bad, regex: '(?P<xid>\\d+)', severity_by: {field: xid, urgent: [1]}}]",
     "rule 'bad': severity_by: 'urgent' is not a severity"),
    ("rules: [{name: dup, regex: x}, {name: dup, regex: y}]", "rule 'dup': defined twice in this file"),
    ("rules:\n  - name: x\n   regex: [", "line 3, column 4: YAML syntax error"),
    ("- just a list", "expected a mapping with one key, rules"),
    ("rules: [{name: bad, regex: x, lines: 9}]", "rule 'bad': lines must be a whole number from 1 to 8"),
    ("rules: [{name: bad, regex: x, hold: -1}]", "rule 'bad': hold must be a whole number from 0 to 64"),
    ("rules: [{name: bad, regex: x, hold: true}]", "rule 'bad': hold must be a whole number"),
    ("rules: [{name: bad, regex: x, superseded_by: Other}]", "rule 'bad': superseded_by must be a list of rule names"),
    ("rules: [{name: bad, regex: x, ~: 1}]", "rule 'bad': unknown key 'None'"),
    ("rules: [{name: bad, regex: x, keywords: [" + "k" * 257 + "]}]", "rule 'bad': keywords must be a list of"),
    ("rules: [{name: bad, regex: x, follow: {regex: y, 2026-12-01: 1, 7: 1}}]",
     "rule 'bad': unknown key follow.'2026-12-01'"),
    ("rules: [{name: bad, regex: x, follow: x}]", "rule 'bad': follow must be a mapping"),
    ("rules: [{name: bad, regex: x, follow: {keywords: [a]}}]", "rule 'bad': follow.regex is required"),
    ("rules: [{name: bad, regex: x, follow: {regex: '('}}]", "rule 'bad': invalid follow.regex: missing )"),
    ("rules: [{name: bad, regex: x, follow: {regex: y, within: 0}}]",
     "rule 'bad': follow.within must be a whole number from 1 to 256"),
    ("rules: [{name: bad, regex: x, follow: {regex: y, alone: yes please}}]", "rule 'bad': follow.alone must be true"),
    ("rules: [{name: bad, regex: x, follow: {regex: y, colour: red}}]", "rule 'bad': unknown key follow.'colour'"),
    ("rules: [{name: bad, regex: x, follow: {regex: y, severity: urgent}}]", "rule 'bad': follow.severity must be"),
    ("rules: [{name: bad, regex: '(?P<s>x)', severity_by: [{field: s, bits: {critical: [64]}}]}]",
     "rule 'bad': severity_by.bits must map severities to lists of bit numbers (0-63)"),
    ("rules: [{name: bad, regex: '(?P<s>x)', severity_by: {field: s, bits: {critical: [1]}, info: [x]}}]",
     "with nothing beside field"),
    ("rules: [{name: bad, regex: '(?P<s>x)', severity_by: [{field: t, info: [x]}]}]",
     "rule 'bad': severity_by.field 't' is not a named group"),
    ("rules: [{name: bad, regex: " + "x" * 9000 + "}]", "rule 'bad': regex is longer than 8192 characters"),
    ("rules: [{name: bad, regex: x, crash: panic}]", "rule 'bad': crash must be a mapping with kind"),
    ("rules: [{name: bad, regex: x, crash: {kind: reboot}}]", "rule 'bad': crash must be a mapping with kind (one of "
                                                               "mce, hardware_error, panic, oops)"),
    ("rules: [{name: bad, regex: x, crash: {kind: oops, colour: red}}]", "rule 'bad': crash must be a mapping"),
    ("rules: [{name: bad, regex: '(?P<k>x)', crash: {kind: oops, field: k}}]", "field with pattern together"),
    ("rules: [{name: bad, regex: x, crash: {kind: oops, severity: urgent}}]", "rule 'bad': crash.severity must be"),
    ("rules: [{name: bad, regex: '(?P<k>x)', crash: {kind: oops, field: t, pattern: x}}]",
     "rule 'bad': crash.field 't' is not a named group"),
    ("rules: [{name: bad, regex: '(?P<k>x)', crash: {kind: oops, field: k, pattern: '('}}]",
     "rule 'bad': invalid crash.pattern: missing )"),
])
def test_broken_rule_file_names_file_rule_and_reason(tmp_path: Path, text: str, reason: str) -> None:
    path = _rule_file(tmp_path, text)
    with pytest.raises(RuleError) as error:
        load_rules([str(tmp_path)])
    assert str(error.value).startswith(f"{path}: ")
    assert reason in str(error.value)
    assert "\n" not in str(error.value)


def test_missing_rule_path_is_an_error_only_when_required(tmp_path: Path) -> None:
    assert {r.name for r in load_rules([str(tmp_path / "absent")]).rules} == SHIPPED_RULES
    with pytest.raises(RuleError, match="absent.yaml: cannot read"):
        load_rules([], required=[str(tmp_path / "absent.yaml")])


def test_user_rules_add_override_and_disable_shipped_ones(tmp_path: Path) -> None:
    _rule_file(tmp_path, """
rules:
  - name: nvidia_xid            # reclass Xid 13 as critical, everything else info
    keywords: ["NVRM: Xid"]
    regex: 'NVRM: Xid \\((?:PCI:)?(?P<pci>[0-9a-f:]+)\\): (?P<xid>\\d+)'
    severity: info
    severity_by: {field: xid, critical: [13]}
  - name: soft_lockup
    enabled: false
  - name: ice_link_down
    regex: 'ice (?P<pci>[0-9a-f:.]+): NIC Link is Down'
""")
    rules = load_rules([str(tmp_path)])
    names = [r.name for r in rules.rules]
    assert "soft_lockup" not in names and names.count("nvidia_xid") == 1 and names[-1] == "ice_link_down"
    assert [m.severity for m in rules.match("NVRM: Xid (PCI:0000:3b:00): 13, pid=1")] == ["critical"]
    assert [m.severity for m in rules.match("NVRM: Xid (PCI:0000:3b:00): 79, pid=1")] == ["info"]
    assert rules.match("watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [python3:4242]") == []
    [link] = rules.match("ice 0000:5e:00.0: NIC Link is Down")
    assert (link.rule, link.severity, link.pci) == ("ice_link_down", "warning", "0000:5e:00.0")
    # A rule without keywords: every record is read for its regex.
    assert [(e.line, e.rule) for e in scan(b"x\nice 0000:5e:00.0: NIC Link is Down\n", rules).events] == [
        (2, "ice_link_down")]


def test_rule_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    path = _rule_file(tmp_path, "rules: []\n" + "#" * (1 << 20))
    with pytest.raises(RuleError, match=rf"{path}: larger than 1048576 bytes \(1 MiB\)"):
        load_rules([str(tmp_path)])


def test_severity_by_list_first_deciding_entry_wins_and_bits_read_a_hex_word(tmp_path: Path) -> None:
    _rule_file(tmp_path, """
rules:
  - name: word
    regex: 'kind=(?P<kind>\\w+)(?: status=(?P<status>\\w+))?'
    keywords: ["kind="]
    severity: info
    severity_by:
      - {field: kind, critical: [boom]}
      - {field: status, bits: {critical: [3, 0], warning: [3]}}
""")
    rules = load_rules([str(tmp_path)])
    verdicts = {text: [m.severity for m in rules.match(text) if m.rule == "word"]
                for text in ("kind=boom status=0", "kind=x status=9", "kind=x status=8", "kind=x status=1", "kind=x",
                             "kind=x status=zz")}
    assert verdicts == {"kind=boom status=0": ["critical"], "kind=x status=9": ["critical"],
                        "kind=x status=8": ["warning"], "kind=x status=1": ["info"], "kind=x": ["info"],
                        "kind=x status=zz": ["info"]}  # not a hex word: the entry does not decide


@pytest.mark.parametrize("words", [["AER: ", "AER: x", "EDAC MC", "EDAC", "a", "ab", "b"], ["x.y", "(?", "\\d"]])
def test_literal_alternation_matches_exactly_its_words(words: list[str]) -> None:
    regex = re.compile(literal_alternation(words))
    for word in words:
        assert regex.fullmatch(word)
    assert not regex.fullmatch("zzz") and not regex.fullmatch("xxy")


def test_rule_severities_include_follow_and_bits() -> None:
    mce = next(r for r in RULES.rules if r.name == "mce")
    assert mce.severities() == ["critical", "warning", "info"]
    aer = next(r for r in RULES.rules if r.name == "pcie_aer_corrected")
    assert aer.severities() == ["info"]


def test_shipped_rule_files_have_no_duplicate_names() -> None:
    names = [rule["name"] for f in SHIPPED_DIR.glob("*.yaml") for rule in yaml.safe_load(f.read_text())["rules"]]
    assert len(names) == len(set(names))


def test_the_prefilter_of_long_keywords_is_built_without_deep_recursion() -> None:
    words = ["x" * 5000, "x" * 4000 + "y", "z"]  # far past Python's recursion limit, one character a level
    pattern = re.compile(literal_alternation(words))
    assert [pattern.fullmatch(word) is not None for word in words] == [True, True, True]
    assert pattern.fullmatch("x" * 4999) is None


def test_a_messages_analysis_is_remembered_within_bounds_and_equals_a_fresh_one() -> None:
    rules = load_rules([])
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
    first = rules.analyse(xid)
    assert [(i, m.rule if m else None) for i, m in first[0]] == [
        (i, rules.rules[i].name if rules.rules[i].match(xid) else None) for i in sorted(rules.candidates(xid)[0])]
    assert rules.analyse(xid) is first  # remembered: the same matches, shared (they are never changed)
    assert load_rules([]).analyse(xid) == first
    long = xid + " " * rules_module.MEMO_CHARS
    rules.analyse(long)
    assert long not in rules._memo  # a long message is analysed, not kept
    for n in range(3 * rules_module.MEMO_MESSAGES):
        rules.analyse(f"NVRM: Xid (PCI:0000:3b:00): {n}, pid=1, name=x")
        assert len(rules._memo) <= rules_module.MEMO_MESSAGES


def _only(text: str) -> RuleSet:
    """The rules of one rule file alone, without the shipped ones."""
    return RuleSet([r for r in parse_rule_file(text, "local.yaml") if isinstance(r, Rule)])


def _events(rules: RuleSet, lines: list[str]) -> list[tuple[int | None, str]]:
    return [(m.index, m.rule) for m in feed(rules, lines)]


def test_a_rule_set_without_rules_matches_nothing_on_every_path() -> None:
    """Every rule disabled: records and text logs are read, and nothing matches or fails."""
    empty = RuleSet([])
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    assert empty.match(xid) == [] and not empty.wants_context(xid)
    stream = StreamMatcher(empty)
    assert stream.feed([Record(xid), Record("Linux version 6.1.0")]) == [] and stream.flush() == []
    assert stream.errors == 0
    assert scan(f"[    1.000000] {xid}\n[    2.000000] x\n".encode(), empty).events == []


def test_a_lone_follow_line_with_keywords_of_its_own_is_the_event() -> None:
    """A fault's detail line found by its own keywords: alone, it stands for the lost first line; after the first
    line, it is that fault's and no event of its own."""
    rules = _only("""
rules:
  - name: widget_fault
    keywords: ["widget: fault"]
    regex: 'widget: fault on (?P<unit>\\w+)'
    severity: critical
    follow: {keywords: ["wdg detail"], regex: 'wdg detail unit=(?P<unit>\\w+)', alone: true}
""")
    assert _events(rules, ["wdg detail unit=a"]) == [(1, "widget_fault")]
    assert _events(rules, ["widget: fault on a", "wdg detail unit=a", "wdg detail unit=b"]) == [
        (1, "widget_fault"), (3, "widget_fault")]


def test_a_follow_line_with_keywords_of_its_own_is_taken_by_its_open_fault() -> None:
    """Two rules whose follow lines share a keyword but not a regex: each fault takes its own lines."""
    rules = _only("""
rules:
  - name: gadget_fault
    keywords: ["gadget: fault"]
    regex: 'gadget: fault'
    follow: {keywords: ["gdg detail"], regex: 'gdg detail one'}
  - name: doohickey_fault
    keywords: ["doohickey: fault"]
    regex: 'doohickey: fault'
    follow: {keywords: ["gdg detail"], regex: 'gdg detail two'}
""")
    for header, detail in (("gadget: fault", "gdg detail one"), ("doohickey: fault", "gdg detail two")):
        stream = StreamMatcher(rules)
        assert [m.rule for m in stream.feed([Record(header), Record(detail)])] == [header.split(":")[0] + "_fault"]
        assert [record.message for _, record in stream.take_absorbed()] == [detail]


def test_a_follow_regex_without_keywords_is_tried_on_every_record() -> None:
    rules = _only("""
rules:
  - name: gizmo_down
    keywords: ["gizmo: down"]
    regex: 'gizmo: down'
    follow: {regex: 'gz unit (?P<unit>\\d+) lost', alone: true}
""")
    assert _events(rules, ["x", "gz unit 3 lost"]) == [(2, "gizmo_down")]


def test_a_message_over_two_records_is_found_when_fed_and_in_a_text_log() -> None:
    rules = _only("""
rules:
  - name: split_banner
    keywords: ["second half"]
    regex: 'first half\\nsecond half'
    lines: 2
""")
    assert _events(rules, ["noise", "first half", "second half"]) == [(2, "split_banner")]
    log = b"[    1.000000] noise\n[    1.000001] first half\n[    1.000002] second half\n"
    assert [(e.rule, e.line) for e in scan(log, rules).events] == [("split_banner", 2)]


def test_a_boot_between_a_header_and_its_detail_makes_the_detail_news() -> None:
    header = "pcieport 0000:00:01.0: AER: Uncorrectable (Non-Fatal) error message received from 0000:3b:00.0"
    detail = ("nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, "
              "(Requester ID)")
    for restart in ("Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org)",
                    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.154.05"):
        assert _events(RULES, [header, detail]) == [(1, "pcie_aer_uncorrected")]
        assert _events(load_rules([]), [header, restart, detail]) == [(1, "pcie_aer_uncorrected"),
                                                                      (3, "pcie_aer_uncorrected")]


SLOW = """
  - name: blk_slow
    keywords: ["blkq:"]
    regex: 'blkq: slow (\\d+) ms'
"""
PLAIN = "rules:" + SLOW + """
  - name: blk_gone
    keywords: ["blkq:"]
    regex: 'blkq: (?P<what>gone)'
    severity: critical
"""
CONDITIONAL = "rules:" + SLOW + """
  - name: blk_either
    keywords: ["blkq:"]
    regex: 'blkq: (x)?(?(1)y|z)!'
"""
NAMED = "rules:" + SLOW + """
  - name: blk_named
    keywords: ["blkq:"]
    regex: 'blkq: (?P<u>u)?(?(u)v|w)\\?'
"""
LITERAL = "rules:" + SLOW + """
  - name: blk_literal
    keywords: ["blkq:"]
    regex: 'blkq: \\(?P<n>'
"""
BACK_REFERENCE = "rules:" + SLOW + """
  - name: blk_twice
    keywords: ["blkq:"]
    regex: 'blkq: (\\w+) twice \\1'
"""


@pytest.mark.parametrize(("text", "line", "rule"), [
    (PLAIN, "blkq: slow 12 ms", "blk_slow"), (PLAIN, "blkq: gone", "blk_gone"),
    (CONDITIONAL, "blkq: xy!", "blk_either"), (CONDITIONAL, "blkq: z!", "blk_either"),
    (NAMED, "blkq: uv?", "blk_named"), (NAMED, "blkq: w?", "blk_named"),
    (LITERAL, "blkq: (P<n>", "blk_literal"), (LITERAL, "blkq: P<n>", "blk_literal"),
    (BACK_REFERENCE, "blkq: ab twice ab", "blk_twice")])
def test_rules_that_share_a_keyword_each_match_their_own_lines(text: str, line: str, rule: str) -> None:
    """Their regexes are searched together where that is the same as one by one: not where one refers to a group
    by number (a back reference, a conditional), which would then count the groups of the others, nor where
    dropping group names would change it."""
    rules = _only(text)
    assert [m.rule for m in rules.match(line)] == [rule]
    assert _events(rules, ["noise", line]) == [(2, rule)]
    assert rules.match("blkq: ab twice ba") == [] and rules.match("blkq: xz!") == []


def test_a_keyword_found_inside_a_longer_one_still_leads_to_its_rules() -> None:
    """"mydrv: fatal" is found where "mydrv" also is: the rules of both are tried."""
    rules = _only("""
rules:
  - name: mydrv_error
    keywords: ["mydrv: fatal"]
    regex: 'mydrv: fatal error (?P<code>\\d+)'
  - name: mydrv_warn
    keywords: ["mydrv"]
    regex: 'mydrv: fatal warn'
""")
    assert _events(rules, ["mydrv: fatal warn"]) == [(1, "mydrv_warn")]
    assert _events(rules, ["mydrv: fatal error 5"]) == [(1, "mydrv_error")]
    over_two = _only("""
rules:
  - name: mydrv_error
    keywords: ["mydrv: fatal"]
    regex: 'mydrv: fatal error (?P<code>\\d+)'
  - name: mydrv_split
    keywords: ["mydrv"]
    regex: 'mydrv: begin\\nmydrv: fatal warn'
    lines: 2
""")
    stream = StreamMatcher(over_two)
    assert [m.rule for m in stream.feed([Record("mydrv: begin"), Record("mydrv: fatal warn")])] == ["mydrv_split"]
    assert stream.errors == 0


def test_a_rule_without_keywords_is_tried_beside_a_keyword_of_another() -> None:
    rules = _only("""
rules:
  - name: blk_gone
    keywords: ["blkq:"]
    regex: 'blkq: gone'
  - name: quux_failed
    regex: 'quux failed'
""")
    assert [m.rule for m in rules.match("blkq: quux failed")] == ["quux_failed"]
    assert _events(rules, ["blkq: quux failed"]) == [(1, "quux_failed")]


@pytest.mark.parametrize("regex", ["^mydrv: fatal", "mydrv: fatal$", "\\Amydrv: fatal", "mydrv: fatal\\Z",
                                   "(?<!.)mydrv: fatal", "(?<=^)mydrv: fatal"])
def test_a_users_rule_anchored_to_the_message_matches_in_every_log_format(regex: str) -> None:
    """Anchors and lookbehinds see the message's own ends, whatever the log's format puts around it."""
    rules = _only(f"rules: [{{name: mydrv, keywords: ['mydrv: fatal'], regex: {json.dumps(regex)}}}]")
    lines = ["[  12.345678] mydrv: fatal", "Nov 30 04:37:39 gpu-node-a kernel: [  12.345678] mydrv: fatal",
             "Nov 30 04:37:39 gpu-node-a kernel: mydrv: fatal", "<3>[  12.345678] mydrv: fatal"]
    log = "\n".join(["[   1.000000] x mydrv: fatal y", *lines]).encode() + b"\n"
    assert [(e.rule, e.line) for e in scan(log, rules).events] == [("mydrv", n) for n in range(2, 6)]
    assert _events(rules, ["x mydrv: fatal y", "mydrv: fatal"]) == [(2, "mydrv")]


def test_anchored_and_unanchored_rules_sharing_a_keyword_each_match_their_own_lines() -> None:
    """Rules with anchors or a lookbehind and a plain one behind one keyword, in every log format: each matches
    its own messages, and a message an anchor rules out matches nothing (the regexes are searched together)."""
    rules = _only("""
rules:
  - {name: start, keywords: ["mydrv:"], regex: '^mydrv: fatal (?P<code>\\d+)'}
  - {name: end, keywords: ["mydrv:"], regex: 'mydrv: halt$'}
  - {name: behind, keywords: ["mydrv:"], regex: '(?<!not )mydrv: stall'}
  - {name: plain, keywords: ["mydrv:"], regex: 'mydrv: \\w+ later'}
""")
    messages = {"mydrv: fatal 3": "start", "x mydrv: fatal 3": None, "mydrv: halt": "end", "mydrv: halt now": None,
                "not mydrv: stall": None, "mydrv: stall": "behind", "mydrv: stop later": "plain"}
    for message, rule in messages.items():
        assert [m.rule for m in rules.match(message)] == ([rule] if rule else []), message
    wanted = [(n, rule) for n, rule in enumerate(messages.values(), 1) if rule]
    assert _events(rules, list(messages)) == wanted
    for head in ("[  12.345678] ", "Nov 30 04:37:39 gpu-node-a kernel: [  12.345678] ",
                 "Nov 30 04:37:39 gpu-node-a kernel: ", "<3>[  12.345678] "):
        log = "".join(f"{head}{message}\n" for message in messages).encode()
        assert [(e.line, e.rule) for e in scan(log, rules).events] == wanted, head
