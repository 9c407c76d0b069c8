"""The canary's pure parts: the verdict and the drills' from captured worker output, tolerances, holds, the collector,
the CLI's report and progress line."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tpuwatch.canary import holds, model, spec, worker
from tpuwatch.canary.cli import ProgressLine, render
from tpuwatch.canary.collector import CanaryCollector
from tpuwatch.canary.judge import KEPT_STACKS, Drill, judge
from tpuwatch.canary.runner import Progress
from tpuwatch.catalog import CATALOG
from tpuwatch.config import Config

from conftest import require_tool

DATA = Path(__file__).parent / "testdata" / "canary"
ALERTS = Path(__file__).parent.parent / "alerts"
CLEAN_FP = "0a98d6364a9cd7c3"
STACK = "jax 0.10.2, jaxlib 0.10.2, cpu"


def lines(name: str) -> list[dict]:
    """A captured worker run (tests/testdata/canary/NAME.jsonl)."""
    return [json.loads(text) for text in (DATA / f"{name}.jsonl").read_text().splitlines()]


def statuses(result) -> dict[str, str]:
    return {d.device: d.status for d in result.devices}


def test_clean_run_passes_and_stores_every_fingerprint() -> None:
    result, history = judge(lines("clean"), None, {})
    assert (result.status, result.reason) == ("pass", None)
    assert statuses(result) == {"0": "pass", "1": "pass", "2": "pass", "3": "pass"}
    assert result.devices[0].fingerprint == CLEAN_FP and result.devices[0].max_abs_error < result.tolerance
    assert history == {f"attn-mlp-v1|float32|cpu|{STACK}": {d: CLEAN_FP for d in "0123"}}


def test_bitflip_is_caught_by_the_peers_only_on_its_chip() -> None:
    result, history = judge(lines("bitflip-2"), None, {})
    assert result.status == "fail"
    assert statuses(result) == {"0": "pass", "1": "pass", "2": "fail", "3": "pass"}
    flipped = result.devices[2]
    assert flipped.check == "peers" and f"differs from {CLEAN_FP} on 3 of 4 chips" in flipped.reason
    assert flipped.max_abs_error < result.tolerance  # within tolerance: only the bits tell
    assert "2" not in next(iter(history.values()))


def test_a_changed_fingerprint_fails_the_history_check() -> None:
    _, history = judge(lines("clean"), None, {})
    key = next(iter(history))
    result, after = judge(lines("clean"), None, {key: {**history[key], "1": "ffffffffffffffff"}})
    assert statuses(result) == {"0": "pass", "1": "fail", "2": "pass", "3": "pass"}
    assert result.devices[1].check == "history" and "changed since the last pass (ffffffffffffffff)" \
        in result.devices[1].reason
    assert after[key]["1"] == "ffffffffffffffff"  # a failing chip never overwrites its last good fingerprint


def test_history_of_another_stack_is_not_compared() -> None:
    result, _ = judge(lines("clean"), None, {"attn-mlp-v1|float32|cpu|jax 0.4.0": {"1": "ffffffffffffffff"}})
    assert result.status == "pass"


def test_nan_fails_the_reference_check() -> None:
    result, _ = judge(lines("nan-1"), None, {})
    assert statuses(result) == {"0": "pass", "1": "fail", "2": "pass", "3": "pass"}
    assert (result.devices[1].check, result.devices[1].max_abs_error) == ("reference", None)
    assert result.devices[1].reason.startswith("output has NaN or Inf")


def test_an_error_over_the_tolerance_fails_the_reference_check() -> None:
    run = lines("clean")
    for line in run:
        if line["event"] == "result":
            line["max_abs_error"] = 0.01
    result, _ = judge(run, None, {})
    assert result.status == "fail" and {d.check for d in result.devices} == {"reference"}
    assert "max abs error 0.01 > tolerance 0.000798" in result.devices[0].reason


def test_a_crash_names_the_chip_it_died_on_and_skips_the_rest() -> None:
    result, _ = judge(lines("crash-1"), "worker crashed with SIGSEGV", {})
    assert (result.status, result.reason) == ("error", "worker crashed with SIGSEGV")
    assert statuses(result) == {"0": "pass", "1": "error", "2": "skipped", "3": "skipped"}
    assert result.devices[3].reason == "not run: the worker ended on device 1"


def test_two_chips_that_disagree_have_no_majority() -> None:
    run = [line for line in lines("bitflip-2") if line.get("device") in (None, "1", "2")]
    result, _ = judge(run, None, {})
    assert [d.check for d in result.devices] == ["peers", "peers"]
    assert "no majority among 2 chips" in result.devices[0].reason


def test_import_failure_is_an_error_of_the_run() -> None:
    result, _ = judge([{"event": "error", "reason": "cannot import jax with /x/python: No module named 'jax'"}],
                      "worker exited with status 3: ", {})
    assert (result.status, result.devices) == ("error", ())
    assert result.reason == "cannot import jax with /x/python: No module named 'jax'"


def test_every_chip_held_is_skipped() -> None:
    run = [{"event": "start", "platform": "tpu", "chip": None, "stack": None, "dtype": "float32", "scale": None},
           {"event": "skipped", "device": "0", "reason": "held by pid 7 (lock on /tmp/libtpu_lockfile)"},
           {"event": "done"}]
    result, history = judge(run, None, {})
    assert (result.status, result.reason, history) == ("skipped", "held by pid 7 (lock on /tmp/libtpu_lockfile)", {})


KEY = f"attn-mlp-v1|float32|cpu|{STACK}"
TIMED_OUT = "timed out after 8s (worker process group killed)"


def only(name: str, device: str) -> list[dict]:
    """A captured four-chip run cut down to one chip, renamed 0, as a one-chip host would see it."""
    out = []
    for line in lines(name):
        if line["event"] == "start":
            out.append({**line, "devices": ["0"]})
        elif line.get("device", device) == device:
            out.append({**line, "device": "0"} if "device" in line else line)
    return out


def test_a_drill_never_changes_the_history_it_is_judged_against() -> None:
    history = {KEY: {d: CLEAN_FP for d in "0123"}, "attn-mlp-v1|float32|cpu|jax 0.4.0": {"0": "f" * 16}}
    for name, ended, kind in (("clean", None, "bitflip"), ("bitflip-2", None, "bitflip"), ("nan-1", None, "nan"),
                              ("crash-1", "worker crashed with SIGSEGV", "crash"), ("hang-1", TIMED_OUT, "hang"),
                              ("bitflip-0-1chip", None, "bitflip")):
        for before in ({}, history):
            _, after = judge(lines(name), ended, before, Drill(kind, "1"))
            assert after is before, name


def test_a_one_chip_drill_with_nothing_to_compare_is_not_detectable_and_not_a_pass() -> None:
    result, after = judge(lines("bitflip-0-1chip"), None, {}, Drill("bitflip", "0"))
    assert result.status == "undetected" and statuses(result) == {"0": "pass"}
    assert result.reason.startswith("not detectable here: bitflip on device 0 stays inside the reference tolerance "
                                    "(1.4e-06 <= 0.0008), no other chip ran to compare its fingerprint with, and "
                                    "device 0 has no fingerprint recorded on this stack yet")
    assert (result.drill.caught, result.drill.checks, result.drill.reason) == (False, (), result.reason)
    assert after == {}


def test_a_one_chip_drill_is_caught_by_the_chip_s_history() -> None:
    result, after = judge(lines("bitflip-0-1chip"), None, {KEY: {"0": CLEAN_FP}}, Drill("bitflip", "0"))
    assert result.status == "fail" and result.devices[0].check == "history"
    assert (result.drill.caught, result.drill.checks, result.drill.reason) == (True, ("history",),
                                                                               "caught by history")
    assert after == {KEY: {"0": CLEAN_FP}}


def test_the_same_one_chip_run_without_a_drill_is_a_pass_that_records_its_fingerprint() -> None:
    # Why drills must never write: this is what the corrupted chip would have stored as its last pass.
    result, after = judge(lines("bitflip-0-1chip"), None, {})
    assert (result.status, result.drill, after) == ("pass", None, {KEY: {"0": "869a2cde9c64063e"}})


def test_a_four_chip_drill_is_caught_by_peers_and_history_together() -> None:
    result, _ = judge(lines("bitflip-2"), None, {KEY: {d: CLEAN_FP for d in "0123"}}, Drill("bitflip", "2"))
    assert result.status == "fail" and statuses(result) == {"0": "pass", "1": "pass", "2": "fail", "3": "pass"}
    assert result.drill.caught and result.drill.checks == ("peers", "history")
    assert result.reason.startswith("device 2: fingerprint 869a2cde9c64063e differs from")


def test_a_two_chip_drill_is_caught_by_peers_with_both_chips_flagged() -> None:
    run = [line for line in lines("bitflip-2") if line.get("device") in (None, "1", "2")]
    result, _ = judge(run, None, {}, Drill("bitflip", "2"))
    assert result.status == "fail" and statuses(result) == {"1": "fail", "2": "fail"}
    assert result.drill.checks == ("peers",)


def test_a_nan_drill_is_caught_by_the_reference_even_on_one_chip() -> None:
    result, _ = judge(lines("nan-1"), None, {}, Drill("nan", "1"))
    assert result.drill.checks == ("reference", "peers")
    result, _ = judge(only("nan-1", "1"), None, {}, Drill("nan", "0"))
    assert (result.status, statuses(result), result.drill.checks) == ("fail", {"0": "fail"}, ("reference",))


@pytest.mark.parametrize("name, kind, ended, check", [("crash-1", "crash", "worker crashed with SIGSEGV", "crash"),
                                                      ("hang-1", "hang", TIMED_OUT, "timeout")])
def test_a_hang_or_crash_drill_is_caught_by_the_worker_s_ending(name: str, kind: str, ended: str, check: str) -> None:
    result, _ = judge(lines(name), ended, {}, Drill(kind, "1"))
    assert (result.status, result.reason) == ("error", ended)
    assert statuses(result) == {"0": "pass", "1": "error", "2": "skipped", "3": "skipped"}
    assert (result.drill.caught, result.drill.checks, result.drill.reason) == (True, (check,), f"caught: {ended}")


def test_a_drill_whose_output_did_not_change_is_missed_not_passed() -> None:
    result, _ = judge(lines("clean"), None, {}, Drill("bitflip", "2"))
    assert result.status == "undetected"
    assert result.reason == ("missed: device 2 passed although bitflip was injected: the reference and its peers "
                             "saw no difference")


def test_a_drill_on_a_held_chip_never_ran() -> None:
    run = [line for line in lines("clean") if line.get("device") != "2"]
    run.insert(1, {"event": "skipped", "device": "2", "reason": "held by pid 7 (device file open)"})
    result, _ = judge(run, None, {}, Drill("scale", "2"))
    assert result.status == "undetected" and result.reason == "not run: device 2: held by pid 7 (device file open)"


def test_a_drill_on_a_chip_that_does_not_exist_is_an_error() -> None:
    run = lines("clean")[:1] + [{"event": "error", "reason": "--inject-device 9: no such device (devices: 0, 1)"}]
    result, _ = judge(run, "worker exited with status 3: ", {}, Drill("scale", "9"))
    assert (result.status, result.reason) == ("error", "--inject-device 9: no such device (devices: 0, 1)")
    assert result.drill.reason == "not run: device 9: --inject-device 9: no such device (devices: 0, 1)"
    result, _ = judge([], "cannot start the canary supervisor /x: No such file or directory", {}, Drill("nan", "0"))
    assert result.status == "error" and not result.drill.caught


def test_history_keeps_the_most_recently_updated_stacks() -> None:
    history = {f"attn-mlp-v1|float32|cpu|jax 0.{i}": {"0": CLEAN_FP} for i in range(KEPT_STACKS)}
    _, after = judge(lines("clean"), None, history)
    assert len(after) == KEPT_STACKS and list(after)[-1] == KEY and "attn-mlp-v1|float32|cpu|jax 0.0" not in after


def test_the_report_says_what_the_drill_did() -> None:
    caught, _ = judge(lines("bitflip-2"), None, {}, Drill("bitflip", "2"))
    text = render(caught)
    assert text.splitlines()[1] == ("drill: bitflip on device 2 caught by peers; the fingerprint history was "
                                    "left as it was")
    undetected, _ = judge(lines("bitflip-0-1chip"), None, {}, Drill("bitflip", "0"))
    head, drill = render(undetected).splitlines()[:2]
    assert head.startswith("canary: UNDETECTED: not detectable here: bitflip on device 0")
    assert drill == "drill: bitflip on device 0 not caught; the fingerprint history was left as it was"
    assert "PASS" not in render(undetected)
    assert json.loads(json.dumps(undetected.to_json()))["drill"] == {
        "kind": "bitflip", "device": "0", "caught": False, "checks": [], "reason": undetected.reason}


def test_the_progress_line_is_rewritten_in_place_once_a_second() -> None:
    stream = io.StringIO()
    line = ProgressLine(stream)
    line(Progress(None, 0.0, 0.4, 120.0))
    assert stream.getvalue() == ""  # a quick run shows nothing
    line(Progress(None, 0.0, 1.2, 120.0))
    line(Progress("1", 2.2, 3.4, 120.0))
    line(Progress("1", 2.4, 3.6, 120.0))  # the same text: not written again
    line.clear()
    assert stream.getvalue() == ("\rcanary: starting the worker (1 s of the 120 s timeout)\x1b[K"
                                 "\rcanary: device 1 running for 2 s (3 s of the 120 s timeout)\x1b[K\r\x1b[K")


def test_tolerance_is_derived_from_the_dot_chain_not_from_jax() -> None:
    assert spec.tolerance("cpu", "float32", 1.0) == pytest.approx(4 * 2.0 ** -24 * 928)
    assert spec.tolerance("tpu", "float32", 1.0) == 4 * spec.tolerance("cpu", "float32", 1.0)
    assert spec.tolerance("rocm", "float32", 1.0) == spec.tolerance("tpu", "float32", 1.0)
    # A float32 numpy run of the same model lands far inside the bound.
    params, x = model.weights(), model.inputs()
    expected = model.reference(params, x)
    error = np.abs(model.forward(np, np.matmul, params, x) - expected).max()
    assert error < spec.tolerance("cpu", "float32", float(np.abs(expected).max())) / 100


def test_device_files_map_to_chips() -> None:
    groups = {"12": 0, "13": 1}
    assert [holds.chip_of_device_file(p, groups) for p in ("accel3", "vfio/13", "vfio/vfio", "vfio/99", "nvidia0")] \
        == [3, 1, None, None, None]


def test_tpu_chips_and_vfio_groups_come_from_sysfs(tmp_path: Path) -> None:
    # Two v5e chips, and two devices that are no accelerator: Google's gVNIC (0x1ae0:0x0042) and an Intel NIC.
    for pci, vendor, device_id, group in (("0000:00:05.0", "0x1ae0", "0x0063", "13"),
                                          ("0000:00:04.0", "0x1ae0", "0x0063", "12"),
                                          ("0000:00:06.0", "0x1ae0", "0x0042", "14"),
                                          ("0000:00:03.0", "0x8086", "0x1533", "2")):
        device = tmp_path / "bus/pci/devices" / pci
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
        (device / "device").write_text(device_id + "\n")
        (device / "iommu_group").symlink_to(tmp_path / "kernel/iommu_groups" / group)
    tpus = holds.accelerator_functions(str(tmp_path))["tpu"]
    assert tpus == ["0000:00:04.0", "0000:00:05.0"]
    assert holds.vfio_groups(str(tmp_path), tpus) == {"12": 0, "13": 1}


def _holder(code: str) -> subprocess.Popen[str]:
    """A real process that holds something, ready once it printed a line."""
    proc = subprocess.Popen([sys.executable, "-c", code + "; print('held', flush=True); import time; "
                             "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_lock_held_by_another_process_names_it(tmp_path: Path) -> None:
    lockfile = tmp_path / "libtpu_lockfile"
    lockfile.touch()
    assert holds.lock_holder(str(lockfile)) is None
    proc = _holder(f"import fcntl; f = open({str(lockfile)!r}, 'r+'); fcntl.lockf(f, fcntl.LOCK_EX)")
    try:
        assert holds.lock_holder(str(lockfile)) == proc.pid
    finally:
        proc.kill()
        proc.wait()
    assert holds.lock_holder(str(lockfile)) is None
    assert holds.lock_holder(str(tmp_path / "missing")) is None


def test_an_open_device_file_names_its_holder(tmp_path: Path) -> None:
    for name in ("accel0", "accel1"):
        (tmp_path / name).touch()
    with open(tmp_path / "accel0"):  # this process's own fds never count
        assert holds.device_file_holders("/proc", str(tmp_path), {}) == {}
    proc = _holder(f"f = open({str(tmp_path / 'accel1')!r})")
    try:
        assert holds.device_file_holders("/proc", str(tmp_path), {}) == {1: proc.pid}
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("vendor", "device", "pci_class", "platform"), [
    ("0x1002", "0x740f", "0x038000", "gpu"),  # MI210: jax's ROCm build, not the CPU
    ("0x1002", "0x74a1", "0x120000", "gpu"),  # MI300X, a processing accelerator by class
    ("0x10de", "0x2330", "0x030200", "gpu"),  # H100
    ("0x1002", "0x73bf", "0x030000", "cpu"),  # a Radeon display card is no accelerator
])
def test_the_plan_names_the_platform_of_the_hosts_accelerators(tmp_path: Path, vendor: str, device: str,
                                                               pci_class: str, platform: str) -> None:
    function = tmp_path / "sys/bus/pci/devices/0000:c1:00.0"
    function.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("device", device), ("class", pci_class)):
        (function / name).write_text(value + "\n")
    args = argparse.Namespace(sysfs=str(tmp_path / "sys"), dev=str(tmp_path), procfs="/proc",
                              lockfile=str(tmp_path / "none"))
    decided = worker.plan(args)
    assert (decided.platform, decided.skips) == (platform, {})


def test_a_tpu_host_with_one_chip_held_runs_one_idle_chip_alone(tmp_path: Path) -> None:
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    dev.mkdir()
    for chip in range(4):  # a v4-8 VM: four chips on the accel driver
        device = sysfs / "bus/pci/devices" / f"0000:00:0{chip + 4}.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x1ae0\n")
        (device / "device").write_text("0x005e\n")
        (dev / f"accel{chip}").touch()
    args = argparse.Namespace(sysfs=str(sysfs), dev=str(dev), procfs="/proc", lockfile=str(tmp_path / "none"))
    assert worker.plan(args).skips == {}
    proc = _holder(f"f = open({str(dev / 'accel0')!r})")
    try:
        decided = worker.plan(args)
    finally:
        proc.kill()
        proc.wait()
    assert decided.platform == "tpu" and decided.idle_tpu_left
    assert decided.skips == {0: f"held by pid {proc.pid} (device file open)",
                             2: "not run: another chip is held, one idle chip per run",
                             3: "not run: another chip is held, one idle chip per run"}
    assert decided.env["TPU_VISIBLE_CHIPS"] == "1" and decided.env["TPU_PROCESS_BOUNDS"] == "1,1,1"


def _recorded(collector: CanaryCollector, name: str, ended: str | None = None) -> None:
    collector.record(judge(lines(name), ended, {})[0])


def test_collector_exports_nothing_before_the_first_run() -> None:
    assert CanaryCollector(Config()).collect() == []


def test_run_counters_of_known_chips_exist_at_zero_before_the_first_run() -> None:
    collector = CanaryCollector(Config(), lambda: ["0", "1", "2", "3"])

    def fails_on_chip_1() -> float:
        return {(s.name, s.labels): s.value for s in collector.collect()}[
            ("tpuwatch_canary_device_runs_total", (("device", "1"), ("path", "scheduled"), ("result", "fail")))]

    assert fails_on_chip_1() == 0  # so that increase() sees the first failure
    _recorded(collector, "nan-1")
    assert fails_on_chip_1() == 1


def test_collector_samples_follow_the_last_measured_outcome() -> None:
    collector = CanaryCollector(Config())
    _recorded(collector, "clean")
    _recorded(collector, "nan-1")
    _recorded(collector, "crash-1", "worker crashed with SIGSEGV")
    samples = {(s.name, s.labels): s.value for s in collector.collect()}
    assert all(name in CATALOG for name, _ in samples)
    assert samples[("tpuwatch_canary_runs_total", (("path", "scheduled"), ("result", "pass")))] == 1
    assert samples[("tpuwatch_canary_runs_total", (("path", "scheduled"), ("result", "fail")))] == 1
    assert samples[("tpuwatch_canary_runs_total", (("path", "scheduled"), ("result", "error")))] == 1
    chip_runs = {(dict(labels)["device"], dict(labels)["result"]): v for (name, labels), v in samples.items()
                 if name == "tpuwatch_canary_device_runs_total"}
    assert {key: v for key, v in chip_runs.items() if key[0] == "1"} == {
        ("1", "pass"): 1, ("1", "fail"): 1, ("1", "suspect"): 0, ("1", "slow"): 0, ("1", "skipped"): 0,
        ("1", "error"): 1}
    assert chip_runs[("2", "pass")] == 2 and chip_runs[("2", "skipped")] == 1
    healthy = {dict(labels)["device"]: v for name, labels in samples if name == "tpuwatch_canary_healthy"
               for v in [samples[(name, labels)]]}
    # 0 and 1 were measured last by the crash run (pass, error); 2 and 3 were skipped there: nan-1 holds.
    assert healthy == {"0": 1.0, "1": 0.0, "2": 1.0, "3": 1.0}
    info = [dict(labels) for name, labels in samples if name == "tpuwatch_canary_info"]
    assert {"device": "2", "fingerprint": CLEAN_FP, "stack": STACK, "chip": "cpu", "path": "scheduled"} in info
    assert not any(i["device"] == "1" for i in info)  # the crashed chip has no fingerprint
    last_success = {(dict(labels)["device"], dict(labels)["path"]) for name, labels in samples
                    if name == "tpuwatch_canary_last_success_timestamp_seconds"}
    assert last_success == {(d, "scheduled") for d in "0123"}  # chip 1 keeps the time of its last pass


def test_a_drill_no_check_caught_is_counted_as_undetected_once_one_happened() -> None:
    collector = CanaryCollector(Config())
    _recorded(collector, "clean")

    def runs() -> dict[str, float]:
        return {dict(s.labels)["result"]: s.value for s in collector.collect()
                if s.name == "tpuwatch_canary_runs_total"}

    assert set(runs()) == {"pass", "fail", "suspect", "slow", "skipped", "error"}
    collector.record(judge(lines("bitflip-0-1chip"), None, {}, Drill("bitflip", "0"))[0])
    assert runs() == {"pass": 1, "fail": 0, "suspect": 0, "slow": 0, "skipped": 0, "error": 0, "undetected": 1}


def test_fleet_outlier_rule_passes_its_promtool_unit_tests() -> None:
    promtool = require_tool("promtool")
    for args in (["check", "rules", "canary.rules.yml"], ["test", "rules", "canary.test.yml"]):
        proc = subprocess.run([promtool, *args], check=False, cwd=ALERTS, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
