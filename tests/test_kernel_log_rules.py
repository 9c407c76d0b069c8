"""Kernel log rules and record parsing: every shipped rule on real-format lines, near misses, rule file errors."""

from __future__ import annotations

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
from tpuwatch.kernel_log.records import (
    Record,
    normalise_pci,
    parse_kmsg,
    parse_line,
    pci_of_kernel_device,
)
from tpuwatch.kernel_log.rulefile import SHIPPED_DIR, RuleError, load_rules

from kernellog import scan

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
