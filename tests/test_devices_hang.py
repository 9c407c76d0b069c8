"""Hung TPU cores: the runtime status parsed on literal answers, the pure detector, the backend against a real
RuntimeMetricService (tests/fakelibtpu.py) serving GetTpuRuntimeStatus, the daemon raising and clearing
AcceleratorHung, and the --simulate hung drill."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from fakelibtpu import HUNG_QUEUED, Runtime, serving
from test_devices_tpu import _holds, make_config, make_host
from tpu_info.proto import tpu_metric_service_pb2 as pb2

from tpuwatch.config import Config, DevicesConfig, HangConfig
from tpuwatch.devices.base import reading_samples
from tpuwatch.devices.hang import Observation, Track, judge
from tpuwatch.devices.progress import ChipStatus
from tpuwatch.devices.runtime import MalformedMetric
from tpuwatch.devices.tpu import TpuBackend
from tpuwatch.devices.tpustatus import MESSAGE_MAX, fold_status, parse_status
from tpuwatch.drills.needs import blocked_drill
from tpuwatch.drills.simulate import DRILL_HANG_AFTER_S, simulated
from tpuwatch.health import device_problems
from tpuwatch.schema import ConfigError, build

from conftest import DaemonProcess, run_cli, wait_until

TC = "TPU_CORE_TYPE_TENSOR_CORE"


# --- the answer, parsed ------------------------------------------------------------------------------

def status(*cores: tuple[int, int, int, int, int, str | None]) -> Any:
    """A GetTpuRuntimeStatusResponse of (global core, chip id, pc, run id, queued, error) cores."""
    answer = pb2.GetTpuRuntimeStatusResponse(host_name="t1v-n-0")
    for core, chip, pc, run, queued, error in cores:
        summary = answer.core_states[core]
        summary.core_id.global_core_id, summary.core_id.chip_id = core, chip
        summary.core_id.core_on_chip.type, summary.core_id.core_on_chip.index = 1, 0
        summary.sequencer_info.add(sequencer_type=1, sequencer_index=0, pc=pc, program_id=7, run_id=run)
        summary.sequencer_info.add(sequencer_type=4, sequencer_index=1, pc=pc + 1, program_id=7, run_id=run)
        for q in range(queued):
            summary.queued_program_info.add(run_id=run + q + 1, launch_id=q, program_fingerprint=b"\xab")
        if error is not None:
            summary.error_message = error
    return answer


def test_each_core_gives_its_sequencers_queued_programs_and_error() -> None:
    cores = parse_status(status((1, 0, 0x40, 3, 2, "  halted:\n  assertion\tfailed "), (0, 0, 0x41, 3, 0, None)))
    assert [c.core for c in cores] == [0, 1], "in core id order, as tpu-info reads them"
    assert cores[1].positions == ((1, 1, 0, 0x40, 7, 3), (1, 4, 1, 0x41, 7, 3))
    assert (cores[1].queued, cores[1].error, cores[0].error) == (2, "halted: assertion failed", None)
    assert cores[0].tensor_core


def test_an_empty_or_long_error_message_is_none_or_cut() -> None:
    (empty,) = parse_status(status((0, 0, 1, 1, 0, "   ")))
    (long,) = parse_status(status((0, 0, 1, 1, 0, "x" * 5000)))
    assert empty.error is None
    assert long.error is not None and len(long.error) == MESSAGE_MAX and long.error.endswith("...")


def test_an_answer_that_is_not_libtpus_shape_is_refused() -> None:
    answer = status((0, 0, 1, 1, 0, None))
    for _ in range(70):
        answer.core_states[0].sequencer_info.add(pc=1)
    with pytest.raises(MalformedMetric, match="sequencers"):
        parse_status(answer)
    with pytest.raises(MalformedMetric, match="chip -2"):
        parse_status(status((0, -2, 1, 1, 0, None)))


def test_chips_are_numbered_by_rank_of_chip_id() -> None:
    folded = fold_status(parse_status(status((0, 8, 1, 1, 0, None), (1, 9, 1, 1, 3, "bad"), (2, 12, 1, 1, 0, None))))
    assert sorted(folded) == [0, 1, 2]
    assert folded[1].queued == 3 and folded[1].errors == ((1, "bad"),)


def test_tpu7x_answers_per_device_and_two_devices_make_a_chip() -> None:
    cores = parse_status(status(*[(d, d, 0x10 + d, 1, d % 2, "e" if d == 3 else None) for d in range(8)]))
    folded = fold_status(cores, per_device=2)
    assert sorted(folded) == [0, 1, 2, 3]
    assert [c for c, *_ in folded[1].positions] == [2, 2, 3, 3] and folded[1].queued == 1
    assert folded[1].errors == ((3, "e"),)
    # A status that names physical chips (both TensorCores under one chip id) is taken as it is.
    paired = parse_status(status(*[(d, d // 2, 1, 1, 0, None) for d in range(8)]))
    assert sorted(fold_status(paired, per_device=2)) == [0, 1, 2, 3]


# --- the detector --------------------------------------------------------------------------------------

HANG = HangConfig(after=600.0)
HOLDER = (4101, "python3")


def frozen(queued: int = 2, pc: int = 0x517) -> ChipStatus:
    return ChipStatus(positions=((0, 1, 0, pc, 7, 3),), queued=queued)


def run(observations: list[Observation], step: float = 60.0,
        config: HangConfig = HANG) -> list[Any]:
    """The verdicts of one chip's reads, ``step`` seconds apart."""
    track: Track | None = None
    verdicts = []
    for i, obs in enumerate(observations):
        track, verdict = judge(track, obs, 1000.0 + i * step, config)
        verdicts.append(verdict)
    return verdicts


def test_a_frozen_core_with_programs_queued_is_hung_after_the_configured_time() -> None:
    verdicts = run([Observation(HOLDER, frozen(), utilization=0.0, hlo_executions=0.0)] * 12)
    assert [v.hung for v in verdicts] == [False] * 10 + [True] * 2
    assert [v.stalled_seconds for v in verdicts[8:]] == [480.0, 540.0, 600.0, 660.0]
    assert verdicts[-1].evidence == ("duty_cycle", "hlo_execution", "sequencers")
    assert (verdicts[-1].pid, verdicts[-1].command, verdicts[-1].queued) == (4101, "python3", 2)


def test_progress_resets_the_stall() -> None:
    moving = [Observation(HOLDER, frozen(pc=pc), utilization=0.0) for pc in (1, 1, 1, 2, 2, 2)]
    verdicts = run(moving, step=300.0)
    assert [v.stalled_seconds for v in verdicts] == [0.0, 300.0, 600.0, 0.0, 300.0, 600.0]
    assert [v.hung for v in verdicts] == [False, False, True, False, False, True]


def test_an_idle_chip_with_nothing_queued_is_not_hung() -> None:
    verdicts = run([Observation(HOLDER, frozen(queued=0), utilization=0.0, hlo_queue=0.0)] * 20)
    assert not any(v.hung for v in verdicts) and all(v.stalled_seconds == 0 for v in verdicts)


def test_a_chip_without_a_holder_is_not_judged() -> None:
    assert run([Observation(None, frozen(), utilization=0.0)] * 20) == [None] * 20


def test_absent_signals_count_neither_way() -> None:
    assert run([Observation(HOLDER)] * 20) == [None] * 20, "nothing to judge: no verdict, no metric"
    # Only the queue is known: work waits, but no signal says whether the chip moves.
    assert not any(v.hung for v in run([Observation(HOLDER, hlo_queue=4.0)] * 20))
    # An older libtpu (no status): the metrics alone, with the HLO queue as the work waiting.
    verdicts = run([Observation(HOLDER, utilization=0.0, hlo_queue=4.0)] * 12)
    assert verdicts[-1].hung and verdicts[-1].evidence == ("duty_cycle",)


def test_without_evidence_of_queued_work_a_quiet_chip_is_not_hung_unless_configured() -> None:
    quiet = [Observation(HOLDER, utilization=0.0)] * 12
    assert not any(v.hung for v in run(quiet))
    assert run(quiet, config=dataclasses.replace(HANG, require_queued=False))[-1].hung


def test_a_signal_turned_off_is_not_asked() -> None:
    busy_looking = [Observation(HOLDER, frozen(), utilization=0.9)] * 12
    assert not any(v.hung for v in run(busy_looking))
    assert run(busy_looking, config=dataclasses.replace(HANG, duty_cycle=False))[-1].hung


def test_tensorcore_idle_time_growing_is_a_stall_and_going_down_is_progress() -> None:
    growing = [Observation(HOLDER, hlo_queue=1.0, idle_seconds=60.0 * i) for i in range(12)]
    verdicts = run(growing)
    assert verdicts[-1].hung and verdicts[-1].evidence == ("tensorcore_idle",)
    reset = run([Observation(HOLDER, hlo_queue=1.0, idle_seconds=s) for s in (0, 60, 120, 5, 65)])
    assert [v.stalled_seconds for v in reset] == [0.0, 60.0, 120.0, 0.0, 60.0]
    unchanged = run([Observation(HOLDER, hlo_queue=1.0, idle_seconds=30.0)] * 20)
    assert all(v.stalled_seconds == 0 for v in unchanged), "a value the runtime did not update says nothing"


def test_hlo_executions_counting_on_is_progress() -> None:
    counting = run([Observation(HOLDER, frozen(), utilization=0.0, hlo_executions=float(i)) for i in range(1, 15)])
    assert not any(v.hung for v in counting)


def test_another_process_on_the_chip_starts_afresh() -> None:
    track: Track | None = None
    for i in range(12):
        track, verdict = judge(track, Observation(HOLDER, frozen(), utilization=0.0), 60.0 * i, HANG)
    assert verdict is not None and verdict.hung
    _, verdict = judge(track, Observation((4242, "python3"), frozen(), utilization=0.0), 60.0 * 12, HANG)
    assert verdict is not None and not verdict.hung and verdict.pid == 4242


def test_the_hang_settings_are_validated_and_shortened_for_the_drill() -> None:
    with pytest.raises(ConfigError, match="devices.hang: enabled with every signal off"):
        build(Config, {"devices": {"hang": {"sequencers": False, "duty_cycle": False, "tensorcore_idle": False,
                                            "hlo_execution": False}}})
    with pytest.raises(ConfigError, match="devices.hang.after"):
        build(Config, {"devices": {"hang": {"after": "0s"}}})
    assert simulated(Config(), "hung").devices.hang.after == DRILL_HANG_AFTER_S
    quick = Config(devices=DevicesConfig(hang=HangConfig(after=5.0)))
    assert simulated(quick, "hung").devices.hang.after == 5.0
    assert simulated(Config(), "overheat").devices.hang.after == 600.0
    off = Config(devices=DevicesConfig(hang=HangConfig(enabled=False)))
    blocked = blocked_drill(simulated(off, "hung"))
    assert blocked is not None and blocked.sentence() == (
        "fire drill hung cannot run: it needs the hang detector, and devices.hang.enabled is false")


# --- the backend against a real RuntimeMetricService ----------------------------------------------------

@pytest.fixture
def serve() -> Iterator[Any]:
    yield from serving()


def test_the_status_lands_on_its_chips_with_the_error_as_a_problem(tmp_path: Path, serve: Any) -> None:
    runtime = Runtime("v5e", "busy", status="error", status_chips=(0, 1, 2, 3))
    readings = TpuBackend(make_config(make_host(tmp_path, "v5e", chips=4), [serve(runtime)])).read()
    assert [r.runtime_status.queued if r.runtime_status else None for r in readings] == [1, 1, 1, 1]
    assert readings[0].runtime_status is not None and readings[0].runtime_status.errors == (
        (0, "TensorCore 0 halted: program 7 failed an assertion"),)
    assert readings[0].sources["runtime_status"].startswith("libtpu:localhost:")
    assert device_problems(readings) == [
        "device 0 (v5e, pci 0000:00:04.0): libtpu runtime reports an error on core 0: "
        "TensorCore 0 halted: program 7 failed an assertion"]
    errors = [dict(s.labels) for s in reading_samples(readings[0], "tpu")
              if s.name == "tpuwatch_device_runtime_error_info"]
    assert errors == [{"core": "0", "device": "0", "message": "TensorCore 0 halted: program 7 failed an assertion"}]


def test_tpu7x_status_per_device_is_folded_two_per_chip(tmp_path: Path, serve: Any) -> None:
    runtime = Runtime("7x", "busy", status="hung", status_chips=tuple(range(8)))
    readings = TpuBackend(make_config(make_host(tmp_path, "7x", chips=4), [serve(runtime)])).read()
    assert [r.runtime_status.queued if r.runtime_status else None for r in readings] == [2 * HUNG_QUEUED] * 4
    assert readings[1].runtime_status is not None
    assert [p[0] for p in readings[1].runtime_status.positions] == [2, 3], "chip 1 holds devices 2 and 3"


def test_a_runtime_without_the_status_rpc_is_asked_once(tmp_path: Path, serve: Any,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    runtime = Runtime("v5e", "busy")  # status None: GetTpuRuntimeStatus answers UNIMPLEMENTED
    backend = TpuBackend(make_config(make_host(tmp_path, "v5e", chips=4), [serve(runtime)]))
    with caplog.at_level(logging.INFO, logger="tpuwatch.devices.libtpu"):
        for _ in range(3):
            readings = backend.read()
    assert runtime.calls["GetTpuRuntimeStatus"] == 1
    assert all(r.runtime_status is None and r.memory_used_bytes for r in readings), "metrics still read"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("has no GetTpuRuntimeStatus" in r.message for r in caplog.records) == 1


def test_garbage_and_slow_status_answers_are_bounded_and_survived(tmp_path: Path, serve: Any,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    paths = make_host(tmp_path, "v5e", chips=4)
    garbage = TpuBackend(make_config(paths, [serve(Runtime(), raw=b"\xff\xfe not a protobuf")]))
    with caplog.at_level(logging.WARNING, logger="tpuwatch.devices.libtpu"):
        for _ in range(3):
            assert all(r.runtime_status is None for r in garbage.read())
    slow = TpuBackend(make_config(paths, [serve(Runtime(status="hung", mode="slow"))], timeout=0.3))
    started = time.monotonic()
    assert all(r.runtime_status is None for r in slow.read())
    assert time.monotonic() - started < 1.5, "the status call shares the read's deadline"


# --- the daemon ------------------------------------------------------------------------------------------

def alerts(daemon: DaemonProcess) -> list[dict[str, Any]]:
    answer: list[dict[str, Any]] = requests.get(f"{daemon.url}/api/alerts", timeout=5).json()["alerts"]
    return answer


def hung_alerts(daemon: DaemonProcess) -> list[dict[str, Any]]:
    return [a for a in alerts(daemon) if a["labels"]["alertname"] == "AcceleratorHung" and a["state"] == "firing"]


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def hold(path: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-c", "import sys; f = open(sys.argv[1]); sys.stdin.read()",
                                    path], stdin=subprocess.PIPE)
        started.append(process)
        wait_until(lambda: _holds(process.pid, path), what="the holder to open its chip")
        return process

    yield hold
    for process in started:
        process.kill()
        process.wait()


def test_the_daemon_raises_acceleratorhung_for_the_held_chip_and_clears_it(
        tmp_path: Path, serve: Any, holder: Any, start_daemon: Callable[..., DaemonProcess]) -> None:
    paths = make_host(tmp_path, "v5e", chips=2)
    runtime = Runtime("v5e", "busy", status="healthy", status_chips=(0, 1), ids={0, 1})
    address = serve(runtime)
    job = holder(f"{paths.dev}/vfio/10")  # holds chip 0; chip 1 is held by nobody
    daemon = start_daemon({
        "interval": "500ms", "collector_timeout": "450ms", "canary": {"enabled": False},
        "kernel_log": {"source": "none"}, "alerting": {"group_wait": "0s"},
        "paths": {"sysfs": paths.sysfs, "dev": paths.dev}, "host": {"holder_scan_interval": "1s"},
        "devices": {"backend": "tpu", "tpu": {"metrics_addr": [address], "call_timeout": "300ms"},
                    "hang": {"after": "2s"}}})
    daemon.wait_ready()

    def hung_series() -> dict[str, str]:
        lines = requests.get(f"{daemon.url}/metrics", timeout=5).text.splitlines()
        return {line.split("} ")[0]: line.split("} ")[1] for line in lines if line.startswith("tpuwatch_device_hung{")}

    wait_until(lambda: any('device="0"' in k for k in hung_series()), timeout=30, what="chip 0 judged")
    assert all('device="1"' not in k for k in hung_series()), "a chip without a holder is not judged"
    runtime.status = "hung"
    runtime.use("v5e", "idle")
    frozen_at = time.monotonic()
    (alert,) = wait_until(lambda: hung_alerts(daemon), timeout=30, what="AcceleratorHung")
    assert time.monotonic() - frozen_at >= 2.0, "not before devices.hang.after"
    assert {"device": "0", "pid": str(job.pid), "severity": "critical"}.items() <= alert["labels"].items()
    assert alert["annotations"]["summary"].startswith("Accelerator chip 0 (0000:00:04.0) hung: process "
                                                      f"{job.pid} (")
    assert [a for a in hung_alerts(daemon) if a["labels"]["device"] == "1"] == []
    status = requests.get(f"{daemon.url}/healthz", timeout=5).json()["checks"]["devices"]["problems"]
    assert any(p.startswith("device 0 (v5e, pci 0000:00:04.0): hung: no progress for") and f"process {job.pid}" in p
               for p in status), status
    runtime.status = "healthy"  # progress resumes
    runtime.use("v5e", "busy")
    wait_until(lambda: not hung_alerts(daemon), timeout=30, what="AcceleratorHung to resolve")
    runtime.status = "idle"  # stopped with nothing queued: idle, not hung
    runtime.use("v5e", "idle")
    wait_until(lambda: hung_series().get(
        f'tpuwatch_device_hung{{command="{alert["labels"]["command"]}",container="",device="0",namespace="",'
        f'pid="{job.pid}",pod=""') == "0.0", timeout=30, what="chip 0 judged again")
    idle_since = time.monotonic()
    wait_until(lambda: time.monotonic() - idle_since > 4.0, timeout=10, what="twice devices.hang.after")
    assert not hung_alerts(daemon), "an idle chip is not hung"


def test_the_hung_drill_fires_on_the_faulty_chip_only(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon({"interval": "200ms", "collector_timeout": "150ms", "canary": {"enabled": False},
                           "kernel_log": {"source": "none"},
                           "devices": {"sim": {"count": 4, "fault_device": 2, "fault_after": "1s"},
                                       "hang": {"after": "1s"}}}, args=["--simulate", "hung"])
    daemon.wait_ready()
    (alert,) = wait_until(lambda: hung_alerts(daemon), timeout=30, what="the drill's AcceleratorHung")
    assert {"device": "2", "pid": "4102", "command": "python3"}.items() <= alert["labels"].items()
    page = requests.get(f"{daemon.url}/", timeout=5).text
    assert "hung: no progress for" in page and "held by process 4102 (python3)" in page, "the status page names it"
    assert [a["labels"]["device"] for a in hung_alerts(daemon)] == ["2"]


def test_check_names_the_runtime_error(tmp_path: Path, serve: Any) -> None:
    paths = make_host(tmp_path, "v5e", chips=1)
    address = serve(Runtime("v5e", "busy", status="error", status_chips=(0,), ids={0}))
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"paths": {"sysfs": paths.sysfs, "dev": paths.dev}, "kernel_log": {"source": "none"},
                                  "canary": {"enabled": False},
                                  "devices": {"backend": "tpu", "tpu": {"metrics_addr": [address]}}}))
    result = run_cli("check", "--json", "--config", str(config))
    assert result.returncode == 1, result.stderr
    problems = json.loads(result.stdout)["problems"]
    assert "device 0 (v5e, pci 0000:00:04.0): libtpu runtime reports an error on core 0: " \
           "TensorCore 0 halted: program 7 failed an assertion" in problems
