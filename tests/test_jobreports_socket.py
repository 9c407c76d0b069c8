"""The daemon's probe socket (tpuwatch.jobreports) over a real Unix socket: who may report, and every refusal.

The peers are real processes: this one (root in CI), and children that drop to nobody (uid 65534) after a
fork, so SO_PEERCRED names them as the kernel sees them.  The chips are simulated ones whose device files
live in a temporary directory; a process holds a chip by keeping its file open.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_jobreports_message import report

from tpuwatch import config as config_module
from tpuwatch.canary.collector import CanaryCollector
from tpuwatch.devices.base import DeviceReading
from tpuwatch.devices.inventory import Board
from tpuwatch.jobreports import server
from tpuwatch.jobreports.collector import JobReports
from tpuwatch.pods.lookup import PodRef
from tpuwatch.probe.channel import exchange

from conftest import require_tool, wait_until

NOBODY = 65534
TPU = "google.com/tpu"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs a peer as another user (needs root)")


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory every user can reach (the socket and the chips' device files)."""
    path = Path(tempfile.mkdtemp(prefix="tpuwatch-probe-"))
    path.chmod(0o755)
    (path / "dev").mkdir(mode=0o755)
    for chip in range(4):
        (path / "dev" / f"accel{chip}").touch(mode=0o666)
    yield path
    for child in sorted(path.rglob("*"), reverse=True):
        child.unlink() if not child.is_dir() else child.rmdir()
    path.rmdir()


def readings(place: Path) -> list[DeviceReading]:
    return [DeviceReading(str(chip), "v5e", device_files=(f"{place}/dev/accel{chip}",),
                          plugin_ids=((TPU, f"tpu-{chip}"),)) for chip in range(4)]


def start_reports(place: Path, pods: Any = None, procfs: Path | None = None, **probe: Any) -> JobReports:
    """The daemon's side of the socket in ``place`` with ``probe`` settings, over its four simulated chips."""
    config = config_module.parse(yaml.safe_dump({
        "state_dir": str(place / "state"), "probe": {"socket": str(place / "probe.sock"), **probe},
        **({"paths": {"procfs": str(procfs)}} if procfs is not None else {})}))
    chips = Board()  # the cycle's inventory, as the devices stage publishes it
    chips.publish(readings(place), {})
    return JobReports(config, CanaryCollector(config), chips, pods)


@pytest.fixture
def serve(place: Path) -> Iterator[Callable[..., JobReports]]:
    """Start the daemon's side of the socket with ``probe`` settings (``start_reports``); stopped at teardown."""
    made: list[JobReports] = []

    def start(pods: Any = None, procfs: Path | None = None, **probe: Any) -> JobReports:
        made.append(start_reports(place, pods, procfs, **probe))
        return made[-1]

    yield start
    for part in made:
        part.close()


def send(path: Path, data: bytes, close: bool = True) -> dict[str, Any]:
    """Send ``data`` to the socket and read its one-line answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(str(path))
        try:
            conn.sendall(data)
            if close:
                conn.shutdown(socket.SHUT_WR)
        except OSError:  # refused before the daemon read it (busy, rate_limited): the answer is waiting
            pass
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                break
            answer += chunk
    parsed: dict[str, Any] = json.loads(answer)
    return parsed


def as_nobody(path: Path, data: bytes, hold: list[Path] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """``send`` from a forked child that holds ``hold`` open and runs as nobody."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only os and socket calls, then _exit
        try:
            handles = [os.open(p, os.O_RDONLY) for p in hold]
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(writer, json.dumps(send(path, data)).encode())
            del handles
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        out = pipe.read()
    os.waitpid(pid, 0)
    parsed: dict[str, Any] = json.loads(out)
    return parsed


def rejected(part: JobReports) -> dict[str, float]:
    return {dict(s.labels)["reason"]: s.value for s in part.collect()
            if s.name == "tpuwatch_probe_reports_rejected_total"}


def accepted(part: JobReports) -> float:
    return next(s.value for s in part.collect() if s.name == "tpuwatch_probe_reports_total")


def line(**changes: Any) -> bytes:
    return json.dumps(report(**changes)).encode() + b"\n"


def test_a_holder_s_report_is_judged_into_the_canary_s_book(place: Path, serve: Callable[..., JobReports]) -> None:
    part = serve()
    held = [open(place / "dev" / f"accel{chip}") for chip in range(4)]  # noqa: SIM115
    try:
        answer = send(place / "probe.sock", line())
    finally:
        for handle in held:
            handle.close()
    assert answer == {"accepted": True, "status": "pass", "reason": None,
                      "devices": {"0": "pass", "1": "pass", "2": "pass", "3": "pass"}}
    assert accepted(part) == 1 and set(rejected(part).values()) == {0}
    [result] = part.book.results()
    assert (result.path, result.job) == ("job", f"pid {os.getpid()} ({Path('/proc/self/comm').read_text().strip()})")
    samples = {(s.name, s.labels): s.value for s in part.book.collect()}
    assert samples[("tpuwatch_canary_healthy", (("device", "2"),))] == 1
    assert ("tpuwatch_canary_last_success_timestamp_seconds", (("device", "2"), ("path", "job"))) in samples


def test_the_answer_gives_each_chip_its_own_verdict(place: Path, serve: Callable[..., JobReports]) -> None:
    part = serve()
    results = report()["results"]
    results[2] = {**results[2], "fingerprint": "0123456789abcdef"}  # chip 2 alone computes other bits
    held = [open(place / "dev" / f"accel{chip}") for chip in range(4)]  # noqa: SIM115
    try:
        answer = send(place / "probe.sock", line(results=results))
    finally:
        for handle in held:
            handle.close()
    assert (answer["accepted"], answer["status"]) == (True, "fail")
    assert answer["devices"] == {"0": "pass", "1": "pass", "2": "fail", "3": "pass"}
    [result] = part.book.results()
    assert [(o.device, o.status) for o in result.devices if o.status != "pass"] == [("2", "fail")]


def test_the_socket_says_up_and_is_removed_at_close(place: Path, serve: Callable[..., JobReports]) -> None:
    part = serve()
    assert {s.name: s.value for s in part.collect()}["tpuwatch_probe_socket_up"] == 1
    assert (place / "probe.sock").stat().st_mode & 0o777 == 0o666
    part.close()
    assert not (place / "probe.sock").exists()


def test_a_stale_socket_is_replaced_and_a_live_one_kept(
        place: Path, serve: Callable[..., JobReports], caplog: pytest.LogCaptureFixture) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(place / "probe.sock"))  # left by a daemon killed with -9: bound, nobody listening
    stale.close()
    caplog.set_level(logging.INFO, logger="tpuwatch.jobreports.collector")
    first = serve()
    assert first.problem is None
    second = serve()  # a second daemon on the same path: it must not steal the first's socket
    problem = f"cannot listen on {place / 'probe.sock'}: another process listens there"
    assert second.problem == problem
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", f"probe reports: listening on {place / 'probe.sock'}"),
        ("WARNING", f"probe reports off: {problem} (in-job probes cannot report here)")]
    assert {s.name: s.value for s in second.collect()}["tpuwatch_probe_socket_up"] == 0
    with pytest.raises(OSError) as taken:
        server.bind(str(place / "probe.sock"))
    assert (taken.value.errno, taken.value.strerror) == (errno.EADDRINUSE, "another process listens there")
    assert send(place / "probe.sock", line())["accepted"] is True  # root holding nothing: named chips
    assert accepted(first) == 1


@needs_root
def test_a_process_that_does_not_hold_the_chip_cannot_report_about_it(
        place: Path, serve: Callable[..., JobReports]) -> None:
    part = serve()
    about_2 = line(named_by="env", results=[{**report()["results"][0], "device": "2"}])
    holding_0_1 = as_nobody(place / "probe.sock", about_2, hold=[place / "dev" / "accel0", place / "dev" / "accel1"])
    assert holding_0_1["accepted"] is False and holding_0_1["reason"] == "not_holder"
    assert "holds chip(s) 0, 1; the report is about chip(s) 2" in holding_0_1["detail"]
    assert as_nobody(place / "probe.sock", about_2)["reason"] == "not_holder"  # holds nothing
    assert rejected(part)["not_holder"] == 2 and accepted(part) == 0
    assert part.book.results() == []
    assert as_nobody(place / "probe.sock", about_2, hold=[place / "dev" / "accel2"])["accepted"] is True


def test_root_may_report_about_any_chip_of_the_host_but_no_other(
        place: Path, serve: Callable[..., JobReports]) -> None:
    part = serve()
    answer = send(place / "probe.sock", line(named_by="env", results=[{**report()["results"][0], "device": "9"}]))
    assert (answer["reason"], answer["detail"]) == ("unknown_chip", "no chip 9 on this host")
    assert rejected(part)["unknown_chip"] == 1


@pytest.mark.parametrize(("data", "reason"), [
    (b"not a report\n", "malformed"),
    (b"[" * 2000 + b"\n", "malformed"),
    (b"{}", "malformed"),  # no newline: the end of the stream ends it
    (b"x" * 3000 + b"\n", "oversized"),
])
def test_a_bad_report_is_refused_and_counted_by_reason(
        serve: Callable[..., JobReports], place: Path, data: bytes, reason: str) -> None:
    part = serve(max_report_bytes=2048)
    answer = send(place / "probe.sock", data)
    assert (answer["accepted"], answer["reason"]) == (False, reason) and answer["detail"]
    assert rejected(part)[reason] == 1 and accepted(part) == 0


def test_a_report_that_does_not_arrive_whole_in_time_is_refused(
        serve: Callable[..., JobReports], place: Path) -> None:
    part = serve(read_timeout="200ms")
    assert send(place / "probe.sock", line()[:50], close=False)["reason"] == "timeout"
    assert rejected(part)["timeout"] == 1


def test_connections_over_a_user_s_share_are_refused_as_busy_and_others_get_through(
        serve: Callable[..., JobReports], place: Path) -> None:
    part = serve(max_connections=8, read_timeout="10s")  # a user may hold 8 / 4 = 2
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
    try:
        for conn in idle:
            conn.connect(str(place / "probe.sock"))
        wait_until(lambda: len(part._server._conns) == 2 if part._server else False, what="two connections held")
        answer = exchange(str(place / "probe.sock"), report())  # the probe's own client hears why
        assert (answer["reason"], answer["detail"]) == ("busy", f"uid {os.geteuid()} holds 2 connections, its share")
        if os.geteuid() == 0:  # another user is not shut out by this one
            assert as_nobody(place / "probe.sock", line(), hold=list((place / "dev").iterdir()))["accepted"] is True
    finally:
        for conn in idle:
            conn.close()
    assert rejected(part)["busy"] == 1
    wait_until(lambda: send(place / "probe.sock", line())["accepted"], what="a report once the idle ones left")


def test_a_connection_closed_before_a_byte_is_neither_answered_nor_counted(
        serve: Callable[..., JobReports], place: Path) -> None:
    part = serve()
    for _ in range(3):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(place / "probe.sock"))
    assert send(place / "probe.sock", line())["accepted"] is True  # taken after the empty ones
    wait_until(lambda: part._server is not None and not part._server._conns, what="the empty connections gone")
    assert set(rejected(part).values()) == {0} and accepted(part) == 1


def test_a_process_over_its_rate_is_refused_and_another_is_not(
        serve: Callable[..., JobReports], place: Path) -> None:
    part = serve(reports_per_minute=2)
    answers = [send(place / "probe.sock", line()) for _ in range(3)]
    assert [a.get("reason") for a in answers] == [None, None, "rate_limited"]
    assert answers[-1] == {"accepted": False, "reason": "rate_limited",
                           "detail": f"pid {os.getpid()} sent over 2 reports a minute"}
    assert rejected(part)["rate_limited"] == 1 and accepted(part) == 2
    assert exchange(str(place / "probe.sock"), report())["reason"] == "rate_limited"  # the probe hears why
    if os.geteuid() == 0:  # another process has its own share
        assert as_nobody(place / "probe.sock", line(), hold=list((place / "dev").iterdir()))["accepted"] is True


@needs_root
def test_a_user_cannot_escape_the_rate_limit_by_forking(serve: Callable[..., JobReports], place: Path) -> None:
    part = serve(reports_per_minute=1)  # each process 1 a minute, the user 8
    answers = [as_nobody(place / "probe.sock", line(), hold=list((place / "dev").iterdir())) for _ in range(9)]
    assert [a.get("reason") for a in answers] == [None] * 8 + ["rate_limited"]
    assert answers[-1]["detail"] == "uid 65534 sent over 8 reports a minute"
    assert rejected(part)["rate_limited"] == 1 and accepted(part) == 8
    assert send(place / "probe.sock", line())["accepted"] is True  # another user has a share of its own


def test_a_flood_of_hostile_reports_leaves_the_socket_serving(
        serve: Callable[..., JobReports], place: Path) -> None:
    part = serve(reports_per_minute=600, max_report_bytes=4096)
    kinds = [b"garbage\n", b"x" * 5000 + b"\n", line(model="other"), b"{"]

    def flood(kind: bytes) -> None:
        for _ in range(100):
            try:
                send(place / "probe.sock", kind)
            except (OSError, ValueError):
                pass

    threads = [threading.Thread(target=flood, args=(kind,)) for kind in kinds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts = rejected(part)
    assert counts["malformed"] + counts["oversized"] + counts["rate_limited"] == 400
    assert counts["oversized"] >= 1 and counts["malformed"] >= 1
    assert part.collect()  # the part answers its cycle as before


def in_child(path: Path, data: bytes, uid: int | None = None, hold: list[Path] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """``send`` from a forked child (a process of its own, so a pid of its own), as ``uid`` when given."""
    if uid is not None:
        return as_nobody(path, data, hold) if uid == NOBODY else pytest.fail(f"no user {uid} here")
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            handles = [os.open(p, os.O_RDONLY) for p in hold]
            os.write(writer, json.dumps(send(path, data)).encode())
            del handles
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        out = pipe.read()
    os.waitpid(pid, 0)
    parsed: dict[str, Any] = json.loads(out)
    return parsed


def padded(size: int) -> bytes:
    """A valid report of exactly ``size`` bytes, its newline included (JSON allows the spaces before it)."""
    data = line()
    assert len(data) <= size
    return data[:-1] + b" " * (size - len(data)) + b"\n"


def test_a_report_of_exactly_the_size_limit_is_read_and_one_byte_more_is_oversized(
        serve: Callable[..., JobReports], place: Path) -> None:
    part = serve(max_report_bytes=1024)
    assert send(place / "probe.sock", padded(1024))["accepted"] is True
    assert send(place / "probe.sock", padded(1024), close=False)["accepted"] is True  # its newline ends it
    assert send(place / "probe.sock", padded(1025)) == {"accepted": False, "reason": "oversized",
                                                        "detail": "over 1024 bytes"}
    assert send(place / "probe.sock", padded(1026)[:-1]) == {"accepted": False, "reason": "oversized",
                                                             "detail": "over 1024 bytes"}  # no newline
    assert rejected(part)["oversized"] == 2 and accepted(part) == 2


def test_the_report_is_the_first_line_and_its_newline_ends_it_without_waiting_for_the_end_of_the_stream(
        serve: Callable[..., JobReports], place: Path) -> None:
    part = serve(read_timeout="30s")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)  # a daemon that waited for the end of the stream would answer after 30 s: too late
        conn.connect(str(place / "probe.sock"))
        conn.sendall(line() + b"what follows the first line is not read\n")
        answer = conn.recv(4096)
        assert json.loads(answer)["accepted"] is True and answer.endswith(b"\n")
        assert conn.recv(4096) == b""  # one answer, then the daemon closes
    assert accepted(part) == 1 and set(rejected(part).values()) == {0}


def test_a_timeout_answer_says_the_limit(serve: Callable[..., JobReports], place: Path) -> None:
    serve(read_timeout="250ms")
    assert send(place / "probe.sock", b"{", close=False) == {"accepted": False, "reason": "timeout",
                                                             "detail": "no whole report within 0.25s"}


@needs_root
def test_connections_over_the_daemon_s_limit_are_refused_as_busy_whoever_asks(
        serve: Callable[..., JobReports], place: Path) -> None:
    part = serve(max_connections=1, read_timeout="10s")  # a user's share: max(1, 1 // 4), one
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
        idle.connect(str(place / "probe.sock"))
        wait_until(lambda: part._server is not None and len(part._server._conns) == 1, what="one connection held")
        answer = as_nobody(place / "probe.sock", line(), hold=list((place / "dev").iterdir()))
        assert answer == {"accepted": False, "reason": "busy", "detail": "1 connections open, the limit"}
    assert rejected(part)["busy"] == 1
    wait_until(lambda: as_nobody(place / "probe.sock", line(), hold=list((place / "dev").iterdir()))["accepted"],
               what="a report once the idle one left")


@needs_root
@pytest.mark.parametrize("limit", [3, 6])  # a quarter of 3 is none (the floor: one), of 6 one (whole connections)
def test_a_user_s_share_of_few_connections_is_one(serve: Callable[..., JobReports], place: Path, limit: int) -> None:
    part = serve(max_connections=limit, read_timeout="10s")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
        idle.connect(str(place / "probe.sock"))
        wait_until(lambda: part._server is not None and len(part._server._conns) == 1, what="one connection held")
        assert send(place / "probe.sock", line()) == {"accepted": False, "reason": "busy",
                                                      "detail": "uid 0 holds 1 connections, its share"}
        assert as_nobody(place / "probe.sock", line(), hold=list((place / "dev").iterdir()))["accepted"] is True
    assert rejected(part)["busy"] == 1 and accepted(part) == 1


def test_a_process_s_rate_is_kept_while_it_reports_and_forgotten_after_max_tracked_pids_others(
        serve: Callable[..., JobReports], place: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "MAX_TRACKED_PIDS", 2)
    part = serve(reports_per_minute=1)  # the user's: 8 a minute, more than this test sends
    path = place / "probe.sock"
    held = list((place / "dev").iterdir())
    mine = [send(path, line())["accepted"], send(path, line()).get("reason")]
    assert mine == [True, "rate_limited"]
    assert in_child(path, line(), hold=held)["accepted"] is True  # two processes tracked: this one is kept
    assert send(path, line())["reason"] == "rate_limited"
    assert in_child(path, line(), hold=held)["accepted"] is True  # forgets the first child, seen before this one
    assert send(path, line())["reason"] == "rate_limited"
    assert in_child(path, line(), hold=held)["accepted"] is True
    assert in_child(path, line(), hold=held)["accepted"] is True  # two others since: this process is forgotten
    assert send(path, line())["accepted"] is True
    assert rejected(part)["rate_limited"] == 3 and accepted(part) == 6


class Pods:
    """A PodLookup that answers ``ref`` for every process and notes what it was asked."""

    def __init__(self, ref: PodRef) -> None:
        self.ref = ref
        self.asked: list[tuple[int, list[tuple[str, str]]]] = []

    def pod_of(self, pid: int, devices: Iterable[tuple[str, str]] = ()) -> PodRef:
        self.asked.append((pid, list(devices)))
        return self.ref


def fake_procfs(place: Path, pid: int, chips: list[int], comm: str | None) -> Path:
    """A procfs where ``pid`` holds ``chips`` (its descriptors point at their device files) and has ``comm``."""
    proc = place / "proc"
    (proc / str(pid) / "fd").mkdir(parents=True)
    for fd, chip in enumerate(chips, start=3):
        (proc / str(pid) / "fd" / str(fd)).symlink_to(place / "dev" / f"accel{chip}")
    if comm is not None:
        (proc / str(pid) / "comm").write_text(comm + "\n")
    return proc


def job_labels(part: JobReports) -> list[dict[str, str]]:
    """The job labels of the chips' job-path counters, each set once."""
    found = {frozenset((k, v) for k, v in s.labels if k in ("pid", "command", "namespace", "pod"))
             for s in part.book.collect()
             if s.name == "tpuwatch_canary_device_runs_total" and ("path", "job") in s.labels}
    return [dict(labels) for labels in found]


def test_a_job_is_named_by_its_pod_and_the_pod_looked_up_by_the_chips_it_holds(
        serve: Callable[..., JobReports], place: Path) -> None:
    pods = Pods(PodRef("ml", "trainer-0", "main", "uid-1"))
    part = serve(pods=pods, procfs=fake_procfs(place, os.getpid(), [1, 2], comm=None))  # no comm: no command
    answer = send(place / "probe.sock", line(results=report()["results"][:2]))  # chips 0, 1 as the job sees them
    assert answer["devices"] == {"0": "pass", "1": "pass"}  # its chips 1 and 2, in order
    assert pods.asked == [(os.getpid(), [(TPU, "tpu-1"), (TPU, "tpu-2")])]
    [result] = part.book.results()
    assert result.job == f"pid {os.getpid()} in pod ml/trainer-0 container main"
    assert [o.device for o in result.devices] == ["1", "2"]
    assert job_labels(part) == [{"pid": str(os.getpid()), "namespace": "ml", "pod": "trainer-0"}]


@pytest.mark.parametrize(("ref", "named"), [
    (PodRef(pod_uid="uid-1", container_id="c1"), " in pod UID uid-1"),  # no kubelet's names: the UID
    (PodRef(), ""),  # not in a pod
])
def test_a_job_is_named_by_its_command_and_its_pod_when_known(
        serve: Callable[..., JobReports], place: Path, ref: PodRef, named: str) -> None:
    pods = Pods(ref)
    part = serve(pods=pods, procfs=fake_procfs(place, os.getpid(), [0, 1, 2, 3], comm="trainer"))
    assert send(place / "probe.sock", line())["accepted"] is True
    assert [r.job for r in part.book.results()] == [f"pid {os.getpid()} (trainer){named}"]
    assert job_labels(part) == [{"pid": str(os.getpid()), "command": "trainer"}]


class Clock:
    """The server's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def bare(place: Path) -> Iterator[Callable[..., tuple[server.ReportServer, Clock, list[str]]]]:
    """The socket alone (server.ReportServer) on a clock of the test's, answering every report with what it read."""
    made: list[server.ReportServer] = []

    def start(**limits: Any) -> tuple[server.ReportServer, Clock, list[str]]:
        clock, refused = Clock(), list[str]()
        settings = {"max_connections": 32, "max_report_bytes": 4096, "read_timeout": 2.0, "reports_per_minute": 60,
                    **limits}
        made.append(server.ReportServer(
            server.bind(str(place / "bare.sock")), server.Limits(**settings),
            lambda peer, data: {"accepted": True, "pid": peer.pid, "uid": peer.uid, "report": data.decode()},
            refused.append, clock))
        made[-1].start()
        return made[-1], clock, refused

    yield start
    for one in made:
        one.stop()


def test_a_process_s_reports_come_back_at_its_rate_and_never_over_its_burst(
        bare: Callable[..., tuple[server.ReportServer, Clock, list[str]]], place: Path) -> None:
    _, clock, refused = bare(reports_per_minute=6)  # one every 10 s, six at once
    path = place / "bare.sock"

    def reasons(count: int) -> list[str | None]:
        return [send(path, b"r\n").get("reason") for _ in range(count)]

    assert send(path, b"r\n") == {"accepted": True, "pid": os.getpid(), "uid": os.geteuid(), "report": "r"}
    assert reasons(6) == [None] * 5 + ["rate_limited"]
    clock.now += 5.0  # half a report's worth: refused, and the refusal costs nothing
    assert reasons(1) == ["rate_limited"]
    clock.now += 5.0
    assert reasons(2) == [None, "rate_limited"]
    clock.now += 3600.0  # idle an hour: no more than the burst at once
    assert reasons(7) == [None] * 6 + ["rate_limited"]
    assert refused == ["rate_limited"] * 4


def test_a_report_not_whole_at_its_deadline_is_refused_then_and_not_before(
        bare: Callable[..., tuple[server.ReportServer, Clock, list[str]]], place: Path) -> None:
    served, clock, refused = bare(read_timeout=2.0)
    path = place / "bare.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
        slow.connect(str(path))
        slow.sendall(b"{")  # accepted at 1000.0: its deadline is 1002.0
        wait_until(lambda: len(served._conns) == 1, what="the slow connection read from")
        clock.now = 1001.999
        for _ in range(2):  # two reports answered: the server has looked at every deadline since the clock moved
            assert send(path, b"r\n")["accepted"] is True
        slow.setblocking(False)
        with pytest.raises(BlockingIOError):
            slow.recv(4096)
        slow.setblocking(True)
        slow.settimeout(10)
        clock.now = 1002.0
        answer = json.loads(slow.recv(4096))
    assert answer == {"accepted": False, "reason": "timeout", "detail": "no whole report within 2s"}
    assert refused == ["timeout"]


class CountingListener(socket.socket):
    """A listening socket that counts the connections the server tries to take."""

    tries = 0

    def accept(self) -> tuple[socket.socket, Any]:
        self.tries += 1
        return super().accept()


def test_out_of_descriptors_the_socket_says_so_once_and_serves_the_waiting_report_when_it_can(
        place: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = place / "bare.sock"
    listener = CountingListener(socket.AF_UNIX, socket.SOCK_STREAM, fileno=server.bind(str(path)).detach())
    served = server.ReportServer(listener, server.Limits(32, 4096, 10.0, 60),
                                 lambda peer, data: {"accepted": True, "report": data.decode()}, lambda reason: None)
    served.start()
    waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # made before this process runs out
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    taken: list[int] = []
    caplog.set_level(logging.INFO, logger="tpuwatch.jobreports.server")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as first:  # the socket's thread is serving
            first.settimeout(10)
            first.connect(str(path))
            first.sendall(b"first\n")
            assert first.makefile("rb").read() == b'{"accepted": true, "report": "first"}\n'  # and closed its end
        assert caplog.records == []  # nothing to say while all is well
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(int(fd) for fd in os.listdir("/proc/self/fd")) + 2, hard))
        with contextlib.suppress(OSError):
            while True:
                taken.append(os.dup(0))
        waiting.settimeout(10)
        waiting.connect(str(path))
        waiting.sendall(b"waiting\n")  # the whole report, sent while the daemon cannot take the connection
        wait_until(lambda: any("cannot accept" in r.getMessage() for r in caplog.records),
                   what="the daemon saying it cannot accept")
        tries, start = listener.tries, time.monotonic()
        wait_until(lambda: time.monotonic() - start > 3 * server.TICK_S, what="a few ticks out of descriptors")
        tries = listener.tries - tries
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        with waiting:
            answer = json.loads(waiting.recv(4096))  # served without another connection to wake the daemon
        assert send(path, b"after\n")["accepted"] is True
    finally:
        served.stop()
    assert answer == {"accepted": True, "report": "waiting"}
    assert tries <= 6  # once a tick, not at every wake-up: the listener, still readable, is set aside meanwhile
    said = [r.getMessage() for r in caplog.records if "cannot accept" in r.getMessage()]
    assert said == ["probe socket: cannot accept: Too many open files (trying again every 0.2s)"]  # once
    after = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO][1:]
    assert after == ["probe socket: accepting again"]  # once, not at every connection after
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def in_new_pid_namespace(function: str, *args: str) -> Any:
    """What this module's ``function`` returns (JSON) given ``args``, called by a new interpreter that runs as pid 1
    of a PID namespace of its own (a container's first process), through unshare(1).  Skipped only where unshare
    cannot make the namespace; the work's own failure fails the test."""
    unshare = require_tool("unshare")
    tried = subprocess.run([unshare, "--pid", "--fork", "true"], capture_output=True, text=True, timeout=60)
    if tried.returncode != 0:
        pytest.skip(f"cannot make a PID namespace here: {tried.stderr.strip()}")
    code = ("import json, os, sys; sys.path.insert(0, sys.argv[1]); import test_jobreports_socket as t; "
            "print(json.dumps({'pid': os.getpid(), 'out': getattr(t, sys.argv[2])(*sys.argv[3:])}))")
    done = subprocess.run([unshare, "--pid", "--fork", sys.executable, "-c", code, str(Path(__file__).parent),
                           function, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["pid"] == 1
    return out["out"]


def report_as_pid_1(place: str, procfs: str) -> dict[str, Any]:
    """Run in ``in_new_pid_namespace``: the daemon, whose namespace sees its own pid as 1, takes a report from it."""
    pods = Pods(PodRef(pod_uid="uid-1"))
    part = start_reports(Path(place), pods, Path(procfs), socket=f"{place}/pid1.sock")
    try:
        answer = send(Path(place) / "pid1.sock", line())
        jobs = [r.job for r in part.book.results()]
    finally:
        part.close()
    return {"accepted": answer["accepted"], "jobs": jobs, "asked": [pid for pid, _ in pods.asked]}


@needs_root
def test_the_first_process_of_the_daemon_s_pid_namespace_is_named_like_any_other(
        serve: Callable[..., JobReports], place: Path) -> None:
    procfs = fake_procfs(place, 1, [0, 1, 2, 3], comm="entrypoint")  # pid 1 as the daemon's namespace sees it
    fake_procfs(place, os.getpid(), [0, 1, 2, 3], comm="trainer")
    assert in_new_pid_namespace("report_as_pid_1", str(place), str(procfs)) == {
        "accepted": True, "jobs": ["pid 1 (entrypoint) in pod UID uid-1"], "asked": [1]}
    part = serve(pods=Pods(PodRef(pod_uid="uid-2")), procfs=procfs)  # and any other process alike
    assert send(place / "probe.sock", line())["accepted"] is True
    assert [r.job for r in part.book.results()] == [f"pid {os.getpid()} (trainer) in pod UID uid-2"]


def test_the_probe_sdc_drill_s_job_is_started_with_the_socket_and_stopped_at_close(
        serve: Callable[..., JobReports], place: Path) -> None:
    def drill_jobs() -> list[int]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"tpuwatch.probe.drill" in command and str(place / "probe.sock").encode() in command:
                    found.append(int(pid))
        return found

    part = serve(socket=str(place / "probe.sock"))
    assert drill_jobs() == []  # the simulated job is the probe-sdc scenario's only
    part.close()
    config = config_module.parse(yaml.safe_dump({
        "state_dir": str(place / "state"), "probe": {"socket": str(place / "probe.sock")},
        "devices": {"backend": "sim", "sim": {"scenario": "probe-sdc", "device_dir": str(place / "dev")}}}))
    board = Board()
    board.publish(readings(place), {})
    drilled = JobReports(config, CanaryCollector(config), board)
    try:
        [job] = wait_until(drill_jobs, what="the drill's simulated job")
    finally:
        drilled.close()
    assert not Path(f"/proc/{job}").exists()  # killed and reaped
    drilled.close()  # closing twice does nothing more
    assert not (place / "probe.sock").exists()


def test_the_socket_is_made_in_a_directory_made_for_it_and_served_by_a_daemon_thread_of_its_own(
        serve: Callable[..., JobReports], place: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = set(threading.enumerate())  # another test's socket thread may still be ending in this process
    umask = os.umask(0o002)  # a daemon whose group may write what it makes: the socket's directory stays 0755
    try:
        part = serve(socket=str(place / "run" / "tpuwatch" / "probe.sock"))  # /run/tpuwatch after a reboot
    finally:
        os.umask(umask)
    assert send(place / "run" / "tpuwatch" / "probe.sock", line())["accepted"] is True
    assert (place / "run" / "tpuwatch").stat().st_mode & 0o777 == 0o755
    [thread] = [t for t in threading.enumerate() if t.name == "tpuwatch-probe-socket" and t not in before]
    assert thread.daemon  # the daemon's exit never waits on a connection
    part.close()
    assert not thread.is_alive()
    monkeypatch.chdir(place)
    server.bind("here.sock").close()  # a path without a directory: the current one
    assert sorted(p.name for p in place.iterdir()) == ["dev", "here.sock", "run", "state"]



def test_a_report_the_daemon_fails_to_handle_is_closed_unanswered_said_once_and_the_socket_serves_on(
        place: Path, caplog: pytest.LogCaptureFixture) -> None:
    def handle(peer: server.Peer, data: bytes) -> dict[str, Any]:
        if data == b"disk full":
            raise OSError(errno.ENOSPC, "No space left on device")  # writing the chips' history, say
        return {"accepted": True}

    path = place / "bare.sock"
    served = server.ReportServer(server.bind(str(path)), server.Limits(32, 4096, 30.0, 60), handle,
                                 lambda reason: None)
    served.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)  # well before the read deadline (30 s)
            conn.connect(str(path))
            conn.sendall(b"disk full\n")
            assert conn.recv(4096) == b""  # closed, without an answer it could take for a verdict
        assert send(path, b"fine\n") == {"accepted": True}
    finally:
        served.stop()
    assert [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("ERROR", f"probe socket: cannot handle the report of pid {os.getpid()} (closed without an answer)", True)]


def test_the_socket_s_thread_outlives_an_error_of_its_own_and_serves_on(
        place: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def refuse(reason: str) -> None:  # the part's counter: failing once
        calls.append(reason)
        if len(calls) == 1:
            raise RuntimeError("the counter failed")

    path = place / "bare.sock"
    served = server.ReportServer(server.bind(str(path)), server.Limits(32, 64, 30.0, 60),
                                 lambda peer, data: {"accepted": True}, refuse)
    served.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as first:
            first.connect(str(path))
            first.sendall(b"x" * 100)  # oversized: its refusal fails (not waited for: it may never be answered)
        wait_until(lambda: caplog.records, what="the error said")
        assert send(path, b"x" * 100) == {"accepted": False, "reason": "oversized", "detail": "over 64 bytes"}
        assert send(path, b"fine\n") == {"accepted": True}
    finally:
        served.stop()
    assert calls == ["oversized", "oversized"]
    assert [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("ERROR", "probe socket: unexpected error, serving on", True)]


def test_stopping_waits_5_s_at_most_for_a_thread_stuck_in_a_report(place: Path) -> None:
    entered, release = threading.Event(), threading.Event()

    def handle(peer: server.Peer, data: bytes) -> dict[str, Any]:
        entered.set()
        release.wait(30)  # a judge stuck on a hung filesystem, say
        return {"accepted": True}

    path = place / "bare.sock"
    served = server.ReportServer(server.bind(str(path)), server.Limits(32, 4096, 30.0, 60), handle,
                                 lambda reason: None)
    served.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(path))
        conn.sendall(b"stuck\n")
        assert entered.wait(10)
        start = time.monotonic()
        served.stop()  # the daemon's shutdown: it must not hang on the stuck thread
        took = time.monotonic() - start
        release.set()
        served._thread.join(10)
    assert 4.9 <= took < 5.6
    assert served.listener.fileno() == -1  # closed all the same
