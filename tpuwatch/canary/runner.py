"""Start the canary worker in its own process group under a hard deadline, and judge its answers.

``run_canary()`` does the I/O (subprocess, fingerprint history in state_dir);
``judge()`` is pure: worker protocol lines plus how the worker ended plus the
stored fingerprints in, a verdict per chip and the fingerprints to store out.
Three checks per chip: (a) max abs error against the float64 reference within
``spec.tolerance``, (b) the same fingerprint as the majority of this host's
chips, (c) the same fingerprint as this chip's last passing run on the same
software stack and chip kind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import tpuwatch
from tpuwatch.canary import spec
from tpuwatch.config import Config

History = dict[str, dict[str, str]]
_STDERR_TAIL = 300


@dataclass(frozen=True)
class DeviceOutcome:
    """One chip's verdict; ``check`` names the first check that failed (reference, peers, history)."""

    device: str
    status: str
    max_abs_error: float | None = None
    fingerprint: str | None = None
    duration_seconds: float | None = None
    reason: str | None = None
    check: str | None = None


@dataclass(frozen=True)
class CanaryResult:
    """One canary run: overall status (pass, fail, skipped, error), why, and every chip."""

    status: str
    reason: str | None
    devices: tuple[DeviceOutcome, ...]
    platform: str | None = None
    chip: str | None = None
    stack: str | None = None
    tolerance: float | None = None
    finished_at: float = 0.0
    wall_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The ``tpuwatch canary --json`` object."""
        out = asdict(self)
        out["devices"] = [asdict(d) for d in self.devices]
        return out


def history_key(stack: str, chip: str, dtype: str) -> str:
    """Fingerprints are comparable only for the same model, dtype, software stack and chip kind."""
    return f"{spec.MODEL_VERSION}|{dtype}|{chip}|{stack}"


def judge(lines: list[dict[str, Any]], ended: str | None, history: History) -> tuple[CanaryResult, History]:
    """The verdict of one run from the worker's protocol lines; ``ended`` says why it stopped early, if so."""
    start = next((line for line in lines if line["event"] == "start"), None)
    failure = next((line["reason"] for line in lines if line["event"] == "error"), None) or ended
    if start is None:
        return _overall([], failure or "the worker said nothing"), history
    results = {line["device"]: line for line in lines if line["event"] == "result"}
    tolerance = spec.tolerance(start["platform"], start["dtype"], start["scale"]) if start["scale"] else None
    majority = _majority([r["fingerprint"] for r in results.values()])
    key = history_key(start["stack"], start["chip"], start["dtype"]) if start["stack"] else ""
    previous = history.get(key, {})
    running = [line["device"] for line in lines if line["event"] == "running"]
    died_on = running[-1] if ended and running and running[-1] not in results else None
    outcomes = []
    for line in lines:
        if line["event"] == "skipped":
            outcomes.append(DeviceOutcome(line["device"], "skipped", reason=line["reason"]))
        elif line["event"] == "result":
            outcomes.append(_checked(line, tolerance, majority, len(results), previous.get(line["device"])))
        elif line["event"] == "running" and line["device"] == died_on:
            outcomes.append(DeviceOutcome(died_on, "error", reason=ended))
    seen = {o.device for o in outcomes}
    outcomes += [DeviceOutcome(d, "skipped", reason=f"not run: the worker ended on device {died_on}")
                 for d in start.get("devices", []) if d not in seen and died_on is not None]
    stored = {**previous, **{o.device: o.fingerprint for o in outcomes if o.status == "pass" and o.fingerprint}}
    result = _overall(outcomes, failure, start, tolerance)
    return result, ({**history, key: stored} if key else history)


def _checked(line: dict[str, Any], tolerance: float | None, majority: tuple[str | None, int], ran: int,
             previous: str | None) -> DeviceOutcome:
    error, fp = line["max_abs_error"], line["fingerprint"]
    problems = []
    if not line["finite"]:
        problems.append(("reference", "output has NaN or Inf"))
    elif tolerance is not None and error > tolerance:
        problems.append(("reference", f"max abs error {error:.3g} > tolerance {tolerance:.3g}"))
    common, count = majority
    if common is None and ran > 1:
        problems.append(("peers", f"fingerprint {fp}: no majority among {ran} chips"))
    elif common is not None and fp != common:
        problems.append(("peers", f"fingerprint {fp} differs from {common} on {count} of {ran} chips"))
    if previous is not None and fp != previous:
        problems.append(("history", f"fingerprint {fp} changed since the last pass ({previous}) on this stack"))
    return DeviceOutcome(line["device"], "fail" if problems else "pass", error, fp, line["duration_seconds"],
                         "; ".join(text for _, text in problems) or None, problems[0][0] if problems else None)


def _majority(fingerprints: list[str]) -> tuple[str | None, int]:
    """The fingerprint more than half the chips share, with its count; (None, 0) if none does."""
    if not fingerprints:
        return None, 0
    common, count = Counter(fingerprints).most_common(1)[0]
    return (common, count) if count * 2 > len(fingerprints) else (None, 0)


def _overall(outcomes: list[DeviceOutcome], failure: str | None, start: dict[str, Any] | None = None,
             tolerance: float | None = None) -> CanaryResult:
    counts = Counter(o.status for o in outcomes)
    if counts["fail"]:
        status = "fail"
    elif failure or counts["error"]:
        status = "error"
    else:
        status = "pass" if counts["pass"] else "skipped"
    reason: str | None
    if failure:
        reason = failure
    elif status == "skipped":
        reason = "; ".join(sorted({o.reason or "" for o in outcomes})) or "no device to run on"
    else:
        reason = "; ".join(f"device {o.device}: {o.reason}" for o in outcomes
                           if o.status in ("fail", "error")) or None
    start = start or {}
    return CanaryResult(status, reason, tuple(outcomes), start.get("platform"), start.get("chip"),
                        start.get("stack"), tolerance, time.time())


def worker_command(config: Config, inject: str | None, inject_device: int) -> list[str]:
    """The worker's command line under ``canary.python`` (default: this interpreter)."""
    command = [config.canary.python or sys.executable, "-m", "tpuwatch.canary.worker",
               "--state-dir", config.state_dir, "--lockfile", config.canary.lockfile,
               "--procfs", config.paths.procfs, "--sysfs", config.paths.sysfs, "--dev", config.paths.dev]
    if inject is not None:
        command += ["--inject", inject, "--inject-device", str(inject_device)]
    return command


def _worker_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    """This environment plus ``extra``, with tpuwatch importable from any interpreter."""
    root = str(Path(tpuwatch.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, **(extra or {}), "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else root}


def _parse(stdout: str) -> list[dict[str, Any]]:
    lines = []
    for text in stdout.splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict) and "event" in line:
            lines.append(line)
    return lines


def _ending(returncode: int, stderr: str, timed_out: float | None) -> str | None:
    if timed_out is not None:
        return f"timed out after {timed_out:g}s (worker process group killed)"
    if returncode < 0:
        return f"worker crashed with {signal.Signals(-returncode).name}"
    if returncode != 0:
        tail = (stderr.strip().splitlines() or ["no output"])[-1][:_STDERR_TAIL]
        return f"worker exited with status {returncode}: {tail}"
    return None


_running: set[int] = set()  # process groups of the workers running now
_running_lock = threading.Lock()


def kill_running_workers() -> None:
    """Kill every worker process group still running (the daemon is stopping)."""
    with _running_lock:
        groups = list(_running)
    for pgid in groups:
        _kill_group(pgid)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_worker(config: Config, inject: str | None = None, inject_device: int = 0, timeout: float | None = None,
               env: Mapping[str, str] | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """Run the worker in a new process group; its protocol lines and why it ended early (None if it did not).

    On timeout the whole group is killed; after any ending the group is swept.
    """
    limit = timeout if timeout is not None else config.canary.timeout
    try:
        proc = subprocess.Popen(worker_command(config, inject, inject_device), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                env=_worker_env(env), start_new_session=True)
    except OSError as exc:
        return [], f"cannot start canary.python {config.canary.python or sys.executable}: {exc.strerror or exc}"
    with _running_lock:
        _running.add(proc.pid)
    timed_out = None
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        stdout, stderr = proc.communicate()
        timed_out = limit
    finally:
        with _running_lock:
            _running.discard(proc.pid)
    _kill_group(proc.pid)
    return _parse(stdout), _ending(proc.returncode, stderr, timed_out)


def history_path(config: Config) -> Path:
    """Where the fingerprint history of this host lives."""
    return Path(config.state_dir) / "canary" / "fingerprints.json"


def load_history(path: Path) -> History:
    """The stored fingerprints; an unreadable or foreign file counts as none."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_canary(config: Config, inject: str | None = None, inject_device: int = 0,
               timeout: float | None = None, env: Mapping[str, str] | None = None) -> CanaryResult:
    """One canary run exactly as the daemon runs it: worker, checks, fingerprint history updated."""
    started = time.monotonic()
    path = history_path(config)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _overall([], f"cannot create {path.parent}: {exc.strerror or exc}")
    lines, ended = run_worker(config, inject, inject_device, timeout, env)
    history = load_history(path)
    result, updated = judge(lines, ended, history)
    if updated != history:
        scratch = path.with_suffix(".tmp")
        scratch.write_text(json.dumps(updated, indent=1, sort_keys=True), encoding="utf-8")
        scratch.replace(path)
    return CanaryResult(**{**result.__dict__, "wall_seconds": time.monotonic() - started})
