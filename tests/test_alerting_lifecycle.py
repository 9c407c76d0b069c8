"""What the daemon inherits and what it says: faults that predate tpuwatch page once (issue #16 item 9), counter
memory across restarts and reboots, alerts of removed rules and vanished chips resolved at start and on reload
(item 1), fire and resolve lines an on-call can read (item 6), and the daemon agreeing with `check`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuwatch import config as config_module
from tpuwatch.alerting import Alerting
from tpuwatch.samples import Sample, sample

from conftest import SIM_FAST, run_cli, wait_until

T0 = 1_700_000_000.0
HOUR = 3600.0


@pytest.fixture
def make_alerting(tmp_path: Path) -> Iterator[Callable[..., Alerting]]:
    """Alerting on one state_dir, as a daemon restarted on it; ``boot`` is the id of the boot it runs in."""
    made: list[Alerting] = []
    procfs = tmp_path / "proc"
    (procfs / "sys" / "kernel" / "random").mkdir(parents=True)

    def make(boot: str = "boot-1", rules: str | None = None, **alerting: Any) -> Alerting:
        (procfs / "sys" / "kernel" / "random" / "boot_id").write_text(boot + "\n")
        rule_files = []
        if rules is not None:
            (tmp_path / "rules.yaml").write_text(rules)
            rule_files = [str(tmp_path / "rules.yaml")]
        config = config_module.parse(yaml.safe_dump({
            "state_dir": str(tmp_path / "state"), "paths": {"procfs": str(procfs)},
            "alerting": {"group_wait": "0s", "rule_files": rule_files, **alerting}}))
        made.append(Alerting(config, config.state_dir))
        return made[-1]

    yield make
    for a in made:
        a.stop()


def chips(ecc: dict[str, float] | None = None, corrected: float = 0, count: int = 4,
          answered: bool = True) -> list[Sample]:
    """What the devices collector reports: ``count`` chips with uncorrectable ECC counts ``ecc``."""
    out = [sample("tpuwatch_collector_success", 1 if answered else 0, collector="devices")]
    if not answered:
        return out
    for d in map(str, range(count)):
        out += [sample("tpuwatch_device_info", 1, device=d, chip="h100", pci=f"0000:1{d}:00.0", backend="nvidia"),
                sample("tpuwatch_device_up", 1, device=d),
                sample("tpuwatch_device_ecc_errors_total", (ecc or {}).get(d, 0), device=d, kind="uncorrected"),
                sample("tpuwatch_device_ecc_errors_total", corrected, device=d, kind="corrected")]
    return out


def firing(alerting: Alerting) -> list[tuple[str, str]]:
    return sorted((a["labels"]["alertname"], a["labels"].get("device", "")) for a in alerting.active_alerts()
                  if a["state"] == "firing")


ECC = ("AcceleratorEccUncorrectable", "2")


def test_a_fault_that_predates_tpuwatch_pages_once_and_a_restart_neither_repeats_nor_misses(
        make_alerting: Any) -> None:
    first = make_alerting()
    first.evaluate(chips({"2": 3}, corrected=500), T0)  # install: chip 2 already counts 3, 500 corrected
    assert firing(first) == [ECC]  # uncorrectable errors since the driver loaded are news; corrected ones are not
    first.stop()
    second = make_alerting()  # tpuwatch restarted alone
    second.evaluate(chips({"2": 3}, corrected=500), T0 + 60)
    assert firing(second) == [ECC]  # still within the hour: neither resolved nor announced again
    second.evaluate(chips({"2": 3}, corrected=500), T0 + HOUR + 10)
    assert firing(second) == []  # an hour on, old news
    second.stop()
    third = make_alerting()
    third.evaluate(chips({"2": 3}, corrected=500), T0 + HOUR + 70)
    assert firing(third) == []  # the count it already alerted on is not news after a restart
    third.stop()
    fourth = make_alerting()  # one more error while tpuwatch was down: counted
    fourth.evaluate(chips({"2": 4}, corrected=550), T0 + HOUR + 130)
    assert firing(fourth) == [ECC] and fourth.active_alerts()[0]["value"] == 1
    fourth.stop()
    rebooted = make_alerting(boot="boot-2")  # the host rebooted: the driver counts afresh
    rebooted.evaluate(chips({"1": 1}, corrected=50), T0 + 3 * HOUR)
    assert firing(rebooted) == [("AcceleratorEccUncorrectable", "1")]


def test_tpuwatch_counters_carry_their_window_across_a_restart(make_alerting: Any) -> None:
    def aer(count: float) -> Sample:
        return sample("tpuwatch_kernel_events_total", count, rule="pcie_aer_corrected", severity="warning",
                      device="1")

    first = make_alerting()
    first.evaluate([aer(0)], T0)
    first.evaluate([aer(6)], T0 + 60)
    first.stop()
    second = make_alerting()
    second.evaluate([aer(5)], T0 + 120)  # the kernel collector's count starts again from zero, then 5 more
    assert firing(second) == [("KernelCorrectedErrorsRising", "1")]  # 11 in the hour, >= 10
    assert second.active_alerts()[0]["value"] == 11


def test_alerts_of_rules_no_longer_loaded_resolve_at_start_and_on_reload(
        make_alerting: Any, caplog: pytest.LogCaptureFixture) -> None:
    rules = ("rules: [{alert: Mine, metric: tpuwatch_device_up, op: '==', threshold: 1, severity: info},\n"
             "        {alert: Other, metric: tpuwatch_device_up, op: '==', threshold: 1, severity: info}]\n")
    first = make_alerting(rules=rules)
    first.evaluate(chips(), T0)
    assert {name for name, _ in firing(first)} == {"Mine", "Other"}
    first.stop()
    with caplog.at_level(logging.WARNING, logger="tpuwatch.alerting"):
        second = make_alerting(rules=rules.replace("Other", "Renamed"))
    assert {name for name, _ in firing(second)} == {"Mine"}
    assert caplog.text.count("resolved: its rule is no longer loaded") == 4
    assert "Other (info) on device 3, pci 0000:13:00.0 resolved: its rule is no longer loaded" in caplog.text
    second.reconfigure(config_module.parse(yaml.safe_dump({"state_dir": second.config.state_dir,
                                                           "alerting": {"rule_files": []}})))
    assert firing(second) == []


def test_alerts_about_chips_the_backend_no_longer_reports_resolve_at_the_first_cycle(make_alerting: Any) -> None:
    first = make_alerting()
    first.evaluate(chips(), T0)
    first.evaluate(chips({"3": 1, "1": 1}), T0 + 10)
    assert firing(first) == [("AcceleratorEccUncorrectable", "1"), ("AcceleratorEccUncorrectable", "3")]
    first.stop()
    second = make_alerting()
    second.evaluate(chips(answered=False), T0 + 20)  # the backend timed out: nothing is known, everything held
    assert firing(second) == [("AcceleratorEccUncorrectable", "1"), ("AcceleratorEccUncorrectable", "3")]
    second.evaluate(chips({"1": 1}, count=3), T0 + 30)  # it answers: chip 3 is gone
    assert firing(second) == [("AcceleratorEccUncorrectable", "1")]


def test_fire_and_resolve_lines_name_alert_severity_chip_pci_and_summary(
        make_alerting: Any, caplog: pytest.LogCaptureFixture) -> None:
    alerting = make_alerting()
    with caplog.at_level(logging.INFO, logger="tpuwatch.alerting"):
        alerting.evaluate([*chips(), sample("tpuwatch_memory_leak_suspected", 1, memory="host", device="", pid="")],
                          T0)
        lost = [s for s in chips({"2": 1}) if s != sample("tpuwatch_device_up", 1, device="0")]
        alerting.evaluate([*lost, sample("tpuwatch_device_up", 0, device="0")], T0 + 10)
        alerting.evaluate(chips(), T0 + 400)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "tpuwatch.alerting.service"]
    host = alerting.host
    assert lines == [
        ("WARNING", f"AcceleratorMemoryLeak (warning) on host {host} firing: "
                    "Memory leak suspected: host memory keeps growing"),
        ("ERROR", "AcceleratorLost (critical) on device 0, pci 0000:10:00.0 firing: "
                  "Accelerator chip 0 (0000:10:00.0) is lost or dead"),
        ("ERROR", "AcceleratorEccUncorrectable (critical) on device 2, pci 0000:12:00.0 firing: "
                  "Uncorrectable ECC error(s) on chip 2 (0000:12:00.0)"),
        ("WARNING", f"AcceleratorMemoryLeak (warning) on host {host} resolved after 6m 40s: "
                    "Memory leak suspected: host memory keeps growing"),
        ("ERROR", "AcceleratorLost (critical) on device 0, pci 0000:10:00.0 resolved after 6m 30s: "
                  "Accelerator chip 0 (0000:10:00.0) is lost or dead"),
    ]


def test_the_ecc_drill_with_a_fault_from_the_start_pages_and_check_agrees(
        start_daemon: Any, receivers: Any, tmp_path: Path) -> None:
    hook = receivers()
    sim = {"count": 4, "fault_device": 1, "fault_after": "0s"}
    daemon = start_daemon({**SIM_FAST, "devices": {"sim": sim},
                           "alerting": {"group_wait": "0s", "group_interval": "1s"},
                           "notify": [{"name": "oncall", "type": "webhook", "url": hook.url()}]},
                          args=["--simulate", "ecc-errors"])
    daemon.wait_ready()
    alert = wait_until(lambda: next((a for b in hook.json() for a in b["alerts"]
                                     if a["labels"]["alertname"] == "AcceleratorEccUncorrectable"), None),
                       20, "the ECC alert of a fault present from the first cycle")
    assert (alert["labels"]["device"], alert["labels"]["pci"]) == ("1", "0000:11:00.0")
    assert "AcceleratorEccUncorrectable (critical) on device 1, pci 0000:11:00.0 firing" in daemon.log()
    faulty = tmp_path / "faulty.yaml"
    faulty.write_text(yaml.safe_dump({"kernel_log": {"source": "none"},
                                      "devices": {"backend": "sim", "sim": {**sim, "scenario": "ecc-errors"}}}))
    check = run_cli("check", "--config", str(faulty))
    assert check.returncode == 1
    assert "device 1 (v5e, pci 0000:11:00.0): 1 uncorrectable ECC error(s) since the driver loaded" in check.stdout
