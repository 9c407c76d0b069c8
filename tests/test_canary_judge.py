"""The canary's verdict at its edges: each chip's outcome and the run's status, reason and figures, and the
verdict on a fire drill, in the cases the captured runs of test_canary.py do not reach (a worker that died on a
later chip or after the last one, the tolerance's boundary, peers measured apart, a drill whose chip passed,
failed or ended in error).  Most runs here are written out line by line, as the worker would print them; the
others are the captured runs of tests/testdata/canary."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tpuwatch.canary import spec
from tpuwatch.canary.judge import CanaryResult, DeviceOutcome, Drill, DrillVerdict, history_key, judge
from tpuwatch.canary.speed import needed

DATA = Path(__file__).parent / "testdata" / "canary"
A, B, C = "a" * 16, "b" * 16, "c" * 16
STACK = "jax 0.10.2, jaxlib 0.10.2, cpu"
SCALE = 3.0
TOLERANCE = spec.tolerance("cpu", "float32", SCALE)
KEY = history_key(STACK, "cpu", "float32")
ERROR = 1e-6
CRASHED = "worker crashed with SIGSEGV"


def start(devices: tuple[str, ...], **more: Any) -> dict[str, Any]:
    """The worker's first line, on a CPU host with these chips."""
    return {"event": "start", "platform": "cpu", "chip": "cpu", "devices": list(devices), "stack": STACK,
            "dtype": "float32", "scale": SCALE, **more}


def result(device: str, fingerprint: str = A, took: float | None = 0.001, check: str | None = None,
           **more: Any) -> dict[str, Any]:
    """One chip's result line: the reference model's (no ``check``, as the captured runs) or a suite check's."""
    line = {"event": "result", "device": device, "finite": True, "max_abs_error": ERROR, "fingerprint": fingerprint,
            "duration_seconds": took, **more}
    return line if check is None else {**line, "check": check, "entry": 5, "error_ratio": 0.01, **more}


def ran(*results: dict[str, Any], devices: tuple[str, ...] | None = None, **more: Any) -> list[dict[str, Any]]:
    """A whole run: the start line (the chips that gave results, unless ``devices`` says), then each result after
    its chip's running line, then done."""
    lines = [start(devices or tuple(dict.fromkeys(r["device"] for r in results)), **more)]
    for line in results:
        if lines[-1].get("device") != line["device"]:
            lines.append({"event": "running", "device": line["device"]})
        lines.append(line)
    return [*lines, {"event": "done"}]


def captured(name: str) -> list[dict[str, Any]]:
    """A captured worker run (tests/testdata/canary/NAME.jsonl)."""
    return [json.loads(text) for text in (DATA / f"{name}.jsonl").read_text().splitlines()]


def statuses(verdict: CanaryResult) -> dict[str, str]:
    return {o.device: o.status for o in verdict.devices}


def outcome(verdict: CanaryResult, device: str) -> DeviceOutcome:
    [found] = [o for o in verdict.devices if o.device == device]
    return found


# --- how the worker ended -----------------------------------------------------------------------------------------


def test_a_worker_that_said_nothing_is_an_error_that_says_so() -> None:
    history = {KEY: {"0": A}}
    verdict, after = judge([], None, history)
    assert (verdict.status, verdict.reason, verdict.devices, after) == ("error", "the worker said nothing", (),
                                                                        history)
    drilled, _ = judge([], None, {}, Drill("nan", "0"))
    assert (drilled.status, drilled.drill) == (
        "error", DrillVerdict("nan", "0", False, (), "not run: device 0: the worker said nothing"))


def test_a_worker_that_died_on_a_later_chip_names_that_chip_and_skips_the_rest() -> None:
    lines = [*ran(result("0"), result("1"), result("2"), devices=tuple("01234"))[:-1],
             {"event": "running", "device": "3"}]
    verdict, _ = judge(lines, CRASHED, {})
    assert (verdict.status, verdict.reason) == ("error", CRASHED)
    assert statuses(verdict) == {"0": "pass", "1": "pass", "2": "pass", "3": "error", "4": "skipped"}
    assert outcome(verdict, "3") == DeviceOutcome("3", "error", reason=CRASHED)
    assert outcome(verdict, "4") == DeviceOutcome("4", "skipped", reason="not run: the worker ended on device 3")


def test_a_worker_that_ended_badly_after_every_chip_finished_is_an_error_that_blames_no_chip() -> None:
    verdict, _ = judge(captured("clean"), "timed out after 8s (worker process group killed)", {})
    assert (verdict.status, verdict.reason) == ("error", "timed out after 8s (worker process group killed)")
    assert statuses(verdict) == {d: "pass" for d in "0123"}


def test_a_run_with_no_chip_to_run_on_is_skipped_saying_so() -> None:
    verdict, history = judge([start(()), {"event": "done"}], None, {})
    assert (verdict.status, verdict.reason, verdict.devices, history) == ("skipped", "no device to run on", (), {})


def test_a_run_whose_chips_were_all_skipped_gives_each_reason_once() -> None:
    held, busy = "held by pid 7 (device file open)", "not run: another chip is held, one idle chip per run"
    lines = [start(tuple("012")), {"event": "skipped", "device": "0", "reason": held},
             {"event": "skipped", "device": "1", "reason": busy}, {"event": "skipped", "device": "2", "reason": busy},
             {"event": "done"}]
    verdict, _ = judge(lines, None, {})
    assert (verdict.status, verdict.reason) == ("skipped", f"{held}; {busy}")


# --- the figures of a run and of each chip ------------------------------------------------------------------------


def test_a_run_carries_its_platform_chip_stack_tolerance_and_when_it_was_judged() -> None:
    before = time.time()
    verdict, _ = judge(ran(result("0")), None, {})
    assert before <= verdict.finished_at <= time.time()
    assert (verdict.platform, verdict.chip, verdict.stack, verdict.tolerance) == ("cpu", "cpu", STACK, TOLERANCE)
    assert (verdict.wall_seconds, verdict.path, verdict.job, verdict.drill) == (0.0, "scheduled", None, None)


def test_an_error_equal_to_the_tolerance_passes_and_one_just_over_it_fails() -> None:
    verdict, _ = judge(ran(result("0", max_abs_error=TOLERANCE)), None, {})
    assert verdict.status == "pass"
    over = TOLERANCE * (1 + 1e-12)
    verdict, _ = judge(ran(result("0", max_abs_error=over)), None, {})
    assert outcome(verdict, "0") == DeviceOutcome("0", "fail", over, A, 0.001,
                                                  f"max abs error {over:.3g} > tolerance {TOLERANCE:.3g}",
                                                  "reference")


def test_a_check_s_error_at_its_bound_passes_and_over_it_fails_with_the_check_s_note() -> None:
    def gemm(**more: Any) -> CanaryResult:
        return judge(ran(result("0"), result("0", B, check="gemm", **more)), None, {})[0]

    assert gemm(error_ratio=1.0).status == "pass"
    assert outcome(gemm(error_ratio=1.5), "0").reason == "gemm error 1.5x its bound"
    failed = outcome(gemm(error_ratio=1.5, note="erf(-0.5) off by 3 ulp"), "0")
    assert (failed.check, failed.reason) == ("gemm reference", "gemm erf(-0.5) off by 3 ulp")


def test_a_chip_s_device_time_is_the_sum_of_its_checks_and_its_figures_are_the_models() -> None:
    # The suite's check first, then the model: the chip's error and fingerprint are still the model's.
    lines = ran(result("0", B, 0.002, check="gemm", max_abs_error=None), result("0", A, 0.001),
                result("1", B, None, check="gemm"), result("1", A, 0.003),
                result("2", B, None, check="gemm"), result("2", A, None))
    verdict, _ = judge(lines, None, {})
    assert [o.device for o in verdict.devices] == ["0", "1", "2"]  # each chip once, whatever it ran
    assert outcome(verdict, "0") == DeviceOutcome("0", "pass", ERROR, A, pytest.approx(0.003))
    assert outcome(verdict, "1") == DeviceOutcome("1", "pass", ERROR, A, 0.003)
    assert outcome(verdict, "2") == DeviceOutcome("2", "pass", ERROR, A, None)  # no time measured: none said


def test_a_failing_chip_keeps_its_figures_and_gives_every_problem_first_check_first() -> None:
    lines = ran(result("0"), result("1"), result("2", B, 0.004, max_abs_error=0.01))
    verdict, _ = judge(lines, None, {KEY: {"2": C}})
    assert outcome(verdict, "2") == DeviceOutcome(
        "2", "fail", 0.01, B, 0.004, f"max abs error 0.01 > tolerance {TOLERANCE:.3g}; fingerprint {B} differs from "
        f"{A} on 2 of 3 chips; fingerprint {B} changed since the last pass ({C}) on this stack", "reference")
    assert verdict.reason == f"device 2: {outcome(verdict, '2').reason}"


def test_chips_are_reported_in_chip_order_whatever_order_they_ran_in() -> None:
    verdict, _ = judge(ran(result("10"), result("9"), result("2")), None, {})
    assert [o.device for o in verdict.devices] == ["2", "9", "10"]


# --- peers, majorities and the history ----------------------------------------------------------------------------


def test_peers_measured_apart_count_in_the_models_majority_only() -> None:
    verdict, _ = judge(ran(result("0", B)), None, {}, peers=(A, A))
    assert outcome(verdict, "0") == DeviceOutcome("0", "fail", ERROR, B, 0.001,
                                                  f"fingerprint {B} differs from {A} on 2 of 3 chips", "peers")
    # A suite check's bits are compared with this run's chips only: the peers' are the model's.
    verdict, _ = judge(ran(result("0", A), result("0", B, check="gemm")), None, {}, peers=(A, A))
    assert verdict.status == "pass"


def test_four_chips_split_two_and_two_have_no_majority() -> None:
    verdict, _ = judge(ran(result("0"), result("1"), result("2", B), result("3", B)), None, {})
    assert {o.reason for o in verdict.devices} == {f"fingerprint {A}: no majority among 4 chips",
                                                   f"fingerprint {B}: no majority among 4 chips"}
    assert verdict.reason == "; ".join(f"device {d}: fingerprint {fp}: no majority among 4 chips"
                                       for d, fp in zip("0123", (A, A, B, B)))


def test_a_run_without_a_stack_is_neither_compared_with_nor_written_to_the_history() -> None:
    history = {history_key(None, "cpu", "float32"): {"0": B}}  # type: ignore[arg-type]
    verdict, after = judge(ran(result("0"), stack=None), None, history)
    assert (verdict.status, after) == ("pass", history)


def timed(slow: dict[str, float | None], again: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Four chips' gemm check, each taking 2 ms but those of ``slow``, and the speed rounds of ``again`` (the
    confirm line's fields, for every slow chip), if the worker timed them again."""
    lines = ran(*(result(d, B, slow.get(d, 0.002), check="gemm") for d in "0123"))
    for device in slow if again is not None else ():
        lines.insert(-1, {"event": "confirm", "device": device, "check": "speed", "entry": 0, **(again or {})})
    return lines


def test_a_chip_much_slower_than_its_peers_is_slow_even_from_a_worker_that_did_not_time_it_again() -> None:
    verdict, _ = judge(timed({"1": 0.006}), None, {})
    assert (verdict.status, verdict.reason) == ("slow", "device 1: 6 ms of device time, 3.0x its peers' median")


def test_a_chip_whose_time_was_not_measured_is_never_slow() -> None:
    verdict, _ = judge(timed({"3": None}), None, {})
    assert (verdict.status, verdict.reason, outcome(verdict, "3").duration_seconds) == ("pass", None, None)


def test_a_slow_chip_computed_right_and_its_fingerprint_is_kept() -> None:
    verdict, history = judge(timed({"1": 0.006}, {"deviations": [True] * 3}), None, {})
    assert outcome(verdict, "1") == DeviceOutcome("1", "slow", ERROR, B, 0.006,
                                                  "6 ms of device time, 3.0x its peers' median", "speed")
    assert history[history_key(STACK, "cpu", "float32", "gemm", 5)] == {d: B for d in "0123"}


def test_a_speed_inconclusive_says_how_many_timings_were_slow_beside_its_peers() -> None:
    beside = needed(5) - 1
    verdict, _ = judge(timed({"1": 0.006}, {"deviations": [True] * 5,
                                            "conclusive": [True] * beside + [False] * (5 - beside)}), None, {})
    assert outcome(verdict, "1") == DeviceOutcome("1", "pass", ERROR, B, 0.006, (
        f"speed inconclusive: 6 ms of device time, 3.0x its peers' median, slow in all 5 timings against its "
        f"peers' fastest, but against its peers timed beside it in only {beside} (a busy host slows some timings, a "
        f"slow chip every one); {needed(5)} needed to call it slow"), "speed")
    # 3 in 4 of them beside its peers make it slow
    verdict, _ = judge(timed({"1": 0.006}, {"deviations": [True] * 5, "conclusive": [True] * 4 + [False]}), None, {})
    assert outcome(verdict, "1").status == "slow"


def test_a_chip_slow_at_first_only_against_its_fastest_peer_is_judged_by_its_rounds() -> None:
    # its first timing 1.9x its peers' median (two of them timed in a busy moment), 3x its fastest: timed again,
    # it was slow against its peers' fastest and beside them in every round
    def lines(again: dict[str, Any]) -> list[dict[str, Any]]:
        out = timed({"1": 0.0095, "2": 0.005, "3": 0.005, "0": 0.0032})
        out.insert(-1, {"event": "confirm", "device": "1", "check": "speed", "entry": 0, **again})
        return out

    assert judge(lines({"deviations": []}), None, {})[0].status == "pass"  # not slow against its peers' median
    rounds = [{"best": 0.0096, "peers_best": 0.0032}]
    verdict, _ = judge(lines({"deviations": [True] * 4, "conclusive": [True] * 4, "rounds": rounds}), None, {})
    assert outcome(verdict, "1").status == "slow"
    assert outcome(verdict, "1").reason == "9.6 ms of device time at its fastest, 3.0x its peers' median fastest"
    assert judge(lines({"deviations": [False], "conclusive": [True]}), None, {})[0].status == "pass"


def test_a_pass_gives_every_chip_whose_speed_was_inconclusive() -> None:
    verdict, _ = judge(timed({"1": 0.006, "2": 0.008}, {"deviations": [True] * 5, "conclusive": [False] * 5}),
                       None, {})
    assert verdict.status == "pass"
    assert verdict.reason == f"device 1: {outcome(verdict, '1').reason}; device 2: {outcome(verdict, '2').reason}"


# --- the re-runs that confirm a deviation -----------------------------------------------------------------------


def _reruns(model: list[bool] | None, gemm: list[bool] | None) -> str:
    """Chip 2's status when its model and gemm fingerprints differ from its peers' and the worker re-ran those
    checks (None: that check was not re-run)."""
    lines = ran(*(r for d in "0123" for r in (result(d, B if d == "2" else A),
                                                 result(d, C if d == "2" else B, check="gemm"))))
    for check, entry, deviations in (("model", 0, model), ("gemm", 5, gemm)):
        if deviations is not None:
            lines.insert(-1, {"event": "confirm", "device": "2", "check": check, "entry": entry,
                              "deviations": deviations})
    return outcome(judge(lines, None, {})[0], "2").status


def test_the_reference_models_deviation_is_confirmed_by_its_own_re_runs() -> None:
    lines = ran(*(result(d, B if d == "2" else A) for d in "0123"))
    for deviations, status in (([True, False, False], "suspect"), ([True, True, False], "fail")):
        confirm = {"event": "confirm", "device": "2", "check": "model", "entry": 0, "deviations": deviations}
        assert outcome(judge([*lines[:-1], confirm, lines[-1]], None, {})[0], "2").status == status


def test_a_chip_stands_confirmed_when_any_check_it_failed_deviated_again_or_was_not_re_run() -> None:
    assert _reruns([True, False, False], [True, True, False]) == "fail"
    assert _reruns([True, True, True], [True, False, False]) == "fail"
    assert _reruns(None, [True, False, False]) == "fail"  # the model's deviation stands: it was not re-run
    assert _reruns([True, False, False], [True, False, False]) == "suspect"


# --- fire drills --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["hang", "crash"])
def test_a_hang_or_crash_drill_whose_chip_passed_is_missed_not_a_pass(kind: str) -> None:
    verdict, _ = judge(captured("clean"), None, {}, Drill(kind, "1"))
    reason = f"missed: device 1 ended pass although {kind} was injected"
    assert (verdict.status, verdict.reason) == ("undetected", reason)
    assert verdict.drill == DrillVerdict(kind, "1", False, (), reason)


def test_a_crash_drill_whose_chip_failed_is_missed_and_the_run_still_fails() -> None:
    verdict, _ = judge(captured("nan-1"), None, {}, Drill("crash", "1"))
    assert verdict.status == "fail" and (verdict.reason or "").startswith("device 1: output has NaN or Inf; ")
    assert verdict.drill == DrillVerdict("crash", "1", False, (), "missed: device 1 ended fail although crash was "
                                                                  "injected")


def test_a_drill_on_a_chip_that_ended_in_error_was_not_judged() -> None:
    verdict, _ = judge(captured("crash-1"), CRASHED, {}, Drill("bitflip", "1"))
    assert (verdict.status, verdict.reason) == ("error", CRASHED)
    assert verdict.drill == DrillVerdict("bitflip", "1", False, (),
                                         f"not judged: device 1 ended in error: {CRASHED}")


def test_a_drill_missed_on_another_chip_leaves_a_failing_run_failing() -> None:
    verdict, _ = judge(captured("bitflip-2"), None, {}, Drill("bitflip", "0"))
    assert verdict.status == "fail" and (verdict.reason or "").startswith("device 2: ")
    assert verdict.drill is not None and not verdict.drill.caught


def test_a_drill_on_a_chip_the_run_does_not_have_never_ran() -> None:
    verdict, _ = judge(captured("clean"), None, {}, Drill("nan", "7"))
    assert (verdict.status, verdict.reason) == ("undetected", "not run: device 7: no device 7 in this run")


def test_a_drill_on_a_suspect_chip_is_caught_but_says_it_was_not_confirmed() -> None:
    lines = ran(*(result(d, C if d == "2" else B, check="gemm") for d in "0123"))
    lines.insert(-1, {"event": "confirm", "device": "2", "check": "gemm", "entry": 5, "deviations": [True, False]})
    verdict, _ = judge(lines, None, {}, Drill("matmul", "2"))
    assert verdict.status == "suspect"
    assert verdict.drill == DrillVerdict("matmul", "2", True, ("gemm peers",),
                                         "caught by gemm peers (suspect: not confirmed as a wrong result)")


def test_a_slow_drill_is_caught_by_the_speed_check() -> None:
    verdict, _ = judge(timed({"1": 0.006}, {"deviations": [True] * 3}), None, {}, Drill("slow", "1"))
    assert verdict.status == "slow"
    assert verdict.drill == DrillVerdict("slow", "1", True, ("speed",), "caught by speed (slow)")


def test_a_slow_drill_whose_speed_was_inconclusive_was_not_judged() -> None:
    verdict, _ = judge(timed({"1": 0.006}, {"deviations": [True] * 5, "conclusive": [False] * 5}), None, {},
                       Drill("slow", "1"))
    reason = f"not judged: device 1: {outcome(verdict, '1').reason}"
    assert (verdict.status, verdict.reason) == ("undetected", reason)
    assert verdict.drill == DrillVerdict("slow", "1", False, (), reason)


def test_a_drill_caught_by_several_checks_names_each() -> None:
    verdict, _ = judge(captured("bitflip-2"), None, {KEY: {d: "0a98d6364a9cd7c3" for d in "0123"}},
                       Drill("bitflip", "2"))
    assert verdict.drill == DrillVerdict("bitflip", "2", True, ("peers", "history"), "caught by peers, history")


@pytest.mark.parametrize(("kind", "lines", "history", "peers", "seen_by"), [
    ("slow", ran(*(result(d) for d in "0123")), {}, (), "the reference and its peers"),
    ("bitflip", ran(result("0"), result("1")), {}, (), "the reference and its peers"),
    ("nan", ran(result("0")), {}, (), "the reference"),
    ("bitflip", ran(result("0")), {KEY: {"0": A}}, (), "the reference and its history"),
    ("bitflip", ran(result("0")), {}, (A, A), "the reference and its peers"),
    ("bitflip", ran(result("0"), result("1")), {KEY: {"1": A}}, (), "the reference and its peers and its history"),
])
def test_a_drill_whose_chip_passed_says_which_checks_saw_no_difference(
        kind: str, lines: list[dict[str, Any]], history: dict[str, dict[str, str]], peers: tuple[str, ...],
        seen_by: str) -> None:
    device = lines[-2]["device"]
    verdict, after = judge(lines, None, history, Drill(kind, device), peers)
    reason = f"missed: device {device} passed although {kind} was injected: {seen_by} saw no difference"
    assert (verdict.status, verdict.reason, after) == ("undetected", reason, history)
    assert verdict.drill == DrillVerdict(kind, device, False, (), reason)


def test_a_one_chip_drill_with_nothing_to_compare_says_why_it_cannot_be_detected() -> None:
    verdict, _ = judge(ran(result("0")), None, {}, Drill("bitflip", "0"))
    assert verdict.reason == (f"not detectable here: bitflip on device 0 stays inside the reference tolerance "
                              f"(1e-06 <= {TOLERANCE:.2g}), no other chip ran to compare its fingerprint with, and "
                              "device 0 has no fingerprint recorded on this stack yet (a run without --inject "
                              "records one)")
    unscaled, _ = judge(ran(result("0"), scale=None), None, {}, Drill("bitflip", "0"))
    assert unscaled.reason == ("not detectable here: bitflip on device 0 stays inside the reference tolerance, no "
                               "other chip ran to compare its fingerprint with, and device 0 has no fingerprint "
                               "recorded on this stack yet (a run without --inject records one)")
