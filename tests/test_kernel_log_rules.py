"""Kernel log rules and record parsing: every shipped rule on real-format lines, near misses, rule file errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuwatch.kernel_log.records import (
    Record,
    normalise_pci,
    parse_kmsg,
    parse_line,
    pci_of_kernel_device,
)
from tpuwatch.kernel_log.rules import SHIPPED_DIR, RuleError, load_rules

DATA = Path(__file__).parent / "testdata" / "kernel_log"
CASES: dict[str, Any] = yaml.safe_load((DATA / "cases.yaml").read_text())
DESIGN_RULES = {"nvidia_xid", "gpu_fell_off_bus", "pcie_aer_corrected", "pcie_aer_uncorrected", "edac_corrected",
                "edac_uncorrected", "mce", "cper_fatal", "tpu_driver_error", "oom_kill", "hung_task", "soft_lockup"}
RULES = load_rules([])

MATCHES = [(rule, case) for rule, cases in CASES.items() for case in cases["match"]]
NEAR_MISSES = [(rule, line) for rule, cases in CASES.items() for line in cases["near_miss"]]


def test_shipped_rules_are_the_design_categories_each_with_fixtures() -> None:
    assert {r.name for r in RULES.rules} == DESIGN_RULES
    assert set(CASES) == DESIGN_RULES
    assert all(CASES[name]["match"] and CASES[name]["near_miss"] for name in DESIGN_RULES)


@pytest.mark.parametrize(("rule", "case"), MATCHES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(MATCHES)])
@pytest.mark.parametrize("prefix", ["", "[ 3605.442181] ", "[Mon Nov 30 04:37:39 2026] ",
                                    "Nov 30 04:37:39 gpu-host-7 kernel: [ 3605.442181] ", "4,812,3605442181,-;"])
def test_every_shipped_rule_matches_its_lines_in_every_format(rule: str, case: dict[str, Any], prefix: str) -> None:
    record = parse_line(prefix + case["line"])
    assert record.message == case["line"]
    [match] = RULES.match(record.message)
    assert (match.rule, match.severity, match.pci, match.xid) == (rule, case["severity"], case.get("pci"),
                                                                  case.get("xid"))


@pytest.mark.parametrize(("rule", "line"), NEAR_MISSES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(NEAR_MISSES)])
def test_near_misses_match_no_rule(rule: str, line: str) -> None:
    assert RULES.match(line) == []


def test_every_rule_keyword_prefilter_admits_all_its_fixture_lines() -> None:
    for rule, case in MATCHES:
        text = "noise line\n" + case["line"] + "\nmore noise\n"
        hits = RULES.hits(text)
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
])
def test_parse_line_formats(line: str, message: str, device: str | None) -> None:
    assert parse_line(line) == Record(message, device)


def _rule_file(tmp_path: Path, text: str, name: str = "local.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "reason"), [
    ("rules: [{name: bad, regex: 'Xid (', severity: warning}]", "rule 'bad': invalid regex: missing )"),
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
])
def test_broken_rule_file_names_file_rule_and_reason(tmp_path: Path, text: str, reason: str) -> None:
    path = _rule_file(tmp_path, text)
    with pytest.raises(RuleError) as error:
        load_rules([str(tmp_path)])
    assert str(error.value).startswith(f"{path}: ")
    assert reason in str(error.value)
    assert "\n" not in str(error.value)


def test_missing_rule_path_is_an_error_only_when_required(tmp_path: Path) -> None:
    assert {r.name for r in load_rules([str(tmp_path / "absent")]).rules} == DESIGN_RULES
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
    assert rules.hits("x\nice 0000:5e:00.0: NIC Link is Down\n") == [2]  # an unkeyed rule scans by its regex


def test_shipped_rule_files_have_no_duplicate_names() -> None:
    names = [rule["name"] for f in SHIPPED_DIR.glob("*.yaml") for rule in yaml.safe_load(f.read_text())["rules"]]
    assert len(names) == len(set(names))
