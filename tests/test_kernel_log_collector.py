"""The kernel log collector: counters, device attribution, storms, bounded queues, real /dev/kmsg end to end."""

from __future__ import annotations

import os
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

from tpuwatch.catalog import CATALOG
from tpuwatch.collectors.guard import GuardedCollector
from tpuwatch.config import parse
from tpuwatch.devices import DeviceReading
from tpuwatch.kernel_log.attribution import device_lookup
from tpuwatch.kernel_log.collector import (
    BATCH_RECORDS,
    BUDGET_SHARE,
    MAX_RECENT_EVENTS,
    KernelLogCollector,
    build_collector,
    event_problems,
)
from tpuwatch.kernel_log.events import KernelEvent, StormFilter
from tpuwatch.kernel_log.filesource import FileSource
from tpuwatch.kernel_log.position import Position
from tpuwatch.kernel_log.records import Record
from tpuwatch.kernel_log.rule import Match
from tpuwatch.kernel_log.rulefile import load_rules
from tpuwatch.kernel_log.rules import RuleSet
from tpuwatch.kernel_log.sieve import BacklogSieve
from tpuwatch.kernel_log.sources import KmsgSource, Source, read_boot_id

from conftest import saved_state, write_selftest_rule

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
READINGS = [DeviceReading(device="0", chip="h100", pci="0000:18:00.0"),
            DeviceReading(device="1", chip="h100", pci="0000:3B:00.0")]


class Clock:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _collector(tmp_path: Path, clock: Clock, window: float = 60.0, max_records: int = 20_000
               ) -> tuple[KernelLogCollector, Path]:
    log = tmp_path / "kern.log"
    log.write_text("")
    source = FileSource(str(log), tmp_path / "state" / "file.json")
    return KernelLogCollector(source, load_rules([]), device_lookup(lambda: READINGS), window,
                              max_records=max_records, clock=clock), log


def _append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)


def _values(samples: list) -> dict:  # type: ignore[type-arg]
    return {(s.name, s.labels): s.value for s in samples}


def test_counters_with_device_attribution_start_at_zero(tmp_path: Path) -> None:
    collector, log = _collector(tmp_path, Clock())
    first = _values(collector.collect())
    assert first[("tpuwatch_kernel_events_total", (("device", ""), ("rule", "nvidia_xid"),
                                                   ("severity", "critical")))] == 0
    _append(log, XID79 + "hello\npcieport 0000:00:01.0: AER: Correctable error message received from "
            "0000:18:00.0\nEDAC MC0: 1 UE memory read error on DIMM_A1\n")
    values = _values(collector.collect())
    events = {k[1]: v for k, v in values.items() if k[0] == "tpuwatch_kernel_events_total" and v}
    assert events == {(("device", "1"), ("rule", "nvidia_xid"), ("severity", "critical")): 1,
                      (("device", "0"), ("rule", "pcie_aer_corrected"), ("severity", "info")): 1,
                      (("device", ""), ("rule", "edac_uncorrected"), ("severity", "critical")): 1}
    assert values[("tpuwatch_kernel_log_records_total", (("source", "file"),))] == 4
    assert values[("tpuwatch_kernel_log_lost_total", (("source", "file"),))] == 0
    assert [e.rule for e in collector.recent_events()] == ["nvidia_xid", "pcie_aer_corrected", "edac_uncorrected"]
    assert collector.recent_events()[0].device == "1" and collector.recent_events()[0].xid == 79


def test_samples_are_in_the_catalogue_and_pass_the_guard(tmp_path: Path) -> None:
    collector, log = _collector(tmp_path, Clock())
    _append(log, XID79)
    guarded = GuardedCollector(collector)
    guarded.start()
    samples = guarded.finish(time.monotonic() + 5)
    assert samples and guarded.status.success
    for s in samples:
        spec = CATALOG[s.name]
        assert spec.kind == "counter" and tuple(sorted(spec.labels)) == tuple(k for k, _ in s.labels)


def test_storm_becomes_one_event_then_a_summary_with_the_count(tmp_path: Path) -> None:
    clock = Clock()
    collector, log = _collector(tmp_path, clock, window=60.0)
    _append(log, XID79 * 500)
    collector.collect()
    assert [(e.rule, e.count) for e in collector.recent_events()] == [("nvidia_xid", 1)]
    clock.now += 30
    _append(log, XID79 * 500)
    collector.collect()
    assert [(e.rule, e.count) for e in collector.recent_events()] == [("nvidia_xid", 1)]
    clock.now += 31
    values = _values(collector.collect())
    first, summary = collector.recent_events()
    assert first.count == 1
    assert summary.count == 999 and summary.message.endswith("(repeated 999 times)")
    assert values[("tpuwatch_kernel_events_total", (("device", "1"), ("rule", "nvidia_xid"),
                                                    ("severity", "critical")))] == 1000  # counters stay exact


def test_a_worse_event_is_never_folded_into_a_storm_of_milder_ones() -> None:
    storms = StormFilter(window=60.0, clock=Clock())
    pci = "0000:18:00.0"
    passed = [e for _ in range(3) for e in storms.offer(KernelEvent("nvidia_xid", "warning", "Xid 13", pci=pci))]
    passed += storms.offer(KernelEvent("nvidia_xid", "critical", "Xid 109", pci=pci))  # same GPU, same rule
    passed += storms.offer(KernelEvent("nvidia_xid", "warning", "Xid 13", pci=pci))
    assert [(e.severity, e.message) for e in passed] == [("warning", "Xid 13"), ("critical", "Xid 109")]
    assert [(e.severity, e.count) for e in storms.flush(force=True)] == [("warning", 3)]  # the summary keeps its own


def test_storm_filter_keys_and_memory_are_bounded() -> None:
    clock = Clock()
    storms = StormFilter(window=60.0, max_keys=8, clock=clock)
    passed = []
    for i in range(100):
        passed += storms.offer(KernelEvent("nvidia_xid", "critical", "m", pci=f"0000:{i:02x}:00.0"))
    assert len(passed) == 100 and len(storms._open) == 8
    assert storms.flush(force=True) == []  # no repeats, no summaries


def test_flood_is_caught_up_in_one_cycle_with_bounded_work_and_memory(tmp_path: Path) -> None:
    collector, log = _collector(tmp_path, Clock(), max_records=5000)
    lines = "".join(f"Out of memory: Killed process {i} (python3) total-vm:1kB\n" for i in range(60_000))
    _append(log, lines + XID79)
    tracemalloc.start()
    values = _values(collector.collect())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    records = values[("tpuwatch_kernel_log_records_total", (("source", "file"),))]
    passed = values[("tpuwatch_kernel_log_skipped_total", (("reason", "backlog"), ("source", "file")))]
    assert records <= 5000 and records + passed == 60_001  # the cap per cycle; every line read or counted
    assert values[("tpuwatch_kernel_events_total", (("device", "1"), ("rule", "nvidia_xid"),
                                                    ("severity", "critical")))] == 1  # the newest, this cycle
    assert peak < 32 << 20, peak
    assert len(collector.recent_events()) <= MAX_RECENT_EVENTS
    again = _values(collector.collect())
    assert again == values  # caught up: nothing more read or passed over


class CountingSource(FileSource):
    """A followed file that counts the records it hands out: the clock of ``cost_timer``."""

    handed_out = 0

    def read(self, limit: int) -> list[Record]:
        out = super().read(limit)
        self.handed_out += len(out)
        return out


def test_a_cycle_stops_on_time_and_still_reaches_the_newest_record(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    source = CountingSource(str(log), None)
    cost = 20e-6  # seconds per record: the collector's timer runs on the work done, not on this machine's load
    collector = KernelLogCollector(source, load_rules([]), device_lookup(lambda: READINGS), 60.0, clock=Clock(),
                                   deadline=1.0, timer=lambda: source.handed_out * cost)
    _append(log, "".join(f"[{i / 1000:12.6f}] NVRM: Xid (PCI:0000:18:00): 13, pid={i}, name=python3, Graphics "
                         f"Exception\n" for i in range(200_000)) + XID79)
    values = _values(collector.collect())
    budget = 1.0 * BUDGET_SHARE
    assert source.handed_out * cost <= budget + BATCH_RECORDS * cost  # stopped within a batch of its budget
    records = values[("tpuwatch_kernel_log_records_total", (("source", "file"),))]
    passed = values[("tpuwatch_kernel_log_skipped_total", (("reason", "backlog"), ("source", "file")))]
    # One line of the passed-over backlog is read after all: the sieve picks a line a critical rule may match
    # once per message, and these lines differ only in their timestamp and pid.
    assert records == source.handed_out + 1 and records + passed == 200_001
    assert values[("tpuwatch_kernel_events_total", (("device", "1"), ("rule", "nvidia_xid"),
                                                    ("severity", "critical")))] == 1
    assert values[("tpuwatch_kernel_events_total", (("device", "0"), ("rule", "nvidia_xid"),
                                                    ("severity", "warning")))] == records - 1  # exact for what is read


def _storm_with_a_fault_inside(log: Path, hidden: str, lines: int = 200_000) -> None:
    """A storm of Xid 13 on one GPU with ``hidden`` in its middle, then the newest line: Xid 79 of another."""
    storm = [f"[{i / 1000:12.6f}] NVRM: Xid (PCI:0000:18:00): 13, pid={i}, name=python3, Graphics Exception\n"
             for i in range(lines)]
    storm.insert(lines // 2, hidden)
    _append(log, "".join(storm) + XID79)


def test_a_critical_line_in_the_middle_of_a_storm_passed_over_is_still_reported(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    source = CountingSource(str(log), None)
    cost = 20e-6
    collector = KernelLogCollector(source, load_rules([]), device_lookup(lambda: READINGS), 60.0, clock=Clock(),
                                   deadline=1.0, timer=lambda: source.handed_out * cost)
    # Composed: GPU 0's own fault (Xid 79) while it floods the log with Xid 13, and an uncorrected memory error.
    _storm_with_a_fault_inside(log, "[  100.000000] NVRM: Xid (PCI:0000:18:00): 79, pid=99, name=python3, "
                                    "GPU has fallen off the bus.\n"
                                    "[  100.000001] EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#0_DIMM#0 "
                                    "(channel:0 slot:0 page:0x0 offset:0x0 grain:32 - OVERFLOW)\n")
    values = _values(collector.collect())
    passed = values[("tpuwatch_kernel_log_skipped_total", (("reason", "backlog"), ("source", "file")))]
    assert passed > 100_000  # the middle of the storm was passed over
    assert values[("tpuwatch_kernel_events_total", (("device", "0"), ("rule", "nvidia_xid"),
                                                    ("severity", "critical")))] == 1
    assert values[("tpuwatch_kernel_events_total", (("device", ""), ("rule", "edac_uncorrected"),
                                                    ("severity", "critical")))] == 1
    records = values[("tpuwatch_kernel_log_records_total", (("source", "file"),))]
    assert records + passed == 200_003  # a line read from the backlog is not counted as passed over too


def test_lines_picked_far_apart_in_a_backlog_are_not_one_fault(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    source = CountingSource(str(log), None)
    collector = KernelLogCollector(source, load_rules([]), device_lookup(lambda: READINGS), 60.0, clock=Clock(),
                                   deadline=1.0, timer=lambda: source.handed_out * 20e-6)
    storm = [f"[{i / 1000:12.6f}] NVRM: Xid (PCI:0000:18:00): 13, pid={i}, name=python3, Graphics Exception\n"
             for i in range(200_000)]
    # Composed: the same page handled twice, 40,000 lines apart (were they neighbours, the second would be
    # the first one's worse line, one event).
    storm.insert(160_000, "[  160.000000] Memory failure: 0x1234: recovery action for dirty LRU page: Failed\n")
    storm.insert(120_000, "[  120.000000] Memory failure: 0x1234: Sending SIGBUS to python3:4242 due to hardware "
                          "memory corruption\n")
    _append(log, "".join(storm) + XID79)
    values = _values(collector.collect())
    assert values[("tpuwatch_kernel_log_skipped_total", (("reason", "backlog"), ("source", "file")))] > 100_000
    for severity in ("warning", "critical"):
        assert values[("tpuwatch_kernel_events_total", (("device", ""), ("rule", "memory_failure"),
                                                        ("severity", severity)))] == 1


def test_the_sieve_picks_each_message_once_and_at_most_its_limit(tmp_path: Path) -> None:
    sieve = BacklogSieve(load_rules([]), limit=3)
    sieve.start()
    storm = b"".join(b"[%d.0] NVRM: Xid (PCI:0000:18:00): 13, pid=%d, name=python3, Graphics Exception\n" % (i, i)
                     for i in range(1000))
    assert sieve.pick(storm) == [storm.split(b"\n")[-2]]  # the same message but for its timestamp and pid
    assert sieve.pick(b"[1.0] e1000e: eno1 NIC Link is Up\n[2.0] audit: type=1400\n") == []  # nothing critical
    others = [b"[3.0] NVRM: Xid (PCI:0000:%02x:00): 79, pid=1, name=x, GPU has fallen off the bus." % bus
              for bus in range(1, 5)]
    assert sieve.pick(b"\n".join(others)) == others[:2] and sieve.full  # three different lines in all
    sieve.start()
    assert sieve.pick(others[3]) == [others[3]] and not sieve.full  # a new skip starts afresh
    sieve.start(lambda: False)  # no time left to sieve: the skip goes on unsieved, and says so
    assert sieve.pick(others[0]) == [] and sieve.unsieved and not sieve.active


def test_a_storm_too_large_to_sieve_in_time_still_reaches_the_newest_record(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    source = CountingSource(str(log), None)
    clock = {"sieved": 0}

    class SlowSieve(BacklogSieve):
        """Each chunk takes a tenth of the deadline to sieve (on the collector's timer)."""

        def pick(self, chunk: bytes) -> list[bytes]:
            clock["sieved"] += 1
            return super().pick(chunk)

    cost = 20e-6
    collector = KernelLogCollector(source, load_rules([]), device_lookup(lambda: READINGS), 60.0, clock=Clock(),
                                   deadline=1.0, timer=lambda: source.handed_out * cost + clock["sieved"] * 0.1)
    collector._sieve = SlowSieve(load_rules([]))
    _storm_with_a_fault_inside(log, "[  100.000000] Kernel panic - not syncing: Fatal hardware error!\n",
                               lines=400_000)
    values = _values(collector.collect())
    assert collector._sieve.unsieved and clock["sieved"] <= 2  # a quarter of what was left: one chunk, maybe two
    assert values[("tpuwatch_kernel_events_total", (("device", "1"), ("rule", "nvidia_xid"),
                                                    ("severity", "critical")))] == 1  # the newest line is read


class FailingMatcher:
    """A stream matcher with a bug: it raises on records that mention "boom"."""

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules

    def feed(self, record: Record) -> list[Match]:
        if "boom" in record.message:
            raise ValueError("cannot match this one")
        return self.rules.match(record.message)

    def flush(self) -> list[Match]:
        return []


class FailingRules(RuleSet):
    def stream(self) -> FailingMatcher:  # type: ignore[override]
        return FailingMatcher(self)


def test_a_record_the_matcher_fails_on_is_counted_and_passed_over(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    collector = KernelLogCollector(FileSource(str(log), tmp_path / "file.json"), FailingRules(load_rules([]).rules),
                                   device_lookup(lambda: READINGS), 60.0)
    _append(log, "boom 1\nboom 2\n" + XID79)
    values = _values(collector.collect())
    assert values[("tpuwatch_kernel_log_skipped_total", (("reason", "error"), ("source", "file")))] == 2
    assert values[("tpuwatch_kernel_events_total", (("device", "1"), ("rule", "nvidia_xid"),
                                                    ("severity", "critical")))] == 1
    assert sum("could not be matched" in r.message for r in caplog.records) == 1  # logged once
    assert saved_state(tmp_path / "file.json")["offset"] == log.stat().st_size  # the position moved


class BrokenSource(Source):
    """A source whose reads fail until ``fixed``."""

    name = "broken"
    fixed = False

    def __init__(self) -> None:
        super().__init__(Position(None, lambda state: None))

    def read(self, limit: int) -> list[Record]:
        if not self.fixed:
            raise OSError(5, "Input/output error")
        self.caught_up = True
        return [Record(XID79.strip())]


def test_a_failing_read_still_returns_the_counters_and_says_why() -> None:
    source = BrokenSource()
    collector = KernelLogCollector(source, load_rules([]), device_lookup(lambda: READINGS), 60.0)
    guard = GuardedCollector(collector)
    guard.start()
    samples = guard.finish(time.monotonic() + 5)
    assert samples and guard.status.success  # the counters flow on, at their last values
    assert collector.degraded == "reading the kernel log failed: OSError: [Errno 5] Input/output error"
    source.fixed = True
    values = _values(collector.collect())
    assert collector.degraded is None
    assert values[("tpuwatch_kernel_events_total", (("device", "1"), ("rule", "nvidia_xid"),
                                                    ("severity", "critical")))] == 1


def test_recent_events_are_the_newest_and_bounded(tmp_path: Path) -> None:
    collector, log = _collector(tmp_path, Clock())
    _append(log, "".join(f"NVRM: Xid (PCI:0000:{i % 256:02x}:{i // 256:02x}): 79\n" for i in range(1500)))
    collector.collect()
    recent = collector.recent_events()
    assert len(recent) == MAX_RECENT_EVENTS and recent[-1].message == "NVRM: Xid (PCI:0000:db:05): 79"  # the last


def test_device_lookup_follows_the_latest_readings() -> None:
    readings: list[DeviceReading] = []
    lookup = device_lookup(lambda: readings)
    assert lookup("0000:3b:00.0") is None
    readings.extend(READINGS)
    assert lookup("0000:3b:00.0") == "1"


def test_build_collector_from_config(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    config = parse(f"state_dir: {tmp_path}/state\nkernel_log: {{source: file, path: {log}, rules_dirs: []}}")
    collector, note = build_collector(config, lambda pci: None)
    assert collector is not None and note == f"kernel log: following file {log}"
    none, note = build_collector(parse("kernel_log: {source: none}"), lambda pci: None)
    assert none is None and "none" in note


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK | os.W_OK), reason="needs root and /dev/kmsg")
def test_real_kmsg_record_becomes_an_event_and_a_counter(tmp_path: Path) -> None:
    tag = f"tpuwatch-test-{uuid.uuid4().hex[:12]}"
    rules_dir = write_selftest_rule(tmp_path / "rules.d", tag)
    source = KmsgSource("/dev/kmsg", tmp_path / "kmsg.json", read_boot_id())
    collector = KernelLogCollector(source, load_rules([rules_dir]), device_lookup(lambda: READINGS), 60.0,
                                   max_records=1_000_000)
    collector.collect()  # this boot's history
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<3>{tag}: device 0000:18:00.0 failed\n")
    values = _values(collector.collect())
    assert values[("tpuwatch_kernel_events_total", (("device", "0"), ("rule", "selftest"),
                                                    ("severity", "critical")))] == 1
    [event] = [e for e in collector.recent_events() if e.rule == "selftest"]
    assert (event.device, event.pci, event.message) == ("0", "0000:18:00.0", f"{tag}: device 0000:18:00.0 failed")
    source.close()


def test_event_problems_name_critical_events_only() -> None:
    events = [KernelEvent("nvidia_xid", "critical", "NVRM: Xid (PCI:0000:3b:00): 79", "0000:3b:00.0", "1", 79),
              KernelEvent("oom_kill", "warning", "Out of memory: Killed process 1 (x)"),
              KernelEvent("edac_uncorrected", "critical", "EDAC MC0: 1 UE", count=3)]
    assert event_problems(events) == [
        "kernel: nvidia_xid on device 1 (pci 0000:3b:00.0): NVRM: Xid (PCI:0000:3b:00): 79",
        "kernel: edac_uncorrected on device ? (pci unknown) x3: EDAC MC0: 1 UE"]


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="needs root and /dev/kmsg")
def test_check_reads_this_boot_without_touching_the_daemon_position(tmp_path: Path) -> None:
    config = parse(f"state_dir: {tmp_path}\nkernel_log: {{source: kmsg, rules_dirs: []}}")
    daemon, _ = build_collector(config, lambda pci: None)
    assert daemon is not None
    daemon.collect()
    saved = (tmp_path / "kernel_log" / "kmsg.json").read_text()
    check, note = build_collector(config, lambda pci: None, persist=False)
    assert check is not None and note == "kernel log: reading /dev/kmsg"
    records = _values(check.collect())[("tpuwatch_kernel_log_records_total", (("source", "kmsg"),))]
    assert records > 0  # this boot's history, from the start of the ring
    assert (tmp_path / "kernel_log" / "kmsg.json").read_text() == saved
