"""Start the canary worker in its own process group under a hard deadline, and record what it found.

``run_worker()`` runs the worker subprocess and kills its whole group on
timeout and after every run; ``run_canary()`` then judges its lines
(``judge.judge``) and updates the fingerprint history (``history``), except
for fire drills, which never write it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tpuwatch
from tpuwatch.canary.history import FingerprintHistory, history_path
from tpuwatch.canary.judge import CanaryResult, Drill, judge
from tpuwatch.config import Config

_STDERR_TAIL = 300


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
        try:
            name = signal.Signals(-returncode).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-returncode}"
        return f"worker crashed with {name}"
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


def run_canary(config: Config, inject: str | None = None, inject_device: int = 0,
               timeout: float | None = None, env: Mapping[str, str] | None = None) -> CanaryResult:
    """One canary run exactly as the daemon runs it: worker, checks, fingerprint history updated.

    A fire drill (``inject``) is judged against the history but never writes it.
    """
    started = time.monotonic()
    store = FingerprintHistory(history_path(config.state_dir))
    try:
        store.path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return CanaryResult("error", f"cannot create {store.path.parent}: {exc.strerror or exc}", (),
                            finished_at=time.time())
    lines, ended = run_worker(config, inject, inject_device, timeout, env)
    drill = Drill(inject, str(inject_device)) if inject is not None else None
    result = store.update(lambda history: judge(lines, ended, history, drill))
    return CanaryResult(**{**result.__dict__, "wall_seconds": time.monotonic() - started})
