"""The kernel log collector: counters, device attribution, storms that hide nothing, the follower thread and its
share of a core, real /dev/kmsg end to end."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from tpuwatch.catalog import CATALOG
from tpuwatch.collectors.guard import GuardedCollector
from tpuwatch.config import parse
from tpuwatch.devices import DeviceReading
from tpuwatch.hw.procfs import read_boot_id
from tpuwatch.kernel_log.attribution import device_lookup
from tpuwatch.kernel_log.collector import (
    MAX_RECENT_EVENTS,
    MAX_SPEND_S,
    WORK_SHARE,
    KernelLogCollector,
    build_collector,
    event_problems,
)
from tpuwatch.kernel_log.events import KernelEvent, StormFilter
from tpuwatch.kernel_log.filesource import FileSource
from tpuwatch.kernel_log.matcher import StreamMatcher
from tpuwatch.kernel_log.position import Position
from tpuwatch.kernel_log.records import Record
from tpuwatch.kernel_log.rule import Match
from tpuwatch.kernel_log.rulefile import load_rules
from tpuwatch.kernel_log.sources import KmsgSource, Source

from conftest import saved_state, wait_until, write_selftest_rule

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
READINGS = [DeviceReading(device="0", chip="h100", pci="0000:18:00.0"),
            DeviceReading(device="1", chip="h100", pci="0000:3B:00.0")]


class Clock:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _collector(tmp_path: Path, clock: Clock, window: float = 60.0) -> tuple[KernelLogCollector, Path]:
    log = tmp_path / "kern.log"
    log.write_text("")
    source = FileSource(str(log), tmp_path / "state" / "file.json")
    return KernelLogCollector(source, load_rules([]), device_lookup(lambda: READINGS), window, clock=clock), log


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


# --- storms: their own lines passed over, every other line read ------------------------------------------------

STORM = "[{t:12.6f}] NVRM: Xid (PCI:0000:18:00): {xid}, pid={pid}, name=python3, Ch {pid:08x}\n"
# An Xid 13 reported again (kernel_rc.c): the first is an event, the rest are its fault's follow lines.
AGAIN = "[{t:12.6f}] NVRM: Xid (PCI:0000:18:00): {xid}, pid={pid}, name=python3, Graphics Exception: ESR 0x{pid:x}\n"
# Composed: what a storm must not hide, each of another rule, of another chip, or worse than the storm.
HIDDEN = {
    ("nvidia_xid", "critical", "0"): "[  100.000000] NVRM: Xid (PCI:0000:18:00): 79, pid=99, name=python3, GPU has "
                                     "fallen off the bus.\n",
    ("nvidia_xid", "warning", "1"): "[  100.000001] NVRM: Xid (PCI:0000:3b:00): 13, pid=98, name=python3, Graphics "
                                    "Exception: ESR 0x0\n",
    ("edac_uncorrected", "critical", ""): "[  100.000002] EDAC MC0: 1 UE memory read error on "
                                          "CPU_SrcID#0_Ha#0_Chan#0_DIMM#0 (channel:0 slot:0 page:0x0 offset:0x0)\n",
    ("hung_task", "warning", ""): "[  100.000003] INFO: task python3:4242 blocked for more than 120 seconds.\n",
    ("kernel_oops", "warning", ""): "[  100.000004] BUG: unable to handle page fault for address: ffffc90000a3c000\n",
    ("oom_kill", "warning", ""): "[  100.000005] Out of memory: Killed process 4242 (python3) total-vm:1kB, "
                                 "anon-rss:1kB\n",
}


class WorkTimer:
    """The collector's clock run on the work it did: ``full`` seconds per record read, ``passed`` per line passed
    over, so that its budget does not depend on this machine's load."""

    def __init__(self, full: float = 20e-6, passed: float = 1e-6) -> None:
        self.full, self.passed = full, passed
        self.collector: KernelLogCollector | None = None

    def __call__(self) -> float:
        assert self.collector is not None
        return (self.collector.reader.records * self.full
                + self.collector.source.skipped["backlog"] * self.passed)


def _timed_collector(tmp_path: Path, timer: WorkTimer) -> tuple[KernelLogCollector, Path]:
    log = tmp_path / "kern.log"
    log.write_text("")
    collector = KernelLogCollector(FileSource(str(log), None), load_rules([]), device_lookup(lambda: READINGS), 60.0,
                                   clock=Clock(), deadline=1.0, timer=timer)
    timer.collector = collector
    return collector, log


def _until_caught_up(collector: KernelLogCollector, cycles: int = 50) -> dict:  # type: ignore[type-arg]
    for _ in range(cycles):
        values = _values(collector.collect())
        if collector.source.caught_up:
            return values
    raise AssertionError(f"not caught up after {cycles} cycles")


def _events(values: dict) -> dict[tuple[str, str, str], float]:  # type: ignore[type-arg]
    return {(dict(k[1])["rule"], dict(k[1])["severity"], dict(k[1])["device"]): v for k, v in values.items()
            if k[0] == "tpuwatch_kernel_events_total" and v}


@pytest.mark.parametrize(("xid", "shape"), [(13, STORM), (79, STORM), (13, AGAIN)])
def test_a_storm_of_one_gpu_hides_no_other_fault_written_in_its_middle(tmp_path: Path, xid: int, shape: str) -> None:
    """200,000 distinct Xid lines of one GPU (warning or critical events, or one event's follow lines), faults of
    other rules, of another GPU and a worse one of the same GPU in the middle: the storm's lines are passed over
    once the collector falls behind, every other line is read, and every line is either read or counted as passed
    over."""
    timer = WorkTimer()
    collector, log = _timed_collector(tmp_path, timer)
    storm = [shape.format(t=i / 1000, xid=xid, pid=i) for i in range(200_000)]
    hidden = dict(HIDDEN) if xid == 13 else {k: v for k, v in HIDDEN.items() if k[:2] != ("nvidia_xid", "critical")}
    storm[100_000:100_000] = list(hidden.values())
    _append(log, "".join(storm) + XID79)
    values = _until_caught_up(collector)
    events = _events(values)
    storm_key = ("nvidia_xid", "warning" if xid == 13 else "critical", "0")
    records = values[("tpuwatch_kernel_log_records_total", (("source", "file"),))]
    passed = values[("tpuwatch_kernel_log_skipped_total", (("reason", "backlog"), ("source", "file")))]
    assert passed > 150_000  # most of the storm was passed over unread
    assert records + passed == 200_000 + len(hidden) + 1  # every line read or counted
    read = records - len(hidden) - 1
    assert events.pop(storm_key) == (read if shape == STORM else 1)  # each line read an event, or one fault
    assert events == {**{key: 1 for key in hidden}, ("nvidia_xid", "critical", "1"): 1}


def test_a_burst_the_budget_can_read_is_read_whole(tmp_path: Path) -> None:
    timer = WorkTimer()
    collector, log = _timed_collector(tmp_path, timer)
    _append(log, "".join(STORM.format(t=i / 1000, xid=13, pid=i) for i in range(2000)))
    values = _values(collector.collect())
    assert values[("tpuwatch_kernel_log_skipped_total", (("reason", "backlog"), ("source", "file")))] == 0
    assert _events(values) == {("nvidia_xid", "warning", "0"): 2000}


def test_a_line_with_an_escape_is_read_though_it_looks_like_the_storm(tmp_path: Path) -> None:
    """A raw kmsg record's ``\\xNN`` escape may hide a keyword that parsing decodes: such a line is never passed
    over as a storm's."""
    timer = WorkTimer()
    collector, log = _timed_collector(tmp_path, timer)
    storm = [f"4,{i},{i},-;NVRM: Xid (PCI:0000:18:00): 13, pid={i}, name=python3, Graphics Exception\n"
             for i in range(100_000)]
    storm[50_000] = "4,50000,50000,-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=python3\\x0aEDAC MC0: 1 UE\n"
    _append(log, "".join(storm))
    values = _until_caught_up(collector)
    assert values[("tpuwatch_kernel_log_skipped_total", (("reason", "backlog"), ("source", "file")))] > 50_000
    assert _events(values)[("nvidia_xid", "warning", "0")] == values[
        ("tpuwatch_kernel_log_records_total", (("source", "file"),))]  # the escaped line read too


def test_the_follower_reads_as_lines_come_and_spends_its_share(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    config = parse(f"state_dir: {tmp_path}/state\nkernel_log: {{source: file, path: {log}, rules_dirs: []}}")
    collector, _ = build_collector(config, device_lookup(lambda: READINGS))
    assert collector is not None and collector._thread is None  # the daemon starts it after its first cycle
    collector.start()
    thread = collector._thread
    try:
        assert thread is not None and thread.is_alive() and thread.name == "kernel-log"
        _append(log, XID79)
        key = ("nvidia_xid", "critical", "1")
        wait_until(lambda: _events(_values(collector.collect())).get(key) == 1, timeout=5, what="the follower")
        clock = time.pthread_getcpuclockid(thread.ident)  # type: ignore[arg-type]
        spent, started = time.clock_gettime(clock), time.monotonic()
        _append(log, "".join(STORM.format(t=i / 1000, xid=13, pid=i) for i in range(400_000)))
        size = log.stat().st_size
        wait_until(lambda: collector.source.caught_up and collector.source._offset == size,  # type: ignore[attr-defined]
                   timeout=60, what="the follower reaching the end of a storm")
        # At most its share of a core on average, and what its bucket held at the start.
        assert time.clock_gettime(clock) - spent <= WORK_SHARE * (time.monotonic() - started) + MAX_SPEND_S + 0.2
        values = _values(collector.collect())
        assert (values[("tpuwatch_kernel_log_records_total", (("source", "file"),))]
                + values[("tpuwatch_kernel_log_skipped_total", (("reason", "backlog"), ("source", "file")))]) == 400_001
    finally:
        collector.close()
    assert not thread.is_alive()
    assert saved_state(tmp_path / "state" / "kernel_log" / "file.json")["offset"] == log.stat().st_size


def test_a_record_the_matcher_fails_on_is_counted_and_passed_over(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    match = StreamMatcher._match

    def failing(self: StreamMatcher, record: Record) -> list[Match]:
        if "boom" in record.message:
            raise ValueError("cannot match this one")
        return match(self, record)

    monkeypatch.setattr(StreamMatcher, "_match", failing)
    log = tmp_path / "kern.log"
    log.write_text("")
    collector = KernelLogCollector(FileSource(str(log), tmp_path / "file.json"), load_rules([]),
                                   device_lookup(lambda: READINGS), 60.0)
    _append(log, "Out of memory: Killed process 1 (boom)\nOut of memory: Killed process 2 (boom)\n" + XID79)
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

    def read(self) -> list[Record]:
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
    collector.close()
    none, note = build_collector(parse("kernel_log: {source: none}"), lambda pci: None)
    assert none is None and "none" in note


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK | os.W_OK), reason="needs root and /dev/kmsg")
@pytest.mark.usefixtures("kmsg_ring")
def test_real_kmsg_record_becomes_an_event_and_a_counter(tmp_path: Path) -> None:
    tag = f"tpuwatch-test-{uuid.uuid4().hex[:12]}"
    rules_dir = write_selftest_rule(tmp_path / "rules.d", tag)
    source = KmsgSource("/dev/kmsg", tmp_path / "kmsg.json", read_boot_id())
    collector = KernelLogCollector(source, load_rules([rules_dir]), device_lookup(lambda: READINGS), 60.0)
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
@pytest.mark.usefixtures("kmsg_ring")
def test_check_reads_this_boot_without_touching_the_daemon_position(tmp_path: Path) -> None:
    config = parse(f"state_dir: {tmp_path}\nkernel_log: {{source: kmsg, rules_dirs: []}}")
    daemon, _ = build_collector(config, lambda pci: None)
    assert daemon is not None
    daemon.start()
    with open("/dev/kmsg", "w") as kmsg:  # a record within kernel_log.lookback, for the follower to read
        kmsg.write(f"<6>tpuwatch-test-{uuid.uuid4().hex[:12]}: a record of this boot\n")
    wait_until(lambda: daemon.reader.records, timeout=5, what="the follower reading /dev/kmsg")
    daemon.close()  # the follower stops and saves its position
    saved = (tmp_path / "kernel_log" / "kmsg.json").read_text()
    check, note = build_collector(config, lambda pci: None, persist=False)
    assert check is not None and note == "kernel log: reading /dev/kmsg"
    records = _values(check.collect())[("tpuwatch_kernel_log_records_total", (("source", "kmsg"),))]
    assert records > 0  # this boot's history, from the start of the ring
    assert (tmp_path / "kernel_log" / "kmsg.json").read_text() == saved
