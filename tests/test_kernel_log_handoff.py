"""The kernel log's follower hands what it reads to the sampling cycle: it never writes into the store itself, and
a burst larger than its handoff is counted whole, the events it could not hold counted as dropped."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tpuwatch.config import parse
from tpuwatch.daemon import Daemon
from tpuwatch.kernel_log.attribution import device_lookup
from tpuwatch.kernel_log.collector import FOLLOW_S, KernelLogCollector
from tpuwatch.kernel_log.filesource import FileSource
from tpuwatch.kernel_log.handoff import Handoff
from tpuwatch.kernel_log.rulefile import load_rules
from tpuwatch.samples import Sample

from conftest import free_port, wait_until

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python3, GPU has fallen off the bus.\n"


def _xid_events(samples: list[Sample]) -> float:
    return sum(s.value for s in samples if s.name == "tpuwatch_kernel_events_total"
               and dict(s.labels)["rule"] == "nvidia_xid")


def _append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)


def test_the_daemon_stores_the_followers_events_only_when_a_cycle_runs(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    config = parse(f"state_dir: {tmp_path}/state\nlisten: 127.0.0.1:{free_port()}\ndevices: {{backend: sim}}\n"
                   f"kernel_log: {{source: file, path: {log}, rules_dirs: []}}")
    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    daemon = Daemon(config, None)  # never started: its cycles are run here, by hand
    kernel_log = daemon.parts.collectors.kernel_log
    assert kernel_log is not None
    try:
        daemon._sample()
        daemon._first_cycle.set()  # the follower reads from here on, as in start()
        assert _xid_events(daemon.parts.store.current()) == 0
        _append(log, XID79.format(pid=1))
        wait_until(lambda: kernel_log.reader.records == 1 and kernel_log.source.caught_up, timeout=10,
                   what="the follower reading the line")
        time.sleep(1.0 + 4 * FOLLOW_S)  # a follower that wrote into the store would have by now
        assert _xid_events(daemon.parts.store.current()) == 0
        daemon._sample()
        assert _xid_events(daemon.parts.store.current()) == 1
        assert [e.rule for e in kernel_log.recent_events()] == ["nvidia_xid"]
    finally:
        kernel_log.close()
        daemon.parts.alerting.db.close()
        daemon.state.close()
        for number, handler in handlers.items():
            signal.signal(number, handler)


def test_a_burst_larger_than_the_handoff_is_counted_whole_and_the_events_dropped_are_counted(
        tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    collector = KernelLogCollector(FileSource(str(log), tmp_path / "file.json"), load_rules([]),
                                   device_lookup(lambda: []), storm_window=0.0)  # no storm folds an event away
    collector._handoff = Handoff(capacity=4)
    collector.start()
    try:
        _append(log, "".join(XID79.format(pid=pid) for pid in range(10)))
        wait_until(lambda: collector.reader.records == 10 and collector.source.caught_up, timeout=10,
                   what="the follower reading the burst")
        assert collector.recent_events() == []  # read, and waiting for the cycle
        samples = collector.collect()
    finally:
        collector.close()
    values = {(s.name, s.labels): s.value for s in samples}
    assert _xid_events(samples) == 10
    assert values[("tpuwatch_kernel_log_events_dropped_total", (("source", "file"),))] == 6
    assert [e.message.split(",")[1] for e in collector.recent_events()] == [f" pid={pid}" for pid in range(6, 10)]
    again = {(s.name, s.labels): s.value for s in collector.collect()}  # taken once: nothing counted twice
    assert again == values


def test_the_handoff_tallies_every_occurrence_and_empties_when_taken() -> None:
    from tpuwatch.kernel_log.events import KernelEvent

    handoff = Handoff(capacity=2)
    events = [KernelEvent("nvidia_xid", "critical", f"m{i}", device="1",
                          fields={"gpu_instance": "3", "recovery_action": "gpu_reset"} if i == 0 else {})
              for i in range(3)]
    handoff.put(events, events)
    taken = handoff.take()
    assert taken.counts == {("nvidia_xid", "critical", "1", "3"): 1, ("nvidia_xid", "critical", "1", ""): 2}
    assert taken.actions == {("1", "gpu_reset"): 1}
    assert [e.message for e in taken.events] == ["m1", "m2"] and taken.dropped == 1
    empty = handoff.take()
    assert (empty.counts, empty.actions, empty.events, empty.dropped) == ({}, {}, [], 0)
