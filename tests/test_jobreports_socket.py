"""The daemon's probe socket (tpuwatch.jobreports) over a real Unix socket: who may report, and every refusal.

The peers are real processes: this one (root in CI), and children that drop to nobody (uid 65534) after a
fork, so SO_PEERCRED names them as the kernel sees them.  The chips are simulated ones whose device files
live in a temporary directory; a process holds a chip by keeping its file open.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_jobreports_message import report

from tpuwatch import config as config_module
from tpuwatch.canary.collector import CanaryCollector
from tpuwatch.devices.base import DeviceReading
from tpuwatch.devices.inventory import Board
from tpuwatch.jobreports.collector import JobReports
from tpuwatch.probe.channel import exchange

from conftest import wait_until

NOBODY = 65534
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
    return [DeviceReading(str(chip), "v5e", device_files=(f"{place}/dev/accel{chip}",)) for chip in range(4)]


@pytest.fixture
def serve(place: Path) -> Iterator[Callable[..., JobReports]]:
    """Start the daemon's side of the socket with ``probe`` settings; stopped at teardown."""
    made: list[JobReports] = []

    def start(**probe: Any) -> JobReports:
        config = config_module.parse(yaml.safe_dump({
            "state_dir": str(place / "state"), "probe": {"socket": str(place / "probe.sock"), **probe}}))
        chips = Board()  # the cycle's inventory, as the devices stage publishes it
        chips.publish(readings(place), {})
        made.append(JobReports(config, CanaryCollector(config), chips))
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


def test_a_stale_socket_is_replaced_and_a_live_one_kept(place: Path, serve: Callable[..., JobReports]) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(place / "probe.sock"))  # left by a daemon killed with -9: bound, nobody listening
    stale.close()
    first = serve()
    second = serve()  # a second daemon on the same path: it must not steal the first's socket
    assert second.problem is not None and "another process listens there" in second.problem
    assert {s.name: s.value for s in second.collect()}["tpuwatch_probe_socket_up"] == 0
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
    wait_until(lambda: part._server is not None and not part._server._conns, what="the empty connections gone")
    assert set(rejected(part).values()) == {0} and accepted(part) == 0


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
