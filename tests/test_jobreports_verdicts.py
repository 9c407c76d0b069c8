"""The daemon's side of in-job reports, pure: which chips a process holds, and reports judged against the host's
other recent reports (tpuwatch/jobreports/chips.py and verdicts.py).  Reports are composed here in the shape
tpuwatch.probe writes (tests/test_probe_e2e.py sends real ones through the socket)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tpuwatch.jobreports import chips
from tpuwatch.jobreports.chips import chip_files, held_by, resolve
from tpuwatch.jobreports.message import Refused, Report, parse
from tpuwatch.jobreports.verdicts import Judge

FP, ODD = "479b034ebb20dd7c", "0123456789abcdef"
HOST = {"0", "1", "2", "3"}


def report(devices: list[str], fingerprint: str = FP, **changes: Any) -> Report:
    doc: dict[str, Any] = {
        "version": 1, "model": "attn-mlp-v1", "platform": "cpu", "chip": "cpu", "stack": "jax 0.10.2, cpu",
        "dtype": "float32", "scale": 3.25, "named_by": "env",
        "results": [{"device": d, "finite": True, "max_abs_error": 1e-6, "fingerprint": fingerprint}
                    for d in devices], "drill": None}
    return parse(json.dumps({**doc, **changes}).encode())


# --- which chips a process holds ----------------------------------------------------------------------------------


def _process(procfs: Path, pid: int, targets: list[str]) -> None:
    fd = procfs / str(pid) / "fd"
    fd.mkdir(parents=True)
    for n, target in enumerate(targets):
        os.symlink(target, fd / str(n))


FILES = {"0": frozenset({"/dev/accel0"}), "1": frozenset({"/dev/accel1"}), "2": frozenset({"/dev/vfio/2"})}


def test_a_process_holds_the_chips_whose_device_files_it_has_open_in_the_inventorys_order(tmp_path: Path) -> None:
    _process(tmp_path, 42, ["socket:[99]", "/dev/vfio/2", "/dev/null", "/dev/accel0"])
    assert held_by(str(tmp_path), 42, FILES) == ["0", "2"]
    assert held_by(str(tmp_path), 43, FILES) == []  # gone, or not ours to see
    _process(tmp_path, 1, ["/dev/accel1"])  # pid 1 of the host's namespace is a process like any other
    assert held_by(str(tmp_path), 1, FILES) == ["1"]


def test_a_process_outside_our_pid_namespace_holds_nothing(tmp_path: Path) -> None:
    _process(tmp_path, 0, ["/dev/accel0"])  # pid 0: a peer the kernel cannot name to us
    assert held_by(str(tmp_path), 0, FILES) == []


def test_only_so_many_descriptors_of_one_process_are_looked_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _process(tmp_path, 42, ["/dev/accel0", "/dev/accel1", "/dev/vfio/2"])
    monkeypatch.setattr(chips, "MAX_FDS", 2)
    assert len(held_by(str(tmp_path), 42, FILES)) == 2


def test_a_chips_device_files_are_under_the_dev_root() -> None:
    class Reading:
        device, device_files = "3", ("accel3", "vfio/3")

    assert chip_files([Reading()], "/host/dev") == {"3": frozenset({"/host/dev/accel3", "/host/dev/vfio/3"})}  # type: ignore[list-item]


def test_what_a_refusal_of_chips_says() -> None:
    with pytest.raises(Refused) as refused:
        resolve(report(["1", "2"]), 1000, 42, ["0"], HOST)
    assert (refused.value.reason, refused.value.detail) == (
        "not_holder", "pid 42 holds chip(s) 0; the report is about chip(s) 1, 2")
    with pytest.raises(Refused) as refused:
        resolve(report(["1"]), 1000, 42, [], HOST)
    assert refused.value.detail == "pid 42 holds no chip; the report is about chip(s) 1"
    with pytest.raises(Refused) as refused:
        resolve(report(["9", "1", "7"]), 0, 42, [], HOST)
    assert (refused.value.reason, refused.value.detail) == ("unknown_chip", "no chip 7, 9 on this host")
    with pytest.raises(Refused) as refused:  # root, but from a pid we cannot see: not trusted
        resolve(report(["1"]), 0, 0, [], HOST)
    assert refused.value.reason == "not_holder"
    assert resolve(report(["1"]), 0, 42, [], HOST) == {"1": "1"}
    assert resolve(report(["1"]), 0, 1, [], HOST) == {"1": "1"}
    with pytest.raises(Refused) as refused:
        resolve(report(["10", "9"]), 0, 42, [], HOST)
    assert refused.value.detail == "no chip 9, 10 on this host"  # in chip order


def test_chips_named_by_order_are_mapped_in_their_numeric_order() -> None:
    named = report(["10", "9"], named_by="ordinal")
    assert resolve(named, 1000, 42, ["2", "3"], HOST) == {"9": "2", "10": "3"}


# --- reports judged with the host's other recent reports -----------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _judge(tmp_path: Path, window: float = 60.0) -> tuple[Judge, Clock]:
    clock = Clock()
    return Judge(str(tmp_path), window, clock=clock), clock


def test_a_report_is_judged_on_the_host_chips_it_was_mapped_to_and_names_its_job(tmp_path: Path) -> None:
    judge, _ = _judge(tmp_path)
    result = judge.judge(report(["0", "1"]), {"0": "2", "1": "3"}, "pid 42 (train)", HOST)
    assert (result.status, result.path, result.job) == ("pass", "job", "pid 42 (train)")
    assert [(o.device, o.status) for o in result.devices] == [("2", "pass"), ("3", "pass")]


def test_a_chip_alone_in_its_report_is_compared_with_other_jobs_chips_of_the_same_stack(tmp_path: Path) -> None:
    judge, clock = _judge(tmp_path)
    judge.judge(report(["0", "1"]), {"0": "0", "1": "1"}, "pid 1", HOST)
    clock.now += 60  # within the window, its edge included
    odd = judge.judge(report(["2"], ODD), {"2": "2"}, "pid 2", HOST)
    assert odd.status == "fail" and odd.devices[0].device == "2"
    assert odd.devices[0].reason == f"fingerprint {ODD} differs from {FP} on 2 of 3 chips"


def test_other_jobs_reports_count_only_within_the_window_on_the_same_stack_and_chips_of_the_host(
        tmp_path: Path) -> None:
    judge, clock = _judge(tmp_path)
    judge.judge(report(["0", "1"]), {"0": "0", "1": "1"}, "pid 1", HOST)
    other = report(["2"], ODD, stack="jax 0.10.3, cpu")
    assert judge.judge(other, {"2": "2"}, "pid 2", HOST).status == "pass"  # another stack: no peers
    assert judge.judge(report(["2"], ODD), {"2": "2"}, "pid 2", {"2", "3"}).status == "pass"  # 0, 1 gone
    judge.judge(report(["0", "1"]), {"0": "0", "1": "1"}, "pid 1", HOST)
    clock.now += 60.5
    assert judge.judge(report(["3"], ODD), {"3": "3"}, "pid 3", HOST).status == "pass"  # too old


def test_a_drill_is_judged_but_leaves_no_peers_and_no_history(tmp_path: Path) -> None:
    judge, _ = _judge(tmp_path)
    drilled = judge.judge(report(["0", "1"], ODD, drill={"kind": "bitflip", "device": "1"}),
                          {"0": "0", "1": "1"}, "pid 1", HOST)
    assert drilled.drill is not None and (drilled.drill.kind, drilled.drill.device) == ("bitflip", "1")
    assert judge.history.read()[0] == {}  # nothing learned from a drill
    assert judge.judge(report(["2"]), {"2": "2"}, "pid 2", HOST).status == "pass"  # the drill's chips: no peers


def test_a_chip_that_failed_is_no_peer_of_later_reports(tmp_path: Path) -> None:
    judge, _ = _judge(tmp_path)
    three = report(["0", "1", "2"])
    three = Report(**{**three.__dict__, "results": (*three.results[:2], {**three.results[2], "fingerprint": ODD})})
    assert judge.judge(three, {"0": "0", "1": "1", "2": "2"}, "pid 1", HOST).status == "fail"
    later = judge.judge(report(["3"], ODD), {"3": "3"}, "pid 3", HOST)  # the failed chip's answer is not a vote
    assert later.devices[0].reason == f"fingerprint {ODD} differs from {FP} on 2 of 3 chips"


def test_reports_from_another_kind_of_chip_are_no_peers(tmp_path: Path) -> None:
    judge, _ = _judge(tmp_path)
    judge.judge(report(["0", "1"], chip="TPU v5 lite"), {"0": "0", "1": "1"}, "pid 1", HOST)
    assert judge.judge(report(["2"], ODD), {"2": "2"}, "pid 2", HOST).status == "pass"
