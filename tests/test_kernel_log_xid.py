"""NVIDIA Xids 140-172 classed as NVIDIA's catalogue classes them, the recovery action of an Xid 154 line, and the MIG
instance an Xid line names: pure parsing on literal lines, then through the kernel log collector."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tpuwatch.devices import DeviceReading
from tpuwatch.hw.recovery import WORDS, action_name, action_words, is_disruptive, xid154_action
from tpuwatch.kernel_log.attribution import device_lookup
from tpuwatch.kernel_log.collector import KernelLogCollector, event_problems
from tpuwatch.kernel_log.filesource import FileSource
from tpuwatch.kernel_log.records import parse_line
from tpuwatch.kernel_log.rulefile import load_rules
from tpuwatch.samples import sample

from kernellog import scan

RULES = load_rules([])

# (Xid, the catalogue's immediate resolution, the severity tpuwatch gives it) - the rule file's table.
CATALOGUE = [
    (140, "RESET_GPU", "critical"), (141, "IGNORE", "info"), (142, "CONTACT_SUPPORT", "warning"),
    (143, "RESET_GPU", "critical"), (151, "RESTART_VM", "critical"), (152, "IGNORE", "info"),
    (153, "IGNORE", "info"), (155, "RESET_GPU", "critical"), (156, "RESET_GPU", "critical"),
    (157, "IGNORE", "info"), (158, "RESET_GPU", "critical"), (159, "CHECK_UVM", "warning"),
    (160, "IGNORE", "info"), (161, "IGNORE", "info"),
    # Not classed upstream yet: warning, or what the code names.
    (162, "", "info"), (163, "", "warning"), (164, "", "warning"), (165, "", "warning"), (166, "", "warning"),
    (167, "", "critical"), (168, "", "warning"), (169, "", "critical"), (170, "", "warning"),
    (171, "", "critical"), (172, "", "critical"), (173, "", "warning"),
]


def _event(line: str, lookup: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    [event] = scan((line + "\n").encode(), RULES, (lookup or {}).get).events
    return event


@pytest.mark.parametrize("xid,bucket,severity", CATALOGUE, ids=[str(c[0]) for c in CATALOGUE])
def test_each_xid_from_140_is_classed_by_its_resolution(xid: int, bucket: str, severity: str) -> None:
    # Composed: the common Xid prefix (see tests/testdata/kernel_log) with each code; the text after it varies.
    event = _event(f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1234, name=python3, Ch 00000010")
    assert (event.rule, event.xid, event.severity) == ("nvidia_xid", xid, severity), bucket


@pytest.mark.parametrize("line,severity", [
    # Composed in the shape of gpud's nvlink_logs_test.go lines (the driver prints the decode sheet's Fatal /
    # Nonfatal); the last line is composed without a severity word.
    ("NVRM: Xid (PCI:0000:04:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 0x00000000)",
     "critical"),
    ("NVRM: Xid (PCI:0008:01:00): 145, pid=11436, name=cache_mgr_main, RLW_SRC_TRACK Nonfatal XC1 i0 Link 03 "
     "(0x040868e2 0x00000008)", "info"),
    ("NVRM: Xid (PCI:0018:01:00): 144, SAW_MVB Fatal XC0 i0 Link -1 (0x00000002 0x00000000)", "critical"),
    ("NVRM: Xid (PCI:0018:01:00): 150, MSE_WATCHDOG Non-fatal XC0 i0 Link -1 (0x00000004)", "info"),
    ("NVRM: Xid (PCI:0018:01:00): 147, TREX error without a severity word", "warning"),
])
def test_nvlink5_xids_follow_the_decoded_severity(line: str, severity: str) -> None:
    assert _event(line).severity == severity


# The first two lines are gpud's (components/accelerator/nvidia/xid kmsg_test.go shape, as it quotes drivers);
# the rest are composed: other transitions, an action newer than tpuwatch, and older drivers' wording.
XID154 = ("NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot "
          "Required)")


@pytest.mark.parametrize("line,action", [
    (XID154, 2),
    ("NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", 4),
    ("NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)",
     0),
    ("NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x0 (None) to 0x9 (Something New)", 9),
    ("NVRM: Xid (PCI:0000:02:00): 154, Node Reboot Required", 2),
    ("NVRM: Xid (PCI:0000:02:00): 154, GPU Reset Required.", 1),
    ("NVRM: Xid (PCI:0000:02:00): 154, Recover IMEX Domain", 5),
    ("NVRM: Xid (PCI:0000:02:00): 154, something else entirely", None),
])
def test_the_recovery_action_of_an_xid_154_line(line: str, action: int | None) -> None:
    assert xid154_action(line) == action


def test_recovery_actions_read_in_words() -> None:
    assert [action_name(code) for code in range(9)] == ["none", "gpu_reset", "node_reboot", "drain_p2p",
                                                       "drain_and_reset", "recover_imex_domain", "bus_reset",
                                                       "system_reboot", "8"]
    assert (action_words(2), action_words(5), action_words(11)) == ("node reboot", "recover IMEX domain", "action 11")
    assert [code for code in range(9) if is_disruptive(code)] == [1, 2, 4, 6, 7]


def test_the_xid_154_event_carries_the_action_and_is_critical() -> None:
    event = _event(XID154, {"0009:01:00.0": "3"})
    assert (event.xid, event.severity, event.pci, event.device) == (154, "critical", "0009:01:00.0", "3")
    assert event.fields["recovery_action"] == "node_reboot"
    assert event.to_json()["fields"]["recovery_action"] == "node_reboot"
    cleared = _event("NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x2 (Node Reboot "
                     "Required) to 0x0 (None)")
    assert (cleared.severity, cleared.fields["recovery_action"]) == ("info", "none")
    assert "recovery_action" not in _event("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.").fields


@pytest.mark.parametrize("words", sorted(WORDS))
@pytest.mark.parametrize("with_code", [True, False], ids=["code", "words-only"])
def test_the_rule_file_classes_every_action_the_driver_words_as_the_code_does(words: str, with_code: bool) -> None:
    """The action's words live in three places (recovery.WORDS, the rule's regex, its severity_by): they agree."""
    code = WORDS[words]
    line = (f"NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x0 (None) to 0x{code:x} ({words})"
            if with_code else f"NVRM: Xid (PCI:0000:02:00): 154, {words}")
    event = _event(line)
    expected = "critical" if is_disruptive(code) else "info" if code == 0 else "warning"
    assert (event.severity, event.fields["recovery_action"]) == (expected, action_name(code))


def test_an_xid_naming_a_mig_instance_names_it_in_the_event() -> None:
    event = _event("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=4242, name=python3, Ch 00000008")
    assert (event.xid, event.pci, event.fields.get("gpu_instance")) == (94, "0000:01:00.0", "5")
    assert "gpu_instance" not in _event("NVRM: Xid (PCI:0000:01:00): 94, pid=4242, Ch 00000008").fields


READINGS = [DeviceReading(device="0", chip="h100", pci="0000:01:00.0"),
            DeviceReading(device="1", chip="gb200", pci="0009:01:00.0")]


def test_the_collector_counts_recovery_actions_and_mig_instances(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    collector = KernelLogCollector(FileSource(str(log), tmp_path / "file.json"), load_rules([]),
                                   device_lookup(lambda: READINGS), 60.0)
    collector.collect()
    with open(log, "a") as handle:
        handle.write(f"{XID154}\nNVRM: Xid (PCI:0000:01:00 GPU-I:05): 95, pid=4242, name=python3, Uncontained\n")
    values = {(s.name, s.labels): s.value for s in collector.collect()}
    assert values[("tpuwatch_kernel_recovery_actions_total", (("action", "node_reboot"), ("device", "1")))] == 1
    assert values[("tpuwatch_kernel_events_total", (("device", "0"), ("gpu_instance", "5"), ("rule", "nvidia_xid"),
                                                    ("severity", "critical")))] == 1
    problems = event_problems(collector.recent_events())
    assert any("GPU-I:05" in p and "device 0" in p for p in problems), problems
    assert any("Node Reboot Required" in p and "pci 0009:01:00.0" in p for p in problems), problems


def test_an_xid_154_line_raises_the_recovery_alert_with_the_action_and_address(tmp_path: Path,
                                                                                make_alerting: Any) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    collector = KernelLogCollector(FileSource(str(log), tmp_path / "file.json"), load_rules([]),
                                   device_lookup(lambda: READINGS), 60.0)
    collector.collect()
    log.write_text(XID154 + "\n")
    chips = [sample("tpuwatch_device_info", 1, device=r.device, chip=r.chip, pci=r.pci or "", backend="nvidia")
             for r in READINGS]
    alerting = make_alerting([])
    alerting.evaluate(chips + collector.collect(), time.time())
    [alert] = [a for a in alerting.active_alerts() if a["labels"]["alertname"] == "AcceleratorRecoveryActionRequired"]
    assert (alert["state"], alert["labels"]["severity"], alert["labels"]["action"]) == ("firing", "critical",
                                                                                       "node_reboot")
    assert alert["annotations"]["summary"] == "GPU recovery action node_reboot on chip 1 (0009:01:00.0)"


def test_xid_lines_in_every_kernel_log_format_keep_their_instance() -> None:
    for prefix in ("", "[ 3605.442181] ", "4,812,3605442181,-;"):
        record = parse_line(prefix + "NVRM: Xid (PCI:0000:01:00 GPU-I:12): 13, pid=1, Graphics Exception")
        [match] = RULES.match(record.message)
        assert match.fields["gpu_instance"] == "12"
