"""The verdict of one canary run, pure: the worker's protocol lines, how it ended and the stored fingerprints in.

Three checks per chip: (a) max abs error against the float64 reference within
``spec.tolerance``, (b) the same fingerprint as the majority of this host's
chips, (c) the same fingerprint as this chip's last passing run on the same
software stack and chip kind.

A fire drill (``Drill``: an injection on one chip) is judged by the same
checks, then the drill itself: was its chip caught, by which checks, and if
not, why not.  A drill never changes the history it is judged against, and a
drill that no check caught is never a pass: the run's status is
``undetected``.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from tpuwatch.canary import spec
from tpuwatch.canary.speed import INCONCLUSIVE, SLOW, median, needed, slow_against_peers, speed_verdict

History = dict[str, dict[str, str]]
KEPT_STACKS = 256  # keys kept in the history (a stack has a key per check and schedule entry), the newest
MODEL = "model"  # the reference model's check: the one the canary always ran and the in-job probe runs
CONFIRMED = 2  # a deviation seen in this many of a check's 3 runs is confirmed
SPEED = "speed"  # the confirm line of a chip the worker timed again
_CATCHER = {"hang": "timeout", "crash": "crash"}  # what catches the drills that stop the worker


@dataclass(frozen=True)
class DeviceOutcome:
    """One chip's verdict (pass, fail, suspect: a deviation not confirmed by its re-runs, slow, skipped, error);
    ``check`` names the first check that failed (reference, peers, history; prefixed by the suite's check)."""

    device: str
    status: str
    max_abs_error: float | None = None
    fingerprint: str | None = None
    duration_seconds: float | None = None
    reason: str | None = None
    check: str | None = None


@dataclass(frozen=True)
class Drill:
    """A fire drill asked for: the injection ``kind`` (spec.INJECTIONS) on chip ``device``."""

    kind: str
    device: str


@dataclass(frozen=True)
class DrillVerdict:
    """Whether a drill was caught, by which checks (reference, peers, history, timeout, crash), and why not."""

    kind: str
    device: str
    caught: bool
    checks: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class CanaryResult:
    """One canary run: overall status (pass, fail, suspect, slow, skipped, error, undetected), why, every chip."""

    status: str
    reason: str | None
    devices: tuple[DeviceOutcome, ...]
    platform: str | None = None
    chip: str | None = None
    stack: str | None = None
    tolerance: float | None = None
    finished_at: float = 0.0
    wall_seconds: float = 0.0
    drill: DrillVerdict | None = None
    path: str = "scheduled"  # or "job": reported by tpuwatch.probe from inside a running job
    job: str | None = None  # the job's process on the job path, as "pid 4242 (python3) in pod ns/name"

    def to_json(self) -> dict[str, Any]:
        """The ``tpuwatch canary --json`` object."""
        return asdict(self)


def history_key(stack: str, chip: str, dtype: str, check: str = MODEL, entry: int = 0) -> str:
    """Fingerprints are comparable only for the same check (and schedule entry), dtype, software stack and chip
    kind.  The reference model's key is the one the canary always used."""
    what = spec.MODEL_VERSION if check == MODEL else f"{check}-{spec.SUITE_VERSION}@{entry}"
    return f"{what}|{dtype}|{chip}|{stack}"


Group = tuple[str, int]  # (check, schedule entry)


def judge(lines: list[dict[str, Any]], ended: str | None, history: History,
          drill: Drill | None = None, peers: tuple[str, ...] = ()) -> tuple[CanaryResult, History]:
    """The verdict of one run and the history to store (``history`` itself for a drill).

    ``ended`` says why the worker stopped early, if it did.  ``peers`` are reference-model fingerprints of other
    chips of this host on the same stack, measured apart from this run (other jobs' reports): they count in the
    majority the run's chips are compared with, but are not judged here.  Each check of the suite is judged on
    its own (its reference bound, the chips' bits for the same input, the chip's past on it); a chip that
    failed a check that the worker re-ran is ``fail`` when it deviated in 2 of 3 runs, else ``suspect``; a chip
    much slower than its peers is ``slow``.
    """
    start = next((line for line in lines if line["event"] == "start"), None)
    failure = next((line["reason"] for line in lines if line["event"] == "error"), None) or ended
    if start is None:
        result = _overall([], failure or "the worker said nothing")
        return (_with_drill(result, _drill_verdict(drill, result, {}, None, 0, None)) if drill else result), history
    groups: dict[Group, dict[str, dict[str, Any]]] = {}
    for line in lines:
        if line["event"] == "result":
            groups.setdefault((line.get("check", MODEL), line.get("entry", 0)), {})[line["device"]] = line
    tolerance = spec.tolerance(start["platform"], start["dtype"], start["scale"]) if start["scale"] else None
    keys = {group: history_key(start["stack"], start["chip"], start["dtype"], *group) if start["stack"] else ""
            for group in groups}
    problems: dict[str, list[tuple[str, str]]] = {}
    for group, results in groups.items():
        extra = list(peers) if group[0] == MODEL else []
        majority = _majority([r["fingerprint"] for r in results.values()] + extra)
        previous = history.get(keys[group], {})
        for device, line in results.items():
            found = _problems(line, tolerance if group[0] == MODEL else None, majority, len(results) + len(extra),
                              previous.get(device))
            prefix = "" if group[0] == MODEL else f"{group[0]} "
            problems.setdefault(device, []).extend((prefix + check, prefix + text) for check, text in found)
    confirmed = _confirmed(lines, problems)
    ran = {device for results in groups.values() for device in results}
    slow, unsure = _slow({d: sum(r["duration_seconds"] or 0.0 for (check, _), results in groups.items()
                                 for dd, r in results.items() if dd == d and check in spec.TIMED_CHECKS) for d in ran},
                         lines)
    running = [line["device"] for line in lines if line["event"] == "running"]
    died_on = running[-1] if ended and running and running[-1] not in ran else None
    outcomes, judged = [], set()
    for line in lines:
        if line["event"] == "skipped":
            outcomes.append(DeviceOutcome(line["device"], "skipped", reason=line["reason"]))
        elif line["event"] == "result" and line["device"] not in judged:
            judged.add(line["device"])
            outcomes.append(_outcome(line["device"], groups, problems[line["device"]], confirmed, slow, unsure))
        elif line["event"] == "running" and line["device"] == died_on:
            outcomes.append(DeviceOutcome(died_on, "error", reason=ended))
    seen = {o.device for o in outcomes}
    outcomes += [DeviceOutcome(d, "skipped", reason=f"not run: the worker ended on device {died_on}")
                 for d in start.get("devices", []) if d not in seen and died_on is not None]
    outcomes.sort(key=lambda o: (len(o.device), o.device))  # chip order, whatever order the worker ran them in
    result = _overall(outcomes, failure, start, tolerance)
    if drill is not None:
        model_group = groups.get((MODEL, 0), {})
        verdict = _drill_verdict(drill, result, problems, tolerance, len(model_group) + len(peers),
                                 history.get(keys.get((MODEL, 0), ""), {}).get(drill.device))
        return _with_drill(result, verdict), history
    clean = {o.device for o in outcomes if o.status in ("pass", "slow")}
    for group, results in groups.items():
        if keys[group]:
            stored = {d: r["fingerprint"] for d, r in results.items() if d in clean and r["fingerprint"]}
            if stored:
                history = _remember(history, keys[group], {**history.get(keys[group], {}), **stored})
    return result, history


def _outcome(device: str, groups: dict[Group, dict[str, dict[str, Any]]], found: list[tuple[str, str]],
             confirmed: dict[str, bool], slow: dict[str, str], unsure: dict[str, str]) -> DeviceOutcome:
    """One chip's verdict over every check it ran; its figures are the reference model's where it ran.  A chip
    whose speed was inconclusive passes, the reason saying so (check ``speed``): recorded, never paged."""
    lines = [results[device] for results in groups.values() if device in results]
    main = groups.get((MODEL, 0), {}).get(device, lines[0])
    took = sum(line["duration_seconds"] or 0.0 for line in lines) if any(
        line["duration_seconds"] is not None for line in lines) else None
    if found:
        status = "fail" if confirmed.get(device, True) else "suspect"
        return DeviceOutcome(device, status, main["max_abs_error"], main["fingerprint"], took,
                             "; ".join(text for _, text in found), found[0][0])
    if device in slow:
        return DeviceOutcome(device, "slow", main["max_abs_error"], main["fingerprint"], took, slow[device], "speed")
    if device in unsure:
        return DeviceOutcome(device, "pass", main["max_abs_error"], main["fingerprint"], took, unsure[device], "speed")
    return DeviceOutcome(device, "pass", main["max_abs_error"], main["fingerprint"], took)


def _confirmed(lines: list[dict[str, Any]], problems: dict[str, list[tuple[str, str]]]) -> dict[str, bool]:
    """device -> whether its problems stand confirmed: a check it failed that the worker did not re-run, or one
    that deviated in CONFIRMED of its runs.  A chip with no confirm line at all is not listed (confirmed)."""
    deviations: dict[tuple[str, str], int] = {}
    for line in lines:
        if line["event"] == "confirm":
            deviations[(line["device"], line["check"])] = sum(bool(flag) for flag in line["deviations"])
    out = {}
    for device in {d for d, _ in deviations}:
        failed = {check.split(" ")[0] if " " in check else MODEL for check, _ in problems.get(device, [])}
        out[device] = any(deviations.get((device, check), CONFIRMED) >= CONFIRMED for check in failed)
    return out


def _slow(took: dict[str, float], lines: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, str]]:
    """(device -> why it is slow, device -> why its speed is inconclusive).  Slow: its device time over
    SLOW_FACTOR x its peers' median (three chips or more), or a speed line of rounds (a chip slow at first only
    against its fastest peer); its fastest time so over its peers' fastest in every round where the worker timed
    the chips again, and in CONSISTENT (3 in 4) of its timings, MIN_CONCLUSIVE at least, also against its peers
    timed in that same round (speed.py).  Inconclusive: slow in every round, but in too few of them against its
    peers beside it."""
    again = {line["device"]: line for line in lines if line["event"] == "confirm" and line["check"] == SPEED}
    slow, unsure = {}, {}
    first = slow_against_peers(took)
    for device in [*first, *(d for d, line in again.items() if d not in first and d in took and line["deviations"])]:
        line = again.get(device)
        found = SLOW if line is None else speed_verdict(line["deviations"], line.get("conclusive"))
        if device in first:
            seen = f"{took[device] * 1000:.3g} ms of device time, {took[device] / first[device]:.1f}x its peers' median"
        else:  # slow at first only against its fastest peer (speed.py): what its rounds found
            last = (line or {}).get("rounds") or [{"best": took[device], "peers_best": median(
                [t for d, t in took.items() if d != device])}]
            seen = (f"{last[-1]['best'] * 1000:.3g} ms of device time at its fastest, "
                    f"{last[-1]['best'] / last[-1]['peers_best']:.1f}x its peers' median fastest")
        if found == SLOW:
            slow[device] = seen
        elif found == INCONCLUSIVE and line is not None:
            beside, timed = sum(bool(c) for c in line["conclusive"]), len(line["deviations"])
            unsure[device] = (f"speed inconclusive: {seen}, slow in all {timed} timings against its peers' fastest, "
                              f"but against its peers timed beside it in only {beside} (a busy host slows some "
                              f"timings, a slow chip every one); {needed(timed)} needed to call it slow")
    return slow, unsure


def _problems(line: dict[str, Any], tolerance: float | None, majority: tuple[str | None, int], ran: int,
              previous: str | None) -> list[tuple[str, str]]:
    """(check, what it found) for every check this chip's result fails."""
    error, fp = line["max_abs_error"], line["fingerprint"]
    problems = []
    if not line["finite"]:
        problems.append(("reference", "output has NaN or Inf"))
    elif tolerance is not None and error > tolerance:
        problems.append(("reference", f"max abs error {error:.3g} > tolerance {tolerance:.3g}"))
    elif tolerance is None and (line.get("error_ratio") or 0) > 1:
        problems.append(("reference", line.get("note") or f"error {line['error_ratio']:.3g}x its bound"))
    common, count = majority
    if common is None and ran > 1:
        problems.append(("peers", f"fingerprint {fp}: no majority among {ran} chips"))
    elif common is not None and fp != common:
        problems.append(("peers", f"fingerprint {fp} differs from {common} on {count} of {ran} chips"))
    if previous is not None and fp != previous:
        problems.append(("history", f"fingerprint {fp} changed since the last pass ({previous}) on this stack"))
    return problems


def _majority(fingerprints: list[str]) -> tuple[str | None, int]:
    """The fingerprint more than half the chips share, with its count; (None, 0) if none does."""
    if not fingerprints:
        return None, 0
    common, count = Counter(fingerprints).most_common(1)[0]
    return (common, count) if count * 2 > len(fingerprints) else (None, 0)


def _remember(history: History, key: str, stored: dict[str, str]) -> History:
    """``history`` with ``key`` set to ``stored`` as the most recent entry, keeping the last KEPT_STACKS keys."""
    ordered = [(k, v) for k, v in history.items() if k != key] + [(key, stored)]
    return dict(ordered[-KEPT_STACKS:])


def _drill_verdict(drill: Drill, result: CanaryResult, problems: dict[str, list[tuple[str, str]]],
                   tolerance: float | None, ran: int, previous: str | None) -> DrillVerdict:
    """Was ``drill`` caught in ``result``; ``ran`` chips gave a result, ``previous`` is its chip's history."""
    device = drill.device
    outcome = next((o for o in result.devices if o.device == device), None)

    def verdict(caught: bool, checks: tuple[str, ...], reason: str) -> DrillVerdict:
        return DrillVerdict(drill.kind, device, caught, checks, reason)

    if outcome is None or outcome.status == "skipped":
        why = outcome.reason if outcome else result.reason or f"no device {device} in this run"
        return verdict(False, (), f"not run: device {device}: {why}")
    if drill.kind in _CATCHER:
        if outcome.status == "error":
            return verdict(True, (_CATCHER[drill.kind],), f"caught: {outcome.reason}")
        return verdict(False, (), f"missed: device {device} ended {outcome.status} although {drill.kind} "
                                  "was injected")
    if outcome.status in ("fail", "suspect", "slow"):
        checks = tuple(dict.fromkeys(check for check, _ in problems.get(device, []))) or ("speed",)
        how = "" if outcome.status == "fail" else f" ({outcome.status}: not confirmed as a wrong result)" \
            if outcome.status == "suspect" else " (slow)"
        return verdict(True, checks, f"caught by {', '.join(checks)}{how}")
    if outcome.status == "error":
        return verdict(False, (), f"not judged: device {device} ended in error: {outcome.reason}")
    if drill.kind == "slow" and outcome.check == "speed":  # its speed went unjudged: the host too busy to tell
        return verdict(False, (), f"not judged: device {device}: {outcome.reason}")
    if drill.kind == "nan" or ran > 1 or previous is not None:
        seen_by = ["the reference"] + ["its peers"] * (ran > 1) + ["its history"] * (previous is not None)
        return verdict(False, (), f"missed: device {device} passed although {drill.kind} was injected: "
                                  f"{' and '.join(seen_by)} saw no difference")
    inside = "" if outcome.max_abs_error is None or tolerance is None else \
        f" ({outcome.max_abs_error:.2g} <= {tolerance:.2g})"
    return verdict(False, (), f"not detectable here: {drill.kind} on device {device} stays inside the reference "
                              f"tolerance{inside}, no other chip ran to compare its fingerprint with, and device "
                              f"{device} has no fingerprint recorded on this stack yet (a run without --inject "
                              "records one)")


def _with_drill(result: CanaryResult, verdict: DrillVerdict) -> CanaryResult:
    """``result`` carrying the drill's verdict; a pass whose drill was not caught is ``undetected``."""
    if result.status == "pass" and not verdict.caught:
        return CanaryResult(**{**result.__dict__, "status": "undetected", "reason": verdict.reason,
                               "drill": verdict})
    return CanaryResult(**{**result.__dict__, "drill": verdict})


def _overall(outcomes: list[DeviceOutcome], failure: str | None, start: dict[str, Any] | None = None,
             tolerance: float | None = None) -> CanaryResult:
    """The run's status and reason from its chips' outcomes and why the worker failed (``failure``), if it did."""
    counts = Counter(o.status for o in outcomes)
    if counts["fail"]:
        status = "fail"
    elif failure or counts["error"]:
        status = "error"
    else:
        status = next((s for s in ("suspect", "slow", "pass") if counts[s]), "skipped")
    reason: str | None
    if failure:
        reason = failure
    elif status == "skipped":
        reason = "; ".join(sorted({o.reason or "" for o in outcomes})) or "no device to run on"
    elif status == "pass":  # a pass that says why a chip's speed went unjudged
        reason = "; ".join(f"device {o.device}: {o.reason}" for o in outcomes
                           if o.status == "pass" and o.reason) or None
    else:
        reason = "; ".join(f"device {o.device}: {o.reason}" for o in outcomes
                           if o.status in ("fail", "error", "suspect", "slow")) or None
    start = start or {}
    return CanaryResult(status, reason, tuple(outcomes), start.get("platform"), start.get("chip"),
                        start.get("stack"), tolerance, time.time())
